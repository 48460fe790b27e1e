"""Comparing two floating-point computations of the same function that may round differently (another library,
another kernel, another memory alignment): flash-attention's rule instead of a fixed tolerance.

Exact equality is right only where the same operations run on the same inputs in the same order. Elsewhere a fixed
``atol`` depends on a dependency's rounding and on the magnitude of the values; this rule does not: the result under
test may be at most ``factor`` times further from a float64 reference than PyTorch's (or transformers') own result
in the same dtype, plus a few units of roundoff at the reference's magnitude (the baseline can be exact by luck).
"""

from __future__ import annotations

import torch

__all__ = ["assert_close_to_reference", "assert_close_lowp", "roundoff"]


def roundoff(reference: torch.Tensor, dtype: torch.dtype, ulps: float = 4.0) -> float:
    """``ulps`` units of ``dtype``'s roundoff at the largest magnitude of ``reference``."""
    return ulps * torch.finfo(dtype).eps * float(reference.detach().double().abs().max())


def assert_close_to_reference(actual: torch.Tensor, baseline: torch.Tensor, reference: torch.Tensor,
                              factor: float = 2.0, what: str = "result") -> None:
    """``max|actual - reference| <= factor * max|baseline - reference| + roundoff``.

    ``actual``: the computation under test; ``baseline``: the established computation in the same dtype;
    ``reference``: the same function in float64 (or at least a wider dtype than ``actual``'s).
    """
    assert actual.shape == baseline.shape == reference.shape, (actual.shape, baseline.shape, reference.shape)
    assert torch.finfo(reference.dtype).eps < torch.finfo(actual.dtype).eps, "the reference needs a wider dtype"
    ref = reference.detach().double()
    err = float((actual.detach().double() - ref).abs().max())
    base = float((baseline.detach().double() - ref).abs().max())
    bound = factor * base + roundoff(ref, actual.dtype)
    assert err <= bound, (f"{what}: max error {err:.3g} against the float64 reference exceeds {factor} x the "
                          f"baseline's {base:.3g} + roundoff ({bound:.3g})")


def assert_close_lowp(out: torch.Tensor, ref32: torch.Tensor, lowp: torch.Tensor, dtype: torch.dtype) -> None:
    """A kernel's output against an fp32 reference: fp32 within 1e-5; half types at most 2x the same-dtype PyTorch
    computation's error (``lowp``) plus a rounding floor (flash-attention's ``+0.3 - 0.3`` trick, STYLE.md)."""
    out, ref32 = out.float(), ref32.float()
    assert torch.isfinite(out).all(), "non-finite output"
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref32, atol=1e-5, rtol=1e-5)
        return
    r = ref32.to(dtype)
    floor = 2 * (r + 0.3 - 0.3 - r).abs().max().item()
    err = (out - ref32).abs().max().item()
    torch_err = (lowp.float() - ref32).abs().max().item()
    assert err <= 2 * torch_err + floor, f"max error {err:.3e} > 2 x torch {torch_err:.3e} + floor {floor:.3e}"
