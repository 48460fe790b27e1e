"""PyTorch reference of sgl-kernel's ``build_tree_kernel_efficient`` (the specification of the Triton op).

Vectorised over the batch and the tree (no Python loop over data, no host sync), so it is also a fair timing
baseline. Semantics, per request ``b`` with ``sel = selected_index[b]`` (``D - 1`` ascending flattened draft-score
indices), ``par = parent_list[b]`` and ``L = verified_seq_len[b]``:

* Node ``i`` (1..D-1) is ``sel[i-1]``. Its parent is the root when ``sel[i-1] // topk == 0`` (C-style truncating
  division); otherwise the parent's flattened index is ``par[sel[i-1] // topk]`` and the parent node is
  ``1 + j`` for the first ``j < D - 1`` with ``sel[j] == that index``. The scan never leaves the row. A parent
  that is not found (ties or NaN in the draft scores, or an out-of-range ``par`` index) leaves the node
  unlinked, as sgl-kernel does after its "invalid eagle tree" warning.
* ``retrive_index[b, i] = b * D + i``; ``retrive_next_token[b, p]`` = the smallest child of ``p`` and
  ``retrive_next_sibling[b, i]`` = the next larger child of ``i``'s parent (head insertion in descending node
  order). Links that do not exist are **not written** (callers pre-fill -1).
* Mask row ``t``: the root column is set, the node columns 1..D-1 are cleared, then for ``t > 0`` the node and its
  ancestors are set, walking at most ``depth`` nodes and stopping at the root or at a missing parent.
  ``positions[b*D + t] = L + (number of nodes walked)`` (``L`` for the root).
* FULL_MASK: row ``t`` starts at ``D*D*b + D*sum(L[:b]) + (L + D)*t``; columns ``[0, L)`` (the prefix) are never
  written. QLEN_ONLY: row ``(b*D + t)`` of ``D`` cells. QLEN_ONLY_BITPACKING: ``nb`` = 1/2/4 little-endian bytes per
  row; byte 0 is assigned (root bit set), the other bytes are OR-ed into what the buffer holds (callers zero it).
  Writes that would fall past the end of ``tree_mask`` are dropped.
"""

from __future__ import annotations

import torch

from ._checks import FULL_MASK, QLEN_ONLY, check_build_tree_args, packed_bytes_per_row

__all__ = ["build_tree_kernel_efficient_ref", "tree_parents_ref"]


def tree_parents_ref(parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int) -> torch.Tensor:
    """Parent node of every node, as the tree builder resolves it: ``[bs, D]`` int64.

    Node 0 (the root) gets -1; a node whose parent is missing also gets -1; level-1 nodes get 0.
    """
    bs, n = selected_index.shape
    dev = selected_index.device
    P = parent_list.shape[1]
    sel = selected_index
    ptb = torch.div(sel, topk, rounding_mode="trunc")
    is_root = ptb == 0
    ok = (ptb > 0) & (ptb < P)
    if P > 0:
        tgt = parent_list.gather(1, ptb.clamp(0, P - 1))
    else:
        tgt = torch.zeros_like(sel)
    eq = (sel.unsqueeze(1) == tgt.unsqueeze(2)) & ok.unsqueeze(2)  # [bs, node i-1, candidate j]
    found = eq.any(2)
    first = eq.to(torch.int8).argmax(2)  # first True (argmax returns the first maximal index)
    parent = torch.where(is_root, torch.zeros_like(sel), torch.where(found, first + 1, torch.full_like(sel, -1)))
    root = torch.full((bs, 1), -1, dtype=torch.int64, device=dev)
    return torch.cat([root, parent], dim=1)


def build_tree_kernel_efficient_ref(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Reference of :func:`eagle_triton.ops.build_tree_kernel_efficient` (same signature, same in-place writes)."""
    mode = check_build_tree_args(
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
        retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
    )
    bs, D = verified_seq_len.shape[0], draft_token_num
    dev = verified_seq_len.device
    if bs == 0:
        return
    nodes = torch.arange(D, device=dev)
    parent = tree_parents_ref(parent_list, selected_index, topk)  # [bs, D]

    # Retrieval links: only existing links are written.
    retrive_index.copy_(torch.arange(bs, device=dev).unsqueeze(1) * D + nodes)
    child_of = parent.unsqueeze(1) == nodes.view(1, D, 1)  # [bs, p, child]
    first_child = torch.where(child_of, nodes.view(1, 1, D), D).min(2).values
    retrive_next_token.copy_(torch.where(first_child < D, first_child, retrive_next_token))
    same = (parent.unsqueeze(2) == parent.unsqueeze(1)) & (parent >= 0).unsqueeze(2)
    same &= nodes.view(1, 1, D) > nodes.view(1, D, 1)  # [bs, i, larger sibling i']
    next_sib = torch.where(same, nodes.view(1, 1, D), D).min(2).values
    retrive_next_sibling.copy_(torch.where(next_sib < D, next_sib, retrive_next_sibling))

    # Ancestor walk, at most `depth` nodes, stopping at the root or at a missing parent.
    walk_parent = torch.where(parent >= 1, parent, torch.full_like(parent, -1))
    cur = nodes.expand(bs, D).clone()
    active = (nodes >= 1).expand(bs, D).clone()
    anc = torch.zeros(bs, D, D, dtype=torch.bool, device=dev)
    depth_count = torch.zeros(bs, D, dtype=torch.int64, device=dev)
    for _ in range(depth):
        anc |= (nodes.view(1, 1, D) == cur.unsqueeze(2)) & active.unsqueeze(2)
        depth_count += active.long()
        nxt = walk_parent.gather(1, cur)
        active &= nxt >= 1
        cur = torch.where(active, nxt, cur)
    rows = anc.clone()
    rows[:, :, 0] = True  # root column of every row

    L = verified_seq_len
    positions.view(-1).copy_((L.unsqueeze(1) + depth_count).reshape(-1))

    flat = tree_mask.view(-1)
    if mode in (FULL_MASK, QLEN_ONLY):
        if mode == FULL_MASK:
            prefix = torch.cumsum(L, 0) - L
            start = D * D * torch.arange(bs, device=dev) + D * prefix
            row_start = start.unsqueeze(1) + (L + D).unsqueeze(1) * nodes + L.unsqueeze(1)  # root cell of row t
        else:
            row_start = (torch.arange(bs, device=dev).unsqueeze(1) * D + nodes) * D
        idx = row_start.unsqueeze(2) + nodes.view(1, 1, D)  # [bs, t, c]
        _scatter_bounded(flat, idx, rows)
    else:
        nb = packed_bytes_per_row(D)
        flat8 = tree_mask.view(-1).view(torch.uint8)
        word = (rows.long() << nodes.view(1, 1, D)).sum(2)  # [bs, t]
        row_byte = (torch.arange(bs, device=dev).unsqueeze(1) * D + nodes) * nb
        for k in range(nb):
            byte = (word >> (8 * k)) & 0xFF
            idx = row_byte + k
            if k == 0:
                _scatter_bounded(flat8, idx, byte.to(torch.uint8))
            else:
                old = flat8[idx.clamp(max=flat8.numel() - 1)].long()
                _scatter_bounded(flat8, idx, (old | byte).to(torch.uint8))


def _scatter_bounded(flat: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> None:
    """``flat[idx] = values`` dropping indices past the end (no host sync: out-of-range writes go to a spare cell)."""
    n = flat.numel()
    ext = torch.cat([flat, flat.new_zeros(1)])
    safe = torch.where(idx < n, idx, torch.full_like(idx, n))
    ext[safe.reshape(-1)] = values.reshape(-1).to(flat.dtype)
    flat.copy_(ext[:n])
