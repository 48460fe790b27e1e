"""Sampling helpers (Triton) vs their references; Philox stream; frequency and CUDA-graph checks on the GPU."""

import warnings

import pytest
import torch

from eagle_triton.ops import (
    philox_uniform,
    philox_uniform_ref,
    sampling_from_probs,
    sampling_from_probs_ref,
    softmax_with_temperature,
    softmax_with_temperature_ref,
    top_k_renorm_probs,
    top_k_renorm_probs_ref,
    top_p_renorm_probs,
    top_p_renorm_probs_ref,
)

warnings.filterwarnings("ignore", message="overflow encountered")  # uint32 wrap-around in the interpreter's Philox

SHAPES = [(1, 7), (5, 100), (3, 64), (2, 129)]


def _dyadic(M, V, g):
    cnt = torch.randint(0, 6, (M, V), generator=g).float()
    cnt[:, 0] += 1
    return cnt / cnt.sum(-1, keepdim=True)


@pytest.mark.parametrize("M,V", SHAPES)
def test_softmax_with_temperature(M, V):
    g = torch.Generator().manual_seed(V)
    for dtype in (torch.float32, torch.float16):
        lg = (torch.randn(M, V, generator=g) * 4).to(dtype)
        for t in (torch.rand(M, generator=g) + 0.2, 0.7):
            torch.testing.assert_close(softmax_with_temperature(lg, t), softmax_with_temperature_ref(lg, t),
                                       atol=1e-5, rtol=1e-5)
    lg = torch.randn(M, V, generator=g)
    lg[:, 1::3] = float("-inf")
    torch.testing.assert_close(softmax_with_temperature(lg, 1.3), softmax_with_temperature_ref(lg, 1.3),
                               atol=1e-5, rtol=1e-5)


def _check_renorm(a, b):
    assert torch.equal(a > 0, b > 0)  # same kept set, exactly
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("M,V", SHAPES)
def test_top_k_renorm(M, V):
    g = torch.Generator().manual_seed(V + 1)
    for p in (_dyadic(M, V, g), torch.softmax(torch.randn(M, V, generator=g) * 3, -1)):
        for k in (torch.randint(-1, V + 2, (M,), generator=g), 1, 3, V):
            a, b = top_k_renorm_probs(p, k), top_k_renorm_probs_ref(p, k)
            _check_renorm(a, b)
    p = torch.softmax(torch.randn(M, V, generator=g), -1)
    kept = (top_k_renorm_probs(p, 2) > 0).sum(-1)
    assert (kept == min(2, V)).all()  # distinct values: exactly k kept
    tie = torch.full((1, 8), 0.125)
    assert (top_k_renorm_probs(tie, 3) > 0).sum() == 8  # ties at the threshold are all kept


@pytest.mark.parametrize("M,V", SHAPES)
def test_top_p_renorm(M, V):
    g = torch.Generator().manual_seed(V + 2)
    for p in (_dyadic(M, V, g), torch.softmax(torch.randn(M, V, generator=g) * 3, -1)):
        for tp in (torch.rand(M, generator=g), 0.0, 0.5, 0.9, 1.0):
            _check_renorm(top_p_renorm_probs(p, tp), top_p_renorm_probs_ref(p, tp))
    p = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    assert (top_p_renorm_probs(p, 0.75) > 0).tolist() == [[True, True, False, False]]
    assert (top_p_renorm_probs(p, 0.76) > 0).tolist() == [[True, True, True, True]]  # tie at 0.125 kept
    assert (top_p_renorm_probs(p, 0.0) > 0).tolist() == [[True, False, False, False]]


@pytest.mark.parametrize("M,V", SHAPES)
def test_sampling_from_probs(M, V):
    g = torch.Generator().manual_seed(V + 3)
    p = _dyadic(M, V, g)
    for _ in range(4):
        u = torch.rand(M, generator=g)
        assert torch.equal(sampling_from_probs(p, u), sampling_from_probs_ref(p, u))
    seed, off = torch.tensor([2 ** 40 + 17]), torch.tensor([2 ** 32 - 2])
    assert torch.equal(sampling_from_probs(p, seed=seed, offset=off), sampling_from_probs_ref(p, seed=seed, offset=off))
    # edges: coin 0 -> first positive; coin 1 with an exact sum -> fallback to the last positive; all zero -> V - 1
    q = torch.zeros(3, V)
    q[0, V // 2] = 1.0
    q[1, 0], q[1, -1] = 0.5, 0.5
    for coin, want in ((0.0, [V // 2, 0, V - 1]), (1.0, [V // 2, V - 1, V - 1])):
        u = torch.full((3,), coin)
        assert sampling_from_probs(q, u).tolist() == want == sampling_from_probs_ref(q, u).tolist()


def test_philox_stream():
    for s, o in ((0, 0), (123456789012345, 2 ** 32 - 3), (-5, 7)):
        seed, off = torch.tensor([s]), torch.tensor([o])
        a, b = philox_uniform(seed, off, 200), philox_uniform_ref(seed, off, 200)
        assert torch.equal(a, b)
        assert (a >= 0).all() and (a < 1).all()
    a = philox_uniform(torch.tensor([1]), torch.tensor([0]), 1000)
    assert abs(float(a.mean()) - 0.5) < 0.05 and len(set(a.tolist())) > 990


def test_validation():
    p = torch.rand(2, 5)
    with pytest.raises(ValueError, match="temperature"):
        softmax_with_temperature(p, 0.0)
    with pytest.raises(TypeError, match="probs"):
        top_k_renorm_probs(p.double(), 2)
    with pytest.raises(ValueError, match="top_p"):
        top_p_renorm_probs(p, torch.rand(3))
    with pytest.raises(ValueError, match="seed"):
        sampling_from_probs(p)
    with pytest.raises(ValueError, match="seed"):
        sampling_from_probs(p, seed=torch.tensor([1, 2]), offset=torch.tensor([0]))


@pytest.mark.gpu
def test_gpu_sampler_frequency():
    """10^6 draws of the Triton sampler (seed/offset RNG) match the distribution (chi-square p > 1e-3)."""
    from scipy.stats import chisquare

    V = 50
    probs = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(0)) * 2, -1)
    probs[7] = 0
    probs = (probs / probs.sum()).cuda()
    rows = probs.expand(10_000, V).contiguous()
    seed, off = torch.tensor([42], device="cuda"), torch.tensor([0], device="cuda")
    counts = torch.zeros(V, dtype=torch.long, device="cuda")
    for _ in range(100):
        counts += torch.bincount(sampling_from_probs(rows, seed=seed, offset=off), minlength=V)
        off += rows.shape[0]
    counts = counts.cpu().numpy()
    assert counts[7] == 0 and counts.sum() == 1_000_000
    keep = probs.cpu().numpy() > 0
    exp = probs.cpu().double().numpy()[keep]
    assert chisquare(counts[keep], exp / exp.sum() * counts.sum()).pvalue > 1e-3


@pytest.mark.gpu
def test_gpu_matches_reference_real_vocab():
    g = torch.Generator().manual_seed(1)
    for V in (32000, 128256):
        lg = torch.randn(6, V, generator=g) * 3
        p = softmax_with_temperature(lg.cuda(), 0.8)
        torch.testing.assert_close(p.cpu(), softmax_with_temperature_ref(lg, 0.8), atol=1e-6, rtol=1e-4)
        cnt = torch.randint(0, 2 ** 7, (6, V), generator=g).double()
        cnt[:, -1] += 2.0 ** 24 - cnt.sum(-1)
        q = (cnt / 2 ** 24).float()  # exact partial sums: kept sets must agree exactly
        for k in (1, 20, 1000):
            _check_renorm(top_k_renorm_probs(q.cuda(), k).cpu(), top_k_renorm_probs_ref(q, k))
        for tp in (0.3, 0.9):
            _check_renorm(top_p_renorm_probs(q.cuda(), tp).cpu(), top_p_renorm_probs_ref(q, tp))
        u = torch.rand(6, generator=g)
        assert torch.equal(sampling_from_probs(q.cuda(), u.cuda()).cpu(), sampling_from_probs_ref(q, u))


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_replay():
    """Tree build + greedy verify + sampling ops captured in one CUDA graph; replays match eager runs."""
    from eagle_triton.integrations.sglang import simulate_eagle_draft
    from eagle_triton.ops import build_tree_kernel_efficient, verify_tree_greedy

    g = torch.Generator().manual_seed(3)
    bs, K, S, D, V = 4, 4, 3, 16, 1000
    _, par, sel, dt = simulate_eagle_draft(bs, K, S, D, vocab_size=V, generator=g, device="cuda")
    L = torch.randint(0, 100, (bs,), generator=g).cuda()
    tm = torch.ones(bs * D * D, dtype=torch.bool, device="cuda")
    pos = torch.empty(bs * D, dtype=torch.long, device="cuda")
    rb = torch.full((3, bs, D), -1, dtype=torch.long, device="cuda")
    cand = torch.randint(0, V, (bs, D), device="cuda")
    tp = torch.randint(0, V, (bs, D), device="cuda")
    pred = torch.full((bs * D,), -1, dtype=torch.int32, device="cuda")
    ai = torch.full((bs, S + 1), -1, dtype=torch.int32, device="cuda")
    an = torch.zeros(bs, dtype=torch.int32, device="cuda")
    logits = torch.randn(bs * D, V, device="cuda")
    seed, off = torch.tensor([5], device="cuda"), torch.tensor([0], device="cuda")

    def step():
        rb.fill_(-1)
        ai.fill_(-1)
        build_tree_kernel_efficient(par, sel, L, tm, pos, rb[0], rb[1], rb[2], K, S, D, 1)
        verify_tree_greedy(pred, ai, an, cand, rb[0], rb[1], rb[2], tp)
        probs = top_p_renorm_probs(top_k_renorm_probs(softmax_with_temperature(logits, 0.7), 50), 0.9)
        return sampling_from_probs(probs, seed=seed, offset=off)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up / compile
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        cand.copy_(torch.where(torch.rand(bs, D, device="cuda") < 0.5, tp.roll(1, 1), cand))
        logits.normal_()
        off += bs * D
        graph.replay()
        got = (out.clone(), pred.clone(), ai.clone(), an.clone(), tm.clone(), pos.clone(), rb.clone())
        want_out = step()
        want = (want_out, pred, ai, an, tm, pos, rb)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
