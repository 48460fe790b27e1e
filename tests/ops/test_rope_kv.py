"""The fused q/k RMSNorm + RoPE + KV-cache write against its reference (the eager PyTorch forward's sequence)."""

import pytest
import torch

from eagle_triton.ops.rope_kv import target_rope_kv, target_rope_kv_ref

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


def _case(M, Hq, Hkv, D, Lmax, start, dtype, device, norm, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(M, (Hq + 2 * Hkv) * D, generator=g).to(device, dtype)
    P = Lmax + 8
    ang = torch.arange(P)[:, None] * torch.rand(D // 2, generator=g)[None, :]
    ang = torch.cat((ang, ang), 1)
    cos, sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
    kc = torch.randn(1, Lmax, Hkv, D, generator=g).to(device, dtype)
    vc = torch.randn(1, Lmax, Hkv, D, generator=g).to(device, dtype)
    seqlens = torch.tensor([start], dtype=torch.int32, device=device)
    pos = (start + torch.randint(0, 4, (M,), generator=g)).to(device)  # tree-like: depths, not row indices
    qn = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype) if norm else None
    kn = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype) if norm else None
    return qkv, kc, vc, seqlens, pos, cos, sin, qn, kn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True], ids=["rope", "qk-norm"])
@pytest.mark.parametrize("M,Hq,Hkv,D,Lmax,start", [(1, 4, 2, 8, 16, 0), (7, 6, 2, 24, 30, 11), (5, 3, 3, 20, 9, 4)])
def test_rope_kv_matches_reference(M, Hq, Hkv, D, Lmax, start, norm, dtype, device):
    qkv, kc, vc, seqlens, pos, cos, sin, qn, kn = _case(M, Hq, Hkv, D, Lmax, start, dtype, device, norm, M + D)
    kc2, vc2 = kc.clone(), vc.clone()
    q = target_rope_kv(qkv, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, qn, kn, 1e-6)
    q_ref = target_rope_kv_ref(qkv, kc2, vc2, seqlens, pos, cos, sin, Hq, Hkv, qn, kn, 1e-6)
    assert torch.equal(vc, vc2)  # rows past Lmax dropped by both (the last case overflows)
    if norm:  # the per-head sum of squares is reduced in another order than torch's mean
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(q.float(), q_ref.float(), atol=tol, rtol=tol)
        torch.testing.assert_close(kc.float(), kc2.float(), atol=tol, rtol=tol)
    else:  # elementwise with the same roundings: exact
        assert torch.equal(q, q_ref) and torch.equal(kc, kc2)


def test_rope_kv_row_is_batch_invariant(device):
    qkv, kc, vc, seqlens, pos, cos, sin, qn, kn = _case(9, 4, 2, 16, 32, 5, torch.float16, device, True, 3)
    q = target_rope_kv(qkv, kc, vc, seqlens, pos, cos, sin, 4, 2, qn, kn)
    k_all = kc.clone()
    one = target_rope_kv(qkv[6:7], kc, vc, seqlens + 6, pos[6:7], cos, sin, 4, 2, qn, kn)
    assert torch.equal(one, q[6:7]) and torch.equal(kc, k_all)


def test_rope_kv_bad_inputs(device):
    qkv, kc, vc, seqlens, pos, cos, sin, qn, kn = _case(3, 4, 2, 8, 16, 0, torch.float32, device, True, 0)
    with pytest.raises(ValueError, match="qkv must be"):
        target_rope_kv(qkv[:, :-8], kc, vc, seqlens, pos, cos, sin, 4, 2)
    with pytest.raises(ValueError, match="given together"):
        target_rope_kv(qkv, kc, vc, seqlens, pos, cos, sin, 4, 2, qn, None)
    with pytest.raises(ValueError, match="positions must have shape"):
        target_rope_kv(qkv, kc, vc, seqlens, pos[:2], cos, sin, 4, 2)


# -- B sequences of S rows in one launch ------------------------------------------------------------------------
def _batched_case(B, S, Hq, Hkv, D, Lmax, starts, dtype, device, norm, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B * S, (Hq + 2 * Hkv) * D, generator=g).to(device, dtype)
    P = Lmax + 8
    ang = torch.arange(P)[:, None] * torch.rand(D // 2, generator=g)[None, :]
    ang = torch.cat((ang, ang), 1)
    cos, sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
    kc = torch.randn(B, Lmax, Hkv, D, generator=g).to(device, dtype)
    vc = torch.randn(B, Lmax, Hkv, D, generator=g).to(device, dtype)
    seqlens = torch.tensor(starts, dtype=torch.int32, device=device)
    pos = (seqlens.long().cpu()[:, None] + torch.randint(0, 4, (B, S), generator=g)).to(device)
    qn = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype) if norm else None
    kn = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype) if norm else None
    return qkv, kc, vc, seqlens, pos, cos, sin, qn, kn


# (B, S, Hq, Hkv, D, Lmax, starts): ragged starts, one sequence running past Lmax (its last rows are dropped)
BATCHED = [(2, 1, 4, 2, 8, 16, (0, 9)), (3, 5, 6, 2, 24, 30, (11, 0, 27)), (4, 3, 3, 3, 20, 9, (4, 6, 0, 2))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True], ids=["rope", "qk-norm"])
@pytest.mark.parametrize("B,S,Hq,Hkv,D,Lmax,starts", BATCHED)
def test_rope_kv_batched_matches_reference(B, S, Hq, Hkv, D, Lmax, starts, norm, dtype, device):
    """Rows grouped by sequence go to ``cache[b, seqlens[b] + j]``, each sequence at its own length."""
    qkv, kc, vc, seqlens, pos, cos, sin, qn, kn = _batched_case(B, S, Hq, Hkv, D, Lmax, starts, dtype, device,
                                                                norm, B * S + D)
    kc2, vc2, kc0 = kc.clone(), vc.clone(), kc.clone()
    q = target_rope_kv(qkv, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, qn, kn, 1e-6)
    q_ref = target_rope_kv_ref(qkv, kc2, vc2, seqlens, pos, cos, sin, Hq, Hkv, qn, kn, 1e-6)
    assert torch.equal(vc, vc2)
    # rows outside [seqlens[b], seqlens[b] + S) of each sequence are untouched
    for b, st in enumerate(starts):
        assert torch.equal(kc[b, :st], kc0[b, :st]) and torch.equal(kc[b, st + S:], kc0[b, st + S:])
    if norm:
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(q.float(), q_ref.float(), atol=tol, rtol=tol)
        torch.testing.assert_close(kc.float(), kc2.float(), atol=tol, rtol=tol)
    else:
        assert torch.equal(q, q_ref) and torch.equal(kc, kc2)


@pytest.mark.parametrize("flat", [False, True], ids=["positions-BS", "positions-M"])
def test_rope_kv_batched_rows_equal_each_sequence_alone(flat, device):
    """Bitwise: each sequence's q rows and cache rows equal a batch-1 launch on that sequence's cache."""
    B, S, Hq, Hkv, D, Lmax, starts = 3, 5, 6, 2, 24, 30, (11, 0, 20)
    qkv, kc, vc, seqlens, pos, cos, sin, qn, kn = _batched_case(B, S, Hq, Hkv, D, Lmax, starts, torch.float16,
                                                                device, True, 7)
    kc1, vc1 = kc.clone(), vc.clone()
    q = target_rope_kv(qkv, kc, vc, seqlens, pos.reshape(-1) if flat else pos, cos, sin, Hq, Hkv, qn, kn)
    for b in range(B):
        rows = slice(b * S, (b + 1) * S)
        one = target_rope_kv(qkv[rows], kc1[b:b + 1], vc1[b:b + 1], seqlens[b:b + 1], pos[b], cos, sin, Hq, Hkv,
                             qn, kn)
        assert torch.equal(one, q[rows]), b
    assert torch.equal(kc, kc1) and torch.equal(vc, vc1)


def test_rope_kv_batched_bad_inputs(device):
    qkv, kc, vc, seqlens, pos, cos, sin, qn, kn = _batched_case(3, 2, 4, 2, 8, 16, (0, 1, 2), torch.float32,
                                                                device, False, 0)
    with pytest.raises(ValueError, match="not S rows for each of the B=3"):
        target_rope_kv(qkv[:5], kc, vc, seqlens, pos.reshape(-1)[:5], cos, sin, 4, 2)
    with pytest.raises(ValueError, match="cache_seqlens must have shape"):
        target_rope_kv(qkv, kc, vc, seqlens[:1], pos, cos, sin, 4, 2)
    with pytest.raises(ValueError, match="positions must have shape"):
        target_rope_kv(qkv, kc, vc, seqlens, pos.reshape(2, 3), cos, sin, 4, 2)
    with pytest.raises(ValueError, match="positions must be contiguous"):
        target_rope_kv(qkv, kc, vc, seqlens, pos.t().contiguous().t(), cos, sin, 4, 2)
