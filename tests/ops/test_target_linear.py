"""The batch-invariant weight product (RMSNorm prologue, bias, SiLU·mul and residual epilogues) and the standalone
RMSNorm against their references, and a row's exact independence from the rows computed with it."""

import pytest
import torch

from eagle_triton.ops.target_linear import (
    LinearConfig,
    default_config,
    target_linear,
    target_linear_ref,
    target_rms_norm,
    target_rms_norm_ref,
)

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
SMALL = LinearConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)  # several tiles per dim
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
@pytest.mark.parametrize("M,N,K,cfg", [(1, 50, 70, None), (37, 24, 33, SMALL), (70, 9, 48, None)])
def test_linear_matches_reference(M, N, K, cfg, flags, dtype, device):
    x, w, kw = _inputs(M, N, K, dtype, device, seed=M * 31 + N, **FLAGS[flags])
    y = target_linear(x, w, config=cfg, **kw)
    ref = target_linear_ref(x.double(), w.double(), **{k: v.double() if torch.is_tensor(v) else v
                                                       for k, v in kw.items()})
    atol, rtol = TOL[dtype]
    assert y.dtype == dtype and y.shape == (M, N)
    torch.testing.assert_close(y.double(), ref, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [SMALL, None], ids=["16x16x16", "default"])
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
