"""SGLang linked-list trees <-> EAGLE buffers: round trips and verifier equivalence."""

import torch

from eagle_triton.integrations.sglang import TreeMaskMode, build_tree_kernel_efficient, simulate_eagle_draft
from eagle_triton.ops import verify_tree, verify_tree_greedy
from eagle_triton.ops.tree_build import tree_parents_ref
from eagle_triton.ops.tree_convert import (
    eagle_accept_to_sglang,
    eagle_to_sglang,
    linked_lists_to_parents,
    parents_from_retrieve_indices,
    sglang_accept_to_eagle,
    sglang_to_eagle,
)
from eagle_triton.tree import build_tree_buffers


def _sgl(bs, K, S, D, g, V=30):
    vid, par, sel, dt = simulate_eagle_draft(bs, K, S, D, vocab_size=V, generator=g)
    L = torch.randint(0, 9, (bs,), generator=g)
    tm, pos, ri, nt, ns, toks = build_tree_kernel_efficient(vid, par, sel, dt, L, int(L.sum()), K, S, D,
                                                            TreeMaskMode.QLEN_ONLY)
    parents = tree_parents_ref(par, sel, K)
    return toks.view(bs, D), tm.view(bs, D, D), pos.view(bs, D) - L.unsqueeze(1), ri, nt, ns, parents


def test_sglang_to_eagle_matches_builder():
    g = torch.Generator().manual_seed(0)
    for bs, K, S, D in [(1, 4, 3, 8), (3, 4, 5, 20), (2, 10, 7, 60), (2, 1, 4, 5)]:
        toks, mask, depth, ri, nt, ns, parents = _sgl(bs, K, S, D, g)
        assert torch.equal(linked_lists_to_parents(nt, ns), parents)
        e = sglang_to_eagle(toks, nt, ns, S)
        assert torch.equal(e.tree_mask[:, 0].bool(), mask)
        assert torch.equal(e.tree_position_ids, depth)
        assert torch.equal(e.draft_tokens, toks)
        # back again: identical links
        c2, ri2, nt2, ns2 = eagle_to_sglang(e.draft_tokens, e.retrieve_indices)
        assert torch.equal(nt2, nt) and torch.equal(ns2, ns) and torch.equal(ri2, ri) and torch.equal(c2, toks)


def test_eagle_roundtrip_and_verifier_equivalence():
    g = torch.Generator().manual_seed(1)
    B, N, ML, V = 3, 25, 6, 12
    parents = torch.full((B, N), -1, dtype=torch.long)
    for i in range(1, N):
        parents[:, i] = (torch.rand(B, generator=g) * i).long()
    depth = build_tree_buffers(parents, N, False)[1]
    ML = int(depth.max())
    for sampling in (False, True):
        anc, pos, retrieve, nl, _ = build_tree_buffers(parents, ML, sampling)
        assert torch.equal(parents_from_retrieve_indices(retrieve, N), parents)
        toks = torch.randint(0, V, (B, N), generator=g)
        cand, ri, nt, ns = eagle_to_sglang(toks, retrieve)
        e = sglang_to_eagle(cand, nt, ns, ML, sampling)
        assert torch.equal(e.retrieve_indices, retrieve) and torch.equal(e.tree_mask[:, 0].bool(), anc)
        assert torch.equal(e.num_leaves, nl) and torch.equal(e.tree_position_ids, pos)
    # EAGLE verify_tree and SGLang verify_tree_greedy agree on the converted tree.
    logits = torch.randn(B, N, V, generator=g)
    kids = torch.where(nt >= 0, toks.gather(1, nt.clamp(min=0)), 0)
    logits.scatter_add_(2, kids.unsqueeze(-1), 8 * (torch.rand(B, N, 1, generator=g) < 0.7).float())
    n, path, bonus = verify_tree(toks, retrieve, logits)
    C = retrieve.shape[2]
    pred = torch.full((B * N,), -1, dtype=torch.int32)
    ai = torch.full((B, C), -1, dtype=torch.int32)
    an = torch.zeros(B, dtype=torch.int32)
    verify_tree_greedy(pred, ai, an, cand, ri, nt, ns, logits.argmax(-1))
    n2, path2, bonus2 = sglang_accept_to_eagle(ai, an, pred, N)
    assert torch.equal(n, n2) and torch.equal(path, path2) and torch.equal(bonus, bonus2)
    assert (n > 0).any()
    p3, a3, n3 = eagle_accept_to_sglang(n, path, bonus, toks)
    assert torch.equal(a3, ai) and torch.equal(n3, an) and torch.equal(p3, pred)


def test_no_host_sync_shapes_static():
    """Outputs have static shapes that depend only on the inputs' shapes (graph-capturable)."""
    g = torch.Generator().manual_seed(2)
    toks, _, _, ri, nt, ns, _ = _sgl(2, 3, 4, 10, g)
    e = sglang_to_eagle(toks, nt, ns, 4)
    assert e.retrieve_indices.shape == (2, 9, 5) and e.tree_mask.shape == (2, 1, 10, 10)
