"""eagle-triton: EAGLE speculative decoding with Triton kernels.

The core namespace holds the configs, the draft heads, the drafter, the engine and the errors. The kernels live in
:mod:`eagle_triton.ops`, the fused drafter in :mod:`eagle_triton.fused`, other projects' APIs in
:mod:`eagle_triton.integrations` and training in :mod:`eagle_triton.train`. Heavy parts (the engine, Triton
kernels, transformers) import on first use.

Two kinds of older top-level names stay importable:

* *integration aliases* (documented, no warning): the EAGLE-user entry points of :mod:`eagle_triton.integrations`
  (``patch_ea_model_with_triton_drafter``, ``optimize_eagle_with_triton``, ``frontier_generate``, ...), which
  SafeAILab-, frontier- and AITER-style callers import from the top level;
* *moved names* (``DeprecationWarning`` naming the new home): the ops (``eagle_triton.verify_tree`` ->
  ``eagle_triton.ops.verify_tree``) and the fused drafter's host API (``eagle_triton.Weights`` ->
  ``eagle_triton.fused.FusedDrafterWeights``).
"""

from __future__ import annotations

import importlib
import warnings

__version__ = "0.1.0"

from .config import TreeConfig
from .drafter import DraftBackend, DraftTree, TreeDrafter, available_draft_backends, register_draft_backend
from .heads import (
    CheckpointError,
    DraftHead,
    DraftHeadConfig,
    Eagle1DraftHead,
    Eagle3DraftHead,
    load_draft_head,
)

# The engine is core but imported on first use (it pulls in the target runners and the Triton ops).
_ENGINE_NAMES = ("EagleEngine", "GenerationStats", "SamplingParams", "LlamaTarget", "HFTarget", "load_target",
                 "ModelLoadError")

# Integration aliases: name -> module that defines it.
INTEGRATION_ALIASES: dict[str, str] = {
    **dict.fromkeys(("patch_ea_model_with_triton_drafter",), ".integrations.safeailab"),
    **dict.fromkeys(("GPUAssertionError", "optimize_eagle_with_triton", "restore_eagle",
                     "fused_draft_token_generation"), ".integrations.optimize"),
    **dict.fromkeys(("FrontierConfig", "frontier_generate", "register_triton_backend"), ".integrations.frontier"),
    **dict.fromkeys(("EAGLEConfig", "EAGLEInference"), ".integrations.aiter"),
}

_OPS = (
    "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only", "verify_tree",
    "softmax_with_temperature", "top_k_renorm_probs", "top_p_renorm_probs", "sampling_from_probs", "philox_uniform",
    "tree_attention", "draft_tree_attention", "append_kv_cache", "compact_kv_cache", "lm_head_topk",
)
# Moved names: old top-level name -> (module, name there).
_MOVED: dict[str, tuple[str, str]] = {
    **{n: (".ops", n) for n in (*_OPS, *(f"{n}_ref" for n in _OPS), "eagle_to_sglang", "sglang_to_eagle")},
    "DrafterConfig": (".fused", "DrafterConfig"),
    "launch_drafter": (".fused", "launch_drafter"),
    "Weights": (".fused", "FusedDrafterWeights"),
    "Buffers": (".fused", "FusedDrafterBuffers"),
}


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        value = getattr(importlib.import_module(".engine", __name__), name)
    elif name in INTEGRATION_ALIASES:
        value = getattr(importlib.import_module(INTEGRATION_ALIASES[name], __name__), name)
    elif name in _MOVED:
        module, attr = _MOVED[name]
        warnings.warn(f"eagle_triton.{name} moved: import {attr} from eagle_triton{module}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(module, __name__), attr)  # not cached: warn on every use
    elif name in ("ops", "fused", "integrations", "engine", "train", "testing"):
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'eagle_triton' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_ENGINE_NAMES) | set(INTEGRATION_ALIASES) | set(_MOVED))


__all__ = [
    # configs
    "TreeConfig",
    "DraftHeadConfig",
    # heads
    "DraftHead",
    "Eagle3DraftHead",
    "Eagle1DraftHead",
    "load_draft_head",
    # drafter
    "TreeDrafter",
    "DraftTree",
    "DraftBackend",
    "register_draft_backend",
    "available_draft_backends",
    # engine
    "EagleEngine",
    "GenerationStats",
    "SamplingParams",
    "LlamaTarget",
    "HFTarget",
    "load_target",
    # errors
    "CheckpointError",
    "ModelLoadError",
    "GPUAssertionError",
    # integration aliases (defined in eagle_triton.integrations)
    "patch_ea_model_with_triton_drafter",
    "optimize_eagle_with_triton",
    "restore_eagle",
    "fused_draft_token_generation",
    "FrontierConfig",
    "frontier_generate",
    "register_triton_backend",
    "EAGLEConfig",
    "EAGLEInference",
    "__version__",
]
