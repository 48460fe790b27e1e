"""A model-free drafter back end (``backend="stub"``): correctly shaped, self-consistent trees without weights."""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from ..config import TreeConfig
from ..heads.base import DraftHead
from ..tree import DraftTree, frontier_parent_offset, select_tree_nodes
from .reference import check_draft_inputs

__all__ = ["StubDraftBackend"]


class StubDraftBackend:
    """A model-free drafter: every level's frontier is the first ``top_k`` children, scores fall with the
    candidate index, tokens are ``(root + index + 1) mod vocab``. Shapes, tree buffers and draft-KV bookkeeping
    behave exactly like a real back end's, so engines and integrations can be tested without weights."""

    name = "stub"

    def __init__(self, head: DraftHead, tree_config: TreeConfig):
        self.head, self.cfg = head, tree_config
        self._kv_len = 0
        self._out: dict = {}  # draft_rows' output buffers, per (batch, sampling, device)

    @property
    def kv_len(self) -> int:
        return self._kv_len

    @property
    def stable_kv(self):
        return None

    def reset(self) -> None:
        self._kv_len = 0

    def draft(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, sampling: bool = False) -> DraftTree:
        check_draft_inputs(self.head, hidden_states, input_ids, self._kv_len)
        self._kv_len = input_ids.shape[1] - 1
        return self._tree(input_ids[:, -1], sampling)

    def draft_rows(self, features: torch.Tensor, new_ids: torch.Tensor, num_new: torch.Tensor | None = None,
                   sampling: bool = False) -> DraftTree:
        """The device-paced form (see :meth:`eagle_triton.fused.host.FusedDraftBackend.draft_rows`): the root is
        ``new_ids[b, num_new[b] - 1]``, gathered on the device."""
        if num_new is None:
            root = new_ids[:, -1]
        else:
            root = new_ids.gather(1, (num_new.long() - 1).view(-1, 1)).view(-1)
        return self._into_buffers(self._tree(root, sampling))

    def _into_buffers(self, tree: DraftTree) -> DraftTree:
        """``tree`` copied into this back end's own output buffers (allocated once per batch size, sampling mode
        and device), as the fused back end drafts: a CUDA graph that reads a tree drafted outside it (the engine's
        verify graph after a generation's eager first draft) then reads the current tree, not freed memory."""
        key = (tree.draft_tokens.shape[0], tree.sampling, tree.draft_tokens.device)
        bufs = self._out.get(key)
        if bufs is None:
            bufs = self._out[key] = {f.name: torch.empty_like(getattr(tree, f.name)) for f in fields(tree)
                                     if isinstance(getattr(tree, f.name), torch.Tensor)}
        for name, buf in bufs.items():
            buf.copy_(getattr(tree, name))
        return replace(tree, **bufs)

    def _tree(self, root: torch.Tensor, sampling: bool) -> DraftTree:
        K, D, T = self.cfg.top_k, self.cfg.depth, self.cfg.num_draft_nodes
        B, dev = root.shape[0], root.device
        n = self.cfg.num_candidates
        g = torch.arange(n, device=dev)
        scores = (-g.to(torch.float32)).expand(B, n)
        # parents_flat as the drafter records them, with frontier = arange(K) at every level
        blocks = [torch.zeros(1, dtype=torch.long, device=dev)]
        for i in range(D):
            blocks.append(torch.arange(K, device=dev) + frontier_parent_offset(i, K))
        parents_flat = torch.cat(blocks).expand(B, -1)
        vocab = self.head.config.vocab_size
        tokens = (root[:, None] + g[None] + 1) % vocab
        selected = select_tree_nodes(scores, T)
        return DraftTree.from_selection(root, tokens, selected, parents_flat, K, D + 1, sampling)
