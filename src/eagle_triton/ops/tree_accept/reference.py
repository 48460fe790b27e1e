"""PyTorch reference of :func:`~eagle_triton.ops.tree_accept.tree_accept_greedy` (SafeAILab ``evaluate_posterior``
with ``logits_processor=None``, in SGLang's accept conventions)."""

from __future__ import annotations

import torch

from ..target_linear.op import argmax_from_keys

__all__ = ["tree_accept_greedy_ref"]


def tree_accept_greedy_ref(
    draft_tokens: torch.Tensor,
    retrieve_indices: torch.Tensor,
    logits: torch.Tensor | None,
    features: torch.Tensor | None = None,
    out: tuple | None = None,
    next_inputs: tuple | None = None,
    validate: bool = True,
    argmax_keys: torch.Tensor | None = None,
):
    """Reference of :func:`~eagle_triton.ops.tree_accept.tree_accept_greedy` (same contract; ``out`` is filled the
    same way, ``validate`` is accepted for signature parity)."""
    del validate
    B, R, C = retrieve_indices.shape
    if argmax_keys is not None:
        pred = argmax_from_keys(argmax_keys)
    else:
        pred = logits.argmax(dim=-1)  # [B, N], first index on ties
    valid = retrieve_indices >= 0
    idx = retrieve_indices.clamp(min=0).view(B, R * C)
    cand = torch.where(valid, draft_tokens.gather(1, idx).view(B, R, C), torch.full_like(retrieve_indices, -1))
    pred_at = pred.gather(1, idx).view(B, R, C)
    match = (cand[:, :, 1:] == pred_at[:, :, :-1]) & valid[:, :, 1:]
    lens = match.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [B, R]
    accept_len, best = lens.max(dim=-1)
    path = retrieve_indices.gather(1, best.view(B, 1, 1).expand(B, 1, C)).squeeze(1)  # [B, C]
    col = torch.arange(C, device=path.device).view(1, C)
    keep = col <= accept_len.view(B, 1)
    accept_index = torch.where(keep, path, torch.full_like(path, -1))
    tokens = torch.where(keep, pred.gather(1, path.clamp(min=0)), torch.full_like(path, -1))
    feats = None
    if features is not None:
        rows = accept_index.clamp(min=0)
        feats = features.gather(1, rows.unsqueeze(-1).expand(B, C, features.shape[-1]))
    results = (accept_index, accept_len, tokens, feats)
    if next_inputs is not None:
        next_inputs[0].copy_(tokens.clamp(min=0))
        next_inputs[1].copy_((accept_len + 1).to(torch.int32))
    if out is None:
        return results
    for dst, src in zip(out, results, strict=True):
        if dst is not None and src is not None:
            dst.copy_(src)
    return tuple(src if dst is None else dst for dst, src in zip(out, results, strict=True))
