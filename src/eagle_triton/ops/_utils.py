"""Shared launch helpers for the Triton ops (no CUDA calls at import time).

Everything here is host-side Python: environment probes, block-size arithmetic, capture detection and the
tensor checks every ``op.py`` repeats. Kernels themselves never import this module.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = [
    "is_interpreter",
    "next_power_of_2",
    "cdiv",
    "num_sms",
    "is_capturing",
    "check_tensor",
    "dtype_of",
    "pdl_enabled",
    "pdl_kwargs",
    "move_slots_to_front",
]


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``).

    Launchers use it to shrink tiles to what the interpreter handles quickly (STYLE.md section 4).
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-int(a) // int(b))


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device | str | None = None) -> int:
    """Streaming multiprocessors on ``device`` (cached); 8 on CPU so that interpreter grids stay small."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return 8
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _pdl_device(index: int) -> bool:
    import triton.language as tl

    return (torch.cuda.get_device_capability(index)[0] >= 9 and hasattr(tl.extra, "cuda")
            and hasattr(tl.extra.cuda, "gdc_wait"))


def pdl_enabled(device: torch.device | str | None) -> bool:
    """Whether launches on ``device`` use programmatic dependent launch (Hopper and later, not the interpreter).

    A kernel launched so may start while the previous kernel in the stream finishes: it loads what does not depend
    on that kernel (weights), then waits for it (``gdc_wait``) before touching its outputs. That hides the launch
    gap and the first loads' latency, which is most of a small kernel's time. ``EAGLE_TRITON_PDL=0`` turns it off
    (the results are the same bits either way)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or is_interpreter():
        return False
    if os.environ.get("EAGLE_TRITON_PDL", "1") in ("0", ""):
        return False
    return _pdl_device(device.index if device.index is not None else torch.cuda.current_device())


def pdl_kwargs(device: torch.device | str | None) -> dict:
    """Launch keywords of a kernel with a ``PDL`` constexpr: ``PDL=True`` and ``launch_pdl=True`` where
    :func:`pdl_enabled`, else none (the kernel's default, ``PDL=False``)."""
    return {"PDL": True, "launch_pdl": True} if pdl_enabled(device) else {}


def is_capturing(device: torch.device | None = None) -> bool:
    """True while a CUDA graph is being captured on the current stream (host syncs are illegal then)."""
    if device is not None and torch.device(device).type != "cuda":
        return False
    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.is_current_stream_capturing())


def dtype_of(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``t.dtype`` is one of ``allowed``."""
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")


def check_tensor(
    name: str,
    t: torch.Tensor,
    ndim: int | None = None,
    shape: tuple | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
    last_dim_contiguous: bool = False,
) -> None:
    """Validate one tensor argument; errors name the argument and the offending property.

    ``shape`` entries may be ``None`` (any size). ``last_dim_contiguous`` asks for stride 1 on the last dim, which
    is what the kernels' 16-byte vector loads need.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {list(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and int(s) != d for s, d in zip(shape, t.shape, strict=True)):
            want = "[" + ", ".join("*" if s is None else str(int(s)) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if dtypes is not None:
        dtype_of(name, t, dtypes)
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")
    if last_dim_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (stride {t.stride(-1)})")


def check_attention_cache(q, k_cache, v_cache, dtypes, name_q: str = "q",
                          any_cache_batch: bool = False) -> tuple[int, int, int, int]:
    """Check ``q [B, S, Hq, D]`` against one layer's cache ``[B, Lmax, Hkv, D]`` (same dtype and device, GQA heads,
    ``1 <= D <= 256``); returns ``(B, Hq, Hkv, D)``. Raises ``ValueError``/``TypeError`` naming the argument.
    ``any_cache_batch``: the cache's batch size is not tied to ``B`` (a cache addressed through slots)."""
    check_tensor(name_q, q, ndim=4, dtypes=dtypes, last_dim_contiguous=True)
    dev = q.device
    B, _, Hq, D = q.shape
    check_tensor("k_cache", k_cache, ndim=4, dtypes=(q.dtype,), device=dev, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, shape=tuple(k_cache.shape), dtypes=(q.dtype,), device=dev,
                 last_dim_contiguous=True)
    if (k_cache.shape[0] != B and not any_cache_batch) or k_cache.shape[3] != D:
        raise ValueError(f"k_cache must be [B={B}, Lmax, Hkv, D={D}], got {list(k_cache.shape)}")
    Hkv = k_cache.shape[2]
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if D < 1 or D > 256:
        raise ValueError(f"head_dim must be in [1, 256], got {D}")
    return B, Hq, Hkv, D


def move_slots_to_front(slots: list[int], *tensors: tuple[torch.Tensor, int]) -> None:
    """Move slot ``slots[j]`` to slot ``j`` along each ``(tensor, dim)``, in place (a batch keeping some of its
    sequences in its first slots): device copies of the slots that move only, no host synchronisation."""
    moves = [(j, s) for j, s in enumerate(slots) if j != s]
    if not moves:
        return
    dev = tensors[0][0].device
    dst = torch.tensor([j for j, _ in moves], device=dev)
    src = torch.tensor([s for _, s in moves], device=dev)
    for t, dim in tensors:
        t.index_copy_(dim, dst, t.index_select(dim, src))  # index_select copies first: overlaps are safe
