"""tree_attention and draft_tree_attention against their PyTorch references and the reference drafter's dense
masked attention (CPU: Triton interpreter, tiny shapes; GPU: bf16/fp16 at real shapes, CUDA-graph replay)."""

import math

import pytest
import torch
from numerics import assert_close_lowp as _close

from eagle_triton.heads.config import DraftHeadConfig
from eagle_triton.heads.layers import Attention, build_attention_mask
from eagle_triton.ops.attention import (
    draft_tree_attention,
    draft_tree_attention_ref,
    tree_attention,
    tree_attention_ref,
)

CPU_DTYPES = [torch.float32, torch.float16]
GPU_DTYPES = [torch.float16, torch.bfloat16]



def _tree_inputs(B, Tq, Hq, Hkv, D, Lmax, dtype, device, masked, gen):
    q = torch.randn(B, Tq, Hq, D, generator=gen).to(device, dtype)
    k = torch.randn(B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    v = torch.randn(B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    lens = torch.randint(0, Lmax - Tq + 1, (B,), generator=gen, dtype=torch.int32)
    lens[0] = Lmax - Tq  # a full cache
    mask = None
    if masked:  # random ancestor-like masks: a random parent per node, closed under ancestry
        par = [[-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, Tq)] for _ in range(B)]
        mask = torch.zeros(B, Tq, Tq, dtype=torch.bool)
        for b in range(B):
            for i in range(Tq):
                j = i
                while j >= 0:
                    mask[b, i, j] = True
                    j = par[b][j]
        mask = mask.to(device)
    return q, k, v, lens.to(device), mask


def _tree_attention_lowp(q, k, v, lens, mask, scale):
    """The same attention in the input dtype (scores and P.V in dtype, softmax in fp32): PyTorch's own error."""
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    out = torch.empty_like(q)
    for b in range(B):
        L = int(lens[b])
        kk = k[b, : L + Tq].repeat_interleave(G, 1).transpose(0, 1)  # [Hq, L+Tq, D]
        vv = v[b, : L + Tq].repeat_interleave(G, 1).transpose(0, 1)
        s = torch.matmul(q[b].transpose(0, 1), kk.transpose(1, 2)) * scale  # [Hq, Tq, L+Tq]
        vis = torch.ones(Tq, L + Tq, dtype=torch.bool, device=q.device)
        vis[:, L:] = mask[b] if mask is not None else torch.ones(Tq, Tq, device=q.device).tril().bool()
        p = torch.softmax(s.float().masked_fill(~vis, float("-inf")), -1).to(q.dtype)
        out[b] = torch.matmul(p, vv).transpose(0, 1)
    return out


TREE_CASES = [  # B, Tq, Hq, Hkv, D, Lmax, masked, num_splits
    pytest.param(2, 5, 4, 2, 32, 40, True, 1, id="B2-T5-gqa2-D32-mask-s1"),
    pytest.param(2, 7, 6, 2, 24, 33, True, 3, id="B2-T7-gqa3-D24-mask-s3"),
    pytest.param(1, 1, 2, 1, 16, 21, False, 2, id="B1-decode-D16-s2"),
    pytest.param(3, 6, 2, 2, 16, 30, False, None, id="B3-T6-mha-causal-auto"),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES + [pytest.param(d, marks=pytest.mark.gpu) for d in [torch.bfloat16]])
@pytest.mark.parametrize("B,Tq,Hq,Hkv,D,Lmax,masked,splits", TREE_CASES)
def test_tree_attention_matches_ref(B, Tq, Hq, Hkv, D, Lmax, masked, splits, dtype, device):
    gen = torch.Generator().manual_seed(1000 + B * 31 + Tq * 7 + D)
    q, k, v, lens, mask = _tree_inputs(B, Tq, Hq, Hkv, D, Lmax, dtype, device, masked, gen)
    out = tree_attention(q, k, v, lens, mask, num_splits=splits)
    assert out.shape == q.shape and out.dtype == dtype
    ref = tree_attention_ref(q, k, v, lens, mask)
    ref32 = tree_attention_ref(q.float(), k.float(), v.float(), lens, mask)
    lowp = _tree_attention_lowp(q, k, v, lens, mask, 1 / math.sqrt(D))
    _close(out, ref32, lowp, dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(ref, ref32)


def test_tree_attention_splits_and_scale(device):
    gen = torch.Generator().manual_seed(7)
    q, k, v, lens, mask = _tree_inputs(2, 4, 4, 4, 16, 48, torch.float32, device, True, gen)
    outs = [tree_attention(q, k, v, lens, mask, softmax_scale=0.3, num_splits=s) for s in (1, 2, 5)]
    ref = tree_attention_ref(q, k, v, lens, mask, softmax_scale=0.3)
    for o in outs:
        torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)


def test_tree_attention_mask_and_prefix_semantics(device):
    """Hand-checkable: a query that sees only itself returns its own value row."""
    B, Tq, H, D, Lmax = 1, 3, 1, 16, 8
    q = torch.randn(B, Tq, H, D, device=device)
    k = torch.randn(B, Lmax, H, D, device=device)
    v = torch.randn(B, Lmax, H, D, device=device)
    lens = torch.zeros(B, dtype=torch.int32, device=device)
    mask = torch.eye(Tq, dtype=torch.bool, device=device)[None]
    out = tree_attention(q, k, v, lens, mask)
    torch.testing.assert_close(out[0, :, 0], v[0, :Tq, 0], atol=1e-6, rtol=1e-6)
    # With a prefix, the cache rows past L + Tq must never be read: poison them.
    lens = torch.full((B,), 2, dtype=torch.int32, device=device)
    k[:, 2 + Tq:] = float("nan")
    v[:, 2 + Tq:] = float("nan")
    out = tree_attention(q, k, v, lens, mask)
    torch.testing.assert_close(out, tree_attention_ref(q, k.nan_to_num(), v.nan_to_num(), lens, mask),
                               atol=1e-5, rtol=1e-5)


def test_tree_attention_errors(device):
    q = torch.randn(1, 4, 4, 16, device=device)
    k = torch.randn(1, 10, 2, 16, device=device)
    lens = torch.tensor([3], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="capacity"):
        tree_attention(q, k, k, torch.tensor([7], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="multiple of KV heads"):
        tree_attention(torch.randn(1, 4, 3, 16, device=device), k, k, lens)
    with pytest.raises(TypeError, match="k_cache"):
        tree_attention(q, k.half(), k.half(), lens)
    with pytest.raises(ValueError, match="tree_mask"):
        tree_attention(q, k, k, lens, torch.ones(1, 4, 5, dtype=torch.bool, device=device))
    with pytest.raises(TypeError, match="cache_seqlens"):
        tree_attention(q, k, k, lens.float())


# ----------------------------------------------------------------------------------------------------------------
# draft_tree_attention


def _rope_tables(P, D, device, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    f = torch.outer(torch.arange(P, dtype=torch.float32), inv)
    e = torch.cat([f, f], -1)
    return e.cos().to(device), e.sin().to(device)


DRAFT_CASES = [  # B, N, Hq, Hkv, D, Lmax, A, num_splits
    pytest.param(2, 5, 4, 2, 32, 40, 4, 1, id="B2-N5-gqa2-D32-A4-s1"),
    pytest.param(1, 3, 6, 2, 16, 27, 3, 3, id="B1-N3-gqa3-D16-A3-s3"),
    pytest.param(2, 1, 2, 1, 24, 19, 1, None, id="B2-N1-D24-A1-auto"),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES + [pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("B,N,Hq,Hkv,D,Lmax,A,splits", DRAFT_CASES)
def test_draft_tree_attention_matches_ref(B, N, Hq, Hkv, D, Lmax, A, splits, dtype, device):
    gen = torch.Generator().manual_seed(2000 + B * 13 + N * 5 + D)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(device, dtype)  # noqa: E731
    q, k, v = rnd(B, N, Hq, D), rnd(B, Lmax, Hkv, D), rnd(B, Lmax, Hkv, D)
    ak, av, kn, vn = rnd(B, N, A, Hkv, D), rnd(B, N, A, Hkv, D), rnd(B, N, Hkv, D), rnd(B, N, Hkv, D)
    prefix = torch.randint(0, Lmax + 1, (B,), generator=gen, dtype=torch.int32).to(device)
    alen = torch.randint(0, A, (B, N), generator=gen, dtype=torch.int32).to(device)
    P = 50
    pos = torch.randint(0, P, (B, N), generator=gen).to(device)
    cos, sin = _rope_tables(P, D, device)
    ak_r, av_r = ak.clone(), av.clone()
    out = draft_tree_attention(q, k, v, prefix, ak, av, alen, cos, sin, pos, kn, vn, num_splits=splits)
    ref = draft_tree_attention_ref(q, k, v, prefix, ak_r, av_r, alen, cos, sin, pos, kn, vn)
    assert torch.equal(av, av_r)  # the node's value lands in its slot, bit for bit
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ak, ak_r, atol=1e-6, rtol=1e-6)
    else:
        ak32, av32 = ak_r.float(), av_r.float()
        # fp32 math on the same (rounded) inputs; the slot write is compared separately above.
        ref32 = draft_tree_attention_ref(q.float(), k.float(), v.float(), prefix, ak.float().clone(), av32.clone(),
                                         alen, cos, sin, pos, kn.float(), vn.float())
        torch.testing.assert_close(ak.float(), ak32, atol=2e-2, rtol=2e-2)
        _close(out, ref32, _draft_lowp(q, k, v, prefix, ak_r, av_r, alen, cos, sin, pos, kn, vn), dtype)


def _draft_lowp(q, k, v, prefix, ak, av, alen, cos, sin, pos, kn, vn):
    """Frontier attention in the input dtype (scores and P.V in dtype, softmax in fp32): PyTorch's own error."""
    from eagle_triton.ops.attention import rope_ref

    B, N, Hq, D = q.shape
    G = Hq // k.shape[2]
    qr = rope_ref(q, cos, sin, pos).to(q.dtype)
    kr = rope_ref(kn, cos, sin, pos).to(q.dtype)
    out = torch.empty_like(q)
    for b in range(B):
        for n in range(N):
            L, a = int(prefix[b]), int(alen[b, n])
            keys = torch.cat([k[b, :L], ak[b, n, :a], kr[b, n][None]]).repeat_interleave(G, 1).transpose(0, 1)
            vals = torch.cat([v[b, :L], av[b, n, :a], vn[b, n][None]]).repeat_interleave(G, 1).transpose(0, 1)
            s = torch.matmul(qr[b, n][:, None], keys.transpose(1, 2)) / math.sqrt(D)  # [Hq, 1, L+a+1]
            p = torch.softmax(s.float(), -1).to(q.dtype)
            out[b, n] = torch.matmul(p, vals)[:, 0]
    return out


def _dense_level(attn, x, pos, past, tmask):
    """The reference drafter's attention at one level: the head's Attention with the dense additive mask."""
    mask = build_attention_mask(x.shape[1], past[0].shape[2], tmask, x.device)
    return attn(x, pos, mask, past)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2)])
def test_draft_tree_attention_equals_reference_drafter_attention(heads, kv_heads, device):
    """Three draft levels of K frontier nodes with random parents: packed-ancestor attention (+ o_proj) equals the
    dense-masked attention of heads/layers.py, with the KV grown and the tree mask rebuilt the way the reference
    drafter does (``cat(tree_mask[:, :, parent_rows], eye)``)."""
    torch.manual_seed(11 + heads)
    hidden, K, P0, levels = 32 * heads // 2, 3, 9, 3
    cfg = DraftHeadConfig(hidden_size=hidden, intermediate_size=48, num_attention_heads=heads, vocab_size=64,
                          num_key_value_heads=kv_heads)
    hd = cfg.head_dim  # 16
    attn = Attention(cfg, in_features=2 * hidden).to(device).eval()
    with torch.no_grad():
        x0 = torch.randn(1, P0, 2 * hidden, device=device)
        _, past = attn(x0, torch.arange(P0, device=device)[None], build_attention_mask(P0, 0, None, device), None)
        prefix_k = past[0].transpose(1, 2).contiguous()  # [1, P0, nkv, hd]: the draft KV prefix
        prefix_v = past[1].transpose(1, 2).contiguous()
        cos, sin = attn.rotary_emb.cos_cached, attn.rotary_emb.sin_cached
        eye = torch.eye(K, device=device)[None, None]
        tmask = eye
        anc_k = torch.zeros(1, K, levels + 1, kv_heads, hd, device=device)
        anc_v = torch.zeros_like(anc_k)
        anc_len = torch.zeros(1, K, dtype=torch.int32, device=device)
        lens = torch.tensor([P0], dtype=torch.int32, device=device)
        for lvl in range(levels):
            x = torch.randn(1, K, 2 * hidden, device=device)
            pos = torch.full((1, K), P0 + lvl, device=device)
            dense, past = _dense_level(attn, x, pos, past, tmask)
            q = attn.q_proj(x).view(1, K, heads, hd)
            kn = attn.k_proj(x).view(1, K, kv_heads, hd)
            vn = attn.v_proj(x).view(1, K, kv_heads, hd)
            out = draft_tree_attention(q, prefix_k, prefix_v, lens, anc_k, anc_v, anc_len, cos, sin, pos, kn, vn)
            torch.testing.assert_close(attn.o_proj(out.reshape(1, K, -1)), dense, atol=1e-5, rtol=1e-5)
            # Next level: random parents among this level's nodes (the reference keeps the best K of K*K).
            parents = torch.randint(0, K, (K,), device=device)
            anc_k, anc_v = anc_k[:, parents].clone(), anc_v[:, parents].clone()
            anc_len = anc_len[:, parents] + 1
            tmask = torch.cat((tmask[:, :, parents], eye), dim=3)
        # The packed rows now hold every node's full path: compare with the dense KV's tree rows.
        tree_k = past[0][0, :, P0:].transpose(0, 1)  # [levels*K, nkv, hd], level-major
        idx = [[i for i in range(tmask.shape[3]) if tmask[0, 0, n, i] > 0] for n in range(K)]
        for n in range(K):
            torch.testing.assert_close(anc_k[0, n, : levels], tree_k[idx[n][:levels]], atol=1e-6, rtol=1e-6)


def test_draft_tree_attention_errors(device):
    B, N, H, D, L, A = 1, 2, 2, 16, 10, 2
    t = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    cos, sin = _rope_tables(20, D, device)
    args = dict(q=t(B, N, H, D), k_cache=t(B, L, H, D), v_cache=t(B, L, H, D),
                prefix_len=torch.tensor([3], device=device), anc_k=t(B, N, A, H, D), anc_v=t(B, N, A, H, D),
                anc_len=torch.tensor([[0, 1]], device=device), cos=cos, sin=sin,
                position_ids=torch.tensor([[4, 5]], device=device), k_new=t(B, N, H, D), v_new=t(B, N, H, D))
    draft_tree_attention(**args)
    with pytest.raises(ValueError, match="anc_len"):
        draft_tree_attention(**{**args, "anc_len": torch.tensor([[0, 2]], device=device)})
    with pytest.raises(ValueError, match="position_ids"):
        draft_tree_attention(**{**args, "position_ids": torch.tensor([[4, 20]], device=device)})
    with pytest.raises(ValueError, match="prefix_len"):
        draft_tree_attention(**{**args, "prefix_len": torch.tensor([11], device=device)})
    with pytest.raises(ValueError, match="anc_v"):
        draft_tree_attention(**{**args, "anc_v": t(B, N, A + 1, H, D)})
    with pytest.raises(ValueError, match="even head_dim"):
        draft_tree_attention(**{**args, **{k: t(*v.shape[:-1], 15) for k, v in args.items()
                                           if k in ("q", "k_cache", "v_cache", "anc_k", "anc_v", "k_new", "v_new")}})


# ----------------------------------------------------------------------------------------------------------------
# GPU: real shapes and CUDA-graph replay


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("prefix", [1000, 4097])
def test_tree_attention_llama8b_shapes_gpu(prefix, dtype):
    gen = torch.Generator().manual_seed(prefix)
    Tq, Lmax = 60, prefix + 64
    q, k, v, lens, mask = _tree_inputs(1, Tq, 32, 8, 128, Lmax, dtype, "cuda", True, gen)
    lens.fill_(prefix)
    out = tree_attention(q, k, v, lens, mask)
    ref32 = tree_attention_ref(q.float(), k.float(), v.float(), lens, mask)
    _close(out, ref32, _tree_attention_lowp(q, k, v, lens, mask, 1 / math.sqrt(128)), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_draft_tree_attention_llama8b_shapes_gpu(dtype):
    gen = torch.Generator().manual_seed(5)
    B, N, Hq, Hkv, D, Lmax, A = 1, 10, 32, 8, 128, 2100, 8
    rnd = lambda *s: torch.randn(*s, generator=gen).to("cuda", dtype)  # noqa: E731
    q, k, v = rnd(B, N, Hq, D), rnd(B, Lmax, Hkv, D), rnd(B, Lmax, Hkv, D)
    ak, av, kn, vn = rnd(B, N, A, Hkv, D), rnd(B, N, A, Hkv, D), rnd(B, N, Hkv, D), rnd(B, N, Hkv, D)
    prefix = torch.tensor([2000], dtype=torch.int32, device="cuda")
    alen = torch.randint(0, A, (B, N), generator=gen, dtype=torch.int32).cuda()
    pos = torch.randint(0, 4096, (B, N), generator=gen).cuda()
    cos, sin = _rope_tables(4096, D, "cuda")
    out = draft_tree_attention(q, k, v, prefix, ak.clone(), av.clone(), alen, cos, sin, pos, kn, vn)
    ref32 = draft_tree_attention_ref(q.float(), k.float(), v.float(), prefix, ak.float(), av.float(), alen, cos,
                                     sin, pos, kn.float(), vn.float())
    _close(out, ref32, _draft_lowp(q, k, v, prefix, ak, av, alen, cos, sin, pos, kn, vn), dtype)


@pytest.mark.gpu
def test_attention_cuda_graph_replay_gpu():
    gen = torch.Generator().manual_seed(3)
    q, k, v, lens, mask = _tree_inputs(1, 60, 32, 8, 128, 1200, torch.bfloat16, "cuda", True, gen)
    lens.fill_(1000)
    tree_attention(q, k, v, lens, mask)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = tree_attention(q, k, v, lens, mask)
    for new_len in (700, 1100):
        q.copy_(torch.randn_like(q))
        lens.fill_(new_len)
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, tree_attention(q, k, v, lens, mask), atol=0, rtol=0)
