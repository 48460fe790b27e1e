"""Pick the Triton op or its PyTorch reference for the tensors at hand (for library-level convenience APIs)."""

from __future__ import annotations

import functools

import torch

from ._utils import is_interpreter


def with_cpu_fallback(op, ref):
    """``op`` when its tensors are on a GPU or Triton's interpreter is on; ``ref`` (same signature) for plain CPU
    tensors, where no Triton driver exists. Kernel-level code calls ``op`` directly."""

    @functools.wraps(op)
    def call(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        use_op = first is None or first.device.type != "cpu" or is_interpreter()
        return (op if use_op else ref)(*args, **kwargs)

    return call
