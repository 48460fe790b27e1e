"""EAGLE-3 training pipeline on a tiny random Llama target built in code (CPU, fp32, no downloads)."""

import argparse
import copy
import json

import pytest
import torch
from chat_testlib import tiny_chat_model, tiny_tokenizer
from numerics import assert_close_to_reference

from eagle_triton import Eagle3DraftHead, TreeConfig, load_draft_head
from eagle_triton.testing import random_eagle3_head
from eagle_triton.train import (
    DataConfig,
    EvalPromptFilter,
    TrainConfig,
    accepted_along_path,
    build_draft_vocab,
    export_dataset,
    generate_dataset,
    greedy_acceptance,
    grow_draft_vocab,
    grown_positions,
    import_dataset,
    load_dataset,
    lr_at,
    make_batches,
    target_forward,
    token_counts,
    train_eagle3,
    ttt_hidden_states,
    user_prefix_ids,
)
from eagle_triton.train.trainer import prepare_batch
from eagle_triton.train.ttt import ttt_loss

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    return tiny_chat_model(tok), tok


def _small_data(tmp_path, tiny, n=12):
    model, tok = tiny
    cfg = DataConfig(num_prompts=n, batch_size=4, prompt_max_tokens=10, max_new_tokens=24,
                     response_temperatures=[0.0, 1.0], seed=3)
    status = generate_dataset(model, tok, cfg, tmp_path / "data", progress=False, log=lambda *_: None)
    assert status["complete"]
    return load_dataset(tmp_path / "data")


# ---------------------------------------------------------------------------------------------------------------
def test_ttt_unroll_matches_inference_chain():
    """Step s at row j equals the head run as a drafter: prefix rows 0..j, then a chain of s single-node steps."""
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=50, draft_vocab_size=20, rope_theta=500.0, seed=1)
    B, S, steps = 2, 7, 4
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(B, S, head.feature_width, generator=g)
    tokens = torch.randint(0, 50, (B, S), generator=g)
    outs = ttt_hidden_states(head, feats, tokens, steps)
    with torch.no_grad():
        for b in range(B):
            for j in range(S - 1):
                out, kv = head(feats[b:b + 1, : j + 1], tokens[b:b + 1, 1: j + 2])
                torch.testing.assert_close(outs[0][b, j], out[0, j], atol=1e-5, rtol=1e-5)
                h = out[:, j:j + 1]
                for s in range(1, steps):
                    if j + 1 + s >= S:
                        break
                    h, kv = head(h, tokens[b:b + 1, j + 1 + s: j + 2 + s],
                                 position_ids=torch.tensor([[j + s]]), past_key_values=kv)
                    torch.testing.assert_close(outs[s][b, j], h[0, 0], atol=1e-5, rtol=1e-5)


def test_ttt_rejects_bad_inputs():
    head = random_eagle3_head(seed=0)
    with pytest.raises(ValueError, match="width"):
        ttt_hidden_states(head, torch.randn(1, 3, 7), torch.zeros(1, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="agree"):
        ttt_hidden_states(head, torch.randn(1, 3, head.feature_width), torch.zeros(1, 4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="steps"):
        ttt_hidden_states(head, torch.randn(1, 3, head.feature_width), torch.zeros(1, 3, dtype=torch.long), 0)


def test_draft_vocab_from_frequencies():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    v = build_draft_vocab(counts, 4, always_include=[6])
    # forced 6, then 9 (ids 2, 5), then 5 (ids 0 and 3 tie: lower id first)
    assert v.used.tolist() == [0, 2, 5, 6]
    assert torch.equal(v.used, torch.arange(4) + v.d2t)
    assert v.t2d.tolist() == [True, False, True, False, False, True, True, False]
    assert v.coverage == pytest.approx(23 / 31)
    c = token_counts([torch.tensor([1, 1, 3, 2]), torch.tensor([0, 3])], 5, starts=[1, 0])
    assert c.tolist() == [1, 1, 1, 2, 0]
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(counts, 9)
    with pytest.raises(ValueError, match="outside"):
        token_counts([torch.tensor([7])], 5)


def test_draft_vocab_grown_keeps_every_id():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    old = torch.tensor([1, 4, 6])  # rare ids: a vocabulary chosen from other data
    v = grow_draft_vocab(old, counts, 5)
    # the old ids stay, then 9 (ids 2, 5) by count
    assert v.used.tolist() == [1, 2, 4, 5, 6]
    assert torch.equal(v.used, torch.arange(5) + v.d2t) and v.t2d.nonzero().flatten().tolist() == v.used.tolist()
    assert v.coverage == pytest.approx(19 / 31)
    assert grown_positions(old, v.used).tolist() == [0, 2, 4]
    assert grow_draft_vocab(old, counts, 3).used.tolist() == [1, 4, 6]  # the same size: unchanged
    with pytest.raises(ValueError, match="cannot grow a draft vocabulary of 3 ids to 2"):
        grow_draft_vocab(old, counts, 2)
    with pytest.raises(ValueError, match="repeated"):
        grow_draft_vocab(torch.tensor([1, 1]), counts, 4)
    with pytest.raises(ValueError, match="ids in"):
        grow_draft_vocab(torch.tensor([8]), counts, 4)
    with pytest.raises(ValueError, match="does not contain"):
        grown_positions(torch.tensor([3]), v.used)


def test_growing_a_trained_heads_vocabulary(tmp_path, tiny):
    """``grow_draft_vocab`` with an init head: its rows move to their ids' places bit for bit, the new ids' rows are
    the target's output rows, the vocabulary and the config are recorded, and training goes on from there."""
    model, tok = tiny
    samples = _small_data(tmp_path, tiny)
    cfg = dict(draft_vocab_size=24, ttt_steps=2, lr=3e-3, warmup_steps=2, max_steps=6, tokens_per_batch=200,
               max_len=64, val_fraction=0.1, log_every=2, save_every=0, save_dtype="float32", intermediate_size=64)
    train_eagle3(model, tok, samples, TrainConfig(**cfg), tmp_path / "a", progress=False, log=lambda *_: None)
    old = load_draft_head(tmp_path / "a" / "head", embed_tokens=model.get_input_embeddings())
    old_used = old.draft_to_target(torch.arange(24))
    logs = []
    grown, meta = train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "grow_draft_vocab": 40}), tmp_path / "b",
                               init_head=tmp_path / "a" / "head", progress=False, log=logs.append)
    assert meta["step"] == 6 and grown.draft_vocab_size == 40 and meta["head_config"]["draft_vocab_size"] == 40
    used = grown.draft_to_target(torch.arange(40))
    assert used.tolist() == meta["vocab_used"] == sorted(set(used.tolist()))
    assert set(old_used.tolist()) <= set(used.tolist())
    change = meta["vocab_changes"]
    assert len(change) == 1 and (change[0]["from"], change[0]["to"], change[0]["step"]) == (24, 40, 6)
    assert change[0]["coverage_after"] >= change[0]["coverage_before"]
    assert any("grown 24 -> 40" in line for line in logs)
    pos = grown_positions(old_used, used)
    assert torch.equal(grown.lm_head.weight[pos], old.lm_head.weight)
    new = torch.ones(40, dtype=torch.bool)
    new[pos] = False
    assert torch.equal(grown.lm_head.weight[new], model.get_output_embeddings().weight[used[new]].float())
    for name, w in old.state_dict().items():
        if name not in ("lm_head.weight", "d2t", "t2d"):
            assert torch.equal(grown.state_dict()[name], w), name
    loaded = load_draft_head(tmp_path / "b" / "head", embed_tokens=model.get_input_embeddings())
    assert loaded.draft_vocab_size == 40 and torch.equal(loaded.draft_to_target(torch.arange(40)), used)

    # training goes on with the grown vocabulary (and a resumed run keeps it: the same size is no change)
    _, meta_c = train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "grow_draft_vocab": 40, "max_steps": 9}),
                             tmp_path / "c", init_head=tmp_path / "b" / "head", progress=False, log=lambda *_: None)
    assert meta_c["step"] == 9 and meta_c["vocab_used"] == meta["vocab_used"]
    assert len(meta_c["vocab_changes"]) == 1  # recorded once, carried by the head's train_meta.json
    # a continuation without growing (the decay phase's run) records the head's size, not the option's default
    _, meta_f = train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "max_steps": 8}), tmp_path / "f",
                             init_head=tmp_path / "b" / "head", progress=False, log=lambda *_: None)
    assert meta_f["train_config"]["draft_vocab_size"] == meta["train_config"]["draft_vocab_size"] == 40
    assert meta_f["vocab_used"] == meta["vocab_used"]
    with pytest.raises(ValueError, match="cannot grow a draft vocabulary of 40 ids to 30"):
        train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "grow_draft_vocab": 30}), tmp_path / "d",
                     init_head=tmp_path / "b" / "head", progress=False, log=lambda *_: None)
    train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "max_steps": 8, "stop_at_step": 7}), tmp_path / "e",
                 progress=False, log=lambda *_: None)
    with pytest.raises(ValueError, match="grows only when training starts from init_head"):
        train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "max_steps": 8, "grow_draft_vocab": 40}),
                     tmp_path / "e", progress=False, log=lambda *_: None)


def test_lr_schedule_and_batches():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=100, decay_fraction=0.5, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(49, cfg) == pytest.approx(1e-3)
    assert lr_at(75, cfg) == pytest.approx(1e-3 * (1 - 0.9 * 0.5))
    assert lr_at(100, cfg) == pytest.approx(1e-4)
    assert lr_at(60, cfg, rewarm_from=59) == pytest.approx(lr_at(60, cfg) * 2 / cfg.rewarmup_steps)
    lengths = [5, 17, 3, 9, 9, 30]
    batches = make_batches(lengths, 20, 16)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(len(b) * max(min(lengths[i], 16) for i in b) <= 20 or len(b) == 1 for b in batches)


def test_eval_prompts_are_filtered():
    filt = EvalPromptFilter()
    assert any("mt_bench" in s for s in filt.sources), filt.sources
    mt = json.loads(open(filt.sources[0].split(" (")[0]).readline())["turns"][0]
    assert mt in filt and ("  " + mt.upper() + " ") in filt
    assert "Write a haiku about the sea." not in filt


def test_prompts_from_target_resumable_and_deterministic(tmp_path, tiny):
    model, tok = tiny
    assert tok.decode(user_prefix_ids(tok)) == "<|im_start|>user\n"
    cfg = DataConfig(num_prompts=6, batch_size=2, prompt_max_tokens=6, max_new_tokens=8, seed=1)
    st = generate_dataset(model, tok, cfg, tmp_path / "d", time_budget_s=0.0, progress=False, log=lambda *_: None)
    assert not st["complete"] and st["batches_done"] == 0
    st = generate_dataset(model, tok, cfg, tmp_path / "d", progress=False, log=lambda *_: None)
    assert st["complete"] and st["batches_done"] == 3
    full = load_dataset(tmp_path / "d")
    assert 1 <= len(full) <= 6
    prefix = user_prefix_ids(tok)
    for s in full:
        assert s.ids[: len(prefix)].tolist() == prefix
        assert 0 < s.resp_start < len(s.ids)
    # Delete a shard: a resumed call regenerates exactly it, bit for bit.
    (tmp_path / "d" / "shard_00001.pt").unlink()
    st = generate_dataset(model, tok, cfg, tmp_path / "d", progress=False, log=lambda *_: None)
    again = load_dataset(tmp_path / "d")
    assert [s.ids.tolist() for s in again] == [s.ids.tolist() for s in full]
    # A different config in the same directory is refused.
    with pytest.raises(ValueError, match="started with other data settings"):
        generate_dataset(model, tok, DataConfig(num_prompts=7, batch_size=2), tmp_path / "d", progress=False)
    # Export/import round trip.
    export_dataset(tmp_path / "d", tmp_path / "pack.pt")
    import_dataset(tmp_path / "pack.pt", tmp_path / "d2")
    assert [s.ids.tolist() for s in load_dataset(tmp_path / "d2")] == [s.ids.tolist() for s in full]
    export_dataset(tmp_path / "d", tmp_path / "pack.pt.gz")  # gzip-compressed pack
    assert (tmp_path / "pack.pt.gz").read_bytes()[:2] == b"\x1f\x8b"
    import_dataset(tmp_path / "pack.pt.gz", tmp_path / "d3")
    assert [s.ids.tolist() for s in load_dataset(tmp_path / "d3")] == [s.ids.tolist() for s in full]
    # a pack read in place: the folder's conversations, in its order, with its response starts
    for pack in ("pack.pt", "pack.pt.gz"):
        in_place = load_dataset(tmp_path / pack)
        assert [(s.ids.tolist(), s.resp_start) for s in in_place] == [(s.ids.tolist(), s.resp_start) for s in full]


def test_prompts_jsonl_drops_eval_prompts(tmp_path, tiny):
    model, tok = tiny
    filt = EvalPromptFilter()
    mt = json.loads(open(filt.sources[0].split(" (")[0]).readline())["turns"][0]
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [{"prompt": "hello there"}, {"turns": [mt, "x"]},
                                                   {"messages": [{"role": "user", "content": "add 2 and 3"}]}]))
    cfg = DataConfig(num_prompts=10, prompts_path=str(f), batch_size=4, max_new_tokens=4)
    st = generate_dataset(model, tok, cfg, tmp_path / "d", progress=False, log=lambda *_: None)
    assert st["dropped_eval_or_empty_prompts"] == 1
    texts = [json.loads(line)["prompt"] for line in open(tmp_path / "d" / "prompts.jsonl")]
    assert texts == ["hello there", "add 2 and 3"]


def test_prepare_batch_masks_and_features(tiny):
    model, tok = tiny
    from eagle_triton.train import Sample

    g = torch.Generator().manual_seed(5)
    samples = [Sample(torch.randint(3, 100, (n,), generator=g), r) for n, r in [(9, 4), (5, 1)]]
    used = torch.arange(0, 112, 3)
    b = prepare_batch(model, samples, used, 64, tok.pad_token_id, "cpu")
    assert b.loss_mask[0].tolist() == [False] * 3 + [True] * 5 + [False]
    assert b.loss_mask[1].tolist() == [True] * 4 + [False] * 5
    ref = target_forward(model, samples[0].ids[None])
    ref64 = target_forward(copy.deepcopy(model).double(), samples[0].ids[None])
    # batched (padded) vs single-row forward: other matmul shapes, which the CPU BLAS may round differently
    assert_close_to_reference(b.features[0], ref.features[0], ref64.features[0], what="batched features")
    torch.testing.assert_close(b.target_logp[0].exp().sum(-1), torch.ones(9), atol=1e-5, rtol=1e-5)
    assert torch.equal(b.target_argmax[0], ref.logits[0].argmax(-1))


def test_train_loss_decreases_checkpoint_roundtrip_and_resume(tmp_path, tiny):
    model, tok = tiny
    samples = _small_data(tmp_path, tiny)
    cfg = dict(draft_vocab_size=48, ttt_steps=3, lr=3e-3, warmup_steps=3, max_steps=24, tokens_per_batch=200,
               max_len=64, val_fraction=0.1, log_every=4, save_every=0, save_dtype="float32", intermediate_size=64)
    head, meta = train_eagle3(model, tok, samples, TrainConfig(**cfg), tmp_path / "a", progress=False,
                              log=lambda *_: None)
    hist = meta["history"]
    assert meta["complete"] and meta["step"] == 24 and len(hist) == 6
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"], [h["loss"] for h in hist]
    assert len(meta["validation"][-1]["acc"]) == 3

    # The published checkpoint loads through the strict loader and computes the same logits.
    loaded = load_draft_head(tmp_path / "a" / "head", embed_tokens=model.get_input_embeddings())
    assert isinstance(loaded, Eagle3DraftHead) and loaded.draft_vocab_size == 48
    assert loaded.config.rope_theta == model.config.rope_parameters["rope_theta"]
    for k, v in head.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert json.loads((tmp_path / "a" / "head" / "train_meta.json").read_text())["step"] == 24

    # Pause at step 9 and resume in a second call: same weights as the uninterrupted run.
    train_eagle3(model, tok, samples, TrainConfig(**cfg, stop_at_step=9), tmp_path / "b", progress=False,
                 log=lambda *_: None)
    assert json.loads((tmp_path / "b" / "history.json").read_text())["step"] == 9
    resumed, meta_b = train_eagle3(model, tok, samples, TrainConfig(**cfg), tmp_path / "b", progress=False,
                                   log=lambda *_: None)
    assert meta_b["step"] == 24
    for k, v in head.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, atol=1e-6, rtol=1e-5, msg=k)

    # Cold resume (fresh machine): weights + step from the published head, fresh optimizer moments.
    cold, meta_c = train_eagle3(model, tok, samples, TrainConfig(**{**cfg, "max_steps": 28}), tmp_path / "c",
                                init_head=tmp_path / "b" / "head", progress=False, log=lambda *_: None)
    assert meta_c["step"] == 28 and meta_c["cold_resumes"] == [24]
    assert "data_changes" not in meta_c  # the same data: its epoch position goes on

    # Continued training on other data: the step and vocabulary go on, the new data start at their first epoch.
    fewer = samples[: len(samples) - 3]
    _, meta_d = train_eagle3(model, tok, fewer, TrainConfig(**{**cfg, "max_steps": 26}), tmp_path / "d",
                             init_head=tmp_path / "b" / "head", progress=False, log=lambda *_: None)
    change = meta_d["data_changes"]
    assert len(change) == 1 and change[0]["step"] == 24 and meta_d["step"] == 26
    assert meta_d["num_train"] == change[0]["num_train"] < meta_c["num_train"]
    assert (meta_d["epoch"], meta_d["batch_pos"]) == (0, 2)
    assert meta_d["vocab_used"] == meta_c["vocab_used"]


def test_ttt_loss_uses_only_response_positions(tiny):
    model, tok = tiny
    from eagle_triton.train import Sample

    head = random_eagle3_head(hidden_size=48, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=112, draft_vocab_size=40, target_hidden_size=48, seed=4)
    head._set_embeddings(model.get_input_embeddings())
    used = head.draft_to_target(torch.arange(40))
    g = torch.Generator().manual_seed(6)
    s = Sample(torch.randint(3, 100, (12,), generator=g), 12)  # resp_start at the end: nothing to learn
    b = prepare_batch(model, [s], used, 64, tok.pad_token_id, "cpu")
    res = ttt_loss(head, b, steps=2)
    assert res.step_count == [0, 0] and float(res.loss.detach()) == 0.0


def test_accepted_along_path():
    # root 0 -> 1 (tok 7) -> 3 (tok 9); root -> 2 (tok 8) -> 4 (tok 5) -> 5 (tok 6)
    tokens = torch.tensor([4, 7, 8, 9, 5, 6])
    ri = torch.tensor([[0, 1, 3, -1], [0, 2, 4, 5]])
    assert accepted_along_path(tokens, ri, torch.tensor([8, 5, 6, 1])) == 3
    assert accepted_along_path(tokens, ri, torch.tensor([8, 5, 2])) == 2
    assert accepted_along_path(tokens, ri, torch.tensor([7, 9, 9])) == 2
    assert accepted_along_path(tokens, ri, torch.tensor([3])) == 0
    assert accepted_along_path(tokens, ri, torch.tensor([], dtype=torch.long)) == 0


def test_greedy_acceptance_accounts_for_every_token(tmp_path, tiny):
    model, tok = tiny
    head = random_eagle3_head(hidden_size=48, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=112, draft_vocab_size=40, target_hidden_size=48, seed=4)
    head._set_embeddings(model.get_input_embeddings())
    res = greedy_acceptance(model, tok, head, ["abc", "hello"], tree_configs=[TreeConfig(8, 2, 3)],
                            max_new_tokens=12)
    r = res["8/2/3"]
    assert r["steps"] >= 1 and 1.0 <= r["mean_accepted_length"] <= 4.0
    assert sum(k * n for k, n in enumerate(r["histogram"])) == r["tokens"]
    assert res["continuation_tokens"] == r["tokens"] and 0 <= res["tokens_out_of_vocab"] <= r["tokens"]
    assert 0 <= r["ended_out_of_vocab"] <= min(r["steps"], res["tokens_out_of_vocab"])
    # the accounting, with the vocabulary mask set to nothing and to everything (the drafts use d2t, not t2d)
    short = sum(r["histogram"][: 3])  # steps that accepted fewer than depth 2 drafts: 1 or 2 tokens
    with torch.no_grad():
        head.t2d.fill_(False)
    none = greedy_acceptance(model, tok, head, ["abc", "hello"], tree_configs=[TreeConfig(8, 2, 3)],
                             max_new_tokens=12)
    assert none["tokens_out_of_vocab"] == none["continuation_tokens"] == r["tokens"]
    assert none["8/2/3"]["histogram"] == r["histogram"] and none["8/2/3"]["ended_out_of_vocab"] == short
    with torch.no_grad():
        head.t2d.fill_(True)
    every = greedy_acceptance(model, tok, head, ["abc", "hello"], tree_configs=[TreeConfig(8, 2, 3)],
                              max_new_tokens=12)
    assert every["tokens_out_of_vocab"] == 0 and every["8/2/3"]["ended_out_of_vocab"] == 0


def test_cli_train_end_to_end(tmp_path, tiny):
    model, tok = tiny
    from eagle_triton.commands import train as train_cmd

    model.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    parser = argparse.ArgumentParser()
    train_cmd.register(parser.add_subparsers())
    argv = ["train", "--target", str(tmp_path / "target"), "--work-dir", str(tmp_path / "w"), "--num-prompts", "4",
            "--gen-batch-size", "2", "--prompt-max-tokens", "6", "--max-new-tokens", "10", "--draft-vocab", "32",
            "--max-steps", "4", "--warmup-steps", "1", "--tokens-per-batch", "128", "--ttt-steps", "2",
            "--val-fraction", "0", "--out", str(tmp_path / "head"), "--export-data", str(tmp_path / "pack.pt"),
            "--device", "cpu", "--no-progress"]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    head = load_draft_head(tmp_path / "head", embed_tokens=model.get_input_embeddings())
    assert head.draft_vocab_size == 32
    from safetensors.torch import load_file

    assert load_file(tmp_path / "head" / "model.safetensors")["fc.weight"].dtype == torch.bfloat16
    assert (tmp_path / "pack.pt").is_file()
    # Same command again: data and training are complete, nothing is redone.
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    meta = json.loads((tmp_path / "w" / "run" / "history.json").read_text())
    assert meta["step"] == 4


def test_shipped_smollm2_head_loads_strictly():
    """The committed head: published EAGLE-3 layout, strict loading, one file, bf16 weights, and the draft vocabulary
    its training record says it grew to (round 7: round 1's 12288 ids grown to 16384, every old id kept)."""
    from safetensors import safe_open

    from eagle_triton.train import smollm2_head_path

    path = smollm2_head_path()
    emb = torch.randn(49152, 576)
    head = load_draft_head(path, embed_tokens=emb)
    assert isinstance(head, Eagle3DraftHead)
    c = head.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (576, 9, 3, 49152)
    assert head.feature_width == 3 * 576 and head.draft_vocab_size == 16384 and c.rope_theta == 100000.0
    used = head.draft_to_target(torch.arange(head.draft_vocab_size))
    assert torch.all(used[1:] > used[:-1]) and torch.equal(head.t2d.nonzero().view(-1), used)
    assert 2 in used.tolist()  # <|im_end|>, the stop token, is always in the draft vocabulary
    files = sorted(path.glob("*.safetensors"))
    assert [f.name for f in files] == ["model.safetensors"]  # one file, as SafeAILab's loader expects
    with safe_open(str(files[0]), "pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    meta = json.loads((path / "train_meta.json").read_text())
    assert meta["complete"] and meta["step"] == meta["train_config"]["max_steps"]
    assert meta["vocab_used"] == used.tolist()
    assert [(c["from"], c["to"]) for c in meta["vocab_changes"]] == [(12288, 16384)]


def test_multi_turn_conversations(tmp_path, tiny):
    """turns=2: the target samples a second user turn after its own answer and answers it; each answer is a
    sample whose prompt is the conversation before it (chat template), turn 0 is the single-turn data bit for bit,
    and the data resume and round-trip through export/import with their turns."""
    model, tok = tiny
    one = DataConfig(num_prompts=6, batch_size=3, prompt_max_tokens=8, max_new_tokens=10, seed=4)
    two = DataConfig(num_prompts=6, batch_size=3, prompt_max_tokens=8, max_new_tokens=10, seed=4, turns=2)
    generate_dataset(model, tok, one, tmp_path / "one", progress=False, log=lambda *_: None)
    st = generate_dataset(model, tok, two, tmp_path / "two", progress=False, log=lambda *_: None)
    assert st["complete"]
    single, multi = load_dataset(tmp_path / "one"), load_dataset(tmp_path / "two")
    shards = [torch.load(f, weights_only=True) for f in sorted((tmp_path / "two").glob("shard_*.pt"))]
    turns = [t for s in shards for t in s["turn"]]
    assert len(turns) == len(multi) and set(turns) <= {0, 1} and 1 in turns
    first = [s for s, t in zip(multi, turns, strict=True) if t == 0]
    assert [s.ids.tolist() for s in first] == [s.ids.tolist() for s in single]
    start = tok.convert_tokens_to_ids("<|im_start|>")
    for s, t in zip(multi, turns, strict=True):
        ids = s.ids.tolist()
        prompt, answer = ids[:s.resp_start], ids[s.resp_start:]
        assert prompt.count(start) == 2 * t + 2  # user, (assistant, user) per earlier turn, then the answer prefix
        assert tok.decode(prompt).endswith("<|im_start|>assistant\n") and start not in answer
        if t == 1:  # its prompt: the first turn's conversation as the template renders it, then the new user turn
            text = tok.decode(prompt)
            assert text.count("<|im_start|>user\n") == 2 and text.count("<|im_start|>assistant\n") == 2
    # resumable: a deleted shard comes back bit for bit
    (tmp_path / "two" / "shard_00001.pt").unlink()
    generate_dataset(model, tok, two, tmp_path / "two", progress=False, log=lambda *_: None)
    assert [s.ids.tolist() for s in load_dataset(tmp_path / "two")] == [s.ids.tolist() for s in multi]
    export_dataset(tmp_path / "two", tmp_path / "pack.pt")
    import_dataset(tmp_path / "pack.pt", tmp_path / "back")
    back = [torch.load(f, weights_only=True) for f in sorted((tmp_path / "back").glob("shard_*.pt"))]
    assert [t for s in back for t in s["turn"]] == turns
    with pytest.raises(ValueError, match="turns"):
        DataConfig(turns=0)


def test_data_folders_from_before_the_turns_setting_resume(tmp_path, tiny):
    """A data folder whose manifest predates a setting resumes with that setting's default, and is refused with
    another value."""
    model, tok = tiny
    cfg = DataConfig(num_prompts=4, batch_size=2, prompt_max_tokens=6, max_new_tokens=6, seed=2)
    st = generate_dataset(model, tok, cfg, tmp_path / "d", time_budget_s=0.0, progress=False, log=lambda *_: None)
    manifest = tmp_path / "d" / "manifest.json"
    doc = json.loads(manifest.read_text())
    del doc["config"]["turns"]
    manifest.write_text(json.dumps(doc))
    st = generate_dataset(model, tok, cfg, tmp_path / "d", progress=False, log=lambda *_: None)
    assert st["complete"]
    with pytest.raises(ValueError, match=r"turns 1 -> 2"):
        generate_dataset(model, tok, DataConfig(num_prompts=4, batch_size=2, prompt_max_tokens=6, max_new_tokens=6,
                                                seed=2, turns=2), tmp_path / "d", progress=False)


def test_prompt_openers_begin_every_sampled_user_turn(tmp_path, tiny):
    """prompt_openers: every sampled user turn starts with its opener, cycled over the conversations (first turns
    by prompt index, second turns from the next opener on); the answers are the target's to those turns; a folder
    started with other openers is refused; bad openers are refused."""
    model, tok = tiny
    openers = ["Write", "Solve this"]
    cfg = DataConfig(num_prompts=5, batch_size=3, prompt_max_tokens=6, max_new_tokens=6, seed=2, turns=2,
                     prompt_openers=openers)
    assert generate_dataset(model, tok, cfg, tmp_path / "d", progress=False, log=lambda *_: None)["complete"]
    recs = [json.loads(line) for line in (tmp_path / "d" / "prompts.jsonl").read_text().splitlines()]
    assert [r["index"] for r in recs] == list(range(5))
    assert all(r["prompt"].startswith(openers[r["index"] % 2]) for r in recs), recs
    shards = [torch.load(f, weights_only=True) for f in sorted((tmp_path / "d").glob("shard_*.pt"))]
    user = "<|im_start|>user\n"
    seconds = 0
    for shard in shards:
        for ids, start, turn in zip(shard["ids"], shard["resp_start"], shard["turn"], strict=True):
            text = tok.decode(ids[:start].tolist())
            last_user = text.split(user)[-1]
            assert any(last_user.startswith(o) for o in openers), last_user
            seconds += turn == 1
    assert seconds > 0
    with pytest.raises(ValueError, match="prompt_openers"):
        generate_dataset(model, tok, DataConfig(num_prompts=5, batch_size=3, prompt_max_tokens=6, max_new_tokens=6,
                                                seed=2, turns=2, prompt_openers=["Write"]),
                         tmp_path / "d", progress=False, log=lambda *_: None)
    for bad in ([], ["  "], "Write", [3]):
        with pytest.raises(ValueError, match="prompt_openers must be"):
            DataConfig(prompt_openers=bad)
