"""append_kv_cache and compact_kv_cache against their references (exact), bounds errors, CUDA-graph replay."""

import pytest
import torch

from eagle_triton.ops.kv_cache import append_kv_cache, append_kv_cache_ref, compact_kv_cache, compact_kv_cache_ref

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Tn,Lmax,Hkv,D", [(3, 5, 40, 2, 24), (1, 1, 7, 1, 16), (2, 60, 97, 3, 40)])
def test_append_matches_ref(B, Tn, Lmax, Hkv, D, dtype, device):
    gen = torch.Generator().manual_seed(B * 100 + Tn)
    k = torch.randn(B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    v = torch.randn(B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    kn = torch.randn(B, Tn, Hkv, D, generator=gen).to(device, dtype)
    vn = torch.randn(B, Tn, Hkv, D, generator=gen).to(device, dtype)
    lens = torch.randint(0, Lmax - Tn + 1, (B,), generator=gen, dtype=torch.int32)
    lens[-1] = Lmax - Tn  # fills the cache exactly
    lens = lens.to(device)
    k2, v2 = k.clone(), v.clone()
    append_kv_cache(k, v, kn, vn, lens)
    append_kv_cache_ref(k2, v2, kn, vn, lens)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    assert not torch.equal(k, torch.randn_like(k)) and torch.equal(k[-1, Lmax - Tn:], kn[-1])


def test_append_strided_layer_view(device):
    """A layer's view of an [NL, B, Lmax, Hkv, D] cache (non-zero storage offset) is written in place."""
    cache_k = torch.randn(3, 2, 20, 2, 16, device=device)
    cache_v = torch.randn(3, 2, 20, 2, 16, device=device)
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    kn, vn = torch.randn(2, 4, 2, 16, device=device), torch.randn(2, 4, 2, 16, device=device)
    lens = torch.tensor([0, 9], device=device)
    append_kv_cache(cache_k[1], cache_v[1], kn, vn, lens)
    append_kv_cache_ref(ref_k[1], ref_v[1], kn, vn, lens)
    assert torch.equal(cache_k, ref_k) and torch.equal(cache_v, ref_v)


def test_append_errors(device):
    k = torch.randn(2, 10, 2, 16, device=device)
    kn = torch.randn(2, 3, 2, 16, device=device)
    with pytest.raises(ValueError, match="capacity"):
        append_kv_cache(k, k.clone(), kn, kn, torch.tensor([0, 8], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="k_new"):
        append_kv_cache(k, k.clone(), kn[:, :, :1], kn, torch.tensor([0, 1], device=device))
    with pytest.raises(TypeError, match="v_new"):
        append_kv_cache(k, k.clone(), kn, kn.half(), torch.tensor([0, 1], device=device))
    with pytest.raises(ValueError, match="cache_seqlens"):
        append_kv_cache(k, k.clone(), kn, kn, torch.tensor([0], device=device))


def _random_paths(B, A, T, gen):
    """Per sequence: a random root-to-node path of increasing tree indices (node 0 first), -1 padded."""
    idx = torch.full((B, A), -1, dtype=torch.int64)
    n_acc = torch.randint(1, A + 1, (B,), generator=gen)
    for b in range(B):
        nodes = torch.randperm(T - 1, generator=gen)[: int(n_acc[b]) - 1].sort().values + 1
        idx[b, 0] = 0
        idx[b, 1 : int(n_acc[b])] = nodes
    return idx, n_acc.to(torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("NL,B,Lmax,Hkv,D,A,T", [(3, 3, 48, 2, 24, 5, 12), (1, 1, 20, 1, 16, 1, 3),
                                                 (2, 2, 80, 3, 40, 8, 61)])
def test_compact_matches_ref(NL, B, Lmax, Hkv, D, A, T, dtype, device):
    gen = torch.Generator().manual_seed(NL * 1000 + B * 10 + A)
    k = torch.randn(NL, B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    v = torch.randn(NL, B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    lens = torch.randint(0, Lmax - T + 1, (B,), generator=gen, dtype=torch.int32).to(device)
    idx, n_acc = _random_paths(B, A, T, gen)
    idx, n_acc = idx.to(device), n_acc.to(device)
    k2, v2 = k.clone(), v.clone()
    compact_kv_cache(k, v, lens, idx, n_acc)
    compact_kv_cache_ref(k2, v2, lens, idx, n_acc)
    assert torch.equal(k, k2) and torch.equal(v, v2)


def test_compact_overlapping_path(device):
    """Path [0, 1, 3, 4, 6]: row 3 moves to 2 while row 4 moves to 3 and 6 to 4 (sources are destinations)."""
    NL, B, Lmax, H, D = 2, 1, 16, 1, 16
    k = torch.arange(NL * B * Lmax * H * D, dtype=torch.float32, device=device).view(NL, B, Lmax, H, D)
    v = -k
    lens = torch.tensor([2], device=device)
    idx = torch.tensor([[0, 1, 3, 4, 6, -1]], device=device)
    before = k.clone()
    compact_kv_cache(k, v, lens, idx, torch.tensor([5], device=device))
    for j, src in enumerate([0, 1, 3, 4, 6]):
        assert torch.equal(k[:, 0, 2 + j], before[:, 0, 2 + src])
        assert torch.equal(v[:, 0, 2 + j], -before[:, 0, 2 + src])
    assert torch.equal(k[:, 0, 7:], before[:, 0, 7:]) and torch.equal(k[:, 0, :2], before[:, 0, :2])


def test_compact_nothing_accepted_is_a_noop(device):
    k = torch.randn(2, 2, 12, 1, 16, device=device)
    v = torch.randn(2, 2, 12, 1, 16, device=device)
    k0, v0 = k.clone(), v.clone()
    compact_kv_cache(k, v, torch.tensor([1, 3], device=device), torch.tensor([[0, 2], [-1, -1]], device=device),
                     torch.tensor([0, 0], device=device))
    assert torch.equal(k, k0) and torch.equal(v, v0)


def test_compact_errors(device):
    k = torch.randn(2, 1, 10, 1, 16, device=device)
    lens = torch.tensor([6], device=device)
    with pytest.raises(ValueError, match="capacity"):
        compact_kv_cache(k, k.clone(), lens, torch.tensor([[0, 5]], device=device), torch.tensor([2], device=device))
    with pytest.raises(ValueError, match="accept_len"):
        compact_kv_cache(k, k.clone(), lens, torch.tensor([[0, 1]], device=device), torch.tensor([3], device=device))
    with pytest.raises(ValueError, match="negative"):
        compact_kv_cache(k, k.clone(), lens, torch.tensor([[0, -1]], device=device), torch.tensor([2], device=device))
    with pytest.raises(ValueError, match="v_cache"):
        compact_kv_cache(k, k[:, :, :5].clone(), lens, torch.tensor([[0, 1]], device=device),
                         torch.tensor([1], device=device))


@pytest.mark.gpu
def test_kv_cache_cuda_graph_replay_gpu():
    """Append + compact captured once, replayed with new lengths, paths and rows (Llama-3.1-8B rows, 32 layers)."""
    NL, B, Lmax, H, D, Tn, A = 32, 2, 512, 8, 128, 60, 8
    k = torch.randn(NL, B, Lmax, H, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kn, vn = torch.randn(B, Tn, H, D, device="cuda", dtype=torch.bfloat16), torch.randn(B, Tn, H, D, device="cuda",
                                                                                            dtype=torch.bfloat16)
    lens = torch.tensor([10, 300], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(0)
    idx, n_acc = _random_paths(B, A, Tn, gen)
    idx, n_acc = idx.cuda(), n_acc.cuda()
    append_kv_cache(k[0], v[0], kn, vn, lens)
    compact_kv_cache(k, v, lens, idx, n_acc)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        append_kv_cache(k[0], v[0], kn, vn, lens)
        compact_kv_cache(k, v, lens, idx, n_acc)
    for it in range(2):
        kn.normal_()
        vn.normal_()
        lens.copy_(torch.tensor([50 + it, 400 - it], dtype=torch.int32))
        new_idx, new_acc = _random_paths(B, A, Tn, gen)
        idx.copy_(new_idx)
        n_acc.copy_(new_acc)
        k_ref, v_ref = k.clone(), v.clone()
        append_kv_cache_ref(k_ref[0], v_ref[0], kn, vn, lens)
        compact_kv_cache_ref(k_ref, v_ref, lens, idx, n_acc)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
