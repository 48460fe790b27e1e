"""PyTorch reference (the specification) for :mod:`eagle_triton.ops.lm_head_topk`."""

from __future__ import annotations

import torch

__all__ = ["lm_head_topk_ref"]


def lm_head_topk_ref(
    hidden: torch.Tensor, weight: torch.Tensor, k: int, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of ``log_softmax(hidden @ weight.T + bias)`` per row, in fp32 from upcast inputs.

    Returns ``(logp [M, k] fp32, ids [M, k] int64)``, sorted by log-probability descending; equal values are
    ordered by lower id first (a stable descending sort).
    """
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    logp = torch.log_softmax(logits, dim=-1)
    order = torch.sort(logp, dim=-1, descending=True, stable=True).indices[:, :k]
    return logp.gather(1, order), order
