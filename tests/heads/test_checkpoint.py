"""Draft-head checkpoints: published layouts, round trips, and strict loading with errors that name the key."""

import json

import pytest
import torch

from eagle_triton import (
    CheckpointError,
    DraftHeadConfig,
    Eagle1DraftHead,
    Eagle3DraftHead,
    TreeConfig,
    TreeDrafter,
    load_draft_head,
)
from eagle_triton.testing import llama31_8b_eagle3_config, random_eagle1_head, random_eagle3_head


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _write_bin(head, path, drop=(), rename=None, reshape=None, fp16=True):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(head.config.to_dict()))
    sd = {k: (v.half() if fp16 and v.is_floating_point() else v) for k, v in head.state_dict().items()
          if k != "embed_tokens.weight" and k not in drop}
    if rename:
        sd[rename[1]] = sd.pop(rename[0])
    if reshape:
        sd[reshape] = torch.zeros(*[s + 1 for s in sd[reshape].shape])
    torch.save(sd, path / "pytorch_model.bin")


def test_published_eagle3_layout_keys_and_shapes():
    with torch.device("meta"):
        head = Eagle3DraftHead(llama31_8b_eagle3_config())
    shapes = {k: list(v.shape) for k, v in head.state_dict().items()}
    assert shapes == {
        "embed_tokens.weight": [128256, 4096], "fc.weight": [4096, 12288],
        "midlayer.self_attn.q_proj.weight": [4096, 8192], "midlayer.self_attn.k_proj.weight": [1024, 8192],
        "midlayer.self_attn.v_proj.weight": [1024, 8192], "midlayer.self_attn.o_proj.weight": [4096, 4096],
        "midlayer.mlp.gate_proj.weight": [14336, 4096], "midlayer.mlp.up_proj.weight": [14336, 4096],
        "midlayer.mlp.down_proj.weight": [4096, 14336], "midlayer.hidden_norm.weight": [4096],
        "midlayer.input_layernorm.weight": [4096], "midlayer.post_attention_layernorm.weight": [4096],
        "norm.weight": [4096], "lm_head.weight": [32000, 4096], "d2t": [32000], "t2d": [128256],
    }


def test_eagle3_round_trip_safetensors_and_identical_drafts(tmp_path):
    head = random_eagle3_head()
    files = head.save_pretrained(tmp_path)
    assert files == ["config.json", "model.safetensors"]
    loaded = Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=head.embed_tokens)
    _same_weights(head, loaded)
    ids = torch.randint(0, 256, (1, 6))
    feats = torch.randn(1, 5, head.feature_width)
    a = TreeDrafter(head, TreeConfig(20, 3, 4)).draft(feats, ids)
    b = TreeDrafter(loaded, TreeConfig(20, 3, 4)).draft(feats, ids)
    assert torch.equal(a.draft_tokens, b.draft_tokens) and torch.equal(a.tree_mask, b.tree_mask)


def test_sharded_safetensors_round_trip(tmp_path):
    head = random_eagle3_head(hidden_size=64, intermediate_size=200)
    files = head.save_pretrained(tmp_path, max_shard_bytes=60_000)
    assert "model.safetensors.index.json" in files and len(files) > 3
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(head.state_dict()) - {"embed_tokens.weight"}
    loaded = load_draft_head(tmp_path, embed_tokens=head.embed_tokens.weight)
    assert isinstance(loaded, Eagle3DraftHead)
    _same_weights(head, loaded)


def test_pytorch_bin_fp16_and_dtype_device(tmp_path):
    head = random_eagle3_head()
    _write_bin(head, tmp_path)
    loaded = Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=head.embed_tokens, dtype=torch.float16,
                                             device="cpu")
    assert loaded.fc.weight.dtype == torch.float16 and loaded.d2t.dtype == torch.long
    assert torch.equal(loaded.fc.weight, head.fc.weight.half())


def test_sharded_bin_index(tmp_path):
    head = random_eagle1_head(bias=False)
    sd = {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"}
    keys = sorted(sd)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        name = f"pytorch_model-{i + 1:05d}-of-00002.bin"
        torch.save({k: sd[k] for k in part}, tmp_path / name)
        weight_map.update({k: name for k in part})
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(head.config.to_dict()))
    loaded = load_draft_head(tmp_path, embed_tokens=head.embed_tokens, lm_head=head.target_lm_head)
    assert isinstance(loaded, Eagle1DraftHead) and loaded.fc.bias is None
    _same_weights(head, loaded)


def test_t2d_is_derived_when_absent(tmp_path):
    head = random_eagle3_head()
    _write_bin(head, tmp_path, drop=("t2d",), fp16=False)
    loaded = Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=head.embed_tokens)
    assert torch.equal(loaded.t2d, head.t2d)


def test_misspelled_key_is_named(tmp_path):
    head = random_eagle3_head()
    _write_bin(head, tmp_path, rename=("midlayer.mlp.gate_proj.weight", "midlayer.mlp.gate_prj.weight"))
    with pytest.raises(CheckpointError) as e:
        Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=head.embed_tokens)
    msg = str(e.value)
    assert "unexpected key 'midlayer.mlp.gate_prj.weight'" in msg
    assert "did you mean 'midlayer.mlp.gate_proj.weight'" in msg
    assert "missing key 'midlayer.mlp.gate_proj.weight'" in msg


def test_misshaped_key_names_both_shapes(tmp_path):
    head = random_eagle3_head()
    _write_bin(head, tmp_path, reshape="fc.weight")
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \[65, 193\] in the checkpoint but the head "
                                              r"expects \[64, 192\]"):
        Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=head.embed_tokens)


def test_missing_key(tmp_path):
    head = random_eagle3_head()
    _write_bin(head, tmp_path, drop=("norm.weight",))
    with pytest.raises(CheckpointError, match=r"missing key 'norm.weight' \(expected shape \[64\]\)"):
        Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=head.embed_tokens)


def test_embeddings_required_and_checked(tmp_path):
    head = random_eagle3_head()
    head.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="pass embed_tokens="):
        Eagle3DraftHead.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"embed_tokens has shape \[256, 32\].*vocab or hidden mismatch"):
        Eagle3DraftHead.from_pretrained(tmp_path, embed_tokens=torch.zeros(256, 32))


def test_narrow_head_keeps_its_own_embeddings(tmp_path):
    head = random_eagle3_head(hidden_size=48, target_hidden_size=80)
    assert head.fc.weight.shape == (48, 240)
    head.save_pretrained(tmp_path)
    loaded = Eagle3DraftHead.from_pretrained(tmp_path)  # embed_tokens comes from the checkpoint
    _same_weights(head, loaded)


def test_wrong_kind_is_an_error(tmp_path):
    e1 = random_eagle1_head()
    e1.save_pretrained(tmp_path / "e1")
    with pytest.raises(CheckpointError, match="EAGLE-1 head but Eagle3DraftHead was asked for"):
        Eagle3DraftHead.from_pretrained(tmp_path / "e1", embed_tokens=e1.embed_tokens)
    e3 = random_eagle3_head()
    e3.save_pretrained(tmp_path / "e3")
    with pytest.raises(CheckpointError, match="EAGLE-3 head but Eagle1DraftHead was asked for"):
        Eagle1DraftHead.from_pretrained(tmp_path / "e3", embed_tokens=e3.embed_tokens)


def test_malformed_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_draft_head(tmp_path / "nope")
    (tmp_path / "a").mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_draft_head(tmp_path / "a")
    (tmp_path / "a" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_draft_head(tmp_path / "a")
    (tmp_path / "a" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="lacks required field"):
        load_draft_head(tmp_path / "a")
    head = random_eagle3_head()
    head.save_pretrained(tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(CheckpointError, match="cannot read safetensors file"):
        load_draft_head(tmp_path / "b", embed_tokens=head.embed_tokens)
    (tmp_path / "b" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights in"):
        load_draft_head(tmp_path / "b")
    (tmp_path / "b" / "pytorch_model.bin").write_bytes(b"\x00" * 50)
    with pytest.raises(CheckpointError, match="cannot read PyTorch checkpoint"):
        load_draft_head(tmp_path / "b")


def test_config_validation():
    with pytest.raises(ValueError, match="not divisible"):
        DraftHeadConfig(hidden_size=65, intermediate_size=8, num_attention_heads=4, vocab_size=10)
    with pytest.raises(ValueError, match="multiple of"):
        DraftHeadConfig(hidden_size=64, intermediate_size=8, num_attention_heads=4, num_key_value_heads=3,
                        vocab_size=10)
    cfg = DraftHeadConfig.from_dict({"hidden_size": 64, "intermediate_size": 8, "num_attention_heads": 4,
                                     "vocab_size": 10, "some_future_field": 1})
    assert cfg.to_dict()["some_future_field"] == 1 and cfg.rope_base == 10000.0


def test_draft_input_errors():
    head = random_eagle3_head()
    d = TreeDrafter(head, TreeConfig(20, 3, 4))
    ids = torch.randint(0, 256, (1, 6))
    with pytest.raises(ValueError, match="width 64 does not match the head's target feature width 192"):
        d.draft(torch.randn(1, 5, 64), ids)
    with pytest.raises(TypeError, match="dtype"):
        d.draft(torch.randn(1, 5, 192, dtype=torch.float64), ids)
    with pytest.raises(ValueError, match="expected 5 new rows"):
        d.draft(torch.randn(1, 4, 192), ids)
    with pytest.raises(ValueError, match="at least one accepted token"):
        d.draft(torch.randn(1, 0, 192), ids[:, :1])
    with pytest.raises(ValueError, match="unknown drafter backend"):
        TreeDrafter(head, TreeConfig(20, 3, 4), backend="nope")
    with pytest.raises(ValueError, match="smaller than top_k"):
        TreeDrafter(random_eagle3_head(draft_vocab_size=8), TreeConfig(20, 2, 10))


@pytest.mark.parametrize("kw,msg", [
    (dict(total_tokens=1), "counts the root"),
    (dict(top_k=0), "top_k must be >= 1"),
    (dict(depth=-1), "depth must be >= 0"),
    (dict(total_tokens=30, depth=1, top_k=4), r"29 drafted nodes exceed the top_k \+ depth \* top_k\*\*2 = 4 \+ 1"),
    (dict(total_tokens=2.5), "must be an int"),
])
def test_tree_config_validation(kw, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        TreeConfig(**kw)


def test_tree_config_meanings():
    c = TreeConfig()
    assert (c.total_tokens, c.depth, c.top_k) == (60, 7, 10)
    assert c.num_draft_nodes == 59 and c.num_candidates == 710 and c.max_levels == 8
    TreeConfig(total_tokens=21, depth=1, top_k=4)  # exactly top_k + depth*top_k**2 nodes is allowed
