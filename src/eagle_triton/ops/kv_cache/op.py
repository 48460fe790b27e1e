"""Launchers for KV-cache append and accepted-path compaction.

Both are in place and graph-capturable. Range checks that need device values (lengths against ``Lmax``) run on
the host, a device sync, only when no CUDA graph is being captured and ``validate=True``; the kernels themselves
drop any row that would fall outside the cache, so a captured graph never writes out of bounds.
"""

from __future__ import annotations

import torch

from .._utils import cdiv, check_tensor, is_capturing, is_interpreter, next_power_of_2
from .kernel import _append_kv_kernel, _compact_kv_kernel

__all__ = ["append_kv_cache", "compact_kv_cache", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)


def _block_c(row: int, cap: int) -> int:
    return min(next_power_of_2(row), 64 if is_interpreter() else cap)


def append_kv_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    validate: bool = True,
) -> None:
    """Write ``Tn`` new K/V rows per sequence at ``cache_seqlens[b] + j``, in place (``cache_seqlens`` unchanged).

    Parameters
    ----------
    k_cache, v_cache : Tensor ``[B, Lmax, Hkv, D]`` (flash-attn layout; a layer's view of a larger cache works).
    k_new, v_new : Tensor ``[B, Tn, Hkv, D]``, same dtype and device.
    cache_seqlens : Tensor ``[B]`` int32/int64: current length per sequence.
    validate : bool. When not capturing a CUDA graph, check ``cache_seqlens[b] + Tn <= Lmax`` on the host (a
        device sync) and raise ``ValueError``. Inside a capture rows past ``Lmax`` are silently dropped.
    """
    check_tensor("k_cache", k_cache, ndim=4, dtypes=_FLOATS, last_dim_contiguous=True)
    dev = k_cache.device
    B, Lmax, Hkv, D = k_cache.shape
    check_tensor("v_cache", v_cache, shape=(B, Lmax, Hkv, D), dtypes=(k_cache.dtype,), device=dev,
                 last_dim_contiguous=True)
    check_tensor("k_new", k_new, ndim=4, dtypes=(k_cache.dtype,), device=dev, last_dim_contiguous=True)
    Tn = k_new.shape[1]
    check_tensor("k_new", k_new, shape=(B, Tn, Hkv, D))
    check_tensor("v_new", v_new, shape=(B, Tn, Hkv, D), dtypes=(k_cache.dtype,), device=dev,
                 last_dim_contiguous=True)
    check_tensor("cache_seqlens", cache_seqlens, shape=(B,), dtypes=_INTS, device=dev)
    if validate and not is_capturing(dev) and B > 0:
        lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
        if lo < 0 or hi + Tn > Lmax:
            raise ValueError(f"appending {Tn} rows to cache_seqlens in [{lo}, {hi}] exceeds the capacity Lmax={Lmax}")
    if B * Tn == 0:
        return
    row = Hkv * D
    block_c = _block_c(row, 1024)
    _append_kv_kernel[(B * Tn, cdiv(row, block_c))](
        k_cache, v_cache, k_new, v_new, cache_seqlens,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_new.stride(0), k_new.stride(1), k_new.stride(2),
        v_new.stride(0), v_new.stride(1), v_new.stride(2),
        Tn, Lmax, HEAD_DIM=D, ROW=row, BLOCK_C=block_c, num_warps=4,
    )


def compact_kv_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
    *,
    validate: bool = True,
) -> None:
    """Move the accepted path's K/V rows to contiguous positions after the prefix, for all layers in one launch.

    For every layer and ``j < accept_len[b]``: row ``cache_seqlens[b] + accept_index[b, j]`` is copied to row
    ``cache_seqlens[b] + j``. Sources may be destinations of other ``j`` (path order makes ``accept_index[b, j] >=
    j``); all sources are read before any destination is written. ``cache_seqlens`` is not changed (the caller
    adds ``accept_len``).

    Parameters
    ----------
    k_cache, v_cache : Tensor ``[NL, B, Lmax, Hkv, D]``: every layer's cache in one tensor.
    cache_seqlens : Tensor ``[B]`` int32/int64: committed length (where the tree's rows start).
    accept_index : Tensor ``[B, A]`` int64 (int32 accepted): tree-node indices relative to ``cache_seqlens[b]``,
        path order, ``-1`` padded (node 0 is the root).
    accept_len : Tensor ``[B]`` int32/int64: rows to keep per sequence (``<= A``).
    validate : bool. When not capturing, check on the host (a sync) that ``0 <= accept_len <= A`` and that every
        used source and destination lies in ``[0, Lmax)``. Inside a capture out-of-range rows are skipped.
    """
    check_tensor("k_cache", k_cache, ndim=5, dtypes=_FLOATS, last_dim_contiguous=True)
    dev = k_cache.device
    NL, B, Lmax, Hkv, D = k_cache.shape
    check_tensor("v_cache", v_cache, shape=(NL, B, Lmax, Hkv, D), dtypes=(k_cache.dtype,), device=dev,
                 last_dim_contiguous=True)
    check_tensor("cache_seqlens", cache_seqlens, shape=(B,), dtypes=_INTS, device=dev)
    check_tensor("accept_index", accept_index, ndim=2, dtypes=_INTS, device=dev)
    A = accept_index.shape[1]
    check_tensor("accept_index", accept_index, shape=(B, A))
    check_tensor("accept_len", accept_len, shape=(B,), dtypes=_INTS, device=dev)
    if validate and not is_capturing(dev) and B * A > 0:
        n = accept_len.long()
        used = torch.arange(A, device=dev)[None, :] < n[:, None]
        src = torch.where(used, cache_seqlens.long()[:, None] + accept_index.long(), 0)
        stats = torch.stack([n.min(), n.max(), torch.where(used, accept_index.long(), 0).min(), src.max(),
                             (cache_seqlens.long() + n).max()]).tolist()
        if stats[0] < 0 or stats[1] > A:
            raise ValueError(f"accept_len in [{stats[0]}, {stats[1]}] outside [0, A={A}]")
        if stats[2] < 0:
            raise ValueError("accept_index has a negative (padding) entry inside accept_len")
        if stats[3] >= Lmax or stats[4] > Lmax:
            raise ValueError(f"accepted rows reach past the cache capacity Lmax={Lmax}")
    if NL * B * A == 0:
        return
    row = Hkv * D
    block_c = _block_c(row, 256)
    _compact_kv_kernel[(NL * B, cdiv(row, block_c))](
        k_cache, v_cache, cache_seqlens, accept_index, accept_len,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        accept_index.stride(0), accept_index.stride(1),
        B, A, Lmax, HEAD_DIM=D, ROW=row, BLOCK_A=max(2, next_power_of_2(A)), BLOCK_C=block_c, num_warps=4,
    )


def _aot_specs():
    """Compile-only specs: Llama-3.1-8B cache rows (8 KV heads x 128), bf16 and fp32."""
    specs = []
    for dt in ("bf16", "fp32"):
        sig = {n: "i32" for n in _append_kv_kernel.arg_names}
        sig.update({"k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "kn_ptr": f"*{dt}", "vn_ptr": f"*{dt}",
                    "seqlens_ptr": "*i32"})
        const = dict(HEAD_DIM=128, ROW=1024, BLOCK_C=1024)
        sig.update({k: "constexpr" for k in const})
        div = [n for n in _append_kv_kernel.arg_names if n.startswith("stride_") or n == "Lmax"]
        specs.append((_append_kv_kernel, sig, const, {"num_warps": 4, "div16": div}))
        sig = {n: "i32" for n in _compact_kv_kernel.arg_names}
        sig.update({"k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "seqlens_ptr": "*i32", "idx_ptr": "*i64",
                    "len_ptr": "*i32"})
        const = dict(HEAD_DIM=128, ROW=1024, BLOCK_A=8, BLOCK_C=256)
        sig.update({k: "constexpr" for k in const})
        div = [n for n in _compact_kv_kernel.arg_names if n.startswith("stride_k") or n.startswith("stride_v")]
        specs.append((_compact_kv_kernel, sig, const, {"num_warps": 4, "div16": div}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
