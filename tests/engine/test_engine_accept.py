"""Tree acceptance (greedy, lossless sampling) and logits processing, against brute force and exact
distributions. Frequency tests use a chi-square goodness-of-fit test at significance 1e-3 (cells with an expected
count below 5 pooled); a correct sampler fails one with probability 1e-3, a seed is fixed so runs are stable."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from eagle_triton.engine import SamplingParams, accept_greedy, accept_sampling, process_logits, sample_from_probs
from eagle_triton.engine.accept import accept_tree
from eagle_triton.tree import build_tree_buffers

ALPHA = 1e-3


def chi_square_ok(counts: torch.Tensor, probs: torch.Tensor) -> tuple[bool, float, float]:
    """Goodness of fit of ``counts`` to ``probs``; zero-probability cells must be empty."""
    counts, probs = counts.double(), probs.double() / probs.sum()
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "a zero-probability outcome was drawn"
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = max(int(keep.sum()) - 1, 1)
    crit = float(chi2.ppf(1 - ALPHA, df))
    return stat <= crit, stat, crit


@pytest.mark.parametrize("params", [SamplingParams(0.7, 1.0, 0), SamplingParams(1.0, 0.8, 0),
                                    SamplingParams(1.3, 0.9, 7), SamplingParams(0.5, 1.0, 3),
                                    SamplingParams(1.0, 0.05, 0)])
def test_process_logits_matches_transformers_warpers(params):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 37, generator=g) * 3
    logits[1, :5] = logits[1, 5]  # ties at the top-k boundary
    ref = logits.clone()
    if params.temperature != 1.0:
        ref = TemperatureLogitsWarper(params.temperature)(None, ref)
    if params.top_p < 1.0:
        ref = TopPLogitsWarper(params.top_p)(None, ref)
    if params.top_k > 0:
        ref = TopKLogitsWarper(params.top_k)(None, ref)
    out = process_logits(logits, params)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    torch.testing.assert_close(out[~torch.isinf(out)], ref[~torch.isinf(ref)], atol=0, rtol=0)


def test_sampling_params_validation():
    for bad in [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(top_k=1.5)]:
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(1e-6).greedy and not SamplingParams(0.1).greedy


def test_sample_from_probs_frequencies():
    g = torch.Generator().manual_seed(1)
    probs = torch.tensor([0.5, 0.0, 0.2, 0.05, 0.25, 0.0, 1e-3])
    draws = sample_from_probs(probs.expand(60000, -1).contiguous(), g)
    ok, stat, crit = chi_square_ok(torch.bincount(draws, minlength=7), probs)
    assert ok, (stat, crit)


def _path_to(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def _brute_greedy(tokens, parents, logits):
    """Longest root-to-node path whose every token is the target's argmax after its parent (EAGLE's rule; with
    duplicate sibling tokens several paths may tie, all emitting the same tokens)."""
    pred = logits.argmax(-1)
    best = [0]
    stack = [[0]]
    while stack:
        path = stack.pop()
        if len(path) > len(best):
            best = path
        cur = path[-1]
        for n in range(len(parents)):
            if int(parents[n]) == cur and int(tokens[n]) == int(pred[cur]):
                stack.append(path + [n])
    return best, [int(pred[p]) for p in best]


@pytest.mark.parametrize("seed", range(4))
def test_accept_greedy_vs_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    B, N, V, levels = 3, 13, 6, 4
    parents = []
    for _ in range(B):
        par, depth = [-1], [0]
        while len(par) < N:
            p = int(torch.randint(0, len(par), (1,), generator=g))
            if depth[p] < levels:
                par.append(p)
                depth.append(depth[p] + 1)
        parents.append(par)
    parents = torch.tensor(parents)
    tokens = torch.randint(0, V, (B, N), generator=g)
    logits = torch.randn(B, N, V, generator=g)
    # plant matches so that long paths get accepted
    for b in range(B):
        for n in range(1, N):
            if torch.rand(1, generator=g) < 0.6:
                logits[b, parents[b, n], tokens[b, n]] += 10.0
    _, _, retrieve, _, _ = build_tree_buffers(parents, levels)
    res = accept_greedy(tokens, retrieve, logits)
    C = retrieve.shape[-1]
    for b in range(B):
        path, toks = _brute_greedy(tokens[b], parents[b], logits[b])
        a = len(path) - 1
        assert int(res.accept_len[b]) == a
        got = res.accept_index[b].tolist()
        assert got[0] == 0 and got[a + 1:] == [-1] * (C - a - 1)
        bonus = int(logits[b, got[a]].argmax())  # tied paths may end at different (duplicate-token) nodes
        assert res.tokens[b].tolist() == toks[:a] + [bonus] + [-1] * (C - a - 1)
        for j in range(a):  # a valid path of drafted tokens equal to the emitted ones
            assert int(parents[b, got[j + 1]]) == got[j] and int(tokens[b, got[j + 1]]) == toks[j]


def test_accept_greedy_full_depth_and_root_only():
    parents = torch.tensor([[-1, 0, 1, 2, 0]])
    tokens = torch.tensor([[9, 1, 2, 3, 4]])
    V = 10
    logits = torch.full((1, 5, V), -5.0)
    for node, nxt in [(0, 1), (1, 2), (2, 3), (3, 7)]:
        logits[0, node, nxt] = 5.0
    _, _, retrieve, _, _ = build_tree_buffers(parents, 3)
    res = accept_greedy(tokens, retrieve, logits)
    assert res.accept_len.tolist() == [3] and res.tokens.tolist() == [[1, 2, 3, 7]]
    assert res.accept_index.tolist() == [[0, 1, 2, 3]]
    logits[0, 0] = 0
    logits[0, 0, 5] = 1.0  # root's argmax is in no child
    res = accept_greedy(tokens, retrieve, logits)
    assert res.accept_len.tolist() == [0] and res.tokens.tolist() == [[5, -1, -1, -1]]


# tree for the sampling tests: root -> (1: a, 2: b, 3: c); 1 -> (4: d, 5: e); 2 -> (6: f); 4 -> (7: g)
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4]
TOKENS = [0, 3, 5, 1, 2, 4, 0, 6]


def _sampling_case(params, B, seed):
    g = torch.Generator().manual_seed(seed)
    V = 8
    N = len(PARENTS)
    logits = torch.randn(N, V, generator=g) * 1.5
    logits[0, 3] += 1.0
    parents = torch.tensor([PARENTS]).expand(B, N).contiguous()
    tokens = torch.tensor([TOKENS]).expand(B, N).contiguous()
    res = accept_sampling(tokens, parents, logits.expand(B, N, V).contiguous(), params, 4, generator=g)
    probs = torch.softmax(process_logits(logits, params), -1)
    return res, probs


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, 0.9, 5)], ids=["t1", "t07-p09-k5"])
def test_accept_sampling_is_lossless(params):
    """First emitted token ~ p(root); second token, given the first is a drafted child, ~ p(child)."""
    B = 40000
    res, probs = _sampling_case(params, B, seed=7)
    first = res.tokens[:, 0]
    ok, stat, crit = chi_square_ok(torch.bincount(first, minlength=8), probs[0])
    assert ok, ("first token", stat, crit)
    for node in (1, 2, 3):  # children of the root
        sel = first == TOKENS[node]
        second = res.tokens[sel, 1]
        assert (second >= 0).all()  # an accepted child always emits a following token
        ok, stat, crit = chi_square_ok(torch.bincount(second, minlength=8), probs[node])
        assert ok, (f"second token after node {node}", stat, crit)
    # third token after a -> d (node 4) follows p(node 4)
    sel = (res.tokens[:, 0] == TOKENS[1]) & (res.tokens[:, 1] == TOKENS[4])
    ok, stat, crit = chi_square_ok(torch.bincount(res.tokens[sel, 2], minlength=8), probs[4])
    assert ok, ("third token", stat, crit)


def test_accept_sampling_structure_and_determinism():
    params = SamplingParams(1.0)
    B = 2000
    res, _ = _sampling_case(params, B, seed=3)
    res2, _ = _sampling_case(params, B, seed=3)
    assert torch.equal(res.tokens, res2.tokens) and torch.equal(res.accept_index, res2.accept_index)
    n = res.accept_len
    for b in range(0, B, 97):
        a = int(n[b])
        path = res.accept_index[b].tolist()
        assert path[0] == 0 and all(x == -1 for x in path[a + 1:])
        for j in range(a):
            assert PARENTS[path[j + 1]] == path[j]
            assert res.tokens[b, j] == TOKENS[path[j + 1]]
        assert res.tokens[b, a] >= 0 and all(x == -1 for x in res.tokens[b, a + 1:].tolist())
    assert int(n.max()) == 3 and int(n.min()) == 0  # the deep path a -> d -> g and immediate rejections occur


def test_accept_sampling_one_hot_target_accepts_everything():
    """A target certain of the drafted path accepts it whole; coins at the edge of [0, 1) change nothing."""
    N, V = len(PARENTS), 8
    logits = torch.full((1, N, V), -1e4)
    for node, nxt in [(0, TOKENS[1]), (1, TOKENS[4]), (4, TOKENS[7]), (7, 5)]:
        logits[0, node, nxt] = 0.0
    for coin in (0.0, 0.999999):
        res = accept_sampling(torch.tensor([TOKENS]), torch.tensor([PARENTS]), logits, SamplingParams(1.0), 4,
                              coins=torch.full((1, N), coin))
        assert res.accept_len.tolist() == [3]
        assert res.tokens.tolist() == [[TOKENS[1], TOKENS[4], TOKENS[7], 5]]
        assert res.accept_index.tolist() == [[0, 1, 4, 7]]


def _random_tree(seed, cfg=(16, 3, 4)):
    from eagle_triton import TreeConfig, TreeDrafter
    from eagle_triton.testing import random_eagle3_head

    head = random_eagle3_head(vocab_size=32, draft_vocab_size=24, seed=seed)
    with torch.no_grad():
        head.lm_head.weight.mul_(4.0)
    drafter = TreeDrafter(head, TreeConfig(*cfg))
    return drafter.draft(torch.randn(1, 5, head.feature_width), torch.randint(0, 32, (1, 6)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_path_greedy_equals_torch_path(seed):
    """The Triton verify_tree kernel (interpreter here) and the PyTorch rule accept the same path."""
    tree = _random_tree(seed)
    N = tree.draft_tokens.shape[1]
    logits = torch.randn(1, N, 32)
    # make the target agree with the tree along some paths so acceptance is non-trivial
    for n in range(1, N):
        if torch.rand(()) < 0.6:
            logits[0, int(tree.parents[0, n]), int(tree.draft_tokens[0, n])] += 8.0
    a = accept_tree(tree, logits, SamplingParams(0.0), use_kernel=False)
    b = accept_tree(tree, logits, SamplingParams(0.0), use_kernel=True)
    assert torch.equal(a.accept_len, b.accept_len)
    assert torch.equal(a.accept_index, b.accept_index) and torch.equal(a.tokens, b.tokens)


def test_kernel_path_sampling_wiring_matches_verify_tree_ref():
    """The engine's kernel path processes the logits, draws coins and lays out tokens exactly as
    ops.verify_tree_ref does with the same coins (the rule itself is frequency-tested in tests/ops/test_verify.py)."""
    from eagle_triton.ops import verify_tree_ref

    tree = _random_tree(5, cfg=(8, 2, 3))
    B, N = 1, tree.draft_tokens.shape[1]
    logits = torch.randn(B, N, 32)
    params = SamplingParams(0.9, 0.95, 12)
    for seed in range(6):
        res = accept_tree(tree, logits, params, torch.Generator().manual_seed(seed), use_kernel=True)
        g = torch.Generator().manual_seed(seed)
        coins, final = torch.rand(B, N, generator=g), torch.rand(B, generator=g)
        probs = torch.softmax(process_logits(logits, params), -1).float()
        n, path, bonus = verify_tree_ref(tree.draft_tokens, tree.retrieve_indices_padded, target_probs=probs,
                                         uniform_samples=coins, uniform_samples_for_final_sampling=final)
        a = int(n[0])
        assert int(res.accept_len[0]) == a and res.accept_index[0, : a + 1].tolist() == path[0, : a + 1].tolist()
        assert res.tokens[0, :a].tolist() == tree.draft_tokens[0, path[0, 1 : a + 1]].tolist()
        assert int(res.tokens[0, a]) == int(bonus[0]) and (res.tokens[0, a + 1 :] == -1).all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cpu_and_kernel_sampling_paths_agree_seed_for_seed(seed):
    """One sampling rule on every device: the CPU path (the kernel's reference) and the Triton kernel accept the
    same path and emit the same tokens from the same generator seed."""
    torch.manual_seed(seed)
    tree = _random_tree(seed, cfg=(8, 2, 3))
    N = tree.draft_tokens.shape[1]
    logits = torch.randn(1, N, 32, generator=torch.Generator().manual_seed(100 + seed))
    for n in range(1, N):  # the target likes every drafted token: acceptance is likely, rejections still occur
        logits[0, int(tree.parents[0, n]), int(tree.draft_tokens[0, n])] += 5.0
    params = SamplingParams(0.8, 0.95, 16)
    accepted = 0
    for run in range(6):
        a = accept_tree(tree, logits, params, torch.Generator().manual_seed(run), use_kernel=False)
        b = accept_tree(tree, logits, params, torch.Generator().manual_seed(run), use_kernel=True)
        assert torch.equal(a.accept_len, b.accept_len) and torch.equal(a.accept_index, b.accept_index)
        assert torch.equal(a.tokens, b.tokens)
        accepted += int(a.accept_len[0])
    assert accepted > 0  # the comparison covers accepted drafts, not only bonus tokens
