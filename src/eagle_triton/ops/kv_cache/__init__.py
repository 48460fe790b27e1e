"""Static KV cache maintenance: :func:`append_kv_cache` and :func:`compact_kv_cache` (+ ``*_ref``)."""

from .op import append_kv_cache, compact_kv_cache
from .reference import append_kv_cache_ref, compact_kv_cache_ref

__all__ = ["append_kv_cache", "append_kv_cache_ref", "compact_kv_cache", "compact_kv_cache_ref"]
