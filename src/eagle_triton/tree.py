"""EAGLE-2 tree selection and tree buffers, built with tensor operations (no host synchronisation).

Everything here is batched over a leading dimension ``B``; batch 1 reproduces SafeAILab EAGLE's ``topK_genrate``
post-processing exactly (reference/EAGLE_ALGORITHM.md section 2.3).

Tie rule: candidates are ranked by (score descending, global index ascending). A child's cumulative score is its
parent's plus a log-probability <= 0, and floating-point addition is monotonic, so a child never outranks its
parent: when they tie, the parent wins on its smaller index. Hence every selected node's parent is selected, for
any scores (NaN scores are treated as -inf first). The same rule picks each level's frontier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

__all__ = [
    "DraftTree",
    "frontier_parent_offset",
    "rank_topk",
    "select_tree_nodes",
    "selected_parents",
    "build_tree_buffers",
    "lexicographic_row_order",
]


def rank_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` along the last dim by (score desc, index asc): ``(values, indices)``, best first.

    Equal to ``torch.topk`` whenever the top ``k`` scores are distinct; deterministic on ties.
    """
    clean = torch.nan_to_num(scores, nan=float("-inf"))
    values, indices = torch.sort(clean, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def frontier_parent_offset(level: int, top_k: int) -> int:
    """What to add to a frontier slot (``0..K-1``) expanded at ``level`` to get its parent's entry in
    ``parents_flat`` (a global candidate index + 1; 0 is the root).

    The candidates are laid out as in SafeAILab EAGLE's ``topK_genrate``: the root's ``K`` children (global
    ``0..K-1``), then one ``K * K`` block per later level. Level 0's frontier is the root's children, so its
    parents sit at ``1 + slot``; level ``i > 0`` expands children from block ``i - 1``, which starts at
    ``K + K * K * (i - 1)``. Every drafter records ``parents_flat`` with this one formula.
    """
    return 1 + top_k * top_k * max(0, level - 1) + (top_k if level > 0 else 0)


def select_tree_nodes(scores_flat: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Global candidate indices of the ``num_nodes`` best candidates, sorted ascending (the tree order).

    scores_flat: ``[B, N]`` cumulative log-probabilities of all candidates (``N = K + D * K**2``).
    Returns ``[B, num_nodes]`` int64.
    """
    _, idx = rank_topk(scores_flat, num_nodes)
    return torch.sort(idx, dim=-1).values


def selected_parents(selected: torch.Tensor, parents_flat: torch.Tensor, top_k: int) -> torch.Tensor:
    """Tree-node index of each node's parent: ``[B, T+1]``, -1 for the root (node 0), 0 for level-1 nodes.

    selected: ``[B, T]`` ascending global candidate indices. parents_flat: ``[B, 1 + D*K]``, the reference's
    ``parents_list`` concatenated: entry ``g // K`` holds candidate ``g``'s parent as a global index + 1 (0 = root).
    """
    p = parents_flat.gather(1, selected // top_k)  # global index + 1 of the parent, 0 for the root
    pos = torch.searchsorted(selected, p - 1)  # where the parent sits among the selected nodes
    node_parent = torch.where(p == 0, torch.zeros_like(pos), pos + 1)
    root = torch.full_like(node_parent[:, :1], -1)
    return torch.cat([root, node_parent], dim=1)


def lexicographic_row_order(rows: torch.Tensor) -> torch.Tensor:
    """Row permutation sorting ``[B, R, C]`` rows lexicographically, -1 counting as larger than any index.

    Least-significant-column-first stable sorts (radix style), so it needs no host synchronisation.
    """
    B, R, C = rows.shape
    big = torch.iinfo(rows.dtype).max
    keys = torch.where(rows < 0, torch.full_like(rows, big), rows)
    order = torch.arange(R, device=rows.device).expand(B, R)
    for c in range(C - 1, -1, -1):
        col = keys[:, :, c].gather(1, order)
        perm = torch.sort(col, dim=1, stable=True).indices
        order = order.gather(1, perm)
    return order


def build_tree_buffers(parents: torch.Tensor, max_levels: int, sampling: bool = False):
    """Ancestor mask, depths and retrieve indices from parent pointers.

    parents: ``[B, T+1]`` int64, node 0 is the root (parent -1); every other node's parent has a smaller index.
    max_levels: upper bound on the deepest level (``depth + 1`` for a drafter tree).
    Returns ``(tree_mask [B, T+1, T+1] bool, positions [B, T+1], retrieve [B, T, max_levels + 1], num_leaves [B],
    max_depth [B])``. ``retrieve`` holds one root-to-leaf path per leaf, in ascending leaf order (or lexicographic
    order when ``sampling``), right-padded with -1; rows past ``num_leaves`` are all -1.
    """
    B, N = parents.shape
    T = N - 1
    dev = parents.device
    nodes = torch.arange(N, device=dev)
    anc = torch.eye(N, dtype=torch.bool, device=dev).expand(B, N, N).clone()
    anc[:, :, 0] = True
    cur = parents
    for _ in range(max_levels):  # pointer chasing: one level of ancestors per pass, bounded by the depth
        valid = cur >= 0
        hit = torch.zeros_like(anc)
        hit.scatter_(2, cur.clamp(min=0).unsqueeze(-1), valid.unsqueeze(-1))
        anc |= hit
        cur = torch.where(valid, parents.gather(1, cur.clamp(min=0)), cur)
    positions = anc.sum(-1) - 1

    is_parent = torch.zeros(B, N, dtype=torch.bool, device=dev)
    is_parent.scatter_(1, parents[:, 1:].clamp(min=0), True)
    is_leaf = ~is_parent
    is_leaf[:, 0] = False
    num_leaves = is_leaf.sum(-1)
    C = max_levels + 1
    # Scatter every (leaf, ancestor) pair to (leaf rank, ancestor depth); non-pairs go to a dropped trash cell.
    rank = torch.where(is_leaf, is_leaf.cumsum(-1) - 1, torch.full_like(positions, T))
    pair = anc & is_leaf.unsqueeze(-1)
    row = rank.unsqueeze(-1).expand(B, N, N)
    col = torch.where(pair, positions.unsqueeze(1).expand(B, N, N), torch.full_like(row, C))
    flat = torch.where(pair, row * (C + 1) + col, torch.full_like(row, T * (C + 1) + C))
    out = torch.full((B, (T + 1) * (C + 1)), -1, dtype=torch.long, device=dev)
    src = nodes.view(1, 1, N).expand(B, N, N)
    out.scatter_(1, flat.reshape(B, -1), src.reshape(B, -1))
    retrieve = out.view(B, T + 1, C + 1)[:, :T, :C].contiguous()
    if sampling:
        order = lexicographic_row_order(retrieve)
        retrieve = retrieve.gather(1, order.unsqueeze(-1).expand(B, T, C))
    return anc, positions, retrieve, num_leaves, positions.max(-1).values


@dataclass
class DraftTree:
    """One draft tree per sequence, in SafeAILab EAGLE's buffer layout (batched over a leading ``B``).

    Attributes
    ----------
    draft_tokens: ``[B, T+1]`` int64 target-vocab ids; node 0 is the root (the last sampled token).
    tree_mask: ``[B, 1, T+1, T+1]`` float; ``1`` where column is an ancestor-or-self of the row.
    positions: ``[B, T+1]`` int64 node depths (root 0): add the sequence length for target RoPE positions.
    parents: ``[B, T+1]`` int64 parent node of each node (-1 for the root).
    retrieve_indices_padded: ``[B, T, depth + 2]`` int64 root-to-leaf paths, -1 padded in both dims.
    num_leaves, max_depth: ``[B]`` int64 device tensors (``R`` and ``C - 1`` of the exact retrieve indices).
    sampling: whether rows are in lexicographic order (for sampling verification) rather than leaf order.
    """

    draft_tokens: torch.Tensor
    tree_mask: torch.Tensor
    positions: torch.Tensor
    parents: torch.Tensor
    retrieve_indices_padded: torch.Tensor
    num_leaves: torch.Tensor
    max_depth: torch.Tensor
    sampling: bool = False

    @property
    def batch_size(self) -> int:
        return self.draft_tokens.shape[0]

    @property
    def tree_position_ids(self) -> torch.Tensor:
        """``[T+1]`` for batch 1 (the reference's shape), else ``[B, T+1]``."""
        return self.positions[0] if self.batch_size == 1 else self.positions

    @property
    def retrieve_indices(self) -> torch.Tensor:
        """Exact ``[R, C]`` retrieve indices of a batch-1 tree. Trimming reads two scalars from the device (a
        host sync); hot paths use :attr:`retrieve_indices_padded` instead."""
        if self.batch_size != 1:
            raise ValueError("retrieve_indices is defined per sequence; use retrieve_indices_padded for a batch")
        r, c = int(self.num_leaves[0]), int(self.max_depth[0]) + 1
        return self.retrieve_indices_padded[0, :r, :c]

    def in_sampling_order(self) -> DraftTree:
        """This tree with its retrieve rows in lexicographic order (what sampling verification walks), no host
        synchronisation; the tree itself when it is already in that order."""
        if self.sampling:
            return self
        rows = self.retrieve_indices_padded
        order = lexicographic_row_order(rows)
        return replace(self, retrieve_indices_padded=rows.gather(1, order.unsqueeze(-1).expand_as(rows)),
                       sampling=True)

    @classmethod
    def from_selection(
        cls,
        root_tokens: torch.Tensor,
        tokens_flat: torch.Tensor,
        selected: torch.Tensor,
        parents_flat: torch.Tensor,
        top_k: int,
        max_levels: int,
        sampling: bool = False,
    ) -> DraftTree:
        """Assemble the buffers from the drafter's candidates: ``root_tokens [B]``, ``tokens_flat [B, N]``
        (target ids of every candidate), ``selected [B, T]`` (ascending) and ``parents_flat [B, 1 + D*K]``."""
        parents = selected_parents(selected, parents_flat, top_k)
        mask, positions, retrieve, num_leaves, max_depth = build_tree_buffers(parents, max_levels, sampling)
        draft_tokens = torch.cat([root_tokens.view(-1, 1), tokens_flat.gather(1, selected)], dim=1)
        return cls(
            draft_tokens=draft_tokens,
            tree_mask=mask.unsqueeze(1).float(),
            positions=positions,
            parents=parents,
            retrieve_indices_padded=retrieve,
            num_leaves=num_leaves,
            max_depth=max_depth,
            sampling=sampling,
        )
