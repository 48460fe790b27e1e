"""Launchers of the sampling helpers (RNG passed as tensors: uniforms, or a seed/offset pair on the device)."""

from __future__ import annotations

import torch

from .._utils import is_interpreter, next_power_of_2
from ._checks import check_probs, check_seed_offset, per_row
from .kernel import _philox_kernel, _renorm_kernel, _sample_kernel, _softmax_temperature_kernel

__all__ = [
    "softmax_with_temperature",
    "top_k_renorm_probs",
    "top_p_renorm_probs",
    "sampling_from_probs",
    "philox_uniform",
    "AOT_SPECS",
]


def _block_v(V: int, cap: int) -> int:
    return max(16, min(next_power_of_2(V), 64 if is_interpreter() else cap))


def softmax_with_temperature(logits: torch.Tensor, temperature) -> torch.Tensor:
    """``softmax(logits / temperature)`` per row, in float32.

    Parameters
    ----------
    logits : ``[M, V]`` float32 / float16 / bfloat16, contiguous.
    temperature : float > 0, or a ``[M]`` tensor of per-row temperatures (values must be > 0; not read back).

    Returns
    -------
    ``[M, V]`` float32 probabilities.
    """
    check_probs("logits", logits, float_only=False)
    M, V = logits.shape
    t = per_row(temperature, M, torch.float32, logits.device, "temperature")
    out = torch.empty(M, V, dtype=torch.float32, device=logits.device)
    if M:
        _softmax_temperature_kernel[(M,)](logits, t, out, V, BLOCK_V=_block_v(V, 4096), num_warps=8)
    return out


def _renorm(probs: torch.Tensor, threshold, name: str) -> torch.Tensor:
    """One launch of the renormalisation kernel: ``name`` is ``"top_k"`` (int per row) or ``"top_p"`` (float)."""
    check_probs("probs", probs)
    M, V = probs.shape
    top_p = name == "top_p"
    t = per_row(threshold, M, torch.float32 if top_p else torch.int64, probs.device, name)
    out = torch.empty_like(probs)
    if M:
        _renorm_kernel[(M,)](probs, t, out, V, TOP_P=top_p, BLOCK_V=_block_v(V, 1024), num_warps=8)
    return out


def top_k_renorm_probs(probs: torch.Tensor, top_k) -> torch.Tensor:
    """Zero every probability below the row's ``k``-th largest and renormalise (ties at the threshold are kept).

    Parameters
    ----------
    probs : ``[M, V]`` float32, non-negative, contiguous.
    top_k : int or ``[M]`` integer tensor; ``k <= 0`` or ``k >= V`` keeps the row.

    Returns
    -------
    ``[M, V]`` float32.
    """
    return _renorm(probs, top_k, "top_k")


def top_p_renorm_probs(probs: torch.Tensor, top_p) -> torch.Tensor:
    """Keep the smallest set of highest probabilities whose mass reaches ``top_p`` and renormalise.

    The kept set is ``{p >= tau}`` with ``tau`` the largest value such that the mass at or above it is
    ``>= top_p`` (ties at ``tau`` are kept; at least the top token is kept; ``top_p >= 1`` keeps the row).

    Parameters
    ----------
    probs : ``[M, V]`` float32, non-negative, contiguous.
    top_p : float or ``[M]`` float tensor.

    Returns
    -------
    ``[M, V]`` float32.
    """
    return _renorm(probs, top_p, "top_p")


def sampling_from_probs(probs: torch.Tensor, uniform_samples: torch.Tensor | None = None,
                        seed: torch.Tensor | None = None, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one token per row by inverse CDF, with RNG passed as tensors (CUDA-graph safe).

    Parameters
    ----------
    probs : ``[M, V]`` float32 (unnormalised rows are fine: ``u`` is scaled by the row sum).
    uniform_samples : ``[M]`` float32 in ``[0, 1)``; or
    seed, offset : one-element int64 tensors on the device; row ``i`` uses ``philox_uniform(seed, offset + i)``.
        Advance ``offset`` by ``M`` in place between calls for fresh draws under graph replay.

    Returns
    -------
    ``[M]`` int64: the first index whose inclusive cumulative sum exceeds ``u * sum(p)`` among ``p > 0``; the last
    positive index when rounding leaves none; ``V - 1`` for an all-zero row.
    """
    check_probs("probs", probs)
    M, V = probs.shape
    out = torch.empty(M, dtype=torch.int64, device=probs.device)
    if uniform_samples is not None:
        if uniform_samples.shape != (M,) or uniform_samples.dtype != torch.float32:
            raise ValueError(f"uniform_samples must be [{M}] float32, got {list(uniform_samples.shape)} "
                             f"{uniform_samples.dtype}")
        if uniform_samples.device != probs.device:
            raise ValueError(f"uniform_samples is on {uniform_samples.device} but probs are on {probs.device}")
        coins, use_seed, seed_t, off_t = uniform_samples.contiguous(), False, out, out
    else:
        if seed is None or offset is None:
            raise ValueError("pass uniform_samples [M], or seed and offset tensors (RNG is never drawn on the host)")
        check_seed_offset(seed, offset, probs.device)
        coins, use_seed, seed_t, off_t = probs, True, seed, offset
    if M:
        _sample_kernel[(M,)](probs, coins, seed_t, off_t, out, V, USE_SEED=use_seed, BLOCK_V=_block_v(V, 4096),
                             num_warps=8)
    return out


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor, n: int) -> torch.Tensor:
    """``[n]`` float32 uniforms in ``[0, 1)`` from Philox-4x32-10, key ``seed``, counters ``offset + arange(n)``.

    ``seed`` and ``offset`` are one-element int64 device tensors, so the call is graph-capturable; the stream is
    defined in :mod:`.reference` and is the same on every Triton version.
    """
    check_seed_offset(seed, offset, seed.device)
    out = torch.empty(n, dtype=torch.float32, device=seed.device)
    if n:
        block = 64 if is_interpreter() else 1024
        _philox_kernel[(-(-n // block),)](out, seed, offset, n, BLOCK=block)
    return out


AOT_SPECS = [
    (_philox_kernel, {"out_ptr": "*fp32", "seed_ptr": "*i64", "offset_ptr": "*i64", "n": "i32"}, {"BLOCK": 1024}),
    (_softmax_temperature_kernel, {"logits_ptr": "*bf16", "temp_ptr": "*fp32", "out_ptr": "*fp32", "V": "i32"},
     {"BLOCK_V": 4096}),
    (_softmax_temperature_kernel, {"logits_ptr": "*fp32", "temp_ptr": "*fp32", "out_ptr": "*fp32", "V": "i32"},
     {"BLOCK_V": 4096}),
    (_renorm_kernel, {"probs_ptr": "*fp32", "param_ptr": "*i64", "out_ptr": "*fp32", "V": "i32"},
     {"TOP_P": False, "BLOCK_V": 1024}),
    (_renorm_kernel, {"probs_ptr": "*fp32", "param_ptr": "*fp32", "out_ptr": "*fp32", "V": "i32"},
     {"TOP_P": True, "BLOCK_V": 1024}),
    (_sample_kernel, {"probs_ptr": "*fp32", "coin_ptr": "*fp32", "seed_ptr": "*i64", "offset_ptr": "*i64",
                      "out_ptr": "*i64", "V": "i32"}, {"USE_SEED": False, "BLOCK_V": 4096}),
    (_sample_kernel, {"probs_ptr": "*fp32", "coin_ptr": "*fp32", "seed_ptr": "*i64", "offset_ptr": "*i64",
                      "out_ptr": "*i64", "V": "i32"}, {"USE_SEED": True, "BLOCK_V": 4096}),
]
