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


_OPS = (
    "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only", "verify_tree",
    "softmax_with_temperature", "top_k_renorm_probs", "top_p_renorm_probs", "sampling_from_probs", "philox_uniform",
    "tree_attention", "draft_tree_attention", "append_kv_cache", "compact_kv_cache", "lm_head_topk",
)
_register_lazy(".ops", *_OPS, *(f"{n}_ref" for n in _OPS), "eagle_to_sglang", "sglang_to_eagle")
_register_lazy(".engine", "EagleEngine", "GenerationStats", "SamplingParams", "LlamaTarget", "HFTarget", "load_target",
               "ModelLoadError")
_register_lazy(".integrations.frontier", "FrontierConfig", "frontier_generate", "register_triton_backend")
_register_lazy(".integrations.safeailab", "patch_ea_model_with_triton_drafter")
_register_lazy(".integrations.optimize", "GPUAssertionError", "optimize_eagle_with_triton", "restore_eagle",
               "fused_draft_token_generation")
_register_lazy(".integrations.aiter", "EAGLEConfig", "EAGLEInference")
_register_lazy(".fused", "DrafterConfig", "Weights", "Buffers", "launch_drafter")


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eagle_triton' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY) + [
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
