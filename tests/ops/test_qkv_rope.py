"""target_qkv_rope (the q/k/v product with the RoPE + KV-cache write as its epilogue) against the two kernels it
replaces (target_linear, then target_rope_kv) and against its PyTorch reference; a row's bits do not depend on the
rows launched with it."""

import dataclasses
import secrets

import pytest
import torch
from rope_testlib import rope_cache_case

from eagle_triton.ops.rope_kv import qkv_rope_config, target_qkv_rope, target_qkv_rope_ref, target_rope_kv
from eagle_triton.ops.target_linear import fold_norm_weight, target_embedding, target_linear

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


def _case(B, S, Hq, Hkv, D, K, Lmax, starts, dtype, device, seed, bias):
    g = torch.Generator().manual_seed(seed)
    N = (Hq + 2 * Hkv) * D
    emb = torch.randn(64, K, generator=g).to(device, dtype)
    ids = torch.randint(0, 64, (B * S,), generator=g).to(device)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(device, dtype)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(device, dtype)
    b = (0.1 * torch.randn(N, generator=g)).to(device, dtype) if bias else None
    cos, sin, kc, vc, seqlens, pos = rope_cache_case(g, B, Lmax, Hkv, D, starts, dtype, device, S)
    return emb, ids, w, nw, b, cos, sin, kc, vc, seqlens, pos


def _two_kernels(x, ss, w, b, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, folded_w, nw):
    if folded_w is not None:
        qkv = target_linear(x, folded_w, b, sumsq=ss, norm_folded=True)
    else:
        qkv = target_linear(x, w, b, norm_weight=nw, sumsq=ss)
    return target_rope_kv(qkv, kc, vc, seqlens, pos, cos, sin, Hq, Hkv)


CASES = [  # B, S, Hq, Hkv, D, K, Lmax, starts, bias, folded
    pytest.param(1, 5, 4, 2, 32, 96, 24, (3,), False, True, id="gqa2-D32-folded"),
    pytest.param(2, 3, 3, 1, 64, 80, 20, (0, 9), True, True, id="B2-gqa3-D64-bias-folded"),
    pytest.param(1, 1, 2, 2, 32, 48, 16, (15,), True, False, id="decode-mha-prologue-last-row"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,S,Hq,Hkv,D,K,Lmax,starts,bias,folded", CASES)
def test_qkv_rope_equals_product_then_rope(B, S, Hq, Hkv, D, K, Lmax, starts, bias, folded, dtype, device):
    seed = secrets.randbelow(1 << 30)
    emb, ids, w, nw, b, cos, sin, kc, vc, seqlens, pos = _case(B, S, Hq, Hkv, D, K, Lmax, starts, dtype, device,
                                                               seed, bias)
    cfg = qkv_rope_config(Hq, Hkv, D, K, device, dtype)
    ss = torch.empty(B * S, 3, device=device, dtype=torch.float32)
    x = target_embedding(ids, emb, sumsq_out=ss)
    fw = fold_norm_weight(w, nw) if folded else None
    kc2, vc2 = kc.clone(), vc.clone()
    kc3, vc3 = kc.clone(), vc.clone()
    q_two = _two_kernels(x, ss, w, b, kc2, vc2, seqlens, pos, cos, sin, Hq, Hkv, fw, nw)
    kw = dict(sumsq=ss, norm_folded=True) if folded else dict(norm_weight=nw, sumsq=ss)
    q = target_qkv_rope(x, fw if folded else w, b, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, config=cfg, **kw)
    kc3, vc3 = kc3.float(), vc3.float()
    q_ref = target_qkv_rope_ref(x.float(), (fw if folded else w).float(), None if b is None else b.float(),
                                kc3, vc3, seqlens, pos, cos.float(), sin.float(), Hq, Hkv,
                                norm_weight=None if folded else nw.float(), sumsq=ss, norm_folded=folded)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=4e-2, rtol=2e-2)
    torch.testing.assert_close(q.float(), q_ref, **tol)
    torch.testing.assert_close(kc.float(), kc3, **tol)
    torch.testing.assert_close(vc.float(), vc3, **tol)
    if dtype != torch.float32:  # the same roundings as the two kernels; the products (two accumulators per
        # program here: another tensor-core instruction schedule, or numpy's tile widths) may round a last bit
        # apart, which the rotation can carry up to one unit of the output
        scale = q_two.float().abs().max()
        assert (q.float() - q_two.float()).abs().max() <= 2 * torch.finfo(dtype).eps * scale, f"seed={seed}"
    untouched = torch.ones(B, Lmax, dtype=torch.bool, device=device)
    for bi, L in enumerate(starts):
        untouched[bi, L:L + S] = False
    assert torch.equal(kc[untouched], kc2[untouched]) and torch.equal(vc[untouched], vc2[untouched]), \
        f"rows outside the new ones were written (seed={seed})"


def test_qkv_rope_row_is_batch_invariant(device):
    """Row 4 of a 7-row chunk equals the same row launched alone (q, k and v bits)."""
    dtype, Hq, Hkv, D, K, Lmax = torch.float16, 4, 2, 32, 96, 24
    emb, ids, w, nw, b, cos, sin, kc, vc, seqlens, pos = _case(1, 7, Hq, Hkv, D, K, Lmax, (2,), dtype, device,
                                                               secrets.randbelow(1 << 30), True)
    ss = torch.empty(7, 3, device=device, dtype=torch.float32)
    x = target_embedding(ids, emb, sumsq_out=ss)
    fw = fold_norm_weight(w, nw)
    kc1, vc1 = kc.clone(), vc.clone()
    q = target_qkv_rope(x, fw, b, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, sumsq=ss, norm_folded=True)
    one = target_qkv_rope(x[4:5], fw, b, kc1, vc1, seqlens + 4, pos[:, 4:5].contiguous(), cos, sin, Hq, Hkv,
                          sumsq=ss[4:5], norm_folded=True)
    assert torch.equal(q[4:5], one)
    assert torch.equal(kc[0, 6], kc1[0, 6]) and torch.equal(vc[0, 6], vc1[0, 6])


@pytest.mark.gpu
@pytest.mark.parametrize("Hq,Hkv,D,K", [(9, 3, 64, 576), (32, 8, 128, 4096)], ids=["smollm2", "llama-8b"])
def test_gpu_qkv_rope_rows_batch_invariant_bf16(Hq, Hkv, D, K):
    """bf16 at real head shapes: rows 0, 37 and 59 of a 60-row chunk (folded norm, bias) equal the same rows
    launched alone, in q and in the k/v cache rows they write."""
    dev, dtype, S, Lmax = "cuda", torch.bfloat16, 60, 256
    emb, ids, w, nw, b, cos, sin, kc, vc, seqlens, pos = _case(1, S, Hq, Hkv, D, K, Lmax, (70,), dtype, dev,
                                                               secrets.randbelow(1 << 30), True)
    P = 36
    ss = torch.empty(S, P, device=dev, dtype=torch.float32)
    x = target_embedding(ids, emb, sumsq_out=ss)
    fw = fold_norm_weight(w, nw)
    kc1, vc1 = kc.clone(), vc.clone()
    q = target_qkv_rope(x, fw, b, kc, vc, seqlens, pos, cos, sin, Hq, Hkv, sumsq=ss, norm_folded=True)
    for r in (0, 37, 59):
        one = target_qkv_rope(x[r:r + 1], fw, b, kc1, vc1, seqlens + r, pos[:, r:r + 1].contiguous(), cos, sin, Hq,
                              Hkv, sumsq=ss[r:r + 1], norm_folded=True)
        assert torch.equal(q[r:r + 1], one), f"row {r}: q"
        assert torch.equal(kc[0, 70 + r], kc1[0, 70 + r]) and torch.equal(vc[0, 70 + r], vc1[0, 70 + r]), r


def test_qkv_rope_slots_write_their_slot(device):
    """With cache_slots, sequence b writes slot slots[b] (and no other) of the whole cache."""
    dtype, Hq, Hkv, D, K, Lmax = torch.float32, 2, 1, 32, 48, 16
    emb, ids, w, nw, b, cos, sin, kc, vc, seqlens, pos = _case(3, 2, Hq, Hkv, D, K, Lmax, (1, 4, 7), dtype,
                                                               device, 5, False)
    x = emb[ids[:2]]
    slots = torch.tensor([2], dtype=torch.int32, device=device)
    kc1, vc1 = kc.clone(), vc.clone()
    target_qkv_rope(x, w, None, kc, vc, seqlens, pos[2:3], cos, sin, Hq, Hkv, cache_slots=slots)
    kv_view = (kc1[2:3].clone(), vc1[2:3].clone())
    target_qkv_rope(x, w, None, *kv_view, seqlens[2:3], pos[2:3], cos, sin, Hq, Hkv)
    assert torch.equal(kc[2], kv_view[0][0]) and torch.equal(vc[2], kv_view[1][0])
    assert torch.equal(kc[:2], kc1[:2]) and torch.equal(vc[:2], vc1[:2])


def test_qkv_rope_config_and_errors(device):
    assert qkv_rope_config(4, 2, 16, 64) is None  # half of 16 is below tl.dot's 16 lanes
    cfg = qkv_rope_config(32, 8, 128, 4096, "cuda", torch.bfloat16)
    assert cfg.block_n >= 16 and 64 % cfg.block_n == 0
    emb, ids, w, nw, b, cos, sin, kc, vc, seqlens, pos = _case(1, 2, 2, 1, 32, 48, 16, (0,), torch.float32,
                                                               device, 1, False)
    x = emb[ids]
    with pytest.raises(ValueError, match=r"weight must be \[\(Hq \+ 2 Hkv\) \* D = 128"):
        target_qkv_rope(x, w[:-32], None, kc, vc, seqlens, pos, cos, sin, 2, 1)
    with pytest.raises(ValueError, match="norm_folded needs sumsq"):
        target_qkv_rope(x, w, None, kc, vc, seqlens, pos, cos, sin, 2, 1, norm_folded=True)
    with pytest.raises(ValueError, match="cannot take head_dim"):
        target_qkv_rope(x, w, None, kc, vc, seqlens, pos, cos, sin, 2, 1,
                        config=dataclasses.replace(qkv_rope_config(2, 1, 32, 48), block_n=32))
