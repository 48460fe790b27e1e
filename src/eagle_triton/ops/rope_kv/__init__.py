"""Fused RoPE (+ Qwen3 q/k RMSNorm) and KV-cache write of the target forward (on its own, or as the epilogue of the
q/k/v product), with the PyTorch references."""

from .op import qkv_rope_config, target_qkv_rope, target_rope_kv
from .reference import target_qkv_rope_ref, target_rope_kv_ref

__all__ = ["target_rope_kv", "target_rope_kv_ref", "target_qkv_rope", "target_qkv_rope_ref", "qkv_rope_config"]
