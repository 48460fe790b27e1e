"""Draft heads are written as one ``model.safetensors`` unless shards are asked for, and the shipped head is one
file, so SafeAILab EAGLE's loader (one ``pytorch_model.bin`` or ``model.safetensors`` in the folder) finds it."""

from pathlib import Path

import torch

from eagle_triton.testing import random_eagle3_head
from eagle_triton.train import TrainConfig

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "eagle_triton" / "assets" / "smollm2-eagle3"

# The keys of SafeAILab's ``cnets.Model`` that a checkpoint provides (its embedding comes from the target).
EAGLE3_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


def safeailab_style_load(folder: Path) -> dict[str, torch.Tensor]:
    """SafeAILab's ``EaModel.from_pretrained`` convention: ``pytorch_model.bin``, else ``model.safetensors``."""
    from safetensors.torch import load_file

    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return load_file(str(folder / "model.safetensors"))


def test_save_pretrained_writes_one_file_by_default(tmp_path):
    head = random_eagle3_head(seed=1)
    files = head.save_pretrained(tmp_path)
    assert files == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    sd = safeailab_style_load(tmp_path)
    for k, v in head.state_dict().items():
        if k != "embed_tokens.weight":
            assert torch.equal(sd[k], v), k


def test_shards_only_when_asked(tmp_path):
    files = random_eagle3_head(seed=1).save_pretrained(tmp_path, max_shard_bytes=60_000)
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files


def test_training_default_is_one_file():
    assert TrainConfig().max_shard_bytes is None


def test_shipped_head_is_one_file_safeailab_can_load():
    names = {p.name for p in SHIPPED.iterdir()}
    assert "model.safetensors" in names
    assert not any(n.endswith(".index.json") or n.startswith("model-0") for n in names), names
    sd = safeailab_style_load(SHIPPED)
    assert set(sd) == EAGLE3_KEYS
    from eagle_triton.heads import load_draft_head

    head = load_draft_head(str(SHIPPED), embed_tokens=torch.zeros(sd["t2d"].shape[0], sd["norm.weight"].shape[0]))
    for k in EAGLE3_KEYS:
        assert torch.equal(head.state_dict()[k].to(sd[k].dtype), sd[k]), k
