"""The three attention/KV operations of the speculative step, routed through one small backend object.

The engine calls ``ops.tree_attention``, ``ops.append_kv_cache`` and ``ops.compact_kv_cache`` on a backend picked
once: the Triton kernels of :mod:`eagle_triton.ops` on CUDA when they import, the PyTorch versions below otherwise.
So the engine has one code path; only the backend object differs.

Layouts (flash-attn vocabulary): one layer's cache is ``k_cache [B, Lmax, Hkv, D]``; the whole static cache is
``[NL, B, Lmax, Hkv, D]``; ``cache_seqlens [B]`` int32 counts the committed rows of each sequence.
"""

from __future__ import annotations

import math

import torch

__all__ = ["TorchOps", "TritonOps", "select_ops", "tree_attention_torch", "append_kv_cache_torch",
           "compact_kv_cache_torch"]


def tree_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    kv_limit: int | None = None,
) -> torch.Tensor:
    """Attention of ``Tq`` new rows over a static cache whose prefix is fully visible.

    Parameters
    ----------
    q: ``[B, Tq, Hq, D]``.
    k_cache, v_cache: ``[B, Lmax, Hkv, D]``; the ``Tq`` new K/V rows are already written at
        ``cache_seqlens[b] + j``.
    cache_seqlens: ``[B]`` int32, committed prefix length per sequence (rows ``[0, cache_seqlens)`` all visible).
    tree_mask: ``[B, Tq, Tq]`` bool, ``True`` where new row ``i`` may see new row ``j``; ``None`` means causal.
    softmax_scale: defaults to ``1 / sqrt(D)``.
    kv_limit: optional host bound on ``cache_seqlens.max() + Tq``: only the first ``kv_limit`` cache rows are
        read (an exact shortcut for eager CPU runs; leave ``None`` under CUDA-graph capture).

    Returns
    -------
    ``[B, Tq, Hq, D]`` in ``q.dtype``. Scores and softmax are computed in fp32.
    """
    B, Tq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} are not a multiple of KV heads {Hkv}")
    L = k_cache.shape[1] if kv_limit is None else min(int(kv_limit), k_cache.shape[1])
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    rep = Hq // Hkv
    k = k_cache[:, :L].transpose(1, 2)
    v = v_cache[:, :L].transpose(1, 2)
    if rep > 1:  # head h reads KV head h // rep (transformers' repeat_kv)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    qh = q.transpose(1, 2)
    scores = torch.matmul(qh.float(), k.float().transpose(-1, -2)) * scale  # [B, Hq, Tq, L]
    j = torch.arange(L, device=q.device)
    rel = j.view(1, 1, L) - cache_seqlens.view(B, 1, 1).long()  # key index relative to the first new row
    prefix = rel < 0
    new = (rel >= 0) & (rel < Tq)
    i = torch.arange(Tq, device=q.device).view(1, Tq, 1)
    if tree_mask is None:
        among_new = rel <= i
    else:
        among_new = tree_mask.to(torch.bool).gather(2, rel.clamp(0, Tq - 1).expand(B, Tq, L))
    visible = prefix | (new & among_new)  # [B, Tq, L]
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.float())  # [B, Hq, Tq, D]
    return out.transpose(1, 2).to(q.dtype)


def append_kv_cache_torch(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cache_seqlens: torch.Tensor
) -> None:
    """Write ``k_new``/``v_new`` (``[B, Tn, Hkv, D]``) at rows ``cache_seqlens[b] + j`` of ``[B, Lmax, Hkv, D]``
    caches, in place. ``cache_seqlens`` is not advanced."""
    B, Tn = k_new.shape[:2]
    rows = cache_seqlens.view(B, 1).long() + torch.arange(Tn, device=k_new.device).view(1, Tn)
    b = torch.arange(B, device=k_new.device).view(B, 1).expand(B, Tn)
    k_cache[b, rows] = k_new.to(k_cache.dtype)
    v_cache[b, rows] = v_new.to(v_cache.dtype)


def compact_kv_cache_torch(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
) -> None:
    """Keep the accepted path of a verified tree: rows ``cache_seqlens + accept_index[b, i]`` move to
    ``cache_seqlens + i`` for ``i <= accept_len[b]`` (root + accepted drafts), in every layer of the
    ``[NL, B, Lmax, Hkv, D]`` caches, and ``cache_seqlens`` advances by ``accept_len + 1``.

    ``accept_index [B, A]`` holds tree-node indices relative to ``cache_seqlens`` (node 0 = root), -1 padded;
    ``accept_len [B]`` counts accepted drafts, excluding the root (SGLang's ``accept_token_num``).
    """
    NL, B, Lmax = k_cache.shape[:3]
    A = accept_index.shape[1]
    dev = k_cache.device
    base = cache_seqlens.view(B, 1).long()
    i = torch.arange(A, device=dev).view(1, A)
    dst = base + i
    keep = i <= accept_len.view(B, 1).long()
    src = torch.where(keep, base + accept_index.long().clamp(min=0), dst)  # dropped entries copy onto themselves
    b = torch.arange(B, device=dev).view(B, 1).expand(B, A)
    for cache in (k_cache, v_cache):
        rows = cache[:, b, src]  # gather first: sources and destinations may overlap
        cache[:, b, dst] = rows
    cache_seqlens.add_((accept_len.view(B) + 1).to(cache_seqlens.dtype))


class TorchOps:
    """PyTorch back end (CPU, or CUDA without the Triton kernels)."""

    name = "torch"
    reads_kv_limit = True

    def tree_attention(self, q, k_cache, v_cache, cache_seqlens, tree_mask=None, softmax_scale=None, kv_limit=None):
        return tree_attention_torch(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, kv_limit)

    def append_kv_cache(self, k_cache, v_cache, k_new, v_new, cache_seqlens):
        append_kv_cache_torch(k_cache, v_cache, k_new, v_new, cache_seqlens)

    def compact_kv_cache(self, k_cache, v_cache, cache_seqlens, accept_index, accept_len):
        compact_kv_cache_torch(k_cache, v_cache, cache_seqlens, accept_index, accept_len)


class TritonOps:
    """The Triton kernels of :mod:`eagle_triton.ops` (pinned signatures). ``kv_limit`` is ignored: the kernels
    read ``cache_seqlens`` on the device. Their host-side validation (a device sync per call) is turned off: the
    engine checks capacity on the host from lengths it already knows.

    Convention bridge: ``ops.compact_kv_cache`` takes the number of rows to keep (root included) and leaves
    ``cache_seqlens`` alone; this back end takes accepted drafts (root excluded) like :func:`compact_kv_cache_torch`
    and the caller (:meth:`StaticKVCache.compact`) sets ``cache_seqlens``.
    """

    name = "triton"
    reads_kv_limit = False

    def __init__(self):
        from .. import ops  # noqa: PLC0415  (raises ImportError when the kernels are absent)

        self._tree_attention = ops.tree_attention
        self._append = ops.append_kv_cache
        self._compact = ops.compact_kv_cache

    def tree_attention(self, q, k_cache, v_cache, cache_seqlens, tree_mask=None, softmax_scale=None, kv_limit=None):
        return self._tree_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale=softmax_scale,
                                    validate=False)

    def append_kv_cache(self, k_cache, v_cache, k_new, v_new, cache_seqlens):
        self._append(k_cache, v_cache, k_new, v_new, cache_seqlens, validate=False)

    def compact_kv_cache(self, k_cache, v_cache, cache_seqlens, accept_index, accept_len):
        self._compact(k_cache, v_cache, cache_seqlens, accept_index, accept_len + 1, validate=False)


def select_ops(device: torch.device | str, name: str = "auto"):
    """``"torch"``, ``"triton"`` or ``"auto"`` (Triton on CUDA when :mod:`eagle_triton.ops` imports, else torch)."""
    device = torch.device(device)
    if name == "torch":
        return TorchOps()
    if name == "triton":
        if device.type != "cuda":
            raise ValueError(f"the triton attention back end needs a CUDA device, got {device}")
        return TritonOps()
    if name != "auto":
        raise ValueError(f"unknown attention back end {name!r}: use 'auto', 'torch' or 'triton'")
    if device.type == "cuda":
        try:
            return TritonOps()
        except (ImportError, AttributeError):
            pass
    return TorchOps()
