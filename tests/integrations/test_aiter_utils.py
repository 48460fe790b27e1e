"""The AITER-style tree and speculative-decoding helpers (old paths ``eagle_utils`` / ``spec_utils``), thin maps
onto the real kernels."""

import pytest
import torch

from eagle_triton.integrations import aiter_spec_utils as su
from eagle_triton.integrations import aiter_tree_utils as eu
from eagle_triton.integrations import sglang


def test_token_bitmask_round_trip():
    for V in (1, 31, 32, 70):
        allowed = torch.rand(3, V) > 0.5
        m = su.generate_token_bitmask(allowed)
        assert m.dtype == torch.int32 and m.shape == (3, -(-V // 32))
        bits = (m.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
        assert torch.equal(bits.view(3, -1)[:, :V].bool(), allowed)
    with pytest.raises(ValueError, match="bool"):
        su.generate_token_bitmask(torch.zeros(2, 3))


def test_sample_from_logits_greedy_and_masked():
    logits = torch.randn(5, 40)
    assert torch.equal(su.sample_from_logits(logits, temperature=0.0), logits.argmax(-1))
    # top_k=1 leaves only the argmax whatever the uniforms
    u = torch.rand(5)
    assert torch.equal(su.sample_from_logits(logits, 0.8, top_k=1, uniform_samples=u), logits.argmax(-1))
    tok = su.sample_from_logits(logits, 1.3, top_p=0.5, top_k=7, uniform_samples=u)
    top7 = logits.topk(7, -1).indices
    assert bool((tok[:, None] == top7).any(-1).all())


def test_small_helpers():
    assert [su.next_power_of_2(n) for n in (1, 2, 3, 33, 64)] == [1, 2, 4, 64, 64]
    assert su.pad_to_alignment(torch.ones(2, 5), 4).shape == (2, 8)
    assert su.pad_to_alignment(torch.ones(2, 8), 4).shape == (2, 8)
    assert su.calculate_acceptance_rate([1, 2, 3], 4) == pytest.approx(0.5)
    assert su.fast_topk_torch is sglang.fast_topk and su.select_top_k_tokens is sglang.select_top_k_tokens
    stats = eu.compute_tree_statistics(torch.tensor([0, 3, 2, 3]), 4)
    assert stats["mean_accept_length"] == pytest.approx(3.0) and stats["accept_histogram"] == [1, 0, 1, 2]


def test_build_and_verify_through_eagle_utils():
    bs, K, S, D = 2, 2, 3, 6
    verified, parent_list, top_idx, draft = sglang.simulate_eagle_draft(bs, K, S, D, vocab_size=50)
    seq_lens = torch.tensor([5, 9])
    ts = eu.build_tree_structure(verified, parent_list, top_idx, draft, seq_lens, K, S, D,
                                 tree_mask_mode=eu.TreeMaskMode.QLEN_ONLY)
    cands = ts.draft_tokens.view(bs, D)
    target = cands.clone()  # the target predicts each node's first child: full acceptance along first children
    nt = ts.retrive_next_token
    for b in range(bs):
        for n in range(D):
            c = int(nt[b, n])
            target[b, n] = cands[b, c] if c >= 0 else 7
    pred, acc_idx, acc_num = eu.verify_tree_greedy(cands, ts.retrive_index, ts.retrive_next_token,
                                                   ts.retrive_next_sibling, target, S + 1)
    assert (acc_num >= 1).all()
    assert int(acc_idx[0, 0]) == 0 and int(acc_idx[1, 0]) == D
