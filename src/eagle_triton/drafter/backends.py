"""Drafter back ends: the protocol they implement and a declarative table, resolved on first use.

The table maps a back-end name to ``"module:Class"``; nothing is imported until a drafter asks for that name, so
``import eagle_triton`` stays light and no back end depends on having been imported first (``"stub"`` works in a
fresh interpreter). Naming a module of a higher layer here (``eagle_triton.fused``) is the one place where the
drafter layer refers upwards, and it does so by name only: the table is the registry, not an import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from ..tree import DraftTree

__all__ = [
    "BUILTIN_DRAFT_BACKENDS",
    "DraftBackend",
    "available_draft_backends",
    "register_draft_backend",
    "resolve_draft_backend",
]


@runtime_checkable
class DraftBackend(Protocol):
    """What :class:`~eagle_triton.TreeDrafter` drives. Built as ``factory(head, tree_config, **options)``."""

    name: str

    @property
    def kv_len(self) -> int:
        """Rows (accepted positions) currently held in the draft KV."""

    @property
    def stable_kv(self):
        """The draft KV of accepted rows in the back end's own layout (``None`` when it keeps none)."""

    def reset(self) -> None:
        """Forget the draft KV (a new sequence starts)."""

    def draft(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, sampling: bool = False) -> DraftTree:
        """Draft one tree per sequence (see :meth:`eagle_triton.TreeDrafter.draft`)."""


DraftBackendFactory = Callable[..., DraftBackend]

BUILTIN_DRAFT_BACKENDS: dict[str, str] = {
    "torch": "eagle_triton.drafter.reference:TorchDraftBackend",  # the reference, the oracle
    "stub": "eagle_triton.drafter.stub:StubDraftBackend",  # model-free trees for control-flow tests
    "triton": "eagle_triton.fused.host:FusedDraftBackend",  # the fused persistent kernel
    "graph": "eagle_triton.fused.multikernel:GraphDraftBackend",  # PyTorch ops captured in one CUDA graph
}

# Back ends added at run time by register_draft_backend: a factory, or a "module:Class" path like the table's.
_REGISTERED: dict[str, DraftBackendFactory | str] = {}


def register_draft_backend(name: str, factory: DraftBackendFactory | str) -> None:
    """Add (or replace) back end ``name``: ``factory(head, tree_config, **options)`` or a ``"module:Class"`` path."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a drafter back-end name must be a non-empty string, got {name!r}")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise TypeError(f"back end {name!r}: factory must be callable or a 'module:Class' path, got {factory!r}")
    _REGISTERED[name] = factory


def _entries() -> dict[str, DraftBackendFactory | str]:
    return {**BUILTIN_DRAFT_BACKENDS, **_REGISTERED}


def resolve_draft_backend(name: str) -> DraftBackendFactory:
    """The factory of back end ``name``, importing its module on first use.

    Raises ``ValueError`` for an unknown name and ``ImportError`` (with the back end named) when its module cannot
    be imported here.
    """
    entries = _entries()
    if name not in entries:
        raise ValueError(f"unknown drafter backend {name!r}; available: {sorted(entries)}")
    entry = entries[name]
    if not isinstance(entry, str):
        return entry
    module, _, attr = entry.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ImportError(f"drafter backend {name!r} ({entry}) cannot be imported here: {e}") from e


def available_draft_backends() -> list[str]:
    """Names of the back ends whose module imports here, sorted."""
    names = []
    for name in _entries():
        try:
            resolve_draft_backend(name)
        except ImportError:
            continue
        names.append(name)
    return sorted(names)
