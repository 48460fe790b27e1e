"""The fused drafter's final phase (``_tree_phase``: the top-``T`` reranking and the tree buffers) on its own, on
the GPU where there is one, else under the interpreter: its 16-bit keys (int32, for bf16/fp16 models) rank as its
64-bit ones, and with many tied scores it selects what a stable sort by (score desc, index asc) selects and builds
the same buffers either way.

The candidates come from real fused-drafter calls (fp32) whose scores are then rounded down to a coarse grid:
rounding is monotone, so a child never outranks its parent and the selected set stays a tree, while most scores
tie."""

import pytest
import torch
import triton
import triton.language as tl

from eagle_triton import TreeConfig
from eagle_triton.fused import Buffers, DrafterConfig, DraftInputs, Weights, launch_drafter
from eagle_triton.fused.kernel import _pack, _pack16, _tree_phase, _unpack16_index, _unpack16_value
from eagle_triton.testing import random_eagle3_head


@triton.jit
def _keys_kernel(v_ptr, o16, o64, oidx, oval, N: tl.constexpr, DT: tl.constexpr):
    offs = tl.arange(0, N)
    v = tl.load(v_ptr + offs)
    k16 = _pack16(v, offs, DT)
    tl.store(o16 + offs, k16)
    tl.store(o64 + offs, _pack(v, offs))
    tl.store(oidx + offs, _unpack16_index(k16))
    tl.store(oval + offs, _unpack16_value(k16, DT))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_keys_rank_as_the_64_bit_keys(dtype, device):
    """Random 16-bit values with many duplicates, both zeros, both infinities and the extremes: the int32 keys sort
    the entries exactly as the int64 keys do (value, then index), and give the index and the value (its bits,
    the zeros' signs too) back."""
    n = 4096
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    v = (torch.randn(n, generator=g) * torch.randint(0, 4, (n,), generator=g).float().exp2() * 3).to(dtype)
    v[torch.randint(0, n, (n // 4,), generator=g)] = v[torch.randint(0, n, (n // 4,), generator=g)]  # ties
    fin = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), fin.max, fin.min, fin.tiny, -fin.tiny],
                           dtype=dtype)
    v[torch.randperm(n, generator=g)[: special.numel()]] = special
    o16, o64, oidx, oval = (torch.empty(n, dtype=torch.int32, device=device),
                            torch.empty(n, dtype=torch.int64, device=device),
                            torch.empty(n, dtype=torch.int32, device=device), torch.empty(n, device=device))
    _keys_kernel[(1,)](v.float().to(device), o16, o64, oidx, oval, N=n,
                       DT=tl.float16 if dtype == torch.float16 else tl.bfloat16)
    o16, o64, oidx, oval = o16.cpu(), o64.cpu(), oidx.cpu(), oval.cpu()
    assert torch.equal(torch.argsort(o16.long()), torch.argsort(o64))
    assert torch.unique(o16).numel() == n
    assert torch.equal(oidx, torch.arange(n, dtype=torch.int32))
    assert torch.equal(oval.view(torch.int32), v.float().view(torch.int32))


@triton.jit
def _tree_only_kernel(ids, nnew, kvlen, cand_sc, cand_tok, par_list, o_tokens, o_retrieve, o_mask, o_pos, o_parents,
                      o_nleaves, o_maxdepth, B, S, prof, K: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
                      TP: tl.constexpr, NCP: tl.constexpr, CP: tl.constexpr, KP: tl.constexpr, DT: tl.constexpr):
    _tree_phase(ids, nnew, kvlen, cand_sc, cand_tok, par_list, o_tokens, o_retrieve, o_mask, o_pos, o_parents,
                o_nleaves, o_maxdepth, B, S, tl.program_id(0), prof, K, D, T, TP, NCP, CP, KP, DT, 1, False)


def _run_tree_phase(cfg, p, bufs, X, cand_sc, dt):
    B, S = X.input_ids.shape
    T = p["T"]
    e = lambda *s, dtype=torch.int64: torch.empty(*s, dtype=dtype, device=cand_sc.device)  # noqa: E731
    outs = dict(tokens=e(B, T + 1), retrieve=e(B, T, cfg.depth + 2), mask=e(B, T + 1, T + 1, dtype=torch.float32),
                pos=e(B, T + 1), parents=e(B, T + 1), nleaves=e(B), maxdepth=e(B))
    kvlen = torch.zeros(B, dtype=torch.int32, device=cand_sc.device)
    sc = bufs.scratch
    _tree_only_kernel[(1,)](X.input_ids, X.num_new, kvlen, cand_sc, sc["cand_tok"], sc["par_list"], *outs.values(),
                            B, S, bufs.profile, K=p["K"], D=p["D"], T=T, TP=p["TP"], NCP=p["NCP"], CP=p["CP"],
                            KP=p["KP"], DT=dt)
    assert torch.equal(kvlen, X.num_new)
    return {k: v.cpu() for k, v in outs.items()}


@pytest.mark.parametrize("tree,batch", [((20, 3, 4), 2), ((14, 2, 5), 1), ((3, 1, 1), 1)],
                         ids=["20-3-4-batch2", "14-2-5", "3-1-1-every-candidate"])
def test_tied_scores_select_by_index_with_16_and_64_bit_keys(tree, batch, device):
    head = random_eagle3_head(lm_head_scale=6.0).to(device)
    cfg = DrafterConfig.from_head(head, TreeConfig(*tree), max_len=64, max_new_rows=8, max_batch=batch)
    w = Weights.from_head(head, 64)
    bufs = Buffers.allocate(cfg, device, batch=batch)
    S = 5
    X = DraftInputs(torch.randn(batch, S, head.feature_width, device=device),
                    torch.randint(0, head.config.vocab_size, (batch, S), device=device),
                    torch.full((batch,), S, dtype=torch.int32, device=device))
    launch_drafter(cfg, X, w, bufs, fallback=False)
    p = cfg.launch_params(device, batch, S)
    NC, T = cfg.num_candidates, p["T"]
    sc = bufs.scratch["cand_sc"].clone()
    # a power-of-two grid with fewer steps than candidates: ties in every sequence (pigeonhole), values exact in
    # fp16 and bf16 (small multiples of a power of two), and the rounding is monotone
    span = float((sc[:, :NC].max() - sc[:, :NC].min()).clamp_min(1.0))
    grid = 2.0 ** torch.ceil(torch.log2(torch.tensor(span / max(NC // 2, 1)))).item()
    sc[:, :NC] = torch.floor(sc[:, :NC] / grid) * grid
    o16 = _run_tree_phase(cfg, p, bufs, X, sc, tl.float16)
    o64 = _run_tree_phase(cfg, p, bufs, X, sc, tl.float32)
    for name in o16:
        assert torch.equal(o16[name], o64[name]), name
    sc, tok = sc.cpu(), bufs.scratch["cand_tok"].cpu()
    for b in range(batch):
        order = sorted(range(NC), key=lambda j: (-float(sc[b, j]), j))[:T]
        chosen = torch.tensor(sorted(order))
        assert torch.equal(o16["tokens"][b, 1:], tok[b, chosen])
        assert int(o16["tokens"][b, 0]) == int(X.input_ids[b, S - 1])
    if NC > 2:
        assert all(len(set(sc[b, :NC].tolist())) < NC for b in range(batch))  # the grid made ties
