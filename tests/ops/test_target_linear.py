"""The batch-invariant weight product (RMSNorm prologue, bias, SiLU·mul and residual epilogues, partial sums of
squares written and read), the standalone RMSNorm and the embedding gather against their references, and a row's
exact independence from the rows computed with it."""

import dataclasses

import pytest
import torch

from eagle_triton.ops.target_linear import (
    KEY_EMPTY,
    LinearConfig,
    argmax_from_keys,
    argmax_keys_ref,
    default_config,
    fold_norm_weight,
    sumsq_width,
    target_embedding,
    target_embedding_ref,
    target_linear,
    target_linear_ref,
    target_rms_norm,
    target_rms_norm_ref,
)

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
SMALL = LinearConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)  # several tiles per dim
ROTATED = dataclasses.replace(SMALL, rotate=True)  # each column tile starts its reduction at another chunk
FLAGS = {"plain": {}, "bias": {"bias": True}, "norm": {"norm": True}, "residual": {"residual": True},
         "silu_mul": {"silu_mul": True}, "all": {"bias": True, "norm": True, "silu_mul": True, "residual": True}}


def _inputs(M, N, K, dtype, device, seed, bias=False, norm=False, residual=False, silu_mul=False):
    g = torch.Generator().manual_seed(seed)
    rows = 2 * N if silu_mul else N
    x = torch.randn(M, K, generator=g).to(device, dtype)
    w = (torch.randn(rows, K, generator=g) / K ** 0.5).to(device, dtype)
    kw = {"silu_mul": silu_mul}
    if bias:
        kw["bias"] = (0.1 * torch.randn(rows, generator=g)).to(device, dtype)
    if norm:
        kw["norm_weight"] = (1 + 0.1 * torch.randn(K, generator=g)).to(device, dtype)
        kw["eps"] = 1e-5
    if residual:
        kw["residual"] = torch.randn(M, N, generator=g).to(device, dtype)
    return x, w, kw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flags", list(FLAGS), ids=list(FLAGS))
@pytest.mark.parametrize("M,N,K,cfg", [(1, 50, 70, None), (37, 24, 33, SMALL), (70, 9, 48, None),
                                         (5, 40, 70, ROTATED)])
def test_linear_matches_reference(M, N, K, cfg, flags, dtype, device):
    x, w, kw = _inputs(M, N, K, dtype, device, seed=M * 31 + N, **FLAGS[flags])
    y = target_linear(x, w, config=cfg, **kw)
    ref = target_linear_ref(x.double(), w.double(), **{k: v.double() if torch.is_tensor(v) else v
                                                       for k, v in kw.items()})
    atol, rtol = TOL[dtype]
    assert y.dtype == dtype and y.shape == (M, N)
    torch.testing.assert_close(y.double(), ref, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [SMALL, ROTATED, None], ids=["16x16x16", "rotated", "default"])
def test_linear_row_is_batch_invariant(cfg, dtype, device):
    """A row computed alone, inside a 5-row batch, and inside a 45-row batch (several row tiles at 16) is
    bit-identical, whatever the epilogue."""
    for flags in ("plain", "all"):
        x, w, kw = _inputs(45, 40, 72, dtype, device, seed=7, **FLAGS[flags])
        full = target_linear(x, w, config=cfg, **kw)

        def rows(sl, kw=kw):
            return {k: (v[sl] if k == "residual" else v) for k, v in kw.items()}

        for r in (0, 3, 17, 44):
            alone = target_linear(x[r:r + 1], w, config=cfg, **rows(slice(r, r + 1)))
            assert torch.equal(alone, full[r:r + 1]), (flags, r)
        few = target_linear(x[16:21], w, config=cfg, **rows(slice(16, 21)))
        assert torch.equal(few, full[16:21])


def test_default_config_ignores_the_row_count():
    """The launcher's tile choice is a function of the weight (N, K, the fused epilogue) alone: no M."""
    import inspect

    assert list(inspect.signature(default_config).parameters) == ["N", "K", "device", "dtype", "silu_mul"]
    assert default_config(4096, 4096) == default_config(4096, 4096)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K", [(1, 48), (9, 130), (3, 7)])
def test_rms_norm_matches_reference_and_is_row_invariant(M, K, dtype, device):
    g = torch.Generator().manual_seed(K)
    x = torch.randn(M, K, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(K, generator=g)).to(device, dtype)
    y = target_rms_norm(x, w, 1e-6)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.float(), target_rms_norm_ref(x, w, 1e-6).float(), atol=atol, rtol=rtol)
    assert torch.equal(target_rms_norm(x[-1:], w, 1e-6), y[-1:])


def test_bad_inputs_are_named(device):
    x, w, _ = _inputs(4, 6, 8, torch.float32, device, 0)
    with pytest.raises(ValueError, match="weight must be"):
        target_linear(x, w[:, :5])
    with pytest.raises(TypeError, match="weight must have dtype"):
        target_linear(x, w.half())
    with pytest.raises(ValueError, match="even row count"):
        target_linear(x, w[:5], silu_mul=True)
    with pytest.raises(ValueError, match="residual must have shape"):
        target_linear(x, w, residual=torch.randn(4, 7, device=device))
    with pytest.raises(ValueError, match="norm_weight must have shape"):
        target_linear(x, w, norm_weight=torch.randn(7, device=device))


@pytest.mark.parametrize("flags", ["plain", "all"])
@pytest.mark.parametrize("K", [16, 33, 48, 70])  # one chunk, a partial second, exactly three, more than the prefetch
def test_weight_prefetch_changes_no_bit(K, flags, device):
    """``prefetch`` (weight chunks loaded before waiting on the previous kernel) reduces the same chunks in the same
    order, and ``l2_prefetch`` (chunks asked of L2 then; on the GPU only, where launches use PDL) is a hint: the
    result is bit-identical to the plain loop, with and without the norm and SiLU·mul (21 columns: a partial tile,
    whose hints are clamped inside the weight)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x, w, kw = _inputs(5, 21, K, dtype, device, seed=K, **FLAGS[flags])
    for rotate in (False, True):  # rotated: the prefetched chunks are the tile's first ones in its own order
        base = target_linear(x, w, config=dataclasses.replace(SMALL, rotate=rotate), **kw)
        for pre, l2 in ((1, 0), (2, 0), (0, 1), (0, 8), (1, 2)):
            cfg = LinearConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1, prefetch=pre,
                               l2_prefetch=l2, rotate=rotate)
            assert torch.equal(target_linear(x, w, config=cfg, **kw), base), (pre, l2, rotate)
    with pytest.raises(ValueError, match="prefetch"):
        LinearConfig(prefetch=3)
    with pytest.raises(ValueError, match="l2_prefetch"):
        LinearConfig(l2_prefetch=3)


@pytest.mark.parametrize("rotate", [False, True])
def test_rotate_starts_each_tile_at_its_own_chunk(rotate, device):
    """With ``rotate``, column tile ``n`` reduces chunks ``n % 3, ..`` of a 3-chunk reduction. The x row holds
    ``1e8`` in chunk 0, ``1`` in chunk 1 and ``-1e8`` in chunk 2 (fp32, weights of ones): only the order
    2, 0, 1 keeps the 1 (``1e8 + 1`` and ``1 - 1e8`` round it away), so tile 2 alone sums to 1; without
    ``rotate`` every tile sums in order 0, 1, 2 and gets 0."""
    x = torch.zeros(1, 48, device=device)
    x[0, 0], x[0, 16], x[0, 32] = 1e8, 1.0, -1e8
    w = torch.ones(48, 48, device=device)
    y = target_linear(x, w, config=dataclasses.replace(SMALL, rotate=rotate))
    want = torch.zeros(1, 48, device=device)
    if rotate:
        want[0, 32:] = 1.0
    assert torch.equal(y, want)


def test_default_config_rotates_the_measured_products(monkeypatch):
    """On the GPU in 16 bits, at 8B-class widths, the gate/up product (``silu_mul``) and the q/k/v product with RoPE
    (tiles derived from it) reduce in rotated order; o, down and lm_head do not (measured slower or no faster)."""
    import importlib

    from eagle_triton.ops.rope_kv import qkv_rope_config

    for mod in ("eagle_triton.ops.target_linear.op", "eagle_triton.ops.rope_kv.op"):  # the GPU's tiles, here too
        monkeypatch.setattr(importlib.import_module(mod), "interpreter_tiles", lambda device: False)
    cuda = torch.device("cuda")
    assert default_config(14336, 4096, cuda, silu_mul=True).rotate
    assert qkv_rope_config(32, 8, 128, 4096, cuda).rotate
    assert not any(default_config(n, k, cuda).rotate for n, k in ((4096, 4096), (4096, 14336), (128256, 4096)))
    assert not default_config(1536, 576, cuda, silu_mul=True).rotate  # small models: not measured


def _empty_keys(M, device):
    return torch.full((M,), KEY_EMPTY, dtype=torch.int64, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K,cfg", [(1, 50, 70, None), (37, 70, 33, SMALL), (9, 300, 48, ROTATED)])
def test_argmax_keys_match_argmax_of_the_outputs(M, N, K, cfg, dtype, device):
    """Each row's key holds the maximum of its outputs as stored and the first column holding it: ties inside a
    tile and across tiles (duplicated weight rows give bit-equal outputs), negative rows, and a row whose maximum
    is zero with -0.0 before +0.0 (equal, as torch compares them); ``store_output=False`` writes the same keys and
    no outputs."""
    x, w, kw = _inputs(M, N, K, dtype, device, seed=M * 7 + N, bias=True)
    w[N - 1] = w[3]  # a tie across tiles (the first index wins)
    w[5] = w[4]  # a tie inside a tile
    x[0] = -x[0].abs()  # a row of mixed signs
    kw["bias"][N // 2] = 50.0  # one row's maximum is large
    keys = _empty_keys(M, device)
    y = target_linear(x, w, config=cfg, argmax_keys=keys, **kw)
    assert torch.equal(keys, argmax_keys_ref(y))
    assert torch.equal(argmax_from_keys(keys), y.float().argmax(-1))
    keys2 = _empty_keys(M, device)
    assert target_linear(x, w, config=cfg, argmax_keys=keys2, store_output=False, **kw) is None
    assert torch.equal(keys2, keys)
    alone = _empty_keys(1, device)  # a row alone: the same key (batch invariance)
    target_linear(x[M - 1:], w, config=cfg, argmax_keys=alone, store_output=False, **kw)
    assert torch.equal(alone, keys[M - 1:])
    zeros = torch.tensor([[-0.0, 0.0, -1.0]], device=device)
    assert argmax_from_keys(argmax_keys_ref(zeros)).tolist() == [0] == zeros.argmax(-1).tolist()


def test_rms_norm_resets_argmax_keys_and_bad_keys_are_named(device):
    x, w, _ = _inputs(6, 5, 40, torch.float32, device, 1)
    nw = torch.ones(40, device=device)
    keys = torch.randint(0, 1 << 40, (6,), device=device)
    y = target_rms_norm(x, nw, 1e-6, reset_argmax_keys=keys)
    assert (keys == KEY_EMPTY).all() and torch.equal(y, target_rms_norm(x, nw, 1e-6))
    with pytest.raises(TypeError, match="argmax_keys must have dtype"):
        target_linear(x, w, argmax_keys=keys.int())
    with pytest.raises(ValueError, match="argmax_keys must have shape"):
        target_linear(x, w, argmax_keys=keys[:5])
    with pytest.raises(ValueError, match="store_output=False needs argmax_keys"):
        target_linear(x, w, store_output=False)
    with pytest.raises(ValueError, match="reset_argmax_keys must have shape"):
        target_rms_norm(x, nw, 1e-6, reset_argmax_keys=keys[:2])


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(1536, 2048), (4096, 4096), (300, 576)])
def test_gpu_linear_default_config_invariant_at_real_shapes(N, K):
    """bf16, default tiles: a row alone, in a 60-row verify, a 64-row chunk and a 200-row batch is bit-identical."""
    for flags in ("plain", "all"):
        x, w, kw = _inputs(200, N, K, torch.bfloat16, "cuda", seed=N, **FLAGS[flags])
        full = target_linear(x, w, **kw)
        for M in (1, 60, 64):
            sub = {k: (v[:M] if k == "residual" else v) for k, v in kw.items()}
            assert torch.equal(target_linear(x[:M], w, **sub), full[:M]), (flags, M)
        ref = target_linear_ref(x.float(), w.float(), **{k: v.float() if torch.is_tensor(v) else v
                                                         for k, v in kw.items()})
        torch.testing.assert_close(full.float(), ref, atol=0.1, rtol=0.03)


# -- partial sums of squares: written by a product's epilogue, read by the next RMSNorm --------------------------
def _tile_sumsq(y, width, P):
    """fp32 [M, P]: the sums of squares of y's stored values over column tiles of ``width`` (independent of the
    module under test)."""
    y32 = torch.nn.functional.pad(y.float(), (0, P * width - y.shape[1]))
    return y32.pow(2).view(y.shape[0], P, width).sum(-1)


def _partials(M, P, device):
    """An fp32 row-major [M, P] buffer (what the target forward allocates)."""
    return torch.empty(M, P, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flags", ["plain", "residual", "all"])
@pytest.mark.parametrize("M,N,K,cfg", [(1, 50, 70, SMALL), (37, 24, 33, SMALL), (70, 9, 48, None),
                                       (5, 130, 20, None)])
def test_sumsq_out_matches_reference(M, N, K, cfg, flags, dtype, device):
    x, w, kw = _inputs(M, N, K, dtype, device, seed=M * 7 + N, **FLAGS[flags])
    used = cfg or default_config(N, K, device, dtype, silu_mul=kw["silu_mul"])
    P = sumsq_width(N, used)
    ss = _partials(M, P, device)
    y = target_linear(x, w, sumsq_out=ss, config=cfg, **kw)
    # the partials are those of the stored (rounded) outputs, over BN-wide tiles
    torch.testing.assert_close(ss, _tile_sumsq(y, used.block_n, P), atol=1e-5, rtol=1e-5)
    ref_ss = torch.empty(M, P, device=device, dtype=torch.float64)
    ref = target_linear_ref(x.double(), w.double(), sumsq_out=ref_ss, config=used,
                            **{k: v.double() if torch.is_tensor(v) else v for k, v in kw.items()})
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double(), ref, atol=atol * 4, rtol=rtol * 4)
    torch.testing.assert_close(ss.double(), ref_ss, atol=atol * 8 * used.block_n, rtol=rtol * 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flags", ["norm", "all"])
@pytest.mark.parametrize("M,N,K,P", [(1, 50, 70, 5), (37, 24, 33, 3), (9, 17, 130, 1), (4, 17, 130, 100)])
def test_norm_from_partials_matches_reference(M, N, K, P, flags, dtype, device):
    """The prologue's RMSNorm reading P partial sums of squares of x: against the reference given the same
    partials, and against the norm that sums the row itself (within the dtype's tolerance)."""
    x, w, kw = _inputs(M, N, K, dtype, device, seed=K + P, **FLAGS[flags])
    ss = _tile_sumsq(x, -(-K // P), P)
    y = target_linear(x, w, sumsq=ss, config=SMALL, **kw)
    ref = target_linear_ref(x, w, sumsq=ss, **kw)
    row = target_linear(x, w, config=SMALL, **kw)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.float(), ref.float(), atol=atol * 4, rtol=rtol * 4)
    torch.testing.assert_close(y.float(), row.float(), atol=atol * 4, rtol=rtol * 4)
    h = target_rms_norm(x, kw["norm_weight"], kw["eps"], sumsq=ss)
    torch.testing.assert_close(h.float(), target_rms_norm_ref(x, kw["norm_weight"], kw["eps"], sumsq=ss).float(),
                               atol=atol, rtol=rtol)
    torch.testing.assert_close(h.float(), target_rms_norm(x, kw["norm_weight"], kw["eps"]).float(), atol=atol,
                               rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("P", [1, 3, 7, 64])
def test_embedding_matches_reference(P, dtype, device):
    g = torch.Generator().manual_seed(P)
    weight = torch.randn(23, 50, generator=g).to(device, dtype)
    ids = torch.tensor([5, 0, 22, 5, 13], device=device)
    ss = _partials(5, P, device)
    y = target_embedding(ids, weight, sumsq_out=ss)
    ref_ss = torch.empty(5, P, device=device)
    assert torch.equal(y, target_embedding_ref(ids, weight, sumsq_out=ref_ss))
    torch.testing.assert_close(ss, ref_ss, atol=1e-5, rtol=1e-5)
    assert torch.equal(target_embedding(ids.int(), weight), y)
    strided = torch.stack([ids, ids.flip(0)], 1)[:, 0]  # ids at stride 2
    assert torch.equal(target_embedding(strided, weight), y)


def _norm_chain_weights(H, inter, V, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return dict(emb=torch.randn(V, H, generator=g).to(device, dtype),
                w_gu=(torch.randn(2 * inter, H, generator=g) / H ** 0.5).to(device, dtype),
                w_d=(torch.randn(H, inter, generator=g) / inter ** 0.5).to(device, dtype),
                w_q=(torch.randn(3 * H // 2, H, generator=g) / H ** 0.5).to(device, dtype),
                nw=[(1 + 0.1 * torch.randn(H, generator=g)).to(device, dtype) for _ in range(3)])


def _norm_chain(ids, p, cfg, folded=False):
    """embedding (partials out) -> normed gate/up product (partials in) -> down product with the residual
    (partials out) -> normed q/k/v-like product -> final RMSNorm (partials in): what one layer of the fused target
    forward does with the residual stream (``folded``: the norm weights folded into the products' weights)."""
    M, H = ids.shape[0], p["emb"].shape[1]
    P = sumsq_width(H, cfg or default_config(H, p["w_d"].shape[1], ids.device, p["emb"].dtype))
    s0, s1 = _partials(M, P, ids.device), _partials(M, P, ids.device)
    x = target_embedding(ids, p["emb"], sumsq_out=s0)
    if folded:
        h = target_linear(x, fold_norm_weight(p["w_gu"], p["nw"][0]), sumsq=s0, norm_folded=True, silu_mul=True,
                          config=cfg)
    else:
        h = target_linear(x, p["w_gu"], norm_weight=p["nw"][0], sumsq=s0, silu_mul=True, config=cfg)
    x = target_linear(h, p["w_d"], residual=x, sumsq_out=s1, config=cfg)
    if folded:
        q = target_linear(x, fold_norm_weight(p["w_q"], p["nw"][1]), sumsq=s1, norm_folded=True, config=cfg)
    else:
        q = target_linear(x, p["w_q"], norm_weight=p["nw"][1], sumsq=s1, config=cfg)
    return x, s1, q, target_rms_norm(x, p["nw"][2], sumsq=s1)


@pytest.mark.parametrize("folded", [False, True], ids=["prologue", "folded"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [SMALL, None], ids=["16x16x16", "default"])
def test_norm_chain_row_is_batch_invariant(cfg, dtype, folded, device):
    """A row computed alone, or inside a 5-row batch, equals bit for bit the same row inside a 37-row batch,
    through the whole chain of partial sums of squares (the norm in the prologue, or folded into the weights)."""
    p = _norm_chain_weights(40, 24, 31, dtype, device, seed=11)
    ids = torch.randint(0, 31, (37,), generator=torch.Generator().manual_seed(12)).to(device)
    full = _norm_chain(ids, p, cfg, folded)
    for lo, hi in ((0, 1), (17, 18), (36, 37), (14, 19)):
        for a, b in zip(_norm_chain(ids[lo:hi], p, cfg, folded), full, strict=True):
            assert torch.equal(a, b[lo:hi]), (lo, hi)


@pytest.mark.gpu
@pytest.mark.parametrize("folded", [False, True], ids=["prologue", "folded"])
@pytest.mark.parametrize("H,inter", [(576, 1536), (4096, 2048)])
def test_gpu_norm_chain_invariant_at_real_shapes(H, inter, folded):
    """bf16, default tiles (SmolLM2 and Llama-8B hidden sizes): the chain's rows alone, in a 60-row verify and a
    64-row chunk, at the start of the batch or anywhere inside a row tile, equal those of a 200-row batch bit for
    bit, and the norms match the row-sum norms closely."""
    p = _norm_chain_weights(H, inter, 1000, torch.bfloat16, "cuda", seed=H)
    ids = torch.randint(0, 1000, (200,), generator=torch.Generator().manual_seed(0)).cuda()
    full = _norm_chain(ids, p, None, folded)
    bad = []
    for lo, hi in ((0, 1), (0, 60), (0, 64), (1, 2), (37, 38), (65, 68), (100, 160)):
        for name, a, b in zip(("x", "sumsq", "q", "h"), _norm_chain(ids[lo:hi], p, None, folded), full, strict=True):
            if not torch.equal(a, b[lo:hi]):
                bad.append((lo, hi, name))
    assert not bad, bad
    x, _, _, h = full
    torch.testing.assert_close(h.float(), target_rms_norm(x, p["nw"][2]).float(), atol=0.02, rtol=0.02)


def test_partials_bad_inputs_are_named(device):
    x, w, kw = _inputs(4, 6, 8, torch.float32, device, 0, norm=True)
    with pytest.raises(ValueError, match="pass norm_weight too"):
        target_linear(x, w, sumsq=torch.ones(4, 2, device=device))
    with pytest.raises(TypeError, match="sumsq must have dtype"):
        target_linear(x, w, sumsq=torch.ones(4, 2, device=device, dtype=torch.float64), **kw)
    with pytest.raises(ValueError, match=r"sumsq must have shape \[M=4"):
        target_linear(x, w, sumsq=torch.ones(3, 2, device=device), **kw)
    with pytest.raises(ValueError, match=r"sumsq_out must have shape \[M=4, 1\]"):
        target_linear(x, w, sumsq_out=torch.empty(4, 2, device=device))
    with pytest.raises(ValueError, match="sumsq must have shape"):
        target_rms_norm(x, kw["norm_weight"], sumsq=torch.ones(4, 0, device=device))
    transposed = torch.ones(3, 4, device=device).t()  # [4, 3] with column stride 4
    with pytest.raises(ValueError, match="sumsq must be row-major"):
        target_linear(x, w, sumsq=transposed, **kw)
    with pytest.raises(ValueError, match="sumsq must be row-major"):
        target_rms_norm(x, kw["norm_weight"], sumsq=transposed)
    with pytest.raises(ValueError, match="sumsq_out must be row-major"):
        target_embedding(torch.tensor([0, 1, 2, 3], device=device), torch.randn(5, 8, device=device),
                         sumsq_out=transposed)
    emb = torch.randn(5, 8, device=device)
    with pytest.raises(TypeError, match="ids must have dtype"):
        target_embedding(torch.tensor([0.0], device=device), emb)
    if device == "cpu":
        with pytest.raises(IndexError, match="token id 5 is out of the embedding's range"):
            target_embedding(torch.tensor([1, 5]), emb)


# ------------------------------------------------------------------------------------------------ folded RMSNorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flags", ["norm", "all"])
@pytest.mark.parametrize("M,N,K,P", [(1, 50, 70, 5), (37, 24, 33, 3), (9, 17, 130, 1), (4, 17, 130, 100)])
def test_norm_folded_matches_reference(M, N, K, P, flags, dtype, device):
    """The norm weight folded into W and each row's rstd (from P partials) applied to the product: against the
    folded reference (same contract, fp64) and against the unfolded RMSNorm product, within the dtype's tolerance
    (the folded form skips the rounding of the normalised row)."""
    x, w, kw = _inputs(M, N, K, dtype, device, seed=int(torch.randint(1 << 30, ())), **FLAGS[flags])
    nw = kw.pop("norm_weight")
    ss = _tile_sumsq(x, -(-K // P), P)
    wf = fold_norm_weight(w, nw)
    y = target_linear(x, wf, sumsq=ss, norm_folded=True, config=SMALL, **kw)
    ref = target_linear_ref(x.double(), wf.double(), sumsq=ss, norm_folded=True,
                            **{k: v.double() if torch.is_tensor(v) else v for k, v in kw.items()})
    unfolded = target_linear_ref(x.double(), w.double(), norm_weight=nw.double(), sumsq=ss,
                                 **{k: v.double() if torch.is_tensor(v) else v for k, v in kw.items()})
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double(), ref, atol=atol * 4, rtol=rtol * 4)
    torch.testing.assert_close(y.double(), unfolded, atol=atol * 8, rtol=rtol * 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_folded_row_is_batch_invariant_and_prefetch_free(dtype, device):
    """Folded: a row alone, in 5 rows and in 45 rows (several row tiles) is bit-identical, with and without the
    weight chunks prefetched, with the SiLU·mul, bias and residual epilogues."""
    x, w, kw = _inputs(45, 40, 72, dtype, device, seed=int(torch.randint(1 << 30, ())), **FLAGS["all"])
    wf = fold_norm_weight(w, kw.pop("norm_weight"))
    ss = _tile_sumsq(x, 24, 3)
    for pre in (0, 1, 2):
        cfg = LinearConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1, prefetch=pre)
        full = target_linear(x, wf, sumsq=ss, norm_folded=True, config=cfg, **kw)
        if pre == 0:
            base = full
        assert torch.equal(full, base), pre
        for sl in (slice(0, 1), slice(44, 45), slice(16, 21)):
            part = target_linear(x[sl], wf, sumsq=ss[sl], norm_folded=True, config=cfg,
                                 **{k: (v[sl] if k == "residual" else v) for k, v in kw.items()})
            assert torch.equal(part, full[sl]), (pre, sl)


def test_norm_folded_bad_inputs_are_named(device):
    x, w, kw = _inputs(4, 6, 8, torch.float32, device, 0, norm=True)
    ss = torch.ones(4, 2, device=device)
    with pytest.raises(ValueError, match="norm_folded needs sumsq"):
        target_linear(x, w, norm_folded=True)
    with pytest.raises(ValueError, match="norm_folded needs sumsq"):
        target_linear(x, w, sumsq=ss, norm_folded=True, **kw)
    with pytest.raises(ValueError, match=r"norm_weight must be \[K=8\]"):
        fold_norm_weight(w, kw["norm_weight"][:5])
