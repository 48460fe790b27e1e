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
