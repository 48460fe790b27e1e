"""The frontier API: draft one tree from concatenated target features through a named drafter back end.

Back ends come from the drafter table (:mod:`eagle_triton.drafter.backends`): ``"torch"`` (the reference),
``"triton"`` (the fused kernel), ``"graph"`` (the multi-kernel drafter) and ``"stub"``
(:class:`~eagle_triton.drafter.stub.StubDraftBackend`, which runs no model and returns correctly shaped,
self-consistent trees for control-flow testing).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ..config import TreeConfig
from ..drafter import DraftTree, TreeDrafter, available_draft_backends
from ..drafter.stub import StubDraftBackend
from ..heads.base import DraftHead

__all__ = ["FrontierConfig", "frontier_generate", "register_triton_backend", "StubDraftBackend"]


def register_triton_backend() -> bool:
    """Whether the fused Triton drafter (back end ``"triton"``) is available here. Kept for the frontier API's
    callers: the back end is in the drafter table and needs no registration."""
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
