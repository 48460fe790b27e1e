"""Reading a Llama checkpoint's ``config.json`` and RoPE frequencies without importing transformers' model code.

``AutoConfig`` plus transformers' rotary class cost about 2 s of imports per CLI call on a 2-core CPU, most of a
cached default model's start. For the common case (``model_type`` llama, every field the fast path reads written
out, default RoPE) the JSON and the default RoPE formula give the same :class:`TargetConfig` and the same
``inv_freq`` bit for bit (tests compare both against transformers). Anything else returns ``None`` and the caller
goes through transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

__all__ = ["read_simple_llama_config", "default_rope_inv_freq"]

# Fields whose class defaults differ across model types or transformers versions: they must be written out.
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "hidden_act")


def default_rope_inv_freq(base: float, dim: int) -> torch.Tensor:
    """transformers' default RoPE (``_compute_default_rope_parameters``, 4.45 to 5.x): the same operations, fp32."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def read_simple_llama_config(root: str | Path) -> tuple[SimpleNamespace, torch.Tensor, float] | None:
    """``(config, inv_freq [head_dim/2] fp32, attention_scaling)`` from ``root/config.json`` when it is a plain
    Llama config with default RoPE, else ``None``. Raises ``ValueError`` for a config.json that is not JSON."""
    raw = json.loads((Path(root) / "config.json").read_text())
    if not isinstance(raw, dict) or raw.get("model_type") != "llama" or any(k not in raw for k in _REQUIRED):
        return None
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        return None
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", raw.get("rope_theta"))
    extra = set(rope) - {"rope_type", "type", "rope_theta"}
    if rope_type != "default" or extra or theta is None or raw.get("partial_rotary_factor", 1.0) != 1.0:
        return None
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    cfg = SimpleNamespace(**raw)
    cfg.head_dim = head_dim
    return cfg, default_rope_inv_freq(float(theta), int(head_dim)), 1.0
