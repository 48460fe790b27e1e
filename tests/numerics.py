"""Comparing two floating-point computations of the same function that may round differently (another library,
another kernel, another memory alignment): flash-attention's rule instead of a fixed tolerance.

Exact equality is right only where the same operations run on the same inputs in the same order. Elsewhere a fixed
``atol`` depends on a dependency's rounding and on the magnitude of the values; this rule does not: the result under
test may be at most ``factor`` times further from a float64 reference than PyTorch's (or transformers') own result
in the same dtype, plus a few units of roundoff at the reference's magnitude (the baseline can be exact by luck).
"""

from __future__ import annotations

import torch

__all__ = ["assert_close_to_reference", "roundoff"]


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
