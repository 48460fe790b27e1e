"""Launcher for the fused RoPE + KV-cache write of the target forward (``B`` sequences of ``S`` rows each)."""

from __future__ import annotations

import torch

from .._utils import check_tensor, is_capturing, next_power_of_2, pdl_kwargs
from .kernel import _rope_kv_kernel

__all__ = ["target_rope_kv", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)


def target_rope_kv(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    validate: bool = True,
    cache_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Split the fused q/k/v product rows, apply the optional per-head RMSNorm (Qwen3) and RoPE, write the rotated
    k and the v of row ``j`` of sequence ``b`` into row ``cache_seqlens[c] + j`` of cache batch index ``c`` (``c = b``,
    or ``cache_slots[b]``), and return the rotated q.

    Parameters
    ----------
    qkv : Tensor ``[M, (Hq + 2 Hkv) D]`` (q heads, then k heads, then v heads), last dim contiguous; ``M = B S``
        rows grouped by sequence (row ``m`` is row ``m % S`` of sequence ``m // S``).
    k_cache, v_cache : Tensor ``[B, Lmax, Hkv, D]`` (one layer of the static cache), dtype of ``qkv``; ``[NB, Lmax,
        Hkv, D]`` (the whole cache) with ``cache_slots``.
    cache_seqlens : Tensor ``[B]`` (``[NB]`` with ``cache_slots``) int32/int64: where each cache index's new rows
        start. Rows past ``Lmax`` are dropped (the caller checks capacity on the host).
    positions : Tensor ``[B, S]`` or ``[M]`` int64/int32, contiguous: rotary positions of the rows (``seqlens + j``
        for a chunk, ``seqlens + depth`` for tree rows).
    cos, sin : Tensor ``[P, D]``, dtype of ``qkv``: the rotary tables (``rotate_half`` convention).
    num_heads, num_kv_heads : Hq, Hkv.
    q_norm, k_norm : Tensor ``[D]`` or None (both or neither): Qwen3's per-head RMSNorm, applied before RoPE.
    out : Tensor ``[M, Hq, D]`` for q, or None.
    validate : bool. Check the arguments; with ``cache_slots`` and no CUDA graph being captured, also check the
        slots on the host (a device sync).
    cache_slots : Tensor ``[B]`` int32 or None: sequence ``b`` writes cache batch index ``cache_slots[b]`` (distinct
        values in ``[0, NB)``), read on the device, so one captured graph serves every slot. None: index ``b``.
        A slot outside ``[0, NB)`` (unchecked when capturing or ``validate=False``) writes nothing.
    """
    M = qkv.shape[0]
    NB, D = k_cache.shape[0], k_cache.shape[-1]
    B = cache_slots.shape[0] if cache_slots is not None and cache_slots.dim() == 1 else NB
    S = M // B if B else 0  # rows per sequence
    if validate:
        check_tensor("qkv", qkv, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
        dev = qkv.device
        check_tensor("k_cache", k_cache, ndim=4, dtypes=(qkv.dtype,), device=dev, last_dim_contiguous=True)
        if k_cache.shape[2] != num_kv_heads:
            raise ValueError(f"k_cache must be [B, Lmax, Hkv={num_kv_heads}, D], got {list(k_cache.shape)}")
        check_tensor("v_cache", v_cache, shape=tuple(k_cache.shape), dtypes=(qkv.dtype,), device=dev,
                     last_dim_contiguous=True)
        if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * D:
            raise ValueError(f"qkv must be [M, (Hq + 2 Hkv) * D = {(num_heads + 2 * num_kv_heads) * D}], "
                             f"got {list(qkv.shape)}")
        if D % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {D}")
        check_tensor("cache_seqlens", cache_seqlens, shape=(NB,), dtypes=_INTS, device=dev)
        if cache_slots is not None:
            check_tensor("cache_slots", cache_slots, ndim=1, dtypes=(torch.int32,), device=dev)
        if B < 1 or M % B:
            src = "cache_slots" if cache_slots is not None else "k_cache"
            raise ValueError(f"qkv has {M} rows, not S rows for each of the B={B} sequences of {src}")
        check_tensor("positions", positions, shape=(M,) if positions.dim() == 1 else (B, M // B), dtypes=_INTS,
                     device=dev)
        if not positions.is_contiguous():
            raise ValueError("positions must be contiguous (row m's position is read at offset m)")
        check_tensor("cos", cos, ndim=2, dtypes=(qkv.dtype,), device=dev, last_dim_contiguous=True)
        if cos.shape[1] != D:
            raise ValueError(f"cos must be [P, D={D}], got {list(cos.shape)}")
        check_tensor("sin", sin, shape=tuple(cos.shape), dtypes=(qkv.dtype,), device=dev)
        if sin.stride() != cos.stride():
            raise ValueError("cos and sin must have the same strides")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm must be given together")
        if q_norm is not None:
            check_tensor("q_norm", q_norm, shape=(D,), dtypes=(qkv.dtype,), device=dev)
            check_tensor("k_norm", k_norm, shape=(D,), dtypes=(qkv.dtype,), device=dev)
        if cache_slots is not None and not is_capturing(dev):
            srt = cache_slots.sort().values
            lo, hi, dup = torch.stack([srt[0].long(), srt[-1].long(), (srt[1:] == srt[:-1]).any().long()]).tolist()
            if lo < 0 or hi >= NB:
                raise ValueError(f"cache_slots in [{lo}, {hi}] outside the cache's batch range [0, NB={NB})")
            if dup:  # two sequences would write the same cache rows
                raise ValueError("cache_slots must be distinct")
    q = out if out is not None else torch.empty(M, num_heads, D, device=qkv.device, dtype=qkv.dtype)
    if M == 0 or S == 0:
        return q
    _rope_kv_kernel[(M,)](
        qkv, q, k_cache, v_cache, cache_seqlens, cache_slots if cache_slots is not None else cache_seqlens, positions,
        cos, sin, q_norm if q_norm is not None else cos, k_norm if k_norm is not None else cos,
        M, S, k_cache.shape[1], qkv.stride(0), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), cos.stride(0), float(eps), NB,
        HQ=num_heads, HKV=num_kv_heads, HEAD_DIM=D, BLOCK_HQ=next_power_of_2(num_heads),
        BLOCK_HKV=next_power_of_2(num_kv_heads), BLOCK_D=max(2, next_power_of_2(D)),
        HAS_NORM=q_norm is not None, HAS_SLOTS=cache_slots is not None, num_warps=4, enable_fp_fusion=False,
        **pdl_kwargs(qkv.device),
    )
    return q


def _aot_specs():
    """Compile-only specs: Llama-3.1-8B heads (32/8 x 128) in bf16 and fp32, Qwen3 q/k norm in bf16; the
    cache-slot variant (one-graph prefill) in bf16."""
    specs = []
    for dt, norm, slots in (("bf16", False, False), ("bf16", True, False), ("fp32", False, False),
                            ("bf16", False, True), ("bf16", True, True)):
        sig = {n: "i32" for n in _rope_kv_kernel.arg_names}
        sig.update({p: f"*{dt}" for p in ("qkv_ptr", "q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr", "qn_ptr",
                                          "kn_ptr")})
        sig.update({"seqlens_ptr": "*i32", "slots_ptr": "*i32", "pos_ptr": "*i64", "eps": "fp32"})
        const = dict(HQ=32, HKV=8, HEAD_DIM=128, BLOCK_HQ=32, BLOCK_HKV=8, BLOCK_D=128, HAS_NORM=norm,
                     HAS_SLOTS=slots, PDL=dt == "bf16")
        sig.update({k: "constexpr" for k in const})
        div = [n for n in _rope_kv_kernel.arg_names if n.startswith("stride_") or n == "Lmax"]
        specs.append((_rope_kv_kernel, sig, const, {"num_warps": 4, "enable_fp_fusion": False, "div16": div,
                                                    "launch_pdl": const["PDL"]}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
