"""A :class:`LlamaTarget` with ``B`` cache slots: sequences prefilled slot by slot, then verified, committed and
decoded together. Each sequence's logits and features must equal those of a batch-1 target doing the same steps
alone: bit for bit through the fused batch-invariant forward (Triton's interpreter on the CPU), within fp32
tolerance through the PyTorch forward."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import tiny_llama

import eagle_triton.engine.target as target_mod
from eagle_triton.engine import LlamaTarget
from eagle_triton.tree import build_tree_buffers

V = 97


@pytest.fixture
def small_chunks(monkeypatch):
    """Prefill chunks of 8 or 4 rows: the prompts below run as several chunks, an overlapping last chunk, or one
    partial chunk."""
    monkeypatch.setattr(target_mod, "PREFILL_CHUNKS", (8, 4))


def _model(model="llama", dtype=torch.float32, **extra):
    return tiny_llama(vocab=V, hidden=48, layers=3, heads=6, kv_heads=2, model=model, seed=3, **extra).to(dtype)


# Three sequences: prompt lengths (ragged: 2 chunks + overlap, one partial chunk, chunk + overlap), their trees
# (parent pointers, different sizes and shapes) and the accepted path of each (root included).
PROMPTS = (13, 3, 9)
TREES = ([-1, 0, 0, 1, 3], [-1, 0, 1], [-1, 0, 0, 1, 1, 2, 4])
PATHS = ([0, 1, 3], [0], [0, 1, 4])
LEVELS = 4


def _scenario(seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, V, (1, n), generator=g) for n in PROMPTS]
    S = max(len(p) for p in TREES)
    trees = []
    for par in TREES:
        tokens = torch.randint(0, V, (1, S), generator=g)
        # pad to S nodes with extra children of the root: no real node sees them (they are nobody's ancestor)
        padded = torch.tensor([par + [0] * (S - len(par))])
        mask, depths, *_ = build_tree_buffers(padded, LEVELS)
        trees.append((tokens, depths, mask, len(par)))
    C = max(len(p) for p in PATHS)
    accept_index = torch.tensor([p + [-1] * (C - len(p)) for p in PATHS])
    accept_len = torch.tensor([len(p) - 1 for p in PATHS])
    bonus = torch.randint(0, V, (len(PROMPTS), 1), generator=g)
    return prompts, trees, accept_index, accept_len, bonus


def _run_alone(target, b, prompts, trees, accept_index, accept_len, bonus):
    """Sequence ``b``'s steps on a batch-1 target, its own (unpadded) tree."""
    tokens, depths, mask, n = trees[b]
    target.setup(48, "eagle3")
    lp, fp = (x.clone() for x in target.prefill(prompts[b]))
    lv, fv = (x.clone() for x in target.verify_rows(tokens[:, :n], depths[:, :n], mask[:, :n, :n], 48))
    target.commit_rows(accept_index[b:b + 1], accept_len[b:b + 1])
    ld, fd = (x.clone() for x in target.decode_rows(bonus[b:b + 1], 48))
    return lp, fp, lv, fv, ld, fd


def _run_batched(target, prompts, trees, accept_index, accept_len, bonus, order=(1, 0, 2)):
    B = len(prompts)
    target.setup(48, "eagle3", batch_size=B)
    pre = {}
    for b in order:  # slot by slot, not in slot order
        pre[b] = tuple(x.clone() for x in target.prefill(prompts[b], slot=b))
    tokens, depths, mask = (torch.cat([t[i] for t in trees]) for i in range(3))
    lv, fv = (x.clone() for x in target.verify_rows(tokens, depths, mask, 48))
    target.commit_rows(accept_index, accept_len)
    ld, fd = (x.clone() for x in target.decode_rows(bonus, 48))
    return pre, lv, fv, ld, fd


def _check_each_sequence(make, same, **model_kw):
    """Batched target (``make()``) vs three batch-1 targets on the scenario; ``same(x, y, what)`` compares."""
    m = _model(**model_kw)
    data = _scenario()
    prompts, trees = data[0], data[1]
    bt = make(m)
    pre, lv, fv, ld, fd = _run_batched(bt, *data)
    for b in range(len(prompts)):
        n = trees[b][3]
        lp1, fp1, lv1, fv1, ld1, fd1 = _run_alone(make(m), b, *data)
        same(pre[b][0], lp1, f"prefill logits {b}")
        same(pre[b][1], fp1, f"prefill features {b}")
        same(lv[b:b + 1, :n], lv1, f"verify logits {b}")
        same(fv[b:b + 1, :n], fv1, f"verify features {b}")
        same(ld[b:b + 1], ld1, f"decode logits {b}")
        same(fd[b:b + 1], fd1, f"decode features {b}")
    want = [p + len(path) + 1 for p, path in zip(PROMPTS, PATHS, strict=True)]
    assert bt.cache.seqlens.tolist() == want
    assert bt.lengths == list(PROMPTS)  # host mirrors: prefills only, until note_committed
    bt.note_committed([w - p for w, p in zip(want, PROMPTS, strict=True)])
    assert bt.lengths == want
    return bt, m, data


def _bitwise(x, y, what):
    assert x.shape == y.shape and torch.equal(x, y), what


def test_fused_batched_rows_equal_each_sequence_alone(small_chunks):
    """fp32 with biases (fp16 is the Qwen3 test's below)."""
    _check_each_sequence(lambda m: LlamaTarget.from_hf(m, ops="triton"), _bitwise, dtype=torch.float32,
                         attention_bias=True, mlp_bias=True)


def test_fused_batched_qwen3_and_slot_reset(small_chunks):
    """Qwen3 (q/k norm) in fp16; then slot 1 is reset and prefilled with a new prompt while slots 0 and 2 keep
    their rows, and a batched decode step still equals each sequence alone."""
    make = lambda m: LlamaTarget.from_hf(m, ops="triton")  # noqa: E731
    bt, m, data = _check_each_sequence(make, _bitwise, model="qwen3", dtype=torch.float16, head_dim=24)
    prompts, trees, accept_index, accept_len, bonus = data
    new_prompt = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(9))
    bt.reset(slot=1)
    assert bt.lengths[1] == 0 and bt.cache.seqlens.tolist()[1] == 0
    lp, fp = bt.prefill(new_prompt, slot=1)
    nxt = torch.randint(0, V, (3, 1), generator=torch.Generator().manual_seed(10))
    ld, fd = bt.decode_rows(nxt, 48)
    fresh = make(m)
    fresh.setup(48, "eagle3")
    lp1, fp1 = fresh.prefill(new_prompt)
    _bitwise(lp, lp1, "re-prefilled slot")
    _bitwise(fp, fp1, "re-prefilled slot features")
    ld1, fd1 = fresh.decode_rows(nxt[1:2], 48)
    _bitwise(ld[1:2], ld1, "slot 1 after reset")
    _bitwise(fd[1:2], fd1, "slot 1 features after reset")
    for b in (0, 2):  # untouched slots continue their sequences
        alone = make(m)
        _run_alone(alone, b, *data)
        l1, f1 = alone.decode_rows(nxt[b:b + 1], 48)
        _bitwise(ld[b:b + 1], l1, f"slot {b} after slot 1 reset")
        _bitwise(fd[b:b + 1], f1, f"slot {b} features after slot 1 reset")


def test_torch_batched_rows_match_each_sequence_alone():
    """The PyTorch forward (batched matmuls may block differently): equal within fp32 tolerance."""

    def close(x, y, what):
        assert x.shape == y.shape, what
        torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-5, msg=what)

    bt, *_ = _check_each_sequence(lambda m: LlamaTarget.from_hf(m, ops="torch"), close, attention_bias=True)
    assert not bt.fused_forward


def test_batch_of_one_is_the_batch1_target():
    """``batch_size=1`` (the default) keeps the batch-1 API: length, decode/verify/commit, note_committed(int)."""
    t = LlamaTarget.from_hf(_model())
    t.setup(32, None)
    assert t.batch_size == 1 and t.length == 0 and t.lengths == [0]
    t.prefill(torch.randint(0, V, (1, 5)))
    t.decode(torch.randint(0, V, (1, 1)))
    t.decode_rows(torch.randint(0, V, (1, 1)))
    t.note_committed(1)
    assert t.length == 7 and t.lengths == [7] and t.cache.seqlens.tolist() == [7]
    t.reset(slot=0)
    assert t.length == 0


def test_bad_batched_input_is_named():
    t = LlamaTarget.from_hf(_model())
    with pytest.raises(ValueError, match="call setup"):
        t.decode_rows(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        t.setup(32, None, batch_size=0)
    t.setup(16, "eagle3", batch_size=3)
    ids = torch.randint(0, V, (1, 5))
    with pytest.raises(ValueError, match=r"slot must be an int in \[0, 3\)"):
        t.prefill(ids, slot=3)
    with pytest.raises(ValueError, match=r"slot must be an int in \[0, 3\)"):
        t.reset(slot=-1)
    with pytest.raises(ValueError, match=r"input_ids must be \[1, S\]"):
        t.prefill(torch.randint(0, V, (2, 5)), slot=0)
    t.prefill(torch.randint(0, V, (1, 12)), slot=2)
    with pytest.raises(ValueError, match="capacity exceeded in slot 2: 12 rows held \\+ 5 new > 16"):
        t.prefill(ids, slot=2)
    t.prefill(ids, slot=0)  # the other slots have room
    mask = torch.ones(3, 4, 4, dtype=torch.bool).tril()
    depths = torch.arange(4).repeat(3, 1)
    with pytest.raises(ValueError, match=r"tokens must have shape \[3, 4\] \(batch_size=3\)"):
        t.verify_rows(torch.zeros(2, 4, dtype=torch.long), depths[:2], mask[:2])
    with pytest.raises(ValueError, match=r"tree_mask must have shape \[3, 4, 4\]"):
        t.verify_rows(torch.zeros(3, 4, dtype=torch.long), depths, mask[:, :3])
    with pytest.raises(ValueError, match="capacity exceeded: a slot holds 12 rows \\+ 5 new > 16"):
        t.verify_rows(torch.zeros(3, 5, dtype=torch.long), torch.zeros(3, 5, dtype=torch.long),
                      torch.ones(3, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"tokens must have shape \[3, 1\]"):
        t.decode_rows(torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"accept_len must have shape \[3\]"):
        t.commit_rows(torch.zeros(3, 2, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="one count per slot \\(3\\), got 1"):
        t.note_committed(1)
    with pytest.raises(ValueError, match="one length per slot"):
        _ = t.length
    with pytest.raises(ValueError, match="use decode_rows/verify_rows/commit_rows"):
        t.decode(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="use decode_rows/verify_rows/commit_rows"):
        t.commit(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long), 0)


@pytest.mark.gpu
def test_gpu_batched_prefill_graphs_per_slot_bf16():
    """On CUDA, full prefill chunks replay per-slot graphs: slot-by-slot prefills (and a batched verify and
    decode) equal the same steps without CUDA graphs, bit for bit."""
    m = tiny_llama(vocab=512, hidden=256, layers=4, heads=4, kv_heads=2, seed=5, std=0.05).to("cuda", torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (1, n), generator=g).cuda() for n in (150, 64, 97)]
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3]] * 3)
    mask, depths, *_ = build_tree_buffers(parents, 4)
    tokens = torch.randint(0, 512, (3, 6), generator=g).cuda()
    outs = []
    for graphs in (True, False):
        t = LlamaTarget.from_hf(m, ops="triton", cuda_graphs=graphs)
        t.setup(256, "eagle3", batch_size=3)
        res = []
        for _ in range(2):  # the second round replays the captured graphs
            t.reset()
            res = [x.clone() for b in (2, 0, 1) for x in t.prefill(prompts[b], slot=b)]
        res += [x.clone() for x in t.verify_rows(tokens, depths.cuda(), mask.cuda())]
        t.commit_rows(torch.tensor([[0, 1, 3]] * 3).cuda(), torch.tensor([2, 0, 1]).cuda())
        res += [x.clone() for x in t.decode_rows(tokens[:, :1])]
        outs.append(res)
    for x, y in zip(*outs, strict=True):
        assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("norm_mode", ["folded", "kernel"])
def test_gpu_batched_rows_equal_each_sequence_alone_bf16(norm_mode):
    """On CUDA in bf16 (steps replayed from graphs, real tiles: 64-row products, wgmma): every sequence's prefill,
    verify and decode logits and features in the batch equal those of the sequence alone, bit for bit."""
    m = tiny_llama(vocab=V, hidden=256, layers=4, heads=4, kv_heads=2, seed=5, std=0.05).to("cuda", torch.bfloat16)
    prompts, trees, accept_index, accept_len, bonus = _scenario(seed=int(torch.randint(1 << 30, ())))
    data = ([p.cuda() for p in prompts], [tuple(x.cuda() if torch.is_tensor(x) else x for x in t) for t in trees],
            accept_index.cuda(), accept_len.cuda(), bonus.cuda())
    make = lambda: LlamaTarget.from_hf(m, ops="triton", norm_mode=norm_mode)  # noqa: E731
    pre, lv, fv, ld, fd = _run_batched(make(), *data)
    bad = []
    for b in range(len(prompts)):
        n = trees[b][3]
        alone = _run_alone(make(), b, *data)
        got = (pre[b][0], pre[b][1], lv[b:b + 1, :n], fv[b:b + 1, :n], ld[b:b + 1], fd[b:b + 1])
        for name, x, y in zip(("prefill logits", "prefill features", "verify logits", "verify features",
                               "decode logits", "decode features"), got, alone, strict=True):
            if x.shape != y.shape or not torch.equal(x, y):
                bad.append(f"{name} {b}: max |diff| {(x.float() - y.float()).abs().max().item():.3g}")
    assert not bad, bad
