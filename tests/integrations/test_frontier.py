"""The frontier drafting API and the stub back end."""

import pytest
import torch
from spec_topk_genrate import SpecDraftModel

from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.integrations.frontier import FrontierConfig, frontier_generate, register_triton_backend
from eagle_triton.testing import random_eagle3_head


@pytest.mark.parametrize("cfg", [(60, 7, 10), (20, 3, 4), (3, 2, 1)])
def test_stub_trees_are_consistent(cfg):
    head = random_eagle3_head()
    tc = TreeConfig(*cfg)
    ids = torch.randint(0, 256, (1, 9))
    tree = frontier_generate(FrontierConfig(head, tc), torch.randn(1, 8, head.feature_width), ids, backend="stub")
    T = tc.num_draft_nodes
    assert tree.draft_tokens.shape == (1, T + 1) and tree.draft_tokens[0, 0] == ids[0, -1]
    parents = tree.parents[0]
    mask = tree.tree_mask[0, 0].bool()
    for n in range(1, T + 1):
        assert 0 <= parents[n] < n
        expect = mask[parents[n]].clone()
        expect[n] = True
        assert torch.equal(mask[n], expect)
    assert torch.equal(mask.sum(-1) - 1, tree.tree_position_ids)
    r = tree.retrieve_indices
    assert r.shape[0] == int(tree.num_leaves) and (r[:, 0] == 0).all()


def test_frontier_torch_backend_equals_reference_and_keeps_kv():
    head = random_eagle3_head()
    tc = TreeConfig(20, 3, 4)
    conf = FrontierConfig(head, tc)
    spec = SpecDraftModel(head, tc)
    ids = torch.randint(0, 256, (1, 7))
    feats = torch.randn(1, 6, head.feature_width)
    tree = frontier_generate(conf, feats, ids, backend="torch")
    ref = spec.topK_genrate(feats, ids)
    assert torch.equal(tree.draft_tokens, ref[0]) and torch.equal(tree.retrieve_indices, ref[1])
    ids2 = torch.cat([ids, torch.randint(0, 256, (1, 2))], 1)
    feats2 = torch.randn(1, 2, head.feature_width)
    tree2 = frontier_generate(conf, feats2, ids2, backend="torch")  # decode call: draft KV carried over
    ref2 = spec.topK_genrate(feats2, ids2)
    assert torch.equal(tree2.draft_tokens, ref2[0])
    # a full-prompt call starts over
    tree3 = frontier_generate(conf, feats, ids, backend="torch")
    assert torch.equal(tree3.draft_tokens, tree.draft_tokens)


def test_stub_drafter_through_tree_drafter():
    head = random_eagle3_head()
    d = TreeDrafter(head, TreeConfig(20, 3, 4), backend="stub")
    ids = torch.randint(0, 256, (1, 5))
    d.draft(torch.randn(1, 4, head.feature_width), ids)
    assert d.kv_len == 4
    with pytest.raises(ValueError, match="expected"):
        d.draft(torch.randn(1, 4, head.feature_width), torch.cat([ids, ids], 1))


def test_register_triton_backend_reports_availability():
    assert isinstance(register_triton_backend(), bool)
