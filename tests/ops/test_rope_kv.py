"""The fused q/k RMSNorm + RoPE + KV-cache write against its reference (the eager PyTorch forward's sequence)."""

import secrets

import pytest
import torch
from rope_testlib import rope_cache_case

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
    cos, sin, kc, vc, seqlens, pos = rope_cache_case(g, B, Lmax, Hkv, D, starts, dtype, device, S)
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


# -- cache slots: sequence b writes cache batch index cache_slots[b] of a larger cache ----------------------------
def _slot_case(NB, B, S, Hq, Hkv, D, Lmax, dtype, device, norm, seed):
    """A whole cache of ``NB`` slots with random lengths (one slot running past ``Lmax``), ``B`` sequences of ``S``
    rows; fresh random values each run."""
    g = torch.Generator().manual_seed(seed)
    qkv, kc, vc, _, _, cos, sin, qn, kn = _batched_case(NB, S, Hq, Hkv, D, Lmax, (0,) * NB, dtype, device, norm, seed)
    qkv = qkv[:B * S].contiguous()
    starts = torch.randint(0, Lmax - S + 1, (NB,), generator=g)
    starts[-1] = Lmax - 1  # overflowing rows are dropped
    seqlens = starts.to(device, torch.int32)
    return qkv, kc, vc, seqlens, cos, sin, qn, kn, g


SLOT_CASES = [  # NB, S, slots: a prefill chunk, a decode row, two sequences in non-monotone slots (one overflowing)
    pytest.param(4, 6, (2,), id="chunk-slot2"),
    pytest.param(5, 1, (4,), id="decode-last-slot"),
    pytest.param(5, 3, (3, 1), id="B2-slots-3-1"),
    pytest.param(6, 4, (5, 0), id="B2-overflow-slot5"),
]


@pytest.mark.parametrize("dtype,norm", [(torch.float32, False), (torch.float16, True)], ids=["fp32", "fp16-norm"])
@pytest.mark.parametrize("NB,S,slots", SLOT_CASES)
def test_rope_kv_slots_equal_view_calls(NB, S, slots, dtype, norm, device):
    """Bitwise: with ``cache_slots`` on the whole cache, q and every cache row equal per-sequence calls on the views
    ``cache[s:s+1]`` (other slots untouched); and the reference with ``cache_slots`` agrees."""
    B, Hq, Hkv, D, Lmax = len(slots), 6, 2, 24, 30
    seed = secrets.randbelow(1 << 30)  # fresh inputs each run (bitwise claims hold for any); printed on failure
    qkv, kc, vc, seqlens, cos, sin, qn, kn, g = _slot_case(NB, B, S, Hq, Hkv, D, Lmax, dtype, device, norm, seed)
    sl = torch.tensor(slots, dtype=torch.int32, device=device)
    pos = (seqlens.long().cpu()[list(slots)][:, None] + torch.randint(0, 4, (B, S), generator=g)).to(device)
    k0, v0 = kc.clone(), vc.clone()
    kv, vv, kr, vr = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    q = target_rope_kv(qkv, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, qn, kn, cache_slots=sl)
    for b, s in enumerate(slots):
        rows = slice(b * S, (b + 1) * S)
        one = target_rope_kv(qkv[rows], kv[s:s + 1], vv[s:s + 1], seqlens[s:s + 1], pos[b], cos, sin, Hq, Hkv,
                             qn, kn)
        assert torch.equal(one, q[rows]), f"sequence {b}, seed={seed}"
    assert torch.equal(kc, kv) and torch.equal(vc, vv), f"seed={seed}"
    others = [i for i in range(NB) if i not in slots]
    assert torch.equal(kc[others], k0[others]) and torch.equal(vc[others], v0[others]), f"seed={seed}"
    assert not torch.equal(kc[list(slots)], k0[list(slots)])  # the slots' rows were written
    q_ref = target_rope_kv_ref(qkv, kr, vr, seqlens, pos, cos, sin, Hq, Hkv, qn, kn, cache_slots=sl)
    assert torch.equal(vc, vr), f"seed={seed}"
    if norm:
        torch.testing.assert_close(q.float(), q_ref.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{m} seed={seed}")
        torch.testing.assert_close(kc.float(), kr.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{m} seed={seed}")
    else:
        assert torch.equal(q, q_ref) and torch.equal(kc, kr), f"seed={seed}"


def test_rope_kv_slots_bad_inputs(device):
    qkv, kc, vc, seqlens, cos, sin, _, _, _ = _slot_case(4, 2, 3, 4, 2, 8, 16, torch.float32, device, False,
                                                         secrets.randbelow(1 << 30))
    pos = torch.zeros(6, dtype=torch.int64, device=device)
    sl = torch.tensor([3, 1], dtype=torch.int32, device=device)

    def call(slots, lens=seqlens, validate=True):
        return target_rope_kv(qkv, kc, vc, lens, pos, cos, sin, 4, 2, cache_slots=slots, validate=validate)

    with pytest.raises(TypeError, match="cache_slots"):
        call(sl.long())
    with pytest.raises(ValueError, match="cache_slots must have 1 dims"):
        call(sl[None])
    with pytest.raises(ValueError, match="cache_slots is on meta"):
        call(torch.empty(2, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="B=4 sequences of cache_slots"):  # 6 rows are not S rows for 4 slots
        call(torch.arange(4, dtype=torch.int32, device=device))
    for bad in ((3, 4), (-1, 0)):
        with pytest.raises(ValueError, match="cache_slots in .* outside"):
            call(torch.tensor(bad, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="cache_slots must be distinct"):
        call(torch.tensor([2, 2], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="cache_seqlens must have shape"):
        call(sl, lens=seqlens[:2])
    # unchecked (validate=False, as under capture): an out-of-range slot writes nothing, the valid one writes
    k0 = kc.clone()
    call(torch.tensor([4, 1], dtype=torch.int32, device=device), validate=False)
    assert torch.equal(kc[[0, 2, 3]], k0[[0, 2, 3]]) and not torch.equal(kc[1], k0[1])
