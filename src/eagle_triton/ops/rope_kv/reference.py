"""PyTorch reference (the specification) for :mod:`eagle_triton.ops.rope_kv`: the eager sequence of
:class:`~eagle_triton.engine.target.LlamaTarget`'s PyTorch forward."""

from __future__ import annotations

import torch

from ..target_linear.reference import target_rms_norm_ref

__all__ = ["target_rope_kv_ref", "target_qkv_rope_ref"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def target_rope_kv_ref(
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
    cache_slots: torch.Tensor | None = None,
    **_: object,
) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.rope_kv.target_rope_kv` (same contract and side effect).

    ``cache_slots`` ``[B]``: sequence ``b`` writes cache batch index ``cache_slots[b]`` of the whole cache (and
    starts at ``cache_seqlens[cache_slots[b]]``); None: index ``b``.
    """
    if cache_slots is not None:  # gather the slots' views, run the plain path, scatter them back
        idx = cache_slots.to(k_cache.device).long()
        kc, vc = k_cache[idx], v_cache[idx]
        q = target_rope_kv_ref(qkv, kc, vc, cache_seqlens.to(idx.device)[idx], positions, cos, sin, num_heads,
                               num_kv_heads, q_norm, k_norm, eps, out=out)
        k_cache[idx], v_cache[idx] = kc, vc
        return q
    M = qkv.shape[0]
    D = k_cache.shape[-1]
    nq, nkv = num_heads * D, num_kv_heads * D
    q = qkv[:, :nq].reshape(M, num_heads, D)
    k = qkv[:, nq:nq + nkv].reshape(M, num_kv_heads, D)
    v = qkv[:, nq + nkv:nq + 2 * nkv].reshape(M, num_kv_heads, D)
    if q_norm is not None:
        q = target_rms_norm_ref(q, q_norm, eps)
        k = target_rms_norm_ref(k, k_norm, eps)
    c = cos[positions.reshape(M).long()].unsqueeze(1)
    s = sin[positions.reshape(M).long()].unsqueeze(1)
    q = q * c + _rotate_half(q) * s
    k = k * c + _rotate_half(k) * s
    B, Lmax = k_cache.shape[0], k_cache.shape[1]
    S = M // B  # rows per sequence: row m is row m % S of sequence m // S
    seq = torch.arange(M, device=qkv.device) // S
    rows = cache_seqlens.to(qkv.device).long()[seq] + torch.arange(M, device=qkv.device) % S
    keep = (rows >= 0) & (rows < Lmax)  # rows past the capacity are dropped, as the kernel does
    k_cache[seq[keep], rows[keep]] = k[keep].to(k_cache.dtype)
    v_cache[seq[keep], rows[keep]] = v[keep].to(v_cache.dtype)
    if out is not None:
        return out.copy_(q)
    return q.contiguous()


def target_qkv_rope_ref(x, weight, bias, k_cache, v_cache, cache_seqlens, positions, cos, sin, num_heads,
                        num_kv_heads, *, norm_weight=None, eps=1e-6, sumsq=None, norm_folded=False, out=None,
                        cache_slots=None, **_: object) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.rope_kv.target_qkv_rope`: the q/k/v product's reference, rounded to
    the dtype, then :func:`target_rope_kv_ref` (same side effect on the caches)."""
    from ..target_linear.reference import target_linear_ref

    qkv = target_linear_ref(x, weight, bias, norm_weight=norm_weight, eps=eps, sumsq=sumsq,
                            norm_folded=norm_folded).to(x.dtype)
    return target_rope_kv_ref(qkv, k_cache, v_cache, cache_seqlens, positions, cos, sin, num_heads, num_kv_heads,
                              eps=eps, out=out, cache_slots=cache_slots)
