"""Triton kernels for the static KV cache: append new rows, compact the accepted path (all layers, one launch).

Status: tested under ``TRITON_INTERPRET=1`` and compiled for sm_90 (Triton 3.9); Triton 3.6 subset. Both are pure
copies: each program moves whole contiguous (head, dim) rows with 16-byte vectors, no host sync, graph-capturable.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _append_kv_kernel(
    k_ptr, v_ptr, kn_ptr, vn_ptr, seqlens_ptr,
    stride_kb, stride_kl, stride_kh,
    stride_vb, stride_vl, stride_vh,
    stride_knb, stride_knt, stride_knh,
    stride_vnb, stride_vnt, stride_vnh,
    Tn, Lmax,
    HEAD_DIM: tl.constexpr, ROW: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``cache[b, seqlen_b + j] = new[b, j]`` for K and V; grid ``(B * Tn, cdiv(Hkv * D, BLOCK_C))``.

    Rows that would land at or past ``Lmax`` are dropped (the host raises before that when it may sync).
    """
    pid = tl.program_id(0)
    b = pid // Tn
    j = pid % Tn
    b64 = b.to(tl.int64)
    dst = tl.load(seqlens_ptr + b).to(tl.int64) + j
    offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    h = offs // HEAD_DIM
    d = offs % HEAD_DIM
    dst_v = tl.zeros([BLOCK_C], tl.int64) + dst  # a vector: the interpreter rejects scalar-broadcast masks
    m = (offs < ROW) & (dst_v < Lmax) & (dst_v >= 0)
    kn = tl.load(kn_ptr + b64 * stride_knb + j * stride_knt + h * stride_knh + d, mask=m)
    vn = tl.load(vn_ptr + b64 * stride_vnb + j * stride_vnt + h * stride_vnh + d, mask=m)
    tl.store(k_ptr + b64 * stride_kb + dst * stride_kl + h * stride_kh + d, kn, mask=m)
    tl.store(v_ptr + b64 * stride_vb + dst * stride_vl + h * stride_vh + d, vn, mask=m)


@triton.jit
def _compact_kv_kernel(
    k_ptr, v_ptr, seqlens_ptr, idx_ptr, len_ptr,
    stride_kn, stride_kb, stride_kl, stride_kh,
    stride_vn, stride_vb, stride_vl, stride_vh,
    stride_ib, stride_ia,
    B, A, Lmax,
    HEAD_DIM: tl.constexpr, ROW: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Accepted-path gather for every layer; grid ``(NL * B, cdiv(Hkv * D, BLOCK_C))``.

    Row ``seqlen_b + accept_index[b, j]`` moves to row ``seqlen_b + j`` for ``j < accept_len[b]``. A program owns
    all ``A`` rows of one (layer, sequence, column chunk): it loads every source before storing any destination,
    so a source that is also a destination (sources are never below their destination on a tree path) is read
    intact. Rows already in place (``accept_index[b, j] == j``) are neither read nor written.
    """
    pid = tl.program_id(0)
    layer = pid // B
    b = pid % B
    b64 = b.to(tl.int64)
    seqlen = tl.load(seqlens_ptr + b).to(tl.int64)
    n_acc = tl.minimum(tl.load(len_ptr + b).to(tl.int32), A)
    offs_a = tl.arange(0, BLOCK_A)
    idx = tl.load(idx_ptr + b64 * stride_ib + offs_a * stride_ia, mask=offs_a < n_acc, other=0).to(tl.int64)
    src = seqlen + idx
    dst = seqlen + offs_a
    move = (offs_a < n_acc) & (idx != offs_a) & (idx >= 0) & (src < Lmax) & (dst < Lmax)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col = (offs_c // HEAD_DIM) * stride_kh + offs_c % HEAD_DIM
    col_v = (offs_c // HEAD_DIM) * stride_vh + offs_c % HEAD_DIM
    m = move[:, None] & (offs_c < ROW)[None, :]
    k_base = k_ptr + layer.to(tl.int64) * stride_kn + b64 * stride_kb
    v_base = v_ptr + layer.to(tl.int64) * stride_vn + b64 * stride_vb
    k_rows = tl.load(k_base + src[:, None] * stride_kl + col[None, :], mask=m)
    v_rows = tl.load(v_base + src[:, None] * stride_vl + col_v[None, :], mask=m)
    # Threads of the program store rows other threads load: all loads must land before any store.
    tl.debug_barrier()
    tl.store(k_base + dst[:, None] * stride_kl + col[None, :], k_rows, mask=m)
    tl.store(v_base + dst[:, None] * stride_vl + col_v[None, :], v_rows, mask=m)
