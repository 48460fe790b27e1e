"""The fused persistent drafter (``backend="triton"``) and the multi-kernel CUDA-graph drafter (``"graph"``).

Public API: :class:`DrafterConfig`, :class:`FusedDrafterWeights`, :class:`FusedDrafterBuffers` (old names
``Weights`` and ``Buffers`` kept), :class:`DraftInputs`, :func:`launch_drafter` (one launch per draft) and
:func:`launch_drafter_ref` (the PyTorch reference, per sequence). The drafter table
(:mod:`eagle_triton.drafter.backends`) names :class:`FusedDraftBackend` (``"triton"``) and
:class:`GraphDraftBackend` (``"graph"``); nothing registers on import. ``AOT_SPECS`` lists
``(kernel, signature, constexprs)`` for the compile-only gate (sm_90, no GPU needed).

Heads: any EAGLE-3 shape with a power-of-two head_dim >= 16 (64 and 128 in the published heads), any KV-head
count, ``target_hidden_size`` different from ``hidden_size``, attention biases, and weight-only FP8 linear layers
(``Eagle3DraftHead.quantize_fp8``: e4m3 weights converted in registers, per-output-channel scales applied in each
product's epilogue, as :func:`eagle_triton.heads.fp8.fp8_linear` defines). What the kernel cannot run is refused
before the launch (see :class:`DrafterConfig`).
"""

from __future__ import annotations

from .host import (
    Buffers,
    DrafterConfig,
    DraftInputs,
    DraftOutput,
    FusedDraftBackend,
    FusedDrafterBuffers,
    FusedDrafterWeights,
    Weights,
    launch_drafter,
    launch_drafter_ref,
    profile_phases,
    triton_available,
)
from .kernel import fused_drafter_kernel
from .multikernel import GraphDraftBackend, MultiKernelDrafter, multikernel_draft
from .specs import AOT_SPECS

__all__ = [
    "AOT_SPECS",
    "Buffers",
    "DraftInputs",
    "DraftOutput",
    "DrafterConfig",
    "FusedDraftBackend",
    "FusedDrafterBuffers",
    "FusedDrafterWeights",
    "GraphDraftBackend",
    "MultiKernelDrafter",
    "Weights",
    "fused_drafter_kernel",
    "launch_drafter",
    "launch_drafter_ref",
    "profile_phases",
    "multikernel_draft",
    "triton_available",
]
