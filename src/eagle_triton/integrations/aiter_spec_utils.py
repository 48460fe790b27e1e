"""AITER-style speculative-decoding utilities (the names of SGLang's ``spec_utils``), mapped onto eagle_triton's
kernels."""

from __future__ import annotations

import torch

from .. import ops
from ..ops._dispatch import with_cpu_fallback
from ..ops._utils import next_power_of_2
from .sglang import fast_topk as fast_topk_torch
from .sglang import select_top_k_tokens

__all__ = ["fast_topk_torch", "select_top_k_tokens", "generate_token_bitmask", "sample_from_logits",
           "calculate_acceptance_rate", "pad_to_alignment", "next_power_of_2"]


def generate_token_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a boolean allow-list ``[B, V]`` into an int32 bitmask ``[B, ceil(V / 32)]``: bit ``j`` of word ``w``
    is set when token ``32 * w + j`` is allowed (the layout grammar back ends such as xgrammar use)."""
    if allowed.dtype != torch.bool or allowed.dim() != 2:
        raise ValueError(f"allowed must be a [B, V] bool tensor, got {allowed.dtype} {list(allowed.shape)}")
    B, V = allowed.shape
    padded = pad_to_alignment(allowed.to(torch.int64), 32, dim=1)
    bits = padded.view(B, -1, 32) << torch.arange(32, device=allowed.device)
    return bits.sum(-1).to(torch.int64).bitwise_and(0xFFFFFFFF).to(torch.uint32).view(torch.int32)


def sample_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    uniform_samples: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row of ``logits [M, V]``: greedy when ``temperature <= 1e-5``, else softmax at
    ``temperature`` then top-k and top-p renormalisation and inverse-CDF sampling (uniforms given as a tensor, or
    drawn from ``generator``). Returns ``[M]`` int64."""
    if temperature <= 1e-5:
        return logits.argmax(-1)
    probs = _op("softmax_with_temperature")(logits.contiguous(), float(temperature))
    if top_k and top_k > 0:
        probs = _op("top_k_renorm_probs")(probs, int(top_k))
    if top_p < 1.0:
        probs = _op("top_p_renorm_probs")(probs, float(top_p))
    if uniform_samples is None:
        uniform_samples = torch.rand(probs.shape[0], device=probs.device, generator=generator)
    return _op("sampling_from_probs")(probs, uniform_samples).to(torch.int64)


def _op(name: str):
    """The Triton op on a GPU (or under the interpreter), its PyTorch reference on a plain CPU."""
    return with_cpu_fallback(getattr(ops, name), getattr(ops, name + "_ref"))


def calculate_acceptance_rate(accept_lengths, max_draft_tokens: int) -> float:
    """Accepted drafts over proposed drafts: ``sum(accept_lengths) / (steps * max_draft_tokens)``, where
    ``accept_lengths`` counts accepted drafted tokens per step (bonus excluded) and ``max_draft_tokens`` is the most
    one step can accept (tree depth + 1 for EAGLE trees)."""
    a = torch.as_tensor(accept_lengths, dtype=torch.float64).flatten()
    if a.numel() == 0:
        return 0.0
    if max_draft_tokens <= 0:
        raise ValueError(f"max_draft_tokens must be positive, got {max_draft_tokens}")
    return float(a.sum() / (a.numel() * max_draft_tokens))


def pad_to_alignment(x: torch.Tensor, alignment: int, dim: int = -1, value=0) -> torch.Tensor:
    """Pad ``x`` along ``dim`` with ``value`` up to the next multiple of ``alignment``."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    size = x.shape[dim]
    extra = (-size) % alignment
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=dim)
