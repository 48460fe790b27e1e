"""Triton kernels of greedy tree acceptance: split argmax of the target logits, then one walk of the tree paths.

Status: tested under ``TRITON_INTERPRET=1`` and compiled for sm_90 (Triton 3.9); Triton 3.6 subset.

* :func:`_argmax_split_kernel` (grid ``(B N, splits)``): the maximum of one ``BLOCK_V`` slice of a node's logits
  and its first index (values compared in fp32: an exact widening, so ties are the input's ties).
* :func:`_tree_accept_kernel` (grid ``(B, C)``, or ``(B, 1)`` without features): every program of a sequence
  reduces the split maxima to each node's argmax (the first index among the splits holding the maximum: torch's
  ``argmax``), or with ``KEYS`` unpacks it from the argmax keys a product wrote
  (:func:`~eagle_triton.ops.target_linear.target_linear`'s ``argmax_keys``), walks the root-to-leaf paths of
  ``retrieve_indices``, takes the longest prefix whose tokens equal their parent's argmax (the first such path on
  ties; tied paths share that prefix), and copies feature row ``c`` of the accepted path; program ``(b, 0)``
  writes the path, its length, the emitted tokens and the next draft's inputs. Every program of ``b`` writes the
  same argmax row into ``pred`` and reads it back after a block barrier (its own writes): the gathers of path
  nodes are then plain loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..lm_head_topk.kernel import _unpack_keys


@triton.jit
def _argmax_split_kernel(x_ptr, max_ptr, idx_ptr, N, V, S, stride_b, stride_n, BLOCK_V: tl.constexpr):
    """``max_ptr[m, s], idx_ptr[m, s]`` = maximum of row ``m = b N + n`` of ``x[b, n, s BLOCK_V : (s + 1) BLOCK_V]``
    and its first index."""
    m = tl.program_id(0)
    s = tl.program_id(1)
    offs = s * BLOCK_V + tl.arange(0, BLOCK_V)
    row = x_ptr + (m // N).to(tl.int64) * stride_b + (m % N).to(tl.int64) * stride_n
    x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    mx = tl.max(x, 0)
    first = tl.min(tl.where(x == mx, offs, V + BLOCK_V), 0)  # all -inf: the slice's first index
    tl.store(max_ptr + m * S + s, mx)
    tl.store(idx_ptr + m * S + s, first)


@triton.jit
def _tree_accept_kernel(
    tok_ptr, ri_ptr, max_ptr, idx_ptr, key_ptr, pred_ptr, feat_ptr,
    acc_idx_ptr, acc_len_ptr, tokens_ptr, out_feat_ptr, ids_ptr, num_new_ptr,
    N, R, C, S, W,
    stride_tb, stride_rb, stride_rr,
    stride_fb, stride_fn, stride_ob, stride_oc,
    stride_ab, stride_lb, stride_kb, stride_ib, stride_nb,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_W: tl.constexpr, FEATS: tl.constexpr, NEXT: tl.constexpr, KEYS: tl.constexpr = False,
):
    b = tl.program_id(0)
    cp = tl.program_id(1)
    b64 = b.to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    if KEYS:  # each node's argmax packed in an int64 key (target_linear's argmax_keys)
        _, pred = _unpack_keys(tl.load(key_ptr + b64 * N + offs_n, mask=offs_n < N, other=0))
    else:  # each node's argmax from its split maxima (first index among the splits that hold the maximum)
        offs_s = tl.arange(0, BLOCK_S)
        ns_mask = (offs_n[:, None] < N) & (offs_s[None, :] < S)
        part = (b64 * N + offs_n[:, None]) * S + offs_s[None, :]
        pm = tl.load(max_ptr + part, mask=ns_mask, other=float("-inf"))
        pi = tl.load(idx_ptr + part, mask=ns_mask, other=2147483647)
        mx = tl.max(pm, 1)
        pred = tl.min(tl.where(pm == mx[:, None], pi, 2147483647), 1).to(tl.int64)
    tl.store(pred_ptr + b64 * N + offs_n, pred, mask=offs_n < N)
    tl.debug_barrier()  # this program's own writes, read back below by other threads of the block

    offs_r = tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    rc_mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    ri_row = ri_ptr + b64 * stride_rb + offs_r[:, None] * stride_rr
    ri = tl.load(ri_row + offs_c[None, :], mask=rc_mask, other=-1)
    par = tl.load(ri_row + offs_c[None, :] - 1, mask=rc_mask & (offs_c[None, :] >= 1), other=-1)
    node = tl.minimum(tl.maximum(ri, 0), N - 1)
    pnode = tl.minimum(tl.maximum(par, 0), N - 1)
    cand = tl.load(tok_ptr + b64 * stride_tb + node, mask=ri >= 0, other=-1)
    ppred = tl.load(pred_ptr + b64 * N + pnode, mask=par >= 0, other=-2)
    match = (ri >= 0) & (par >= 0) & (cand == ppred)
    bad = (~match) & (offs_c[None, :] >= 1)
    lens = tl.min(tl.where(bad, offs_c[None, :], BLOCK_C), 1) - 1  # leading matches after the root
    lens = tl.where(offs_r < R, lens, -1)
    accept_len = tl.max(lens, 0)
    best = tl.min(tl.where(lens == accept_len, offs_r, BLOCK_R), 0)
    path = tl.sum(tl.where(offs_r[:, None] == best, ri, 0), 0)  # [BLOCK_C]
    keep = (offs_c <= accept_len) & (offs_c < C)
    acc_index = tl.where(keep, path, -1)
    if cp == 0:
        pnode_path = tl.minimum(tl.maximum(path, 0), N - 1)
        tok = tl.load(pred_ptr + b64 * N + pnode_path, mask=keep, other=-1)
        tl.store(acc_idx_ptr + b64 * stride_ab + offs_c, acc_index, mask=offs_c < C)
        tl.store(tokens_ptr + b64 * stride_kb + offs_c, tok, mask=offs_c < C)
        tl.store(acc_len_ptr + b64 * stride_lb, accept_len.to(tl.int64))
        if NEXT:  # the next draft's inputs: tokens with the padding as 0, and the rows it ingests
            tl.store(ids_ptr + b64 * stride_ib + offs_c, tl.maximum(tok, 0), mask=offs_c < C)
            tl.store(num_new_ptr + b64 * stride_nb, (accept_len + 1).to(tl.int32))
    if FEATS:  # feature row cp of the accepted path (the root's for the padding columns, as a clamped gather)
        row = tl.maximum(tl.sum(tl.where(offs_c == cp, acc_index, 0), 0), 0)
        src = feat_ptr + b64 * stride_fb + row * stride_fn
        dst = out_feat_ptr + b64 * stride_ob + cp * stride_oc
        for w0 in range(0, W, BLOCK_W):
            offs_w = w0 + tl.arange(0, BLOCK_W)
            tl.store(dst + offs_w, tl.load(src + offs_w, mask=offs_w < W), mask=offs_w < W)
