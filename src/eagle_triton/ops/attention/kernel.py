"""Triton kernels for tree-masked verification attention and frontier (draft) attention.

Status: tested under ``TRITON_INTERPRET=1`` (fp32/fp16) and compiled for sm_90 with Triton 3.9; written to the
subset of Triton 3.6 (no block pointers, no ``break``, no libdevice).

Both kernels tile the *query* side as (query, head-in-group) rows: a KV head's ``G = Hq / Hkv`` query heads of all
queries share one K/V tile, so every prefix row is loaded once per row tile and reused ``BLOCK_M`` times (GQA
packing; row ``r`` of a tile is query ``r // G``, head ``kvh * G + r % G``). The key axis is split over programs
(split-K, ``NUM_SPLITS``) so that a single sequence fills the GPU; each split keeps an online softmax in the log2
domain and writes ``(acc / l, m + log2 l)`` partials that :func:`_attn_combine_kernel` merges. With one split the
kernel normalises and writes the output directly.

Math (per query row, keys ``j`` visible to it): ``out = sum_j softmax_j(scale * q.k_j) v_j``, accumulated in fp32.
A row with no visible key gets zeros.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _online_update(acc, m_i, l_i, s, v, PRECISION: tl.constexpr):
    """One online-softmax step: ``s`` [M, N] log2-scaled scores (-inf = hidden), ``v`` [N, D]."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _prefix_blocks(
    acc, m_i, l_i, q, k_base, v_base, stride_kl, stride_vl, offs_d, d_mask, n_lo, n_hi, seqlen, qk_scale,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    """Attend the row tile ``q`` [M, D] to cache rows ``[n_lo, min(n_hi, seqlen))`` (all rows see all of them)."""
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < seqlen
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kl + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vl + offs_d[None, :], mask=kv_mask, other=0.0)
        acc, m_i, l_i = _online_update(acc, m_i, l_i, s, v, PRECISION)
    return acc, m_i, l_i


@triton.jit
def _program_rows(Hq, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Both attention kernels' grid ``(row blocks, B * Hkv, splits)``: ``(b, kv head, b as int64, split, rows)``;
    row ``r`` stands for query (or node) ``r // GROUP`` and head ``kvh * GROUP + r % GROUP``."""
    pid_bh = tl.program_id(1)
    n_kv = Hq // GROUP
    b = pid_bh // n_kv
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return b, pid_bh % n_kv, b.to(tl.int64), tl.program_id(2), offs_r


@triton.jit
def _split_range(seqlen, pid_s, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key rows ``[lo, hi)`` of split ``pid_s``: the prefix's blocks dealt out evenly (computed on device)."""
    nb = tl.cdiv(seqlen, BLOCK_N)
    lo = (nb * pid_s) // NUM_SPLITS
    hi = (nb * (pid_s + 1)) // NUM_SPLITS
    return lo * BLOCK_N, hi * BLOCK_N


@triton.jit
def _write_result(
    acc, m_i, l_i, o_ptr, op_ptr, lse_ptr, row_off, part_row, offs_d, row_mask, d_mask, pid_s,
    NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Final output (one split) or the split's normalised partial and log2-sum-exp (several splits)."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    out_mask = row_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        tl.store(o_ptr + row_off[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        p_row = part_row * NUM_SPLITS + pid_s
        tl.store(op_ptr + p_row[:, None] * BLOCK_D + offs_d[None, :], out, mask=out_mask)
        tl.store(lse_ptr + p_row, lse, mask=row_mask)


@triton.jit
def _tree_attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, mask_ptr, o_ptr, op_ptr, lse_ptr,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kl, stride_kh,
    stride_vb, stride_vl, stride_vh,
    stride_mb, stride_mi, stride_mj,
    stride_ob, stride_ot, stride_oh,
    Tq, Hq, Lmax, qk_scale,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, HAS_MASK: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Tree verification attention; grid ``(cdiv(Tq * G, BLOCK_M), B * Hkv, NUM_SPLITS)``.

    Query ``i`` of sequence ``b`` sees cache rows ``[0, seqlen_b)`` and tree rows ``seqlen_b + j`` for which
    ``mask[b, i, j]`` (``HAS_MASK``) or ``j <= i`` (causal). The last split also handles the tree rows.
    """
    b, kvh, b64, pid_s, offs_r = _program_rows(Hq, GROUP, BLOCK_M)
    row_mask = offs_r < Tq * GROUP
    qi = tl.where(row_mask, offs_r // GROUP, 0)
    h = kvh * GROUP + offs_r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    q_off = b64 * stride_qb + qi.to(tl.int64) * stride_qt + h * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_mask[:, None] & d_mask[None, :], other=0.0)

    # Clamped so that no read leaves the cache even for out-of-range lengths (the host checks when it can).
    seqlen = tl.minimum(tl.maximum(tl.load(seqlens_ptr + b).to(tl.int32), 0), Lmax - Tq)
    k_base = k_ptr + b64 * stride_kb + kvh * stride_kh
    v_base = v_ptr + b64 * stride_vb + kvh * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    n_lo, n_hi = _split_range(seqlen, pid_s, NUM_SPLITS, BLOCK_N)
    acc, m_i, l_i = _prefix_blocks(acc, m_i, l_i, q, k_base, v_base, stride_kl, stride_vl, offs_d, d_mask,
                                   n_lo, n_hi, seqlen, qk_scale, BLOCK_N, PRECISION)

    if pid_s == NUM_SPLITS - 1:
        if HAS_MASK:
            t_hi = Tq
        else:
            t_hi = tl.minimum(Tq, tl.max(qi, 0) + 1)
        kt_base = k_base + seqlen.to(tl.int64) * stride_kl
        vt_base = v_base + seqlen.to(tl.int64) * stride_vl
        # Mask offsets in int32 (the mask is small) and narrower key blocks: a [BLOCK_M, BLOCK_T] tile of 64-bit
        # mask pointers is what would otherwise spill registers.
        m_row = (b * stride_mb + qi * stride_mi).to(tl.int32)
        for t0 in range(0, t_hi, BLOCK_T):
            offs_t = t0 + tl.arange(0, BLOCK_T)
            t_mask = offs_t < Tq
            kv_mask = t_mask[:, None] & d_mask[None, :]
            k = tl.load(kt_base + offs_t[:, None] * stride_kl + offs_d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
            if HAS_MASK:
                vis = tl.load(mask_ptr + (m_row[:, None] + offs_t[None, :] * stride_mj),
                              mask=row_mask[:, None] & t_mask[None, :], other=0)
                vis = vis != 0
            else:
                vis = (offs_t[None, :] <= qi[:, None]) & t_mask[None, :]
            s = tl.where(vis, s, float("-inf"))
            v = tl.load(vt_base + offs_t[:, None] * stride_vl + offs_d[None, :], mask=kv_mask, other=0.0)
            acc, m_i, l_i = _online_update(acc, m_i, l_i, s, v, PRECISION)

    o_off = b64 * stride_ob + qi.to(tl.int64) * stride_ot + h * stride_oh
    part_row = (b64 * Tq + qi) * Hq + h
    _write_result(acc, m_i, l_i, o_ptr, op_ptr, lse_ptr, o_off, part_row, offs_d, row_mask, d_mask, pid_s,
                  NUM_SPLITS, BLOCK_D)


@triton.jit
def _rope_rows(x_base, row_off, cos_ptr, sin_ptr, pos, stride_cp, offs_d, m2, HEAD_DIM: tl.constexpr):
    """Half-rotation RoPE of gathered rows ``x_base[row_off + d]`` at positions ``pos``, in fp32.

    Offsets are int32 relative to a scalar base: tiles of 64-bit pointers are what exhausts registers here.
    """
    half: tl.constexpr = HEAD_DIM // 2
    x = tl.load(x_base + (row_off[:, None] + offs_d[None, :]), mask=m2, other=0.0).to(tl.float32)
    offs_rot = tl.where(offs_d < half, offs_d + half, offs_d - half)
    x_rot = tl.load(x_base + (row_off[:, None] + offs_rot[None, :]), mask=m2, other=0.0).to(tl.float32)
    x_rot = tl.where(offs_d[None, :] < half, -x_rot, x_rot)
    t_off = pos[:, None] * stride_cp + offs_d[None, :]
    c = tl.load(cos_ptr + t_off, mask=m2, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t_off, mask=m2, other=0.0).to(tl.float32)
    return x * c + x_rot * s


@triton.jit
def _vec_update(acc, m_i, l_i, s, v):
    """Online-softmax step with one key per row: ``s`` [M] log2-scaled (-inf = hidden), ``v`` [M, D] fp32."""
    m_new = tl.maximum(m_i, s)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p[:, None] * v
    return acc, m_new, l_i


@triton.jit
def _draft_attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, prefix_ptr, ak_ptr, av_ptr, alen_ptr, cos_ptr, sin_ptr, pos_ptr, kn_ptr, vn_ptr,
    o_ptr, op_ptr, lse_ptr,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kl, stride_kh,
    stride_vb, stride_vl, stride_vh,
    stride_akb, stride_akn, stride_aka, stride_akh,
    stride_avb, stride_avn, stride_ava, stride_avh,
    stride_lb, stride_ln, stride_pb, stride_pn, stride_cp,
    stride_knb, stride_knn, stride_knh,
    stride_vnb, stride_vnn, stride_vnh,
    stride_ob, stride_on, stride_oh,
    N, Hq, A, Lmax, P, qk_scale,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    """Frontier attention with in-kernel RoPE; grid ``(cdiv(N * G, BLOCK_M), B * Hkv, NUM_SPLITS)``.

    Node ``n`` (rows ``n * G .. n * G + G - 1``) sees prefix rows ``[0, prefix_len_b)``, its ``anc_len[b, n]``
    packed ancestors ``anc_k[b, n, :anc_len]`` and itself (``rope(k_new[b, n])``). The last split handles the
    ancestors and self, and its group-head-0 rows store ``rope(k_new)`` / ``v_new`` into slot ``anc_len[b, n]``.
    """
    b, kvh, b64, pid_s, offs_r = _program_rows(Hq, GROUP, BLOCK_M)
    row_mask = offs_r < N * GROUP
    node = tl.where(row_mask, offs_r // GROUP, 0)
    hg = offs_r % GROUP
    h = kvh * GROUP + hg
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m2 = row_mask[:, None] & d_mask[None, :]

    pos = tl.load(pos_ptr + b64 * stride_pb + node * stride_pn, mask=row_mask, other=0).to(tl.int32)
    pos = tl.minimum(tl.maximum(pos, 0), P - 1)
    q32 = _rope_rows(q_ptr + b64 * stride_qb, node * stride_qn + h * stride_qh, cos_ptr, sin_ptr, pos, stride_cp,
                     offs_d, m2, HEAD_DIM)
    # Rounded to the input dtype, as the dense reference applies RoPE in that dtype before Q.K.
    q = q32.to(q_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    if pid_s == NUM_SPLITS - 1:
        # Ancestors and self first: their temporaries are dead before the pipelined prefix loop starts.
        qf = q.to(tl.float32)
        alen = tl.load(alen_ptr + b64 * stride_lb + node * stride_ln, mask=row_mask, other=0).to(tl.int32)
        alen = tl.minimum(tl.maximum(alen, 0), A - 1)
        ak_base = ak_ptr + b64 * stride_akb + kvh * stride_akh
        av_base = av_ptr + b64 * stride_avb + kvh * stride_avh
        ak_row = node * stride_akn
        av_row = node * stride_avn
        a_hi = tl.max(tl.where(row_mask, alen, 0), 0)
        for a in range(0, a_hi):
            a_mask = row_mask & (a < alen)
            ma = a_mask[:, None] & d_mask[None, :]
            ka = tl.load(ak_base + ((ak_row + a * stride_aka)[:, None] + offs_d[None, :]), mask=ma, other=0.0)
            sa = tl.where(a_mask, tl.sum(qf * ka.to(tl.float32), 1) * qk_scale, float("-inf"))
            va = tl.load(av_base + ((av_row + a * stride_ava)[:, None] + offs_d[None, :]), mask=ma, other=0.0)
            acc, m_i, l_i = _vec_update(acc, m_i, l_i, sa, va.to(tl.float32))

        k_self = _rope_rows(kn_ptr + b64 * stride_knb + kvh * stride_knh, node * stride_knn, cos_ptr, sin_ptr, pos,
                            stride_cp, offs_d, m2, HEAD_DIM).to(kn_ptr.dtype.element_ty)
        s_self = tl.where(row_mask, tl.sum(qf * k_self.to(tl.float32), 1) * qk_scale, float("-inf"))
        vn_base = vn_ptr + b64 * stride_vnb + kvh * stride_vnh
        v_self = tl.load(vn_base + ((node * stride_vnn)[:, None] + offs_d[None, :]), mask=m2, other=0.0)
        acc, m_i, l_i = _vec_update(acc, m_i, l_i, s_self, v_self.to(tl.float32))

        # One writer per (b, node, kv head): the group's head-0 row, into the node's own slot.
        w_mask = m2 & (hg == 0)[:, None]
        tl.store(ak_base + ((ak_row + alen * stride_aka)[:, None] + offs_d[None, :]), k_self, mask=w_mask)
        tl.store(av_base + ((av_row + alen * stride_ava)[:, None] + offs_d[None, :]),
                 v_self.to(av_ptr.dtype.element_ty), mask=w_mask)

    seqlen = tl.minimum(tl.maximum(tl.load(prefix_ptr + b).to(tl.int32), 0), Lmax)
    k_base = k_ptr + b64 * stride_kb + kvh * stride_kh
    v_base = v_ptr + b64 * stride_vb + kvh * stride_vh
    n_lo, n_hi = _split_range(seqlen, pid_s, NUM_SPLITS, BLOCK_N)
    acc, m_i, l_i = _prefix_blocks(acc, m_i, l_i, q, k_base, v_base, stride_kl, stride_vl, offs_d, d_mask,
                                   n_lo, n_hi, seqlen, qk_scale, BLOCK_N, PRECISION)

    o_off = b64 * stride_ob + node.to(tl.int64) * stride_on + h * stride_oh
    part_row = (b64 * N + node) * Hq + h
    _write_result(acc, m_i, l_i, o_ptr, op_ptr, lse_ptr, o_off, part_row, offs_d, row_mask, d_mask, pid_s,
                  NUM_SPLITS, BLOCK_D)


@triton.jit
def _attn_combine_kernel(
    op_ptr, lse_ptr, o_ptr, n_rows, Tq, Hq, stride_ob, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Merge split partials: ``out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)``; grid ``cdiv(rows, BLOCK_R)``.

    Partial row ``(b * Tq + i) * Hq + h`` holds ``NUM_SPLITS`` entries of ``BLOCK_D`` floats each.
    """
    offs_s = tl.arange(0, BLOCK_S)
    s_mask = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    for rr in range(0, BLOCK_R):
        row = tl.program_id(0) * BLOCK_R + rr
        if row < n_rows:
            row64 = row.to(tl.int64)
            lse = tl.load(lse_ptr + row64 * NUM_SPLITS + offs_s, mask=s_mask, other=float("-inf"))
            m = tl.max(lse, 0)
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            w = tl.exp2(lse - m_safe)
            w_sum = tl.sum(w, 0)
            parts = tl.load(op_ptr + (row64 * NUM_SPLITS + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                            mask=s_mask[:, None] & d_mask[None, :], other=0.0)
            out = tl.sum(parts * w[:, None], 0) / tl.where(w_sum > 0.0, w_sum, 1.0)
            h = row % Hq
            bi = row // Hq
            i = bi % Tq
            b = bi // Tq
            o_off = b.to(tl.int64) * stride_ob + i.to(tl.int64) * stride_ot + h * stride_oh
            tl.store(o_ptr + o_off + offs_d, out.to(o_ptr.dtype.element_ty), mask=d_mask)
