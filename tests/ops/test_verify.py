"""Tree verification ops vs their references; sgl-kernel subtleties; EAGLE-style verify_tree; losslessness."""

import numpy as np
import pytest
import torch

from eagle_triton.integrations.sglang import TreeMaskMode, build_tree_kernel_efficient, simulate_eagle_draft
from eagle_triton.ops import (
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_ref,
    verify_tree,
    verify_tree_greedy,
    verify_tree_greedy_ref,
    verify_tree_ref,
)
from eagle_triton.tree import build_tree_buffers

SHAPES = [(1, 4, 3, 8), (3, 4, 3, 16), (2, 3, 5, 13), (2, 1, 4, 5), (2, 10, 7, 60)]


def _sgl_tree(bs, K, S, D, g, V=20):
    vid, par, sel, dt = simulate_eagle_draft(bs, K, S, D, vocab_size=V, generator=g)
    L = torch.randint(0, 9, (bs,), generator=g)
    _, _, ri, nt, ns, toks = build_tree_kernel_efficient(vid, par, sel, dt, L, int(L.sum()), K, S, D,
                                                         TreeMaskMode.QLEN_ONLY)
    return toks.view(bs, D), ri, nt, ns


def _dyadic_probs(shape, g, peak_tokens=None, peak=0):
    """Probabilities that are multiples of 2**-k: every partial sum is exact in float32 in any order."""
    cnt = torch.randint(0, 8, shape, generator=g).float()
    cnt[..., 0] += 1
    if peak_tokens is not None:
        peaks = torch.full_like(peak_tokens, peak, dtype=torch.float).unsqueeze(-1)
        cnt.scatter_add_(-1, peak_tokens.unsqueeze(-1), peaks)
    total = cnt.sum(-1, keepdim=True)
    scale = 2.0 ** torch.ceil(torch.log2(total))
    cnt[..., -1:] += scale - total  # pad the last token so every row sums to a power of two
    return cnt / scale


def _outs(bs, D, S1, extra=1, device="cpu"):
    return (torch.full((bs * D + extra,), -1, dtype=torch.int32, device=device),
            torch.full((bs, S1), -1, dtype=torch.int32, device=device),
            torch.full((bs,), -5, dtype=torch.int32, device=device))


def _greedy(fn, cand, ri, nt, ns, tp, S1):
    bs, D = cand.shape
    pred, ai, an = _outs(bs, D, S1, device=cand.device)
    fn(pred, ai, an, cand, ri, nt, ns, tp)
    return pred, ai, an


def _biased_target(cand, nt, g, rate):
    """target_predict that matches the first child's token with probability `rate` (long accepted paths)."""
    bs, D = cand.shape
    tp = torch.randint(0, 20, (bs, D), generator=g)
    use = (torch.rand(bs, D, generator=g) < rate) & (nt >= 0)
    return torch.where(use, cand.gather(1, nt.clamp(min=0)), tp)


@pytest.mark.parametrize("bs,K,S,D", SHAPES)
@pytest.mark.parametrize("rate", [0.0, 0.6, 1.0])
def test_greedy_matches_reference(bs, K, S, D, rate):
    g = torch.Generator().manual_seed(D * 7 + bs + int(rate * 10))
    cand, ri, nt, ns = _sgl_tree(bs, K, S, D, g)
    tp = _biased_target(cand, nt, g, rate)
    for S1 in (S + 1, 2):  # accepted depth is capped by num_spec_step - 1
        a = _greedy(verify_tree_greedy, cand, ri, nt, ns, tp, S1)
        b = _greedy(verify_tree_greedy_ref, cand, ri, nt, ns, tp, S1)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        pred, ai, an = a
        assert (an <= S1 - 1).all()
        for r in range(bs):  # structural invariants
            n = int(an[r])
            assert (ai[r, n + 1:] == -1).all() and (ai[r, : n + 1] >= 0).all()
            on_path = ai[r, : n + 1].long()
            assert (pred[on_path] >= 0).all()  # n accepted tokens + 1 bonus emitted
            assert int(pred[on_path[-1]]) == int(tp.view(-1)[on_path[-1]])  # bonus = target's prediction
        off = torch.ones(bs * D + 1, dtype=torch.bool)
        off[ai[ai >= 0].long()] = False
        assert (pred[off] == -1).all()  # predicts off the accepted path are not written
    if rate == 1.0 and K == 1:
        assert (a[2] == S1 - 1).all()


def test_greedy_first_matching_sibling_wins_and_links_are_bounded():
    # root -> children 1, 2 (same token 7), 2 -> 3. The first sibling in list order wins.
    cand = torch.tensor([[5, 7, 7, 9]])
    ri = torch.arange(4).view(1, 4)
    nt = torch.tensor([[1, -1, 3, -1]])
    ns = torch.tensor([[-1, 2, -1, -1]])
    tp = torch.tensor([[7, 9, 9, 1]])
    for fn in (verify_tree_greedy, verify_tree_greedy_ref):
        pred, ai, an = _greedy(fn, cand, ri, nt, ns, tp, 4)
        assert ai.tolist() == [[0, 1, -1, -1]] and an.tolist() == [1] and pred[1] == 9
    # Corrupt links: a sibling cycle and an out-of-range child terminate.
    ns_cyc = torch.tensor([[-1, 2, 1, -1]])
    nt_bad = torch.tensor([[1, 99, -1, -1]])
    tp2 = torch.tensor([[3, 0, 0, 0]])
    for fn in (verify_tree_greedy, verify_tree_greedy_ref):
        pred, ai, an = _greedy(fn, cand, ri, nt_bad, ns_cyc, tp2, 4)
        assert an.tolist() == [0] and int(pred[0]) == 3


def _sampling(fn, cand, ri, nt, ns, coins, cf, tprobs, S1, thr=(1.0, 1.0), draft=None):
    bs, D = cand.shape
    pred, ai, an = _outs(bs, D, S1, extra=0, device=cand.device)
    dp = torch.zeros_like(tprobs) if draft is None else draft.clone()
    fn(pred, ai, an, cand, ri, nt, ns, coins, cf, tprobs, dp, *thr)
    return pred, ai, an, dp


@pytest.mark.parametrize("bs,K,S,D", SHAPES)
@pytest.mark.parametrize("thr", [(1.0, 1.0), (0.5, 0.7), (0.0, 0.0), (1.0, 0.3)])
def test_sampling_matches_reference(bs, K, S, D, thr):
    g = torch.Generator().manual_seed(D * 13 + bs)
    V = 24
    cand, ri, nt, ns = _sgl_tree(bs, K, S, D, g, V=V)
    first_child_tok = cand.gather(1, nt.clamp(min=0))
    tprobs = _dyadic_probs((bs, D, V), g, first_child_tok, peak=40)
    for _ in range(3):
        coins, cf = torch.rand(bs, D, generator=g), torch.rand(bs, generator=g)
        a = _sampling(tree_speculative_sampling_target_only, cand, ri, nt, ns, coins, cf, tprobs, S + 1, thr)
        b = _sampling(tree_speculative_sampling_target_only_ref, cand, ri, nt, ns, coins, cf, tprobs, S + 1, thr)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        pred, ai, an, dp = a
        for r in range(bs):
            n = int(an[r])
            assert (ai[r, n + 1:] == -1).all() and (pred[ai[r, : n + 1].long()] >= 0).all()
        # draft_probs holds exactly the target probabilities of rejected children
        changed = dp != 0
        assert torch.equal(dp[changed], tprobs[changed])


def _chain():
    """root(0) -> 1 -> 2 with tokens 3, 5; root also has child 3 (token 6) after 1."""
    cand = torch.tensor([[0, 3, 5, 6]])
    ri = torch.arange(4).view(1, 4)
    nt = torch.tensor([[1, 2, -1, -1]])
    ns = torch.tensor([[-1, 3, -1, -1]])
    return cand, ri, nt, ns


@pytest.mark.parametrize("fn", [tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_ref])
def test_sampling_boundaries(fn):
    cand, ri, nt, ns = _chain()
    V = 8
    tprobs = torch.zeros(1, 4, V)
    tprobs[0, 0, 3], tprobs[0, 0, 6], tprobs[0, 0, 7] = 0.25, 0.25, 0.5  # root row
    tprobs[0, 1, 5], tprobs[0, 1, 1] = 0.5, 0.5
    tprobs[0, 2, 2] = 1.0
    tprobs[0, 3, 4] = 1.0
    cf = torch.tensor([0.3])
    # Coin exactly on the first interval's upper edge: accepted (coin <= acc).
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.25, 0.5, 0.9, 0.9]]), cf, tprobs, 3)
    assert r[1].tolist() == [[0, 1, 2]] and r[2].tolist() == [2]
    # Just above the first edge, inside the second child's interval (0.25, 0.5]: node 3 accepted.
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.5, 0.5, 0.9, 0.9]]), cf, tprobs, 3)
    assert r[1].tolist() == [[0, 3, -1]] and r[2].tolist() == [1]
    assert int(r[3][0, 0, 3]) == 0 and float(r[3][0, 0, 3]) == 0.25  # rejected child recorded at the root row
    # Above both: reject all; correction drawn from the residual (tokens 3 and 6 removed): only 7 is left.
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.75, 0.5, 0.9, 0.9]]), cf, tprobs, 3)
    assert r[2].tolist() == [0] and int(r[0][0]) == 7
    # Full-depth acceptance: bonus from the target row of the last node, draft_probs ignored.
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.1, 0.4, 0.9, 0.9]]), cf, tprobs, 3)
    assert r[2].tolist() == [2] and int(r[0][2]) == 2
    # Thresholds (0, 0): every first child is accepted even with zero target mass.
    z = torch.zeros_like(tprobs)
    z[..., 0] = 1.0
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.99, 0.99, 0.9, 0.9]]), cf, z, 3, thr=(0.0, 0.0))
    assert r[1].tolist() == [[0, 1, 2]]
    # threshold_single: a single child with p >= threshold is accepted whatever the coin.
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.99, 0.99, 0.9, 0.9]]), cf, tprobs, 3, thr=(0.25, 1.0))
    assert r[1].tolist() == [[0, 1, 2]]
    # Final coin 1.0 with an exact sum: nothing exceeds u, fallback = last index with positive residual.
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.9, 0.5, 0.9, 0.9]]), torch.tensor([1.0]), tprobs, 3)
    assert int(r[0][0]) == 7
    # All-zero residual row -> V - 1.
    zr = tprobs.clone()
    zr[0, 0] = 0
    zr[0, 0, 3] = 1.0
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.9, 0.5, 0.9, 0.9]]), cf, zr, 2, thr=(1.0, 1.0))
    assert r[2].tolist() == [1]  # coin 0.9 <= 1.0: the single-mass child is accepted
    r = _sampling(fn, cand, ri, nt, ns, torch.tensor([[0.5, 0.5, 0.9, 0.9]]), cf, zr, 1)
    assert r[2].tolist() == [0] and int(r[0][0]) == 3  # num_spec_step 1: the bonus is drawn from the target


@pytest.mark.parametrize("fn", [tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_ref])
def test_sampling_one_hot_target_accepts_drafts(fn):
    """A one-hot target equal to a drafted child accepts it at every level, whatever the coins."""
    g = torch.Generator().manual_seed(4)
    bs, K, S, D, V = 2, 3, 4, 12, 20
    cand, ri, nt, ns = _sgl_tree(bs, K, S, D, g, V=V)
    # follow the first child of each list: target one-hot on it
    tprobs = torch.zeros(bs, D, V)
    want = []
    for b in range(bs):
        node, path = 0, [b * D]
        for _ in range(S):
            last = int(nt[b, node])
            tprobs[b, node, int(cand[b, last]) if last >= 0 else 0] = 1.0
            if last < 0:
                break
            node = last
            path.append(b * D + last)
        if len(path) == S + 1:
            tprobs[b, node, 1] = 1.0
        want.append(path)
    coins = torch.rand(bs, D, generator=g)
    r = _sampling(fn, cand, ri, nt, ns, coins, torch.rand(bs, generator=g), tprobs, S + 1)
    for b in range(bs):
        assert r[1][b, : len(want[b])].tolist() == want[b]


def test_sampling_validation():
    cand, ri, nt, ns = _chain()
    tprobs = torch.full((1, 4, 8), 1 / 8)
    pred, ai, an = _outs(1, 4, 3, extra=0)
    args = [pred, ai, an, cand, ri, nt, ns, torch.rand(1, 4), torch.rand(1), tprobs, torch.zeros_like(tprobs)]
    with pytest.raises(ValueError, match="threshold_acc"):
        tree_speculative_sampling_target_only(*args, 1.0, 1.5)
    with pytest.raises(TypeError, match="target_probs"):
        tree_speculative_sampling_target_only(*args[:9], tprobs.double(), args[10])
    with pytest.raises(ValueError, match="draft_probs"):
        tree_speculative_sampling_target_only(*args[:10], torch.zeros(1, 4, 7))
    with pytest.raises(ValueError, match="predicts"):
        verify_tree_greedy(pred[:3], ai, an, cand, ri, nt, ns, cand)
    with pytest.raises(TypeError, match="accept_index"):
        verify_tree_greedy(pred, ai.long(), an, cand, ri, nt, ns, cand)


def _eagle_tree(B, N, ML, g):
    parents = torch.full((B, N), -1, dtype=torch.long)
    depth = torch.zeros(B, N, dtype=torch.long)
    for b in range(B):
        for i in range(1, N):
            while True:
                p = int(torch.randint(0, i, (1,), generator=g))
                if depth[b, p] < ML:
                    break
            parents[b, i], depth[b, i] = p, depth[b, p] + 1
    return parents, build_tree_buffers(parents, ML, True)[2]


def _eagle_greedy_oracle(toks, retrieve, logits):
    """SafeAILab EAGLE's evaluate_posterior (greedy) on one tree: longest matching retrieve row."""
    pred = logits.argmax(-1)
    rows = [r for r in retrieve.tolist() if r[0] == 0]
    best_len, best_row = 0, rows[0]
    for r in rows:
        n = 0
        while n + 1 < len(r) and r[n + 1] >= 0 and int(toks[r[n + 1]]) == int(pred[r[n]]):
            n += 1
        if n > best_len:
            best_len, best_row = n, r
    return best_len, best_row[: best_len + 1], int(pred[best_row[best_len]])


@pytest.mark.parametrize("B,N,ML,V", [(1, 6, 3, 16), (3, 12, 4, 24), (2, 30, 8, 40)])
def test_verify_tree_matches_reference_and_eagle(B, N, ML, V):
    g = torch.Generator().manual_seed(N)
    parents, retrieve = _eagle_tree(B, N, ML, g)
    toks = torch.randint(0, V, (B, N), generator=g)
    logits = torch.randn(B, N, V, generator=g)
    # make each node's first child the argmax half of the time
    child = torch.full((B, N), -1, dtype=torch.long)
    for b in range(B):
        for i in range(N - 1, 0, -1):
            child[b, parents[b, i]] = i
    boost = (child >= 0) & (torch.rand(B, N, generator=g) < 0.6)
    logits.scatter_add_(2, toks.gather(1, child.clamp(min=0)).unsqueeze(-1), boost.float().unsqueeze(-1) * 10)
    a = verify_tree(toks, retrieve, logits)
    assert all(torch.equal(x, y) for x, y in zip(a, verify_tree_ref(toks, retrieve, logits), strict=True))
    for b in range(B):
        n, path, bonus = _eagle_greedy_oracle(toks[b], retrieve[b], logits[b])
        assert int(a[0][b]) == n and a[1][b, : n + 1].tolist() == path and int(a[2][b]) == bonus
        assert (a[1][b, n + 1:] == -1).all()
    pr = _dyadic_probs((B, N, V), g, toks.gather(1, child.clamp(min=0)), peak=30)
    for _ in range(3):
        u, uf = torch.rand(B, N, generator=g), torch.rand(B, generator=g)
        a = verify_tree(toks, retrieve, target_probs=pr, uniform_samples=u, uniform_samples_for_final_sampling=uf)
        b = verify_tree_ref(toks, retrieve, target_probs=pr, uniform_samples=u, uniform_samples_for_final_sampling=uf)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_verify_tree_eagle_rule_skips_duplicates_and_removes_rejected():
    # root children 1 (token 2), 2 (token 2, duplicate), 3 (token 4)
    toks = torch.tensor([[0, 2, 2, 4]])
    retrieve = torch.tensor([[[0, 1], [0, 2], [0, 3]]])
    V = 6
    p = torch.zeros(1, 4, V)
    p[0, 0, 2], p[0, 0, 4], p[0, 0, 5] = 0.5, 0.25, 0.25
    # coin for node 1: 0.6 >= 0.5 reject; node 2 duplicate skipped (even with coin 0); node 3: u*rem = 0.4*0.5 < 0.25
    u = torch.tensor([[0.0, 0.6, 0.0, 0.4]])
    for fn in (verify_tree, verify_tree_ref):
        n, path, bonus = fn(toks, retrieve, target_probs=p, uniform_samples=u,
                            uniform_samples_for_final_sampling=torch.tensor([0.5]))
        assert n.tolist() == [1] and path.tolist() == [[0, 3]]
        u2 = torch.tensor([[0.0, 0.6, 0.0, 0.9]])  # all rejected: residual keeps only token 5
        n, path, bonus = fn(toks, retrieve, target_probs=p, uniform_samples=u2,
                            uniform_samples_for_final_sampling=torch.tensor([0.01]))
        assert n.tolist() == [0] and bonus.tolist() == [5]


# ---------------------------------------------------------------- losslessness (frequency tests)

def _freq_tree():
    """root -> a (token 1), b (token 2); a -> c (token 3). V = 6; distinct target rows per node."""
    toks = torch.tensor([[0, 1, 2, 3]])
    nt = torch.tensor([[1, 3, -1, -1]])
    ns = torch.tensor([[-1, 2, -1, -1]])
    retrieve = torch.tensor([[[0, 1, 3], [0, 2, -1]]])
    p = torch.tensor([[[0.05, 0.30, 0.25, 0.10, 0.20, 0.10],   # root
                       [0.10, 0.10, 0.10, 0.40, 0.20, 0.10],   # after a
                       [0.30, 0.20, 0.10, 0.10, 0.20, 0.10],   # after b
                       [0.20, 0.20, 0.20, 0.20, 0.10, 0.10]]])  # after c
    return toks, nt, ns, retrieve, p


def _emitted(n, path, bonus, toks):
    first = np.where(n >= 1, toks[0, path[:, 1].clip(min=0)], bonus)
    second = np.where(n >= 2, toks[0, path[:, 2].clip(min=0)], np.where(n == 1, bonus, -1))
    return first, second


def _chi2_ok(samples, probs):
    from scipy.stats import chisquare

    V = probs.shape[0]
    obs = np.bincount(samples, minlength=V)
    keep = probs > 0
    assert obs[~keep].sum() == 0
    exp = probs[keep].astype(np.float64)
    return chisquare(obs[keep], exp / exp.sum() * obs.sum()).pvalue


@pytest.mark.parametrize("rule", ["eagle", "sgl"])
def test_lossless_frequency_cpu(rule):
    """Both acceptance rules emit tokens distributed as the target (chi-square p > 1e-3, 2e5 draws, seeded)."""
    toks, nt, ns, retrieve, p = _freq_tree()
    M = 200_000
    g = torch.Generator().manual_seed(123 if rule == "eagle" else 321)
    u = torch.rand(M, 4, generator=g)
    uf = torch.rand(M, generator=g)
    if rule == "eagle":
        n, path, bonus = verify_tree_ref(toks.expand(M, 4).contiguous(), retrieve.expand(M, 2, 3).contiguous(),
                                         target_probs=p.expand(M, 4, 6).contiguous(), uniform_samples=u,
                                         uniform_samples_for_final_sampling=uf)
    else:
        D = 4
        pred, ai, an = (torch.full((M * D,), -1, dtype=torch.int32), torch.full((M, 3), -1, dtype=torch.int32),
                        torch.zeros(M, dtype=torch.int32))
        ri = torch.arange(M * D).view(M, D)
        tprobs = p.expand(M, D, 6).contiguous()
        tree_speculative_sampling_target_only_ref(pred, ai, an, toks.expand(M, D).contiguous(), ri,
                                                  nt.expand(M, D).contiguous(), ns.expand(M, D).contiguous(), u, uf,
                                                  tprobs, torch.zeros_like(tprobs))
        from eagle_triton.ops.tree_convert import sglang_accept_to_eagle

        n, path, bonus = sglang_accept_to_eagle(ai, an, pred, D)
    first, second = _emitted(n.numpy(), path.numpy(), bonus.numpy(), toks.numpy())
    assert _chi2_ok(first, p[0, 0].numpy()) > 1e-3
    after_a = second[first == 1]
    assert _chi2_ok(after_a, p[0, 1].numpy()) > 1e-3
    after_b = second[first == 2]
    assert _chi2_ok(after_b, p[0, 2].numpy()) > 1e-3
    if rule == "sgl":  # negative control: a lossy threshold_acc must fail the same test
        pred.fill_(-1), ai.fill_(-1)
        tree_speculative_sampling_target_only_ref(pred, ai, an, toks.expand(M, D).contiguous(), ri,
                                                  nt.expand(M, D).contiguous(), ns.expand(M, D).contiguous(), u, uf,
                                                  tprobs, torch.zeros_like(tprobs), 1.0, 0.6)
        n, path, bonus = sglang_accept_to_eagle(ai, an, pred, D)
        first, _ = _emitted(n.numpy(), path.numpy(), bonus.numpy(), toks.numpy())
        assert _chi2_ok(first, p[0, 0].numpy()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["eagle", "sgl"])
def test_lossless_frequency_gpu(rule):
    """10^6 draws through the Triton kernels on the GPU."""
    toks, nt, ns, retrieve, p = (t.cuda() for t in _freq_tree())
    M, D = 1_000_000, 4
    g = torch.Generator(device="cuda").manual_seed(7)
    u = torch.rand(M, D, generator=g, device="cuda")
    uf = torch.rand(M, generator=g, device="cuda")
    tprobs = p.expand(M, D, 6).contiguous()
    if rule == "eagle":
        n, path, bonus = verify_tree(toks.expand(M, D).contiguous(), retrieve.expand(M, 2, 3).contiguous(),
                                     target_probs=tprobs, uniform_samples=u, uniform_samples_for_final_sampling=uf)
    else:
        from eagle_triton.ops.tree_convert import sglang_accept_to_eagle

        pred = torch.full((M * D,), -1, dtype=torch.int32, device="cuda")
        ai = torch.full((M, 3), -1, dtype=torch.int32, device="cuda")
        an = torch.zeros(M, dtype=torch.int32, device="cuda")
        ri = torch.arange(M * D, device="cuda").view(M, D)
        tree_speculative_sampling_target_only(pred, ai, an, toks.expand(M, D).contiguous(), ri,
                                              nt.expand(M, D).contiguous(), ns.expand(M, D).contiguous(), u, uf,
                                              tprobs, torch.zeros_like(tprobs))
        n, path, bonus = sglang_accept_to_eagle(ai, an, pred, D)
    first, second = _emitted(n.cpu().numpy(), path.cpu().numpy(), bonus.cpu().numpy(), toks.cpu().numpy())
    p = p.cpu()
    assert _chi2_ok(first, p[0, 0].numpy()) > 1e-3
    assert _chi2_ok(second[first == 1], p[0, 1].numpy()) > 1e-3


@pytest.mark.gpu
def test_gpu_matches_reference_real_shapes():
    g = torch.Generator()
    g.seed()  # fresh inputs each run
    bs, K, S, D, V = 4, 10, 7, 60, 32000
    cand, ri, nt, ns = _sgl_tree(bs, K, S, D, g, V=V)
    tp = _biased_target(cand, nt, g, 0.7)
    a = _greedy(verify_tree_greedy, *(t.cuda() for t in (cand, ri, nt, ns, tp)), S + 1)
    b = _greedy(verify_tree_greedy_ref, cand, ri, nt, ns, tp, S + 1)
    assert all(torch.equal(x.cpu(), y) for x, y in zip(a, b, strict=True))
    # dyadic target rows (2**-24 grid): exact in any summation order, so the draws match bit for bit
    cnt = torch.randint(0, 2 ** 8, (bs, D, V), generator=g).double()
    first_child = cand.gather(1, nt.clamp(min=0)).unsqueeze(-1)
    cnt.scatter_add_(2, first_child, torch.full((bs, D, 1), 2.0 ** 21, dtype=torch.double))
    cnt[..., -1] += 2.0 ** 24 - cnt.sum(-1)
    assert (cnt >= 0).all()
    tprobs = (cnt / 2 ** 24).float()
    coins, cf = torch.rand(bs, D, generator=g), torch.rand(bs, generator=g)
    on_gpu = (t.cuda() for t in (cand, ri, nt, ns, coins, cf, tprobs))
    a = _sampling(tree_speculative_sampling_target_only, *on_gpu, S + 1)
    b = _sampling(tree_speculative_sampling_target_only_ref, cand, ri, nt, ns, coins, cf, tprobs, S + 1)
    assert all(torch.equal(x.cpu(), y) for x, y in zip(a, b, strict=True))
