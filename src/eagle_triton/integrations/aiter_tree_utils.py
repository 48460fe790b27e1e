"""AITER-style tree helpers (the names of SGLang's ``eagle_utils``), mapped onto eagle_triton's SGLang-compatible
kernels.

Every name here delegates to the one implementation in :mod:`eagle_triton.ops` /
:mod:`eagle_triton.integrations.sglang`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .sglang import TreeMaskMode, organize_draft_results
from .sglang import build_tree_kernel_efficient as _build_tree
from .sglang import verify_tree_greedy as _verify_tree_greedy_op

__all__ = ["TreeMaskMode", "TreeStructure", "organize_draft_results", "build_tree_structure",
           "verify_tree_greedy", "compute_tree_statistics"]


class TreeStructure(NamedTuple):
    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    draft_tokens: torch.Tensor


def build_tree_structure(
    verified_id: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
) -> TreeStructure:
    """SGLang's ``build_tree_kernel_efficient`` with ``seq_lens_sum`` computed here (one host read for the
    FULL_MASK buffer size; pass buffers through :func:`eagle_triton.integrations.sglang.build_tree_kernel_efficient`
    for graph capture). Returns the tree buffers as a named tuple."""
    seq_lens_sum = int(seq_lens.sum()) if tree_mask_mode == TreeMaskMode.FULL_MASK else 0
    return TreeStructure(*_build_tree(verified_id, parent_list, top_scores_index, draft_tokens, seq_lens,
                                      seq_lens_sum, topk, spec_steps, num_verify_tokens,
                                      tree_mask_mode=tree_mask_mode))


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_spec_step: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocating form of ``verify_tree_greedy``: returns ``(predicts [bs*D] int32, accept_index [bs, S+1] int32
    (-1 padded), accept_token_num [bs] int32)``. ``num_spec_step`` is the maximal accepted drafts + 1."""
    bs, D = candidates.shape
    dev = candidates.device
    predicts = torch.full((bs * D,), -1, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, num_spec_step), -1, dtype=torch.int32, device=dev)
    accept_token_num = torch.empty(bs, dtype=torch.int32, device=dev)
    _verify_tree_greedy_op(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict)
    return predicts, accept_index, accept_token_num


def compute_tree_statistics(accept_token_num: torch.Tensor, num_spec_step: int) -> dict:
    """Statistics of accepted drafts per request and step (``accept_token_num`` excludes the bonus token).

    Returns ``mean_accept_length`` (tokens emitted per step, bonus included), ``acceptance_rate`` (accepted
    drafts over the most a step can accept, ``num_spec_step - 1``) and ``accept_histogram`` (count per accepted
    length ``0 .. num_spec_step - 1``).
    """
    n = accept_token_num.to(torch.long).flatten()
    max_drafts = max(num_spec_step - 1, 1)
    hist = torch.bincount(n.clamp(0, num_spec_step - 1), minlength=num_spec_step)
    return {
        "steps": int(n.numel()),
        "mean_accept_length": float(n.float().mean() + 1) if n.numel() else 0.0,
        "acceptance_rate": float(n.float().mean() / max_drafts) if n.numel() else 0.0,
        "accept_histogram": hist.tolist(),
    }
