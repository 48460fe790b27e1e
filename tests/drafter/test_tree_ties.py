"""Tie rule of the tree selection: (score desc, global index asc), so a node is never selected without its parent."""

import pytest
import torch

from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.drafter import build_tree_buffers, rank_topk, select_tree_nodes, selected_parents
from eagle_triton.testing import random_eagle1_head


def test_rank_topk_matches_torch_topk_without_ties():
    for n, k in [(1, 1), (7, 3), (100, 10), (710, 59)]:
        x = torch.randn(3, n)
        v, i = rank_topk(x, k)
        tv, ti = torch.topk(x, k)
        assert torch.equal(v, tv) and torch.equal(i, ti)


def test_rank_topk_breaks_ties_by_lower_index_and_nan_last():
    x = torch.tensor([[0.5, 1.0, 1.0, float("nan"), 1.0, -2.0]])
    v, i = rank_topk(x, 5)
    assert i.tolist() == [[1, 2, 4, 0, 5]]
    assert v[0, -1] == -2.0


def _tree_from_scores(scores_flat, parents_flat, K, T, D):
    sel = select_tree_nodes(scores_flat, T)
    parents = selected_parents(sel, parents_flat, K)
    return sel, parents, build_tree_buffers(parents, D + 1)


def test_child_tying_its_parent_is_never_selected_alone():
    # K=2, D=1: candidates 0,1 (level 1) and 2..5 (children of frontier 0 -> cand 1, frontier 1 -> cand 0).
    K, D = 2, 1
    # Frontier after level 1 is [cand 1, cand 0] (cand 1 scores higher). Its children: 2,3 under cand 1; 4,5 under 0.
    scores = torch.tensor([[-0.5, -0.25, -0.25, -0.25, -0.6, -0.7]])
    parents_flat = torch.tensor([[0, 2, 1]])  # block 0 -> root; block 1 (cands 2,3) -> cand 1 (+1); block 2 -> cand 0
    # T=1: the three-way tie at -0.25 between cand 1 and its children 2, 3 must pick the parent (index 1).
    sel, parents, _ = _tree_from_scores(scores, parents_flat, K, 1, D)
    assert sel.tolist() == [[1]] and parents.tolist() == [[-1, 0]]
    sel, parents, (mask, pos, retrieve, nleaf, maxd) = _tree_from_scores(scores, parents_flat, K, 3, D)
    assert sel.tolist() == [[1, 2, 3]]
    assert parents.tolist() == [[-1, 0, 1, 1]]
    assert pos.tolist() == [[0, 1, 2, 2]]
    assert int(nleaf) == 2 and retrieve[0, :2].tolist() == [[0, 1, 2], [0, 1, 3]]


def test_saturated_head_keeps_trees_connected():
    # A head so peaked that top log-probs round to exactly 0: every child ties its parent.
    head = random_eagle1_head()
    with torch.no_grad():
        head.target_lm_head.weight.mul_(40.0)
    drafter = TreeDrafter(head, TreeConfig(60, 7, 10))
    ids = torch.randint(0, 256, (1, 6))
    for _ in range(3):
        tree = drafter.draft(torch.randn(1, 5, head.feature_width), ids)
        parents = tree.parents[0]
        assert bool((parents[1:] >= 0).all()) and bool((parents[1:] < torch.arange(1, 60)).all())
        # parents are selected nodes: the searchsorted hit is exact
        mask = tree.tree_mask[0, 0]
        assert bool((mask.sum(-1) - 1 == tree.tree_position_ids).all())
        drafter.reset()


def test_build_tree_buffers_on_a_hand_made_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]])
    mask, pos, retrieve, nleaf, maxd = build_tree_buffers(parents, max_levels=4)
    assert pos.tolist() == [[0, 1, 1, 2, 2, 2, 3]]
    assert int(nleaf) == 3 and int(maxd) == 3
    assert retrieve[0, :3, :4].tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]  # leaves 4, 5, 6
    assert (retrieve[0, 3:] == -1).all() and (retrieve[0, :, 4:] == -1).all()
    _, _, lex, _, _ = build_tree_buffers(parents, max_levels=4, sampling=True)
    assert lex[0, :3, :4].tolist() == [[0, 1, 3, 6], [0, 1, 4, -1], [0, 2, 5, -1]]
    expect = torch.zeros(7, 7, dtype=torch.bool)
    for n, chain in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]):
        expect[n, chain] = True
    assert torch.equal(mask[0], expect)


@pytest.mark.parametrize("B", [1, 3])
def test_build_tree_buffers_batched_matches_per_sequence(B):
    T = 13
    parents = torch.full((B, T + 1), -1)
    for b in range(B):
        for n in range(1, T + 1):
            parents[b, n] = int(torch.randint(0, n, ()))
    batched = build_tree_buffers(parents, max_levels=T)
    for b in range(B):
        single = build_tree_buffers(parents[b:b + 1], max_levels=T)
        for x, y in zip(batched, single, strict=True):
            assert torch.equal(x[b:b + 1], y)
