"""The three attention/KV operations of the speculative step, routed through one small backend object.

The engine calls ``ops.tree_attention``, ``ops.append_kv_cache`` and ``ops.compact_kv_cache`` on a backend picked
once: the Triton kernels of :mod:`eagle_triton.ops` on CUDA when they import, the PyTorch versions below otherwise.
So the engine has one code path; only the backend object differs.

Layouts (flash-attn vocabulary): one layer's cache is ``k_cache [B, Lmax, Hkv, D]``; the whole static cache is
``[NL, B, Lmax, Hkv, D]``; ``cache_seqlens [B]`` int32 counts the committed rows of each sequence.
"""

from __future__ import annotations

import torch

__all__ = ["TorchOps", "TritonOps", "select_ops"]


class TorchOps:
    """PyTorch back end (CPU, or CUDA without the Triton kernels): the ``_ref`` specifications of
    :mod:`eagle_triton.ops`. ``kv_limit`` (a host bound on ``cache_seqlens.max() + Tq``) lets eager CPU runs read
    only the first ``kv_limit`` cache rows, an exact shortcut since later rows are invisible.

    Convention bridge (shared with :class:`TritonOps`): ``compact_kv_cache`` here takes accepted drafts (root
    excluded, SGLang's ``accept_token_num``); the ops take the number of rows kept (root included). A caller that
    already holds that count (``rows_kept``, ``accept_len + 1`` as int32 ``[B]``: the step's next ``num_new``) passes
    it, and the op reads it as it is: no add launch per step. The caller (:meth:`StaticKVCache.compact`) advances
    ``cache_seqlens``.
    """

    name = "torch"
    reads_kv_limit = True

    def __init__(self):
        from ..ops.attention import tree_attention_ref
        from ..ops.kv_cache import append_kv_cache_ref, compact_kv_cache_ref

        self._tree_attention, self._append, self._compact = (tree_attention_ref, append_kv_cache_ref,
                                                             compact_kv_cache_ref)

    def tree_attention(self, q, k_cache, v_cache, cache_seqlens, tree_mask=None, softmax_scale=None, kv_limit=None):
        if kv_limit is not None:
            k_cache, v_cache = k_cache[:, :kv_limit], v_cache[:, :kv_limit]
        return self._tree_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale)

    def append_kv_cache(self, k_cache, v_cache, k_new, v_new, cache_seqlens):
        self._append(k_cache, v_cache, k_new, v_new, cache_seqlens)

    def compact_kv_cache(self, k_cache, v_cache, cache_seqlens, accept_index, accept_len, rows_kept=None):
        kept = accept_len + 1 if rows_kept is None else rows_kept
        self._compact(k_cache, v_cache, cache_seqlens, accept_index, kept)


class TritonOps:
    """The Triton kernels of :mod:`eagle_triton.ops` (pinned signatures). ``kv_limit`` is ignored: the kernels
    read ``cache_seqlens`` on the device. Their host-side validation (a device sync per call) is turned off: the
    engine checks capacity on the host from lengths it already knows.

    Same convention bridge as :class:`TorchOps`.
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

    def compact_kv_cache(self, k_cache, v_cache, cache_seqlens, accept_index, accept_len, rows_kept=None):
        kept = accept_len + 1 if rows_kept is None else rows_kept
        self._compact(k_cache, v_cache, cache_seqlens, accept_index, kept, validate=False)


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
