"""Triton kernel of sgl-kernel's ``build_tree_kernel_efficient`` (all three tree mask modes).

Status: tested against :mod:`.reference` under ``TRITON_INTERPRET=1`` (Triton 3.9) and compiled for sm_90; GPU runs
use Triton 3.6. One program per request builds everything in registers: the node vector has ``BLOCK_D`` lanes
(``D`` padded to a power of two) and the parent search, the child/sibling links and the ancestor walk are
``BLOCK_D x BLOCK_D`` compare-and-reduce steps instead of sgl-kernel's per-thread serial scans. The parent scan
covers exactly the ``D - 1`` entries of the request's ``selected_index`` row and the walk is capped at ``depth``
nodes, so malformed input (missing or cyclic parents) cannot read past a row or loop forever.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _build_tree_kernel(
    parent_list_ptr,  # [bs, P] int64
    selected_index_ptr,  # [bs, D-1] int64
    verified_seq_len_ptr,  # [bs] int64
    tree_mask_ptr,  # bool cells (modes 0/1) or uint8 bytes (mode 2)
    positions_ptr,  # [bs*D] int64
    retrive_index_ptr,  # [bs, D] int64
    retrive_next_token_ptr,
    retrive_next_sibling_ptr,
    stride_par,
    stride_sel,
    P,
    topk,
    depth,
    D,
    mask_numel,
    MODE: tl.constexpr,  # 0 FULL_MASK, 1 QLEN_ONLY, 2 QLEN_ONLY_BITPACKING
    NB: tl.constexpr,  # bytes per packed row (mode 2)
    BLOCK_D: tl.constexpr,
    BLOCK_BS: tl.constexpr,
):
    """Tree links, ancestor-mask rows and RoPE positions for request ``program_id(0)`` (SGLANG_KERNELS.md 2.3)."""
    i_b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    is_node = (offs >= 1) & (offs < D)
    # Node i is selected_index[b, i - 1].
    sel = tl.load(selected_index_ptr + i_b * stride_sel + offs - 1, mask=is_node, other=-1)
    # C-style truncating division, as the CUDA kernel computes it.
    ptb = tl.where(sel >= 0, sel // topk, -((-sel) // topk))
    is_root_child = is_node & (ptb == 0)
    has_par = is_node & (ptb > 0) & (ptb < P)
    tgt = tl.load(parent_list_ptr + i_b * stride_par + ptb, mask=has_par, other=-1)
    # First node i2 with sel[i2] == tgt[i] (rows: node i, columns: candidate parent i2).
    eq = (sel[None, :] == tgt[:, None]) & has_par[:, None] & is_node[None, :]
    first = tl.min(tl.where(eq, offs[None, :], BLOCK_D), axis=1)
    parent = tl.where(is_root_child, 0, tl.where(first < BLOCK_D, first, -1))

    # Retrieval links (only existing links are written; the caller pre-fills -1).
    row_off = i_b * D + offs
    tl.store(retrive_index_ptr + row_off, row_off, mask=offs < D)
    child_of = parent[None, :] == offs[:, None]  # rows: parent p, columns: child
    first_child = tl.min(tl.where(child_of, offs[None, :], BLOCK_D), axis=1)
    tl.store(retrive_next_token_ptr + row_off, first_child.to(tl.int64), mask=(offs < D) & (first_child < BLOCK_D))
    same = (parent[None, :] == parent[:, None]) & (parent[:, None] >= 0) & (offs[None, :] > offs[:, None])
    next_sib = tl.min(tl.where(same, offs[None, :], BLOCK_D), axis=1)
    tl.store(retrive_next_sibling_ptr + row_off, next_sib.to(tl.int64), mask=(offs < D) & (next_sib < BLOCK_D))

    # Ancestor walk, at most `depth` nodes, stopping at the root or at a missing parent.
    walk_parent = tl.where(parent >= 1, parent, -1)
    cur = offs
    active = is_node
    anc = (offs[:, None] < 0) & (offs[None, :] < 0)  # all False, [BLOCK_D, BLOCK_D]
    count = tl.zeros([BLOCK_D], dtype=tl.int64)
    for _ in range(depth):
        hit = offs[None, :] == cur[:, None]
        anc = anc | (hit & active[:, None])
        count += active.to(tl.int64)
        nxt = tl.sum(tl.where(hit, walk_parent[None, :], 0), axis=1)
        active = active & (nxt >= 1)
        cur = tl.where(active, nxt, cur)
    rows = anc | (offs[None, :] == 0)

    seq_len = tl.load(verified_seq_len_ptr + i_b)
    tl.store(positions_ptr + row_off, seq_len + count, mask=offs < D)

    valid = (offs[:, None] < D) & (offs[None, :] < D)
    if MODE == 0:
        prefix = tl.zeros([BLOCK_BS], dtype=tl.int64)
        for start in range(0, i_b, BLOCK_BS):
            o = start + tl.arange(0, BLOCK_BS)
            prefix += tl.load(verified_seq_len_ptr + o, mask=o < i_b, other=0)
        row_start = D * D * i_b + D * tl.sum(prefix, axis=0) + (seq_len + D) * offs + seq_len
        cell = row_start[:, None] + offs[None, :]
        tl.store(tree_mask_ptr + cell, rows, mask=valid & (cell < mask_numel))
    elif MODE == 1:
        cell = (i_b * D + offs[:, None]) * D + offs[None, :]
        tl.store(tree_mask_ptr + cell, rows, mask=valid & (cell < mask_numel))
    else:
        bit = tl.full([BLOCK_D], 1, tl.int64) << offs.to(tl.int64)
        word = tl.sum(tl.where(rows & valid, bit[None, :], 0), axis=1)
        byte_off = (i_b * D + offs) * NB
        for k in tl.static_range(NB):
            byte = (word >> (8 * k)) & 0xFF
            m = (offs < D) & (byte_off + k < mask_numel)
            if k == 0:
                tl.store(tree_mask_ptr + byte_off, byte.to(tl.uint8), mask=m)
            else:
                old = tl.load(tree_mask_ptr + byte_off + k, mask=m, other=0).to(tl.int64)
                tl.store(tree_mask_ptr + byte_off + k, (old | byte).to(tl.uint8), mask=m)
