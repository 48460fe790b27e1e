"""Triton kernels of the batch-invariant target attention (decode, prefill chunks and tree verification).

Status: tested under ``TRITON_INTERPRET=1`` (fp32/fp16) and compiled for sm_90 with Triton 3.9; written to the
subset of Triton 3.6 (no block pointers, no ``break``, no libdevice).

**Reduction structure (the invariant).** Every key a query row sees has an absolute *position*: committed cache
row ``p`` has position ``p``; in causal mode new row ``j`` has position ``L + j``; in tree mode the ``d``-th
visible tree row of query ``i`` (its ancestors and itself, in index order) has position ``L + d``. A row at
position ``P`` sees exactly positions ``0..P``, one key each. Keys are reduced in blocks of ``BLOCK_N`` positions
aligned to absolute positions (the key at position ``p`` always sits in slot ``p % BLOCK_N``; masked slots give
exact zeros), blocks are grouped into splits of ``SPLIT_BLOCKS`` blocks at fixed positions, each split runs an
online softmax over its blocks in increasing order from a fresh state, and :func:`_merge_splits` merges the
splits of a row in split order, one at a time, wherever it runs. Every block update, whichever kernel runs it, is
:func:`_block_update` on tiles of the same shape (``BLOCK_M`` query rows x ``BLOCK_N`` keys x ``BLOCK_D``), so a
score and a P.V product come from the same instruction shape. A row's result therefore depends only on its query,
its keys in position order and the module's tile constants: not on how many rows run with it, nor on whether its
ancestors are tree rows (verify) or committed rows (the plain decode of the same token).

Kernels:

* :func:`_shared_kernel`: row tiles of ``BLOCK_M // GROUP`` tokens x the ``GROUP`` query heads of one KV head
  share each K/V block. Causal mode: every block up to the tile's last position (per-row causal mask). Tree mode:
  only the whole splits below the one holding block ``L // BLOCK_N`` (every key visible to every row); nothing
  for a context shorter than one split, so a short verify does not wait for it.
* :func:`_tree_kernel` (tree mode): ``TT`` tokens per program x one KV head, each token's group of heads in its
  own rows of the tile; runs the split holding block ``L // BLOCK_N`` from its start (its committed blocks once
  for all the program's rows, at most ``SPLIT_BLOCKS - 1`` of them) and the remaining blocks, gathering for each
  slot the cache row of its position (committed row, or the tree row of the ancestor at that depth, read from the
  tree's ancestor table).
* :func:`_ancestors_kernel`: the ancestor table of a tree mask, made once per tree (a forward passes it to every
  layer) instead of every tree-kernel program ranking its mask rows.
* :func:`_combine_kernel` (causal mode): ``out = sum_k 2^(c (m_k - M)) acc_k / sum_k 2^(c (m_k - M)) l_k`` over the
  row's splits, one split at a time (:func:`_merge_splits`); in tree mode the tree kernel merges its rows itself
  (the same function), so a verify is two launches (three with the table).

**Rows of one split** (``n_keys <= BLOCK_N * SPLIT_BLOCKS``: every row of a context shorter than one split) are
finished by the kernel that runs their last block (the causal shared kernel, or the tree kernel), as ``acc / l``
(:func:`_normalise`), and the combine leaves them alone: no partial state goes through memory and the combine of
a short context only reads the lengths. Which rows these are depends on the row's position only, so every path
finishes a given row the same way.

**Cache slots.** With ``HAS_SLOTS`` query sequence ``b`` reads the keys and the length of cache batch index
``slots[b]`` (loaded on the device, clamped to ``[0, NB)``), so one CUDA graph serves every slot of a larger cache;
queries, tree masks, partials and outputs stay indexed by ``b``. Without it the index is ``b`` and the code is the
same as before the option existed. Which cache index is read changes no arithmetic.

Scores are kept raw (``q.k``); the scale enters as ``exp2((s - m) * c)`` with ``c = scale * log2(e)``, a form the
backend cannot contract into an FMA (the launcher also compiles with ``enable_fp_fusion=False``).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _block_update(acc, m_i, l_i, q, k, v, vis, qk_scale, PRECISION: tl.constexpr):
    """One online-softmax step over a key block: ``q`` [M, D], ``k``/``v`` [N, D], ``vis`` [M, N] visibility.

    A block with no visible key for a row leaves that row's state bit-identical (alpha = 1, p = 0).
    """
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.where(m_new == m_i, 1.0, tl.exp2((m_i - m_safe) * qk_scale))
    p = tl.exp2((s - m_safe[:, None]) * qk_scale)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _mask_true(m, MASK_FLOAT: tl.constexpr):
    """Which loaded tree-mask cells are true: a bool mask's bytes ``!= 0``, a float mask's values ``> 0.5`` (compared
    in fp32: exact for every float dtype, and right under the interpreter, whose bf16 arithmetic is not)."""
    if MASK_FLOAT:
        return m.to(tl.float32) > 0.5
    else:
        return m != 0


@triton.jit
def _cache_index(slots_ptr, b, b64, NB, HAS_SLOTS: tl.constexpr):
    """Cache batch index of query sequence ``b`` and its int64: ``slots[b]`` clamped to ``[0, NB)`` (no read leaves
    the cache, whatever the device holds), or ``b`` itself without slots (then ``(b, b64)`` unchanged)."""
    if HAS_SLOTS:
        c = tl.minimum(tl.maximum(tl.load(slots_ptr + b), 0), NB - 1)
        return c, c.to(tl.int64)
    else:
        return b, b64


@triton.jit
def _store_state(acc_ptr, ml_ptr, acc, m_i, l_i, part_row, split, row_ok, offs_d, NSPLIT, BLOCK_D: tl.constexpr):
    """Write a split's raw state: ``acc`` to ``acc_ptr[part_row, split, :]``, ``(m, l)`` to ``ml_ptr[.., 0:2]``."""
    idx = part_row * NSPLIT + split
    tl.store(acc_ptr + idx[:, None] * BLOCK_D + offs_d[None, :], acc, mask=row_ok[:, None])
    tl.store(ml_ptr + idx * 2, m_i, mask=row_ok)
    tl.store(ml_ptr + idx * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _normalise(o, l_i):
    """``o / l`` per row (a row with no visible key has ``l = 0`` and ``o = 0``: zeros). The one division of a
    finished row, whether it had one split (its state as is) or several (:func:`_merge_splits`)."""
    return o / tl.where(l_i > 0.0, l_i, 1.0)[:, None]


@triton.jit
def _store_rows(o_ptr, out, b64, tok, h, row_ok, offs_d, d_mask, stride_ob, stride_ot, stride_oh):
    """Write finished rows ``out`` ``[R, BLOCK_D]`` (fp32) to ``o[b, tok, h, :]`` in the output dtype."""
    o_off = b64 * stride_ob + tok.to(tl.int64) * stride_ot + h * stride_oh
    tl.store(o_ptr + o_off[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_mask[None, :])


@triton.jit
def _merge_splits(acc_ptr, ml_ptr, first, n_split, k_max, offs_d, qk_scale, BLOCK_D: tl.constexpr):
    """``sum_k 2^(c (m_k - M)) acc_k / sum_k 2^(c (m_k - M)) l_k`` over splits ``0 .. n_split - 1`` of each row.

    ``first`` ``[R]``: each row's first partial (``part_row * NSPLIT``), ``n_split`` ``[R]``: its split count,
    ``k_max``: a bound on them (the loop's trip count). Splits are taken one at a time in split order with
    elementwise operations only (a row past its own count keeps its sums), so a row's bits depend on its partials
    alone: the same in the combine kernel and in the tree kernel, whatever their tiles or warps."""
    m_all = tl.full(n_split.shape, float("-inf"), tl.float32)
    for k in range(0, k_max):
        ok = k < n_split
        m_all = tl.maximum(m_all, tl.load(ml_ptr + (first + k) * 2, mask=ok, other=float("-inf")))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_tot = tl.zeros(n_split.shape, tl.float32)
    o = tl.zeros([n_split.shape[0], BLOCK_D], tl.float32)
    for k in range(0, k_max):
        ok = k < n_split
        m_k = tl.load(ml_ptr + (first + k) * 2, mask=ok, other=float("-inf"))
        l_k = tl.load(ml_ptr + (first + k) * 2 + 1, mask=ok, other=0.0)
        w = tl.exp2((m_k - m_safe) * qk_scale)
        a_k = tl.load(acc_ptr + (first + k)[:, None] * BLOCK_D + offs_d[None, :], mask=ok[:, None], other=0.0)
        l_tot = tl.where(ok, l_tot + l_k * w, l_tot)
        o = tl.where(ok[:, None], o + a_k * w[:, None], o)
    return _normalise(o, l_tot)


@triton.jit(do_not_specialize=["S", "NB"])
def _shared_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, slots_ptr, acc_ptr, ml_ptr, o_ptr,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kl, stride_kh,
    stride_vb, stride_vl, stride_vh,
    stride_ob, stride_ot, stride_oh,
    S, Hq, Lmax, NSPLIT, qk_scale, NB,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_BLOCKS: tl.constexpr,
    PRECISION: tl.constexpr, HAS_SLOTS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Splits over key blocks shared by a tile of tokens; grid ``(cdiv(S, BLOCK_M // GROUP), B * Hkv, Z)``.

    Program ``z`` of a (tile, KV head) handles splits ``z, z + Z, ...`` (which program runs a split does not
    change its arithmetic).
    """
    TPT: tl.constexpr = BLOCK_M // GROUP
    if PDL:  # programmatic dependent launch: wait for the kernels that wrote q and the cache
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    n_kv = Hq // GROUP
    b = pid_bh // n_kv
    kvh = pid_bh % n_kv
    b64 = b.to(tl.int64)
    c, c64 = _cache_index(slots_ptr, b, b64, NB, HAS_SLOTS)

    offs_r = tl.arange(0, BLOCK_M)
    tok = pid_t * TPT + offs_r // GROUP
    row_ok = (offs_r < TPT * GROUP) & (tok < S)
    tok = tl.where(row_ok, tok, 0)
    h = kvh * GROUP + offs_r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_off = b64 * stride_qb + tok.to(tl.int64) * stride_qt + h * stride_qh

    # Clamped so that no read leaves the cache even for out-of-range lengths (the host checks when it can).
    L = tl.minimum(tl.maximum(tl.load(seqlens_ptr + c).to(tl.int32), 0), Lmax - S)
    if CAUSAL:
        pos_row = L + tok  # row t sees positions 0..L+t
        hi = L + tl.minimum(S, (pid_t + 1) * TPT)  # positions < hi are loaded
        blk_end = tl.cdiv(hi, BLOCK_N)
    else:
        pos_row = tl.zeros([BLOCK_M], tl.int32) + (L - 1)  # committed positions only; the rest is the tree kernel's
        hi = L
        # whole splits below the one holding block L // BLOCK_N (the tree kernel runs that split from its start)
        blk_end = (L // BLOCK_N // SPLIT_BLOCKS) * SPLIT_BLOCKS
    n_split = tl.cdiv(blk_end, SPLIT_BLOCKS)

    k_base = k_ptr + c64 * stride_kb + kvh * stride_kh
    v_base = v_ptr + c64 * stride_vb + kvh * stride_vh
    part_row = (b64 * S + tok) * Hq + h
    for split in range(tl.program_id(2), n_split, tl.num_programs(2)):
        # q is loaded by programs with a split to run only: most of a decode's or short verify's programs have none
        q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_mask[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        j_lo = split * SPLIT_BLOCKS
        j_hi = tl.minimum(j_lo + SPLIT_BLOCKS, blk_end)
        for j in range(j_lo, j_hi):
            offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < hi
            kv_mask = n_ok[:, None] & d_mask[None, :]
            k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kl + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vl + offs_d[None, :], mask=kv_mask, other=0.0)
            vis = offs_n[None, :] <= pos_row[:, None]
            acc, m_i, l_i = _block_update(acc, m_i, l_i, q, k, v, vis, qk_scale, PRECISION)
        if CAUSAL:  # rows whose keys all lie in split 0 are finished here; the combine skips them
            single = (pos_row < BLOCK_N * SPLIT_BLOCKS) & (split == 0)
            _store_rows(o_ptr, _normalise(acc, l_i), b64, tok, h, row_ok & single, offs_d, d_mask, stride_ob,
                        stride_ot, stride_oh)
            _store_state(acc_ptr, ml_ptr, acc, m_i, l_i, part_row, split, row_ok & ~single, offs_d, NSPLIT, BLOCK_D)
        else:
            _store_state(acc_ptr, ml_ptr, acc, m_i, l_i, part_row, split, row_ok, offs_d, NSPLIT, BLOCK_D)


@triton.jit(do_not_specialize=["S"])
def _ancestors_kernel(mask_ptr, anc_ptr, S, stride_mb, stride_mi, stride_mj, BLOCK_S: tl.constexpr,
                      MASK_FLOAT: tl.constexpr, PDL: tl.constexpr = False):
    """``anc[b, i, d]``: the ``d``-th true column of ``tree_mask[b, i]`` (the token's ancestors and itself, in index
    order), -1 past them; grid ``(B * S,)``, one mask row per program. ``MASK_FLOAT``: cells ``> 0.5`` are true."""
    bi = tl.program_id(0)
    if PDL:  # programmatic dependent launch: wait for the kernel that wrote the mask
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = bi // S
    i = bi % S
    offs = tl.arange(0, BLOCK_S)
    m = tl.load(mask_ptr + b.to(tl.int64) * stride_mb + i * stride_mi + offs * stride_mj, mask=offs < S, other=0)
    m = _mask_true(m, MASK_FLOAT).to(tl.int32)
    rank = tl.cumsum(m, 0) - 1  # depth of each visible column
    hit = (m[None, :] != 0) & (rank[None, :] == offs[:, None])  # [depth, column]
    col = tl.sum(tl.where(hit, offs[None, :], 0), 1)
    anc = tl.where(offs < tl.sum(m, 0), col, -1)
    tl.store(anc_ptr + bi.to(tl.int64) * S + offs, anc, mask=offs < S)


@triton.jit
def _tree_table_rows(a_base, tok, row_ok, pid_t, offs_tt, L, j_lo, S, TT: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_S: tl.constexpr):
    """The ancestor-table rows a tree program reads up front: each tile row's token's whole row (its position) and,
    per token of the program (``offs_tt``), its ancestors at the tree positions of block ``j_lo`` (the first tree
    block, often the only one: its gathers then wait on nothing but q and the new rows)."""
    offs_s = tl.arange(0, BLOCK_S)
    arows = tl.load(a_base + tok[:, None] * S + offs_s[None, :], mask=row_ok[:, None] & (offs_s < S)[None, :],
                    other=-1)
    i_tt = pid_t * TT + offs_tt
    depth_lo = j_lo * BLOCK_N + tl.arange(0, BLOCK_N) - L
    col_lo = tl.load(a_base + i_tt[:, None] * S + depth_lo[None, :],
                     mask=((offs_tt < TT) & (i_tt < S))[:, None] & ((depth_lo >= 0) & (depth_lo < S))[None, :],
                     other=-1)
    return arows, col_lo


@triton.jit(do_not_specialize=["S", "NB"])
def _tree_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, slots_ptr, anc_ptr, acc_ptr, ml_ptr, o_ptr,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kl, stride_kh,
    stride_vb, stride_vl, stride_vh,
    stride_ob, stride_ot, stride_oh,
    S, Hq, Lmax, NSPLIT, qk_scale, NB,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    SPLIT_BLOCKS: tl.constexpr, PRECISION: tl.constexpr, TT: tl.constexpr = 1, HAS_SLOTS: tl.constexpr = False,
    PDL: tl.constexpr = False, TTP: tl.constexpr = 1, ANC_EARLY: tl.constexpr = False,
):
    """Blocks from ``L // BLOCK_N`` to each row's own position, ``TT`` tokens per program; grid
    ``(cdiv(S, TT), B * Hkv)``. ``anc_ptr``: the tree's ancestor table ``[B, S, S]`` int32
    (:func:`_ancestors_kernel`, made once per tree and read by every layer).

    Slot of position ``p``: cache row ``p`` if ``p < L``, else tree row ``L + anc[b, i, p - L]`` (-1: past the
    token's position). Token ``t`` of the program owns tile rows ``t * GROUP ..`` (its query heads) and gets its
    own gathered key block; the update runs on the whole tile with only those rows visible, which leaves the other
    rows' states as they were (:func:`_block_update`), so a row's arithmetic is the same for any ``TT`` (``TT`` sets
    how many gathers one program has in flight).

    Programmatic dependent launch: the lengths and the committed rows' first key block are read before waiting
    for the previous kernel (older than it: only q and the tree rows are its output), and so is the ancestor table
    with ``ANC_EARLY`` (a table the caller made before the previous kernel: a forward's, made once before its first
    layer); without it the table may be the previous kernel's output (the op's own table launch) and is read after
    the wait.
    """
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    n_kv = Hq // GROUP
    b = pid_bh // n_kv
    kvh = pid_bh % n_kv
    b64 = b.to(tl.int64)
    c, c64 = _cache_index(slots_ptr, b, b64, NB, HAS_SLOTS)

    offs_r = tl.arange(0, BLOCK_M)
    t_row = offs_r // GROUP  # the program's token of each tile row
    tok = pid_t * TT + t_row
    row_ok = (t_row < TT) & (tok < S)
    tok = tl.where(row_ok, tok, 0)
    h = kvh * GROUP + offs_r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    L = tl.minimum(tl.maximum(tl.load(seqlens_ptr + c).to(tl.int32), 0), Lmax - S)
    a_base = anc_ptr + b64 * S * S
    j_lo = L // BLOCK_N
    part_row = (b64 * S + tok) * Hq + h
    k_base = k_ptr + c64 * stride_kb + kvh * stride_kh
    v_base = v_ptr + c64 * stride_vb + kvh * stride_vh
    # The split holding block j_lo, from its start: its whole committed blocks are visible to every row (one update
    # for all the program's tokens, as the shared kernel would run them), then each token's gathered blocks. The
    # first committed block (if any) is loaded before the wait.
    j_first = (j_lo // SPLIT_BLOCKS) * SPLIT_BLOCKS
    offs_n = j_first * BLOCK_N + tl.arange(0, BLOCK_N)
    vis0 = tl.where(j_first < j_lo, offs_n < L, False)
    kv_mask = vis0[:, None] & d_mask[None, :]
    k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kl + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vl + offs_d[None, :], mask=kv_mask, other=0.0)
    # The ancestor table is read before the wait too when it is older than the previous kernel (ANC_EARLY: a
    # forward makes it before its first layer), after it when the previous kernel made it (a table made by this op)
    offs_tt = tl.arange(0, TTP)  # TTP: TT rounded up to a power of two
    if ANC_EARLY:
        arows, col_lo = _tree_table_rows(a_base, tok, row_ok, pid_t, offs_tt, L, j_lo, S, TT, BLOCK_N, BLOCK_S)
    if PDL:  # programmatic dependent launch: wait for the kernels that wrote q and the tree rows
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if not ANC_EARLY:
        arows, col_lo = _tree_table_rows(a_base, tok, row_ok, pid_t, offs_tt, L, j_lo, S, TT, BLOCK_N, BLOCK_S)
    # each row's position (its token's visible tree rows) and one past its last block (pos >= -1: no negative
    # division); at least block j_lo, so that a row seeing no tree row still ends in this kernel (its keys in j_lo
    # are all masked: the state is unchanged)
    pos_r = L + tl.sum((arows >= 0).to(tl.int32), 1) - 1
    j_end_r = tl.where(row_ok, tl.maximum((pos_r + BLOCK_N) // BLOCK_N, j_lo + 1), 0)
    j_end = tl.max(j_end_r, 0)
    q_off = b64 * stride_qb + tok.to(tl.int64) * stride_qt + h * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # a block no row sees leaves every state as it was (no committed block: j_first == j_lo)
    acc, m_i, l_i = _block_update(acc, m_i, l_i, q, k, v, vis0[None, :] & (offs_r >= 0)[:, None], qk_scale,
                                  PRECISION)
    for j in range(j_first + 1, j_lo):
        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kl + offs_d[None, :], mask=d_mask[None, :],
                    other=0.0)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vl + offs_d[None, :], mask=d_mask[None, :],
                    other=0.0)
        vis = (offs_n < L)[None, :] & (offs_r >= 0)[:, None]
        acc, m_i, l_i = _block_update(acc, m_i, l_i, q, k, v, vis, qk_scale, PRECISION)
    for j in range(j_lo, j_end):
        fresh = (j % SPLIT_BLOCKS) == 0
        if fresh & (j > j_lo):  # a split boundary inside the tail: close the rows' previous split
            _store_state(acc_ptr, ml_ptr, acc, m_i, l_i, part_row, j // SPLIT_BLOCKS - 1, row_ok & (j_end_r > j),
                         offs_d, NSPLIT, BLOCK_D)
        m_i = tl.where(fresh, float("-inf"), m_i)
        l_i = tl.where(fresh, 0.0, l_i)
        acc = tl.where(fresh, 0.0, acc)
        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        depth = offs_n - L
        for t in tl.static_range(TT):
            i = pid_t * TT + t
            # the token's ancestor at each tree position of the block (-1 past its own position): block j_lo's
            # from the rows read before the wait, a later block's loaded here
            later = tl.load(a_base + i * S + depth,
                            mask=(depth >= 0) & (depth < tl.where((i < S) & (j > j_lo), S, 0)), other=-1)
            tree_col = tl.where(j == j_lo, tl.sum(tl.where(offs_tt[:, None] == t, col_lo, 0), 0), later)
            # clamped: a corrupt table passed by a caller still reads inside the new rows
            krow = tl.where(offs_n < L, offs_n, L + tl.minimum(tree_col, S - 1)).to(tl.int64)
            n_ok = (offs_n < L) | (tree_col >= 0)
            kv_mask = n_ok[:, None] & d_mask[None, :]
            k = tl.load(k_base + krow[:, None] * stride_kl + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + krow[:, None] * stride_vl + offs_d[None, :], mask=kv_mask, other=0.0)
            vis = n_ok[None, :] & (t_row == t)[:, None]
            acc, m_i, l_i = _block_update(acc, m_i, l_i, q, k, v, vis, qk_scale, PRECISION)
        # rows whose last block this was: finished here when it is their only split, else their last state
        done = row_ok & (j_end_r == j + 1)
        if j < SPLIT_BLOCKS:
            _store_rows(o_ptr, _normalise(acc, l_i), b64, tok, h, done, offs_d, d_mask, stride_ob, stride_ot,
                        stride_oh)
        else:
            _store_state(acc_ptr, ml_ptr, acc, m_i, l_i, part_row, j // SPLIT_BLOCKS, done, offs_d, NSPLIT, BLOCK_D)
    # Rows of several splits: the earlier ones are the shared kernel's (a previous launch, complete) and this
    # program's own stores (visible to its threads after the barrier); merged as the combine kernel merges.
    n_split_r = tl.where(row_ok, (j_end_r - 1) // SPLIT_BLOCKS + 1, 0)
    k_max = (j_end - 1) // SPLIT_BLOCKS + 1
    if k_max > 1:
        tl.debug_barrier()
        out = _merge_splits(acc_ptr, ml_ptr, part_row * NSPLIT, n_split_r, k_max, offs_d, qk_scale, BLOCK_D)
        _store_rows(o_ptr, out, b64, tok, h, row_ok & (n_split_r > 1), offs_d, d_mask, stride_ob, stride_ot,
                    stride_oh)


@triton.jit(do_not_specialize=["S", "NB"])
def _combine_kernel(
    seqlens_ptr, slots_ptr, acc_ptr, ml_ptr, o_ptr,
    stride_ob, stride_ot, stride_oh,
    S, Hq, Lmax, NSPLIT, qk_scale, NB,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_BLOCKS: tl.constexpr, HAS_SLOTS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Causal rows of several splits: merge their split states in split order (:func:`_merge_splits`); grid
    ``(B * S, cdiv(Hq, BLOCK_H))``, ``BLOCK_H`` heads of one token per program. Rows of one split were finished
    by the shared kernel and are left alone. (A verify's rows are all finished by the tree kernel.)"""
    bi = tl.program_id(0)
    if PDL:  # programmatic dependent launch: wait for the split states
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    i = bi % S
    b = bi // S
    c, _ = _cache_index(slots_ptr, b, b, NB, HAS_SLOTS)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < Hq
    L = tl.minimum(tl.maximum(tl.load(seqlens_ptr + c).to(tl.int32), 0), Lmax - S)
    SPLIT: tl.constexpr = BLOCK_N * SPLIT_BLOCKS
    n_split = tl.cdiv(L + i + 1, SPLIT)
    n_split_h = tl.where(h_ok, offs_h * 0 + n_split, 0)
    todo = n_split_h > 1  # one split: finished by the shared kernel
    offs_d = tl.arange(0, BLOCK_D)
    first = (bi.to(tl.int64) * Hq + offs_h) * NSPLIT
    out = _merge_splits(acc_ptr, ml_ptr, first, n_split_h, tl.where(n_split > 1, n_split, 0), offs_d, qk_scale,
                        BLOCK_D)
    _store_rows(o_ptr, out, b.to(tl.int64), i + offs_h * 0, offs_h, todo, offs_d, offs_d < HEAD_DIM, stride_ob,
                stride_ot, stride_oh)
