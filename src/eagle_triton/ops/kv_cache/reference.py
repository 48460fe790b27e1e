"""PyTorch references (the specification) for :mod:`eagle_triton.ops.kv_cache`."""

from __future__ import annotations

import torch

__all__ = ["append_kv_cache_ref", "compact_kv_cache_ref"]


def append_kv_cache_ref(k_cache, v_cache, k_new, v_new, cache_seqlens, **_: object) -> None:
    """``k_cache[b, cache_seqlens[b] + j] = k_new[b, j]`` (and V), in place; no host sync."""
    B, Tn = k_new.shape[:2]
    dev = k_cache.device
    bi = torch.arange(B, device=dev)[:, None].expand(B, Tn)
    dst = cache_seqlens.to(dev).long()[:, None] + torch.arange(Tn, device=dev)[None, :]
    k_cache[bi, dst] = k_new
    v_cache[bi, dst] = v_new


def compact_kv_cache_ref(k_cache, v_cache, cache_seqlens, accept_index, accept_len, **_: object) -> None:
    """For every layer ``l`` and ``j < accept_len[b]``: row ``L_b + accept_index[b, j]`` -> row ``L_b + j``.

    Caches are ``[NL, B, Lmax, Hkv, D]``. Loop-clear (host loop, it syncs); all sources are read before any
    destination is written, as the kernel does.
    """
    seq = cache_seqlens.tolist()
    n_acc = accept_len.tolist()
    idx = accept_index.tolist()
    for b in range(k_cache.shape[1]):
        n = min(int(n_acc[b]), accept_index.shape[1])
        if n <= 0:
            continue
        src = torch.tensor([seq[b] + int(i) for i in idx[b][:n]], device=k_cache.device)
        dst = torch.arange(n, device=k_cache.device) + seq[b]
        for cache in (k_cache, v_cache):
            rows = cache[:, b, src].clone()
            cache[:, b, dst] = rows
