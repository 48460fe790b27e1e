"""RoPE (with the optional Qwen3 q/k RMSNorm) applied to a q/k/v product row, and the KV-cache write, in one kernel.

Status: tested under ``TRITON_INTERPRET=1`` (fp32/fp16) and compiled for sm_90 with Triton 3.9; Triton 3.6 subset.

Rows come grouped by sequence (row ``m`` belongs to sequence ``m // S``), so one launch serves ``B`` sequences
of ``S`` rows each (a batched verify or decode step); a row's arithmetic never depends on ``B`` or ``S``. With
``HAS_SLOTS`` sequence ``b`` writes cache batch index ``slots[b]`` (read on the device, so one CUDA graph serves
every slot of a larger cache); without it, index ``b`` (the code is then the same as before the option existed).

Per element, so batch-invariant by construction (the per-head norm reduces ``D`` values of one head in one
``tl.sum``). Roundings follow the eager PyTorch forward: the norm's ``(x * rstd).to(dtype) * w``, then
``(x * cos).to(dtype) + (rotate_half(x) * sin).to(dtype)`` with the cos/sin tables in the model dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _norm_rope(x_base, heads, h_mask, w_ptr, c, s, offs_d, d_mask, eps, HEAD_DIM: tl.constexpr,
               HAS_NORM: tl.constexpr, dt: tl.constexpr):
    """Heads ``x_base[heads * D + d]`` as a ``[BLOCK_H, BLOCK_D]`` tile: optional RMSNorm over each head's ``D``
    values, then half-rotation RoPE with the row's ``c``/``s`` ``[BLOCK_D]``; returns the tile in ``dt``."""
    half: tl.constexpr = HEAD_DIM // 2
    offs_rot = tl.where(offs_d < half, offs_d + half, offs_d - half)
    m2 = h_mask[:, None] & d_mask[None, :]
    x = tl.load(x_base + heads[:, None] * HEAD_DIM + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
    xr = tl.load(x_base + heads[:, None] * HEAD_DIM + offs_rot[None, :], mask=m2, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)
        w = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + offs_rot, mask=d_mask, other=0.0).to(tl.float32)
        x = (w[None, :] * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        xr = (wr[None, :] * (xr * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    xr = tl.where(offs_d[None, :] < half, -xr, xr)
    a = (x * c[None, :]).to(dt).to(tl.float32)
    b = (xr * s[None, :]).to(dt).to(tl.float32)
    return (a + b).to(dt)


@triton.jit(do_not_specialize=["M", "S", "NB"])
def _rope_kv_kernel(
    qkv_ptr, q_ptr, k_ptr, v_ptr, seqlens_ptr, slots_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
    M, S, Lmax, stride_qkv, stride_qm, stride_qh, stride_kb, stride_kl, stride_kh, stride_vb, stride_vl, stride_vh,
    stride_cp, eps, NB,
    HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
    BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr, HAS_SLOTS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Grid ``(M,)``: program ``m`` (row ``j = m % S`` of sequence ``b = m // S``) rotates the q heads of row ``m``
    into ``q``, and rotates its k heads and copies its v heads into row ``seqlens[cb] + j`` of cache batch index
    ``cb`` (``cb = slots[b]`` with ``HAS_SLOTS``, else ``b``; dropped at or past ``Lmax``, or for ``cb`` outside
    ``[0, NB)``)."""
    m = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    dt = q_ptr.dtype.element_ty
    if PDL:  # programmatic dependent launch: wait for the q/k/v product (and everything before it)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pos = tl.load(pos_ptr + m).to(tl.int64)
    c = tl.load(cos_ptr + pos * stride_cp + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_cp + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    row = qkv_ptr + m.to(tl.int64) * stride_qkv

    hq = tl.arange(0, BLOCK_HQ)
    hq_mask = hq < HQ
    q = _norm_rope(row, hq, hq_mask, qn_ptr, c, s, offs_d, d_mask, eps, HEAD_DIM, HAS_NORM, dt)
    tl.store(q_ptr + m.to(tl.int64) * stride_qm + hq[:, None] * stride_qh + offs_d[None, :], q,
             mask=hq_mask[:, None] & d_mask[None, :])

    hk = tl.arange(0, BLOCK_HKV)
    b = m // S
    if HAS_SLOTS:  # an out-of-range slot writes nothing (no access leaves the cache, whatever the device holds)
        slot = tl.load(slots_ptr + b)
        slot_v = tl.zeros([BLOCK_HKV], tl.int32) + slot
        cb = tl.minimum(tl.maximum(slot, 0), NB - 1)
    else:
        cb = b
    dst = tl.load(seqlens_ptr + cb).to(tl.int64) + (m - b * S)
    dst_v = tl.zeros([BLOCK_HKV], tl.int64) + dst  # a vector mask: the interpreter rejects scalar broadcasts
    hk_mask = (hk < HKV) & (dst_v < Lmax) & (dst_v >= 0)
    if HAS_SLOTS:
        hk_mask = hk_mask & (slot_v >= 0) & (slot_v < NB)
    w_mask = hk_mask[:, None] & d_mask[None, :]
    k = _norm_rope(row + HQ * HEAD_DIM, hk, hk < HKV, kn_ptr, c, s, offs_d, d_mask, eps, HEAD_DIM, HAS_NORM, dt)
    k_seq = k_ptr + cb.to(tl.int64) * stride_kb
    v_seq = v_ptr + cb.to(tl.int64) * stride_vb
    tl.store(k_seq + dst * stride_kl + hk[:, None] * stride_kh + offs_d[None, :], k.to(k_ptr.dtype.element_ty),
             mask=w_mask)
    v = tl.load(row + (HQ + HKV) * HEAD_DIM + hk[:, None] * HEAD_DIM + offs_d[None, :], mask=w_mask, other=0.0)
    tl.store(v_seq + dst * stride_vl + hk[:, None] * stride_vh + offs_d[None, :], v.to(v_ptr.dtype.element_ty),
             mask=w_mask)
