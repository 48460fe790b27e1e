"""Seed 000's frontier API: draft one tree from concatenated target features through a named back end.

Back ends come from the drafter registry (:func:`eagle_triton.drafter.register_draft_backend`): ``"torch"``
(the reference), ``"triton"`` (the fused kernel, registered by :func:`register_triton_backend`) and ``"stub"``,
which runs no model and returns correctly shaped, self-consistent trees for control-flow testing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ..config import TreeConfig
from ..drafter import DraftTree, TreeDrafter, available_draft_backends, register_draft_backend
from ..drafter.reference import check_draft_inputs
from ..heads.base import DraftHead
from ..tree import select_tree_nodes

__all__ = ["FrontierConfig", "frontier_generate", "register_triton_backend", "StubDraftBackend"]


class StubDraftBackend:
    """A model-free drafter: every level's frontier is the first ``top_k`` children, scores fall with the
    candidate index, tokens are ``(root + index + 1) mod vocab``. Shapes, tree buffers and draft-KV bookkeeping
    behave exactly like a real back end's, so engines and integrations can be tested without weights."""

    name = "stub"

    def __init__(self, head: DraftHead, tree_config: TreeConfig):
        self.head, self.cfg = head, tree_config
        self._kv_len = 0

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
        K, D, T = self.cfg.top_k, self.cfg.depth, self.cfg.num_draft_nodes
        B, dev = input_ids.shape[0], input_ids.device
        n = self.cfg.num_candidates
        g = torch.arange(n, device=dev)
        scores = (-g.to(torch.float32)).expand(B, n)
        # parents_flat as the drafter records them, with frontier = arange(K) at every level
        blocks = [torch.zeros(1, dtype=torch.long, device=dev)]
        for i in range(D):
            blocks.append(torch.arange(K, device=dev) + (1 + K * K * max(0, i - 1) + (K if i > 0 else 0)))
        parents_flat = torch.cat(blocks).expand(B, -1)
        root = input_ids[:, -1]
        vocab = self.head.config.vocab_size
        tokens = (root[:, None] + g[None] + 1) % vocab
        selected = select_tree_nodes(scores, T)
        self._kv_len = input_ids.shape[1] - 1
        return DraftTree.from_selection(root, tokens, selected, parents_flat, K, D + 1, sampling)


register_draft_backend("stub", StubDraftBackend)


def register_triton_backend() -> bool:
    """Register the fused Triton drafter as back end ``"triton"``. Returns whether it is available."""
    return "triton" in available_draft_backends()


@dataclass
class FrontierConfig:
    """What :func:`frontier_generate` needs besides the features: the head, the tree shape and the row order."""

    head: DraftHead
    tree: TreeConfig = field(default_factory=TreeConfig)
    sampling: bool = False


# Drafters (and their draft KV) cached per head and back end; dropped with the head.
_DRAFTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def frontier_generate(
    config: FrontierConfig,
    features_concat: torch.Tensor,
    input_ids: torch.Tensor,
    backend: str = "triton",
    drafter: TreeDrafter | None = None,
) -> DraftTree:
    """Draft one EAGLE-2 tree from ``features_concat`` (``[1, S, 3 * Ht]``: the target's low, mid and high taps
    concatenated) and ``input_ids`` (``[1, L + 1]``: accepted tokens plus the root).

    The draft KV persists in ``drafter`` (or in a drafter cached per head and back end): pass the features of the
    rows it does not hold yet; features for all ``L`` accepted rows start a new sequence. ``backend="triton"``
    needs a GPU; use ``"torch"`` or ``"stub"`` without one.
    """
    if backend == "triton" and not register_triton_backend():
        raise ValueError("the 'triton' drafter back end is unavailable here (it needs eagle_triton.fused)")
    if drafter is None:
        per_head = _DRAFTERS.setdefault(config.head, {})
        drafter = per_head.get(backend)
        if drafter is None or drafter.tree_config != config.tree:
            drafter = per_head[backend] = TreeDrafter(config.head, config.tree, backend=backend)
    if features_concat.dim() == 3 and features_concat.shape[1] == input_ids.shape[-1] - 1:
        drafter.reset()  # features for every accepted row: a new sequence starts
    return drafter.draft(features_concat, input_ids, sampling=config.sampling)
