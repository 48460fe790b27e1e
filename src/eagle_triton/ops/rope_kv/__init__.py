"""Fused RoPE (+ Qwen3 q/k RMSNorm) and KV-cache write of the target forward, with its PyTorch reference."""

from .op import target_rope_kv
from .reference import target_rope_kv_ref

__all__ = ["target_rope_kv", "target_rope_kv_ref"]
