"""Triton kernels for the LM head's top-k log-probabilities without materialising logits.

Status: tested under ``TRITON_INTERPRET=1`` (fp32/fp16) and compiled for sm_90 (Triton 3.9); Triton 3.6 subset
(``tl.topk`` without its later ``descending`` flag).

Pass 1 splits the vocabulary over programs. Each streams its vocabulary tiles once: ``logits = hidden @ W_tile^T``
(fp32 accumulation), a running log-sum-exp ``(m, l)`` and a running top-k. Pass 2 (one program per row) merges
the splits' top-k lists and log-sum-exps: ``logp = logit - (M + log sum_s l_s e^(m_s - M))``.

Top-k with indices uses single int64 keys: the high 32 bits are the fp32 logit's bits mapped to a signed order
(``b >= 0 ? b : b ^ 0x7fffffff``), the low 32 bits ``2^32 - 1 - id``. Sorting keys descending sorts by logit
descending and, among equal logits, by id ascending, which is the tie rule of the reference.
"""

from __future__ import annotations

import triton
import triton.language as tl

_KEY_PAD = tl.constexpr(-9223372036854775807)  # below every real key (INT64_MIN + 1)


@triton.jit
def _pack_keys(x, ids):
    """int64 keys ordering (value desc, id asc); ``x`` fp32, ``ids`` int64 (``< 2**32``)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0 folds -0.0 into +0.0
    hi = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (hi.to(tl.int64) << 32) | (4294967295 - ids)


@triton.jit
def _unpack_keys(keys):
    hi = (keys >> 32).to(tl.int32)
    bits = tl.where(hi >= 0, hi, hi ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 4294967295 - (keys & 4294967295)


@triton.jit
def _lm_head_topk_partial_kernel(
    x_ptr, w_ptr, bias_ptr, keys_ptr, m_ptr, l_ptr,
    M, V, H,
    stride_xm, stride_wv,
    HAS_BIAS: tl.constexpr, NUM_SPLITS: tl.constexpr, KPAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, PRECISION: tl.constexpr,
):
    """Pass 1; grid ``(cdiv(M, BLOCK_M), NUM_SPLITS)``. Writes ``KPAD`` keys and ``(m, l)`` per (row, split).

    The running top-k is only re-sorted when some tile logit beats the current k-th best of its row.
    """
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_h = tl.arange(0, BLOCK_H)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm

    n_tiles = tl.cdiv(V, BLOCK_V)
    t_lo = (n_tiles * pid_s) // NUM_SPLITS
    t_hi = (n_tiles * (pid_s + 1)) // NUM_SPLITS

    run = tl.full([BLOCK_M, KPAD], _KEY_PAD, tl.int64)
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    for t in range(t_lo, t_hi):
        offs_v = t * BLOCK_V + tl.arange(0, BLOCK_V)
        v_mask = offs_v < V
        w_rows = w_ptr + offs_v[:, None].to(tl.int64) * stride_wv
        acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
        for h0 in range(0, H, BLOCK_H):
            h_mask = (h0 + offs_h) < H
            x = tl.load(x_rows + (h0 + offs_h)[None, :], mask=m_mask[:, None] & h_mask[None, :], other=0.0)
            w = tl.load(w_rows + (h0 + offs_h)[None, :], mask=v_mask[:, None] & h_mask[None, :], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_v, mask=v_mask, other=0.0).to(tl.float32)[None, :]
        logits = tl.where(v_mask[None, :], acc, float("-inf"))

        m_new = tl.maximum(m_run, tl.max(logits, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_run = l_run * tl.exp(m_run - m_safe) + tl.sum(tl.exp(logits - m_safe[:, None]), 1)
        m_run = m_new

        keys = _pack_keys(logits, offs_v.to(tl.int64)[None, :])
        keys = tl.where(v_mask[None, :] & m_mask[:, None], keys, _KEY_PAD)
        beats = tl.max(keys, 1) > tl.min(run, 1)
        if tl.max(beats.to(tl.int32), 0) > 0:
            best = tl.topk(keys, KPAD)
            both = tl.reshape(tl.join(run, best), [BLOCK_M, 2 * KPAD])
            run = tl.topk(both, KPAD)

    offs_k = tl.arange(0, KPAD)
    part = offs_m.to(tl.int64) * NUM_SPLITS + pid_s
    tl.store(keys_ptr + part[:, None] * KPAD + offs_k[None, :], run, mask=m_mask[:, None])
    tl.store(m_ptr + part, m_run, mask=m_mask)
    tl.store(l_ptr + part, l_run, mask=m_mask)


@triton.jit
def _lm_head_topk_merge_kernel(
    keys_ptr, m_ptr, l_ptr, logp_ptr, ids_ptr, k,
    NUM_SPLITS: tl.constexpr, KPAD: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Pass 2; grid ``(M,)``: top-``k`` of the row's ``NUM_SPLITS * KPAD`` keys, minus the merged log-sum-exp."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    s_mask = offs_s < NUM_SPLITS
    m_s = tl.load(m_ptr + row * NUM_SPLITS + offs_s, mask=s_mask, other=float("-inf"))
    l_s = tl.load(l_ptr + row * NUM_SPLITS + offs_s, mask=s_mask, other=0.0)
    m = tl.max(m_s, 0)
    lse = m + tl.log(tl.sum(l_s * tl.exp(m_s - m), 0))

    offs = tl.arange(0, BLOCK_S * KPAD)
    keys = tl.load(keys_ptr + row * NUM_SPLITS * KPAD + offs, mask=offs < NUM_SPLITS * KPAD, other=_KEY_PAD)
    top = tl.topk(keys, KPAD)
    val, ids = _unpack_keys(top)
    offs_k = tl.arange(0, KPAD)
    tl.store(logp_ptr + row * k + offs_k, val - lse, mask=offs_k < k)
    tl.store(ids_ptr + row * k + offs_k, ids, mask=offs_k < k)
