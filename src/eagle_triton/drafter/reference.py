"""The PyTorch reference drafter: SafeAILab EAGLE's ``topK_genrate`` (EAGLE-2 dynamic tree), reproduced exactly.

It is the oracle every faster drafter is tested against. The head forwards mirror the reference's computation
(concatenated draft KV, dense additive masks) so that in fp32 the outputs are bit-identical; the tree buffers are
built with tensor operations (see :mod:`.tree`) instead of the reference's Python loops and host syncs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import TreeConfig
from ..heads.base import DraftHead
from ..tree import DraftTree, frontier_parent_offset, rank_topk, select_tree_nodes

__all__ = ["TorchDraftBackend", "check_draft_inputs"]


def check_draft_inputs(head: DraftHead, hidden_states: torch.Tensor, input_ids: torch.Tensor, kv_len: int) -> None:
    """Validate one ``draft`` call's inputs against the head and the rows already in the draft KV."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L] (accepted tokens + root), got shape {list(input_ids.shape)}")
    if hidden_states.dim() != 3:
        raise ValueError(f"hidden_states must be [B, S, W], got shape {list(hidden_states.shape)}")
    if input_ids.shape[0] != hidden_states.shape[0]:
        raise ValueError(f"batch mismatch: hidden_states {hidden_states.shape[0]} vs input_ids {input_ids.shape[0]}")
    if input_ids.shape[1] < 2:
        raise ValueError("input_ids must hold at least one accepted token plus the root token")
    if hidden_states.shape[-1] != head.feature_width:
        raise ValueError(
            f"hidden_states width {hidden_states.shape[-1]} does not match the head's target feature width "
            f"{head.feature_width} ({'3 x target hidden' if head.kind == 'eagle3' else 'target hidden'})"
        )
    if hidden_states.dtype != head.dtype:
        raise TypeError(f"hidden_states dtype {hidden_states.dtype} differs from the head's {head.dtype}")
    if hidden_states.device != head.device:
        raise ValueError(f"hidden_states are on {hidden_states.device} but the head is on {head.device}")
    expected = input_ids.shape[1] - 1 - kv_len
    if hidden_states.shape[1] != expected:
        raise ValueError(
            f"hidden_states has {hidden_states.shape[1]} rows but the draft KV holds {kv_len} of the "
            f"{input_ids.shape[1] - 1} accepted positions: expected {expected} new rows"
        )


class TorchDraftBackend:
    """Reference implementation (batch 1). State: ``stable_kv``, the draft KV of accepted rows only."""

    name = "torch"

    def __init__(self, head: DraftHead, tree_config: TreeConfig):
        if head.draft_vocab_size < tree_config.top_k:
            raise ValueError(f"draft vocabulary {head.draft_vocab_size} is smaller than top_k {tree_config.top_k}")
        self.head = head
        self.cfg = tree_config
        self.stable_kv = None

    def reset(self) -> None:
        self.stable_kv = None

    @property
    def kv_len(self) -> int:
        return 0 if self.stable_kv is None else self.stable_kv[0][0].shape[2]

    def _logp(self, h: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.head.compute_logits(h), dim=-1)

    @torch.no_grad()
    def draft(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, sampling: bool = False) -> DraftTree:
        head, K, D, T = self.head, self.cfg.top_k, self.cfg.depth, self.cfg.num_draft_nodes
        check_draft_inputs(head, hidden_states, input_ids, self.kv_len)
        if input_ids.shape[0] != 1:
            raise ValueError("the torch backend drafts one sequence at a time (batch 1)")
        input_ids = input_ids.to(hidden_states.device)
        dev = hidden_states.device
        root = input_ids[:, -1]
        ids = input_ids[:, 1:]  # row j pairs feature j with token j + 1
        len_posi = ids.shape[1]

        # Root step over the rows not yet in the draft KV; its KV is kept, tree rows never are.
        out, kv = head(hidden_states, ids[:, self.kv_len:], past_key_values=self.stable_kv)
        self.stable_kv = kv
        last = out[:, -1]
        values, index = torch.topk(self._logp(last), K, dim=-1)
        scores = values[0]
        scores_list = [scores[None]]
        parents_list = [torch.zeros(1, dtype=torch.long, device=dev)]
        tokens = head.draft_to_target(index)
        tokens_list = [tokens]
        frontier_ids = tokens
        frontier_hidden = last[None].repeat(1, K, 1)
        eye = torch.eye(K, device=dev)[None, None]
        tree_mask = eye
        frontier = torch.arange(K, device=dev)
        zeros_k = torch.zeros(K, dtype=torch.long, device=dev)

        for i in range(D):
            out, kv = head(frontier_hidden, frontier_ids, position_ids=len_posi + zeros_k, past_key_values=kv,
                           tree_mask=tree_mask)
            len_posi += 1
            parents_list.append(frontier + frontier_parent_offset(i, K))
            values, index = torch.topk(self._logp(out[0]), K, dim=-1)
            cu = values + scores[:, None]
            scores, frontier = rank_topk(cu.view(-1), K)
            parent_rows = frontier // K
            frontier_hidden = out[:, parent_rows]
            frontier_ids = head.draft_to_target(index.view(-1)[frontier][None])
            tokens_list.append(head.draft_to_target(index))
            scores_list.append(cu)
            tree_mask = torch.cat((tree_mask[:, :, parent_rows], eye), dim=3)

        scores_flat = torch.cat(scores_list, dim=0).view(1, -1)
        tokens_flat = torch.cat(tokens_list, dim=0).view(1, -1)
        parents_flat = torch.cat(parents_list, dim=0).view(1, -1)
        selected = select_tree_nodes(scores_flat, T)
        return DraftTree.from_selection(root, tokens_flat, selected, parents_flat, K, D + 1, sampling)
