"""eagle-triton: EAGLE speculative decoding with Triton kernels.

Draft heads (EAGLE-3, EAGLE-1/2), the EAGLE-2 dynamic draft tree (reference and fused Triton drafters), kernels
for the speculative step, and a lossless engine. Heavy parts (the engine, transformers) import lazily.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from .config import TreeConfig
from .drafter import DraftTree, TreeDrafter, register_draft_backend
from .heads import (
    CheckpointError,
    DraftHead,
    DraftHeadConfig,
    Eagle1DraftHead,
    Eagle3DraftHead,
    load_draft_head,
)

# Names resolved on first use: module path for each lazily imported public name.
_LAZY: dict[str, str] = {}


def _register_lazy(module: str, *names: str) -> None:
    for n in names:
        _LAZY[n] = module


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eagle_triton' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CheckpointError",
    "DraftHead",
    "DraftHeadConfig",
    "DraftTree",
    "Eagle1DraftHead",
    "Eagle3DraftHead",
    "TreeConfig",
    "TreeDrafter",
    "__version__",
    "load_draft_head",
    "register_draft_backend",
]
