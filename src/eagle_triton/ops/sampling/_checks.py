"""Argument validation and per-row parameter broadcasting for the sampling helpers."""

from __future__ import annotations

import torch

from .._utils import check_tensor


def check_probs(name: str, t: torch.Tensor, float_only: bool = True) -> None:
    dtypes = (torch.float32,) if float_only else (torch.float32, torch.float16, torch.bfloat16)
    check_tensor(name, t, ndim=2, dtypes=dtypes)
    if t.shape[1] < 1:
        raise ValueError(f"{name} must have a non-empty vocabulary dim, got shape {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def per_row(value, M: int, dtype: torch.dtype, device, name: str) -> torch.Tensor:
    """A scalar or a ``[M]`` tensor -> a contiguous ``[M]`` tensor of ``dtype`` on ``device`` (no host sync)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            value = value.reshape(1).expand(M)
        if value.shape != (M,):
            raise ValueError(f"{name} must be a scalar or a [{M}] tensor, got shape {list(value.shape)}")
        if value.device != torch.device(device):
            raise ValueError(f"{name} is on {value.device} but probs are on {device}")
        return value.to(dtype).contiguous()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    if name == "temperature" and not value > 0:
        raise ValueError(f"temperature must be > 0, got {value}")
    return torch.full((M,), value, dtype=dtype, device=device)


def check_seed_offset(seed, offset, device) -> None:
    for name, t in (("seed", seed), ("offset", offset)):
        check_tensor(name, t, dtypes=(torch.int64,), device=device)
        if t.numel() != 1:
            raise ValueError(f"{name} must be a one-element int64 tensor, got shape {list(t.shape)}")
