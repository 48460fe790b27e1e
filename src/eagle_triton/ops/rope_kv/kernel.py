"""RoPE (with the optional Qwen3 q/k RMSNorm) applied to a q/k/v product row, and the KV-cache write, in one kernel.

Status: tested under ``TRITON_INTERPRET=1`` (fp32/fp16) and compiled for sm_90 with Triton 3.9; Triton 3.6 subset.

Per element, so batch-invariant by construction (the per-head norm reduces ``D`` values of one head in one
``tl.sum``). Roundings follow the eager PyTorch forward: the norm's ``(x * rstd).to(dtype) * w``, then
``(x * cos).to(dtype) + (rotate_half(x) * sin).to(dtype)`` with the cos/sin tables in the model dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _norm_rope(x_base, w_ptr, c, s, offs_d, d_mask, eps, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
               dt: tl.constexpr):
    """One head's row: optional RMSNorm over ``D`` then half-rotation RoPE; returns the row in ``dt``."""
    half: tl.constexpr = HEAD_DIM // 2
    offs_rot = tl.where(offs_d < half, offs_d + half, offs_d - half)
    x = tl.load(x_base + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    xr = tl.load(x_base + offs_rot, mask=d_mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / HEAD_DIM + eps)
        w = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + offs_rot, mask=d_mask, other=0.0).to(tl.float32)
        x = (w * (x * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        xr = (wr * (xr * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    xr = tl.where(offs_d < half, -xr, xr)
    a = (x * c).to(dt).to(tl.float32)
    b = (xr * s).to(dt).to(tl.float32)
    return (a + b).to(dt)


@triton.jit(do_not_specialize=["M"])
def _rope_kv_kernel(
    qkv_ptr, q_ptr, k_ptr, v_ptr, seqlens_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
    M, Lmax, stride_qkv, stride_qm, stride_qh, stride_kl, stride_kh, stride_vl, stride_vh, stride_cp, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr,
):
    """Grid ``(M, HQ + HKV)``: program ``(m, h)`` rotates q head ``h`` (``h < HQ``) into ``q``, or rotates k head
    ``h - HQ`` and copies its v head into cache row ``seqlens[0] + m`` (dropped past ``Lmax``)."""
    m = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    dt = q_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + m).to(tl.int64)
    c = tl.load(cos_ptr + pos * stride_cp + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_cp + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    row = qkv_ptr + m.to(tl.int64) * stride_qkv
    if h < HQ:
        out = _norm_rope(row + h * HEAD_DIM, qn_ptr, c, s, offs_d, d_mask, eps, HEAD_DIM, HAS_NORM, dt)
        tl.store(q_ptr + m.to(tl.int64) * stride_qm + h * stride_qh + offs_d, out, mask=d_mask)
    else:
        j = h - HQ
        dst = tl.load(seqlens_ptr).to(tl.int64) + m
        dst_v = tl.zeros([BLOCK_D], tl.int64) + dst  # a vector mask: the interpreter rejects scalar broadcasts
        w_mask = d_mask & (dst_v < Lmax) & (dst_v >= 0)
        k = _norm_rope(row + (HQ + j) * HEAD_DIM, kn_ptr, c, s, offs_d, d_mask, eps, HEAD_DIM, HAS_NORM, dt)
        tl.store(k_ptr + dst * stride_kl + j * stride_kh + offs_d, k.to(k_ptr.dtype.element_ty), mask=w_mask)
        v = tl.load(row + (HQ + HKV + j) * HEAD_DIM + offs_d, mask=d_mask, other=0.0)
        tl.store(v_ptr + dst * stride_vl + j * stride_vh + offs_d, v.to(v_ptr.dtype.element_ty), mask=w_mask)
