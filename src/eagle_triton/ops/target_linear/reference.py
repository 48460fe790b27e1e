"""PyTorch references (the specification) for :mod:`eagle_triton.ops.target_linear`.

They follow the eager sequence of transformers' Llama-family layers, with the same roundings to the input dtype:
LlamaRMSNorm (normalise in fp32, cast, multiply by the weight), ``F.linear``, ``F.silu(gate) * up``, ``x + y``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["target_linear_ref", "target_rms_norm_ref"]


def target_rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, **_: object) -> torch.Tensor:
    """transformers' LlamaRMSNorm over the last dim: fp32 normalisation, cast to ``x.dtype``, times ``weight``."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def target_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    silu_mul: bool = False,
    out: torch.Tensor | None = None,
    **_: object,
) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.target_linear.target_linear` (same contract)."""
    h = target_rms_norm_ref(x, norm_weight, eps) if norm_weight is not None else x
    y = F.linear(h, weight, bias)
    if silu_mul:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = residual + y
    if out is not None:
        out.copy_(y)
        return out
    return y
