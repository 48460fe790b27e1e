"""Batch-invariant weight product ``y = x @ W.T`` with an optional RMSNorm prologue and epilogues.

Status: tested under ``TRITON_INTERPRET=1`` (fp32/fp16) and compiled for sm_90 with Triton 3.9; Triton 3.6 subset
(no block pointers, no ``break``, no libdevice).

Batch invariance: a program owns a ``[BM, BN]`` output tile and reduces K in fixed ``BK`` chunks, in order, with
one ``tl.dot`` shape. The tile configuration depends only on ``(N, K)`` (the launcher never looks at ``M``) and
``M`` is not specialised, so a row gets the same instruction sequence and the same partial-sum boundaries whether
it is alone (a 1-row decode, padded to the ``BM`` tile with masked zeros) or the 60th row of a verify.

Prologue (``HAS_NORM``): transformers' LlamaRMSNorm of each x row, ``w * (x * rsqrt(mean(x^2) + eps)).to(dtype)``.
The row's sum of squares comes either from ``NUM_SS`` partial sums written by the kernel that produced ``x`` (the
residual epilogue below, or the embedding gather), loaded as one ``[BM, NSS_P2]`` tile and added by ``tl.sum``
(:func:`_partials_rstd`), or (``NUM_SS == 0``) from a first pass over the row tile in fixed ``BK`` chunks.
Epilogues: ``+ bias``; ``SILU_MUL`` (W is ``[2N, K] = cat(gate, up)``: the program streams the matching gate rows
``n`` and up rows ``N + n`` and stores ``silu(gate) * up``); ``HAS_RES`` (``out = residual + y``); ``WRITE_SS``
(per row, the fp32 sum of squares of the tile's stored outputs: one partial per ``BN`` columns, so the next
RMSNorm needs no pass over the row). Intermediate roundings to the output dtype follow the eager PyTorch sequence
(linear output, silu, product, residual sum).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._prefetch import l2_prefetch_rows
from ..lm_head_topk.kernel import _pack_keys


@triton.jit
def _row_rstd(x_ptr, offs_m, m_mask, stride_xm, K, eps, BM: tl.constexpr, BK: tl.constexpr):
    """``rsqrt(mean(x^2) + eps)`` per row, the squares summed in fixed ``BK`` chunks (fp32)."""
    offs_k = tl.arange(0, BK)
    ss = tl.zeros([BM], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + offs_k
        xk = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + kk[None, :],
                     mask=m_mask[:, None] & (kk < K)[None, :], other=0.0).to(tl.float32)
        ss += tl.sum(xk * xk, 1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _partials_rstd(ss_ptr, offs_m, m_mask, stride_sm, K, eps, BM: tl.constexpr, NUM_SS: tl.constexpr,
                   NSS_P2: tl.constexpr):
    """``rsqrt(sum(partials) / K + eps)`` per row from an fp32 ``[M, NUM_SS]`` buffer with unit column stride.

    The row tile's partials are ONE ``[BM, NSS_P2]`` load (masked past ``NUM_SS`` and ``M``) and a ``tl.sum`` over
    the row: one L2 round trip, then in-thread adds and ``log2`` shuffle levels per program, instead of ``NUM_SS``
    dependent load+add steps (at Llama-8B, ``NUM_SS = 128``: 128 serialised round trips in every program of the
    q/k/v and gate/up products, whose 1024-2048 unrolled loads per thread also spilled 3-8 KiB of registers per thread
    on sm_90). Row-major partials make the tile's rows contiguous runs of ``4 * NUM_SS`` bytes (the whole tile is
    one run when its rows are consecutive), and the unit column stride is known to the compiler, so the load is
    16-byte vectors; the row stride (``NUM_SS``) does not depend on the row count. Memory: at most
    ``BM * NSS_P2 * 4`` bytes from L2 (32 KiB at ``BM = 64``, 128 partials; masked rows are not read, so a 1-row
    decode reads 512 B), against the program's ``BN * K`` weight bytes from HBM (512 KiB for q/k/v at 8B).

    The reduction order is fixed by the compiled kernel (tile shape, warps), never by ``M``: a row's norm is
    batch-invariant. It is not the same order in another kernel (the standalone RMSNorm) or in the interpreter. An
    explicit pairwise tree (``tl.reshape`` + ``tl.split`` levels) would be, but Triton 3.6 then lays out the q/k/v
    main loop so that it spills 2.4 KiB of registers per thread.

    Why not fewer, wider partials: a producing program knows only its own ``BN`` columns. Merging tiles' sums
    deterministically needs a wider producer tile (the o/down products' ``BN = 32`` was tuned to keep 128 programs
    streaming weights on 132 SMs) or an ordered cross-program reduction (atomics add in arrival order, so the bits
    would vary; a semaphore chain serialises the producers). Once the partials are one block load, their count
    costs ``4 * NUM_SS`` bytes per row from L2 and a few add levels, so there is little left to save."""
    offs_p = tl.arange(0, NSS_P2)
    v = tl.load(ss_ptr + offs_m[:, None].to(tl.int64) * stride_sm + offs_p[None, :],
                mask=m_mask[:, None] & (offs_p < NUM_SS)[None, :], other=0.0)
    return 1.0 / tl.sqrt(tl.sum(v, 1) / K + eps)


@triton.jit
def _k_chunk(acc, acc_u, x_rows, m_mask, kk, w, wu, rstd, nw_ptr, K, HAS_NORM: tl.constexpr,
             SILU_MUL: tl.constexpr, PRECISION: tl.constexpr, dt: tl.constexpr):
    """One ``BK`` chunk of the reduction: load (and normalise) the x tile, multiply by the weight tile(s)."""
    k_mask = kk < K
    xk = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
    if HAS_NORM:
        xn = (xk.to(tl.float32) * rstd[:, None]).to(dt)
        nw = tl.load(nw_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
        xk = (nw[None, :] * xn.to(tl.float32)).to(dt)
    acc = tl.dot(xk, tl.trans(w), acc, input_precision=PRECISION)
    if SILU_MUL:
        acc_u = tl.dot(xk, tl.trans(wu), acc_u, input_precision=PRECISION)
    return acc, acc_u


@triton.jit
def _mainloop(x_ptr, w_rows, u_rows, nw_ptr, sin_ptr, offs_m, m_mask, n_mask, K, stride_xm, stride_sin_m, eps,
              HAS_NORM: tl.constexpr, NUM_SS: tl.constexpr, NSS_P2: tl.constexpr, TWO: tl.constexpr,
              NORM_FOLDED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              PRECISION: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr, dt: tl.constexpr,
              L2_PRE: tl.constexpr = 0, ROTATE: tl.constexpr = False, tile=0):
    """The reduction of a ``[BM, BN]`` tile (and, with ``TWO``, of the second weight tile at ``u_rows``):
    weight chunks prefetched (``PRE``), the wait on the previous kernel (``PDL``), the row norms' ``rstd``, then
    ``K`` in fixed ``BK`` chunks. Returns ``(acc, acc_u, rstd)`` (fp32; ``rstd`` not yet applied when
    ``NORM_FOLDED``). Shared by every kernel whose rows must round as the products' do.

    ``L2_PRE`` (with ``PDL``): before the wait, ask L2 for the first ``L2_PRE`` chunks of the weight rows
    (:mod:`.._prefetch`; every row pointer must lie inside the weight, masked rows included): no registers, no
    stage, no bit changed.

    ``ROTATE``: the program of output tile ``tile`` reduces the chunks in the order ``r, r + 1, ..``, wrapping
    around, with ``r = tile % cdiv(K, BK)``, so that the programs running at one time read different chunks of
    the activations and of the weights' columns. The order depends on the tile only (never on ``M``): rows stay
    batch-invariant."""
    offs_k = tl.arange(0, BK)
    rot = 0
    k_first = 0
    if ROTATE:
        rot = tile % tl.cdiv(K, BK)
        k_first = rot * BK
    if PDL:
        if L2_PRE > 0:
            LINE: tl.constexpr = 1024 // w_rows.dtype.element_ty.primitive_bitwidth
            l2_prefetch_rows(w_rows + k_first, K - k_first, L2_PRE * BK, LINE)
            if TWO:
                l2_prefetch_rows(u_rows + k_first, K - k_first, L2_PRE * BK, LINE)
    # weights first: they do not depend on the previous kernel
    if PRE >= 1:
        k0_ = k_first + offs_k
        w0 = tl.load(w_rows + k0_[None, :], mask=n_mask[:, None] & (k0_ < K)[None, :], other=0.0)
        u0 = w0
        if TWO:
            u0 = tl.load(u_rows + k0_[None, :], mask=n_mask[:, None] & (k0_ < K)[None, :], other=0.0)
    if PRE >= 2:
        k1 = ((1 + rot) % tl.cdiv(K, BK)) * BK + offs_k
        w1 = tl.load(w_rows + k1[None, :], mask=n_mask[:, None] & (k1 < K)[None, :], other=0.0)
        u1 = w1
        if TWO:
            u1 = tl.load(u_rows + k1[None, :], mask=n_mask[:, None] & (k1 < K)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

    rstd = tl.zeros([BM], tl.float32)
    if NORM_FOLDED:  # a [BM] vector held through the loop (not the [BM, NSS_P2] tile: registers)
        rstd = _partials_rstd(sin_ptr, offs_m, m_mask, stride_sin_m, K, eps, BM, NUM_SS, NSS_P2)
    if HAS_NORM:
        if NUM_SS > 0:
            rstd = _partials_rstd(sin_ptr, offs_m, m_mask, stride_sin_m, K, eps, BM, NUM_SS, NSS_P2)
        else:
            rstd = _row_rstd(x_ptr, offs_m, m_mask, stride_xm, K, eps, BM, BK)

    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros([BM, BN], tl.float32)
    acc_u = tl.zeros([BM, BN], tl.float32)
    if PRE >= 1:
        acc, acc_u = _k_chunk(acc, acc_u, x_rows, m_mask, k_first + offs_k, w0, u0, rstd, nw_ptr, K, HAS_NORM,
                              TWO, PRECISION, dt)
    if PRE >= 2:
        if K > BK:  # a chunk past K is skipped, as the loop would
            acc, acc_u = _k_chunk(acc, acc_u, x_rows, m_mask, k1, w1, u1, rstd, nw_ptr, K, HAS_NORM, TWO,
                                  PRECISION, dt)
    for k0 in range(PRE * BK, K, BK):
        kc = k0
        if ROTATE:  # chunk (k0 / BK + rot) mod cdiv(K, BK). Kept inside one loop: a loop of its own under the
            # constexpr branch doubled the q/k/v kernel's shared memory on sm_90 (Triton 3.9), even untaken
            kc = k0 + rot * BK
            kc = tl.where(kc >= K, kc - tl.cdiv(K, BK) * BK, kc)
        acc, acc_u = _w_chunk(acc, acc_u, x_rows, w_rows, u_rows, m_mask, n_mask, kc + offs_k, rstd, nw_ptr,
                              K, HAS_NORM, TWO, PRECISION, dt)

    return acc, acc_u, rstd


@triton.jit
def _w_chunk(acc, acc_u, x_rows, w_rows, u_rows, m_mask, n_mask, kk, rstd, nw_ptr, K, HAS_NORM: tl.constexpr,
             TWO: tl.constexpr, PRECISION: tl.constexpr, dt: tl.constexpr):
    """One chunk of the main loop: load its weight tile(s), then :func:`_k_chunk`."""
    k_mask = kk < K
    w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    wu = w
    if TWO:
        wu = tl.load(u_rows + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    return _k_chunk(acc, acc_u, x_rows, m_mask, kk, w, wu, rstd, nw_ptr, K, HAS_NORM, TWO, PRECISION, dt)


#: The smallest int64: the key of a row no tile has reported yet (every real key is larger).
KEY_EMPTY = -(2 ** 63)
_KEY_EMPTY = tl.constexpr(KEY_EMPTY)


@triton.jit
def _argmax_key(y, cols, mask):
    """int64 keys ordering ``(value, column)`` pairs by value, then by lower column: the LM-head top-k's keys
    (:func:`~eagle_triton.ops.lm_head_topk.kernel._pack_keys`: -0.0 counted as +0.0, as comparisons do) of the
    values widened to fp32; ``KEY_EMPTY`` where ``mask`` is false."""
    return tl.where(mask, _pack_keys(y.to(tl.float32), cols.to(tl.int64)[None, :]), _KEY_EMPTY)


@triton.jit(do_not_specialize=["M"])
def _bi_linear_kernel(
    x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, y_ptr, sin_ptr, sout_ptr, key_ptr,
    M, N, K, stride_xm, stride_wn, stride_rm, stride_ym, stride_sin_m, stride_sout_m,
    eps,
    HAS_NORM: tl.constexpr, NUM_SS: tl.constexpr, NSS_P2: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    SILU_MUL: tl.constexpr, WRITE_SS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
    PRE: tl.constexpr = 0, PDL: tl.constexpr = False, NORM_FOLDED: tl.constexpr = False, L2_PRE: tl.constexpr = 0,
    ROTATE: tl.constexpr = False, ARGMAX: tl.constexpr = False, STORE_Y: tl.constexpr = True,
):
    """Grid ``(cdiv(M, BM), cdiv(N, BN))``: the M tiles of one weight tile are neighbours, so they share it in L2.

    The partial-sum buffers are row-major ``[M, P]`` with unit column stride (their row stride is ``P``: a new row
    count compiles nothing). The reader's ``[BM, P]`` tile is then contiguous; the writer's ``[BM]`` column is
    strided, but it writes each partial once where up to ``cdiv(N', BN')`` programs of the next product read it.

    ``PRE`` (0-2): the weight tiles of the first ``PRE`` chunks are loaded before anything that depends on the
    previous kernel; with ``PDL`` (programmatic dependent launch) the program then waits for the previous kernel
    (``gdc_wait``), so those loads overlap its tail and the launch. The chunks are reduced in the same order with
    the same tiles either way: ``PRE`` and ``PDL`` never change a bit of the result. ``L2_PRE`` (0, 1, 2, 4 or 8,
    with ``PDL``): the first ``L2_PRE`` weight chunks are asked of L2 instead (a hint, see :func:`_mainloop`).

    ``ROTATE``: each program starts its reduction at chunk ``pid_n % cdiv(K, BK)`` (see :func:`_mainloop`); a
    tile-configuration choice (it changes the bits, the same for every ``M``).

    ``ARGMAX``: each row's maximum over the tile's outputs (as rounded to the dtype) and its first column, packed
    into one int64 key (:func:`_argmax_key`), go into ``key_ptr[row]`` by ``atomic_max``: the largest key of the row
    over all tiles is its maximum with the first column holding it (``torch.argmax``), whatever order the tiles
    finish in. ``STORE_Y=False``: the outputs themselves are not stored (greedy decoding needs only the keys).

    ``NORM_FOLDED`` (with ``NUM_SS`` partials, without ``HAS_NORM``): the RMSNorm weight is folded into W (the
    launcher's caller stores ``W * norm_weight``) and each row's ``rstd`` scales the fp32 accumulator before the
    bias: x is streamed as is. The prologue's per-element normalisation of the ``[BM, BK]`` x tile (which a 1-row
    decode pays for all ``BM`` padded rows, in every chunk) disappears; the row's partials are one small load."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    m_mask = offs_m < M
    n_mask = offs_n < N
    dt = y_ptr.dtype.element_ty

    # rows past N (masked: never loaded) point at row N - 1, so that the L2 hints stay inside the weight
    n_in = tl.minimum(offs_n, N - 1)[:, None].to(tl.int64)
    w_rows = w_ptr + n_in * stride_wn
    u_rows = w_ptr + (n_in + N) * stride_wn  # the up half (SILU_MUL)
    acc, acc_u, rstd = _mainloop(x_ptr, w_rows, u_rows, nw_ptr, sin_ptr, offs_m, m_mask, n_mask, K, stride_xm,
                                 stride_sin_m, eps, HAS_NORM, NUM_SS, NSS_P2, SILU_MUL, NORM_FOLDED, BM, BN, BK,
                                 PRECISION, PRE, PDL, dt, L2_PRE, ROTATE, pid_n)

    if NORM_FOLDED:
        acc = acc * rstd[:, None]
        if SILU_MUL:
            acc_u = acc_u * rstd[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            acc_u += tl.load(b_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dt)
    if SILU_MUL:
        g = y.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt)
        y = (s.to(tl.float32) * acc_u.to(dt).to(tl.float32)).to(dt)
    out_mask = m_mask[:, None] & n_mask[None, :]
    if HAS_RES:
        r = tl.load(r_ptr + offs_m[:, None].to(tl.int64) * stride_rm + offs_n[None, :], mask=out_mask, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dt)
    if STORE_Y:
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], y, mask=out_mask)
    if ARGMAX:
        tl.atomic_max(key_ptr + offs_m, tl.max(_argmax_key(y, offs_n, out_mask), 1), mask=m_mask, sem="relaxed")
    if WRITE_SS:
        # the squares of the values as stored (the next RMSNorm reads the rounded residual stream)
        yf = tl.where(out_mask, y.to(tl.float32), 0.0)
        tl.store(sout_ptr + offs_m.to(tl.int64) * stride_sout_m + pid_n, tl.sum(yf * yf, 1),
                 mask=m_mask)


@triton.jit(do_not_specialize=["M"])
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, s_ptr, key_ptr, M, K, stride_xm, stride_ym, stride_s_m, eps,
                     BK: tl.constexpr, NUM_SS: tl.constexpr, NSS_P2: tl.constexpr, PDL: tl.constexpr = False,
                     RESET_KEY: tl.constexpr = False):
    """Standalone LlamaRMSNorm, one row per program, the same fixed ``BK`` chunk order as the linear prologue; with
    ``NUM_SS > 0`` the row's sum of squares is the sum of its partials (one pass over the row, not two), loaded as
    one ``[1, NSS_P2]`` block. ``RESET_KEY``: also set ``key_ptr[row]`` to ``KEY_EMPTY``, for the ``ARGMAX``
    product that reads this norm's output (after its PDL wait, so after this store)."""
    row = tl.program_id(0)
    offs_k = tl.arange(0, BK)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if RESET_KEY:
        tl.store(key_ptr + row, _KEY_EMPTY)
    if NUM_SS > 0:
        one = row + tl.arange(0, 1)
        rstd = _partials_rstd(s_ptr, one, one < M, stride_s_m, K, eps, 1, NUM_SS, NSS_P2)
    else:
        ss = tl.zeros([BK], tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + offs_k
            xk = tl.load(x_ptr + row.to(tl.int64) * stride_xm + kk, mask=kk < K, other=0.0).to(tl.float32)
            ss += xk * xk
        rstd = 1.0 / tl.sqrt(tl.sum(ss, 0) / K + eps)
    dt = y_ptr.dtype.element_ty
    for k0 in range(0, K, BK):
        kk = k0 + offs_k
        xk = tl.load(x_ptr + row.to(tl.int64) * stride_xm + kk, mask=kk < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        y = (w * (xk * rstd).to(dt).to(tl.float32)).to(dt)
        tl.store(y_ptr + row.to(tl.int64) * stride_ym + kk, y, mask=kk < K)


@triton.jit(do_not_specialize=["ids_ptr", "stride_ids"])
def _embedding_kernel(ids_ptr, w_ptr, y_ptr, s_ptr, V, H, W, P, stride_ids, stride_wv, stride_ym, stride_s_m,
                      WRITE_SS: tl.constexpr, BP: tl.constexpr, BW: tl.constexpr, PDL: tl.constexpr = False):
    """One row per program: ``y[row] = weight[ids[row]]`` and (``WRITE_SS``) the row's ``P`` partial sums of
    squares over consecutive ``W``-wide column chunks; the row is read as ``[BP, BW]`` tiles (chunk by column), so
    a decode row is one or a few loads, not ``P`` dependent round trips. ``ids`` is not specialised (a prefill
    chunk's ids may be a slice at any offset of the prompt)."""
    row = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tok = tl.load(ids_ptr + row * stride_ids).to(tl.int64)
    tl.device_assert((tok >= 0) & (tok < V), "token id out of the embedding's range")
    offs_p = tl.arange(0, BP)
    offs_w = tl.arange(0, BW)
    for p0 in range(0, P, BP):
        pp = p0 + offs_p
        cols = pp[:, None] * W + offs_w[None, :]
        mask = (pp < P)[:, None] & (offs_w < W)[None, :] & (cols < H)
        e = tl.load(w_ptr + tok * stride_wv + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row.to(tl.int64) * stride_ym + cols, e, mask=mask)
        if WRITE_SS:
            ef = e.to(tl.float32)
            tl.store(s_ptr + row.to(tl.int64) * stride_s_m + pp, tl.sum(ef * ef, 1), mask=pp < P)
