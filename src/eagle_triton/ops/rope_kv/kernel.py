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

from ..target_linear.kernel import _mainloop


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


@triton.jit(do_not_specialize=["M", "S", "NB"])
def _qkv_rope_kernel(
    x_ptr, w_ptr, b_ptr, nw_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, seqlens_ptr, slots_ptr, pos_ptr, cos_ptr, snt_ptr,
    M, S, K, Lmax, NB, stride_xm, stride_wn, stride_sin_m, stride_qm, stride_kb, stride_kl, stride_kh,
    stride_vb, stride_vl, stride_vh, stride_cp, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr, NUM_SS: tl.constexpr, NSS_P2: tl.constexpr, NORM_FOLDED: tl.constexpr,
    HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
    PRE: tl.constexpr = 0, HAS_SLOTS: tl.constexpr = False, PDL: tl.constexpr = False, L2_PRE: tl.constexpr = 0,
    ROTATE: tl.constexpr = False,
):
    """The q/k/v product of :func:`~eagle_triton.ops.target_linear.target_linear` with this module's RoPE and
    KV-cache write as its epilogue; grid ``(cdiv(M, BM), (HQ + HKV) * HALF / BN + HKV * D / (2 BN))``.

    Each program reduces two ``BN``-wide column sets with the product's own main loop
    (:func:`~eagle_triton.ops.target_linear.kernel._mainloop`, same chunks, same tiles as a plain product): a q or
    k program takes dims ``g BN ..`` of a head's first half and the matching dims ``HALF + g BN ..`` of its second
    half, so ``rotate_half`` pairs sit in the same lanes of its two accumulators; a v program takes two adjacent
    sets. The outputs are rounded to the dtype as the product's output was, then rotated with the rounding sequence
    of :func:`_rope_kv_kernel`; q goes to ``q`` ``[M, HQ * D]``, k and v to cache row ``seqlens[cb] + j`` (row ``m``
    is row ``j = m % S`` of sequence ``b = m // S``; ``cb = slots[b]`` with ``HAS_SLOTS``, else ``b``; rows at or
    past ``Lmax``, or of a slot outside ``[0, NB)``, are dropped). No q/k/v row goes through memory."""
    HALF: tl.constexpr = HEAD_DIM // 2
    GROUPS: tl.constexpr = HALF // BN  # q/k programs per head
    N_ROPE: tl.constexpr = (HQ + HKV) * GROUPS
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    offs_c = tl.arange(0, BN)
    dt = q_ptr.dtype.element_ty
    rope = pid_n < N_ROPE
    head = pid_n // GROUPS  # q/k programs
    d1 = tl.where(rope, (pid_n % GROUPS) * BN, 0) + offs_c  # first-half dims of a q/k program
    vp = pid_n - N_ROPE  # v programs: columns (HQ + HKV) D + 2 BN vp ..
    n1 = tl.where(rope, head * HEAD_DIM + d1, (HQ + HKV) * HEAD_DIM + vp * 2 * BN + offs_c)
    n2 = n1 + tl.where(rope, HALF, BN)
    n_mask = offs_c < BN
    w_rows = w_ptr + n1[:, None].to(tl.int64) * stride_wn
    u_rows = w_ptr + n2[:, None].to(tl.int64) * stride_wn
    acc, acc_u, rstd = _mainloop(x_ptr, w_rows, u_rows, nw_ptr, sin_ptr, offs_m, m_mask, n_mask, K, stride_xm,
                                 stride_sin_m, eps, HAS_NORM, NUM_SS, NSS_P2, True, NORM_FOLDED, BM, BN, BK,
                                 PRECISION, PRE, PDL, dt, L2_PRE, ROTATE, pid_n)
    if NORM_FOLDED:
        acc = acc * rstd[:, None]
        acc_u = acc_u * rstd[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n1).to(tl.float32)[None, :]
        acc_u += tl.load(b_ptr + n2).to(tl.float32)[None, :]
    # the product's output rounding (what the q/k/v buffer held), then the rotation of _norm_rope
    x1 = acc.to(dt).to(tl.float32)
    x2 = acc_u.to(dt).to(tl.float32)

    b = offs_m // S
    if HAS_SLOTS:  # an out-of-range slot writes nothing (no access leaves the cache, whatever the device holds)
        slot = tl.load(slots_ptr + b, mask=m_mask, other=0)
        cb = tl.minimum(tl.maximum(slot, 0), NB - 1)
        row_w = m_mask & (slot >= 0) & (slot < NB)
    else:
        cb = b
        row_w = m_mask
    dst = tl.load(seqlens_ptr + cb, mask=m_mask, other=0).to(tl.int64) + (offs_m - b * S)
    row_w = row_w & (dst < Lmax) & (dst >= 0)
    cb64 = cb.to(tl.int64)
    if rope:
        pos = tl.load(pos_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
        tab = pos[:, None] * stride_cp + d1[None, :]
        c1 = tl.load(cos_ptr + tab, mask=m_mask[:, None], other=0.0).to(tl.float32)
        s1 = tl.load(snt_ptr + tab, mask=m_mask[:, None], other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + tab + HALF, mask=m_mask[:, None], other=0.0).to(tl.float32)
        s2 = tl.load(snt_ptr + tab + HALF, mask=m_mask[:, None], other=0.0).to(tl.float32)
        y1 = ((x1 * c1).to(dt).to(tl.float32) + ((-x2) * s1).to(dt).to(tl.float32)).to(dt)
        y2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
        if head < HQ:
            q_rows = q_ptr + offs_m[:, None].to(tl.int64) * stride_qm + head * HEAD_DIM
            tl.store(q_rows + d1[None, :], y1, mask=m_mask[:, None])
            tl.store(q_rows + (d1 + HALF)[None, :], y2, mask=m_mask[:, None])
        else:
            k_rows = k_ptr + cb64[:, None] * stride_kb + dst[:, None] * stride_kl + (head - HQ) * stride_kh
            tl.store(k_rows + d1[None, :], y1.to(k_ptr.dtype.element_ty), mask=row_w[:, None])
            tl.store(k_rows + (d1 + HALF)[None, :], y2.to(k_ptr.dtype.element_ty), mask=row_w[:, None])
    else:
        cv = n1 - (HQ + HKV) * HEAD_DIM  # a v program's 2 BN columns lie in one head (2 BN divides D)
        kvh = cv // HEAD_DIM
        dv = cv % HEAD_DIM
        v_rows = v_ptr + cb64[:, None] * stride_vb + dst[:, None] * stride_vl
        off = kvh * stride_vh + dv
        tl.store(v_rows + off[None, :], x1.to(v_ptr.dtype.element_ty), mask=row_w[:, None])
        tl.store(v_rows + (off + BN)[None, :], x2.to(v_ptr.dtype.element_ty), mask=row_w[:, None])
