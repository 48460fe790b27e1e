"""The ``config.json`` of published EAGLE draft heads, parsed into a typed dataclass."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["DraftHeadConfig"]

_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


@dataclass
class DraftHeadConfig:
    """Fields of an EAGLE draft-head ``config.json`` (a LlamaConfig with EAGLE's additions).

    ``draft_vocab_size`` (EAGLE-3) is the reduced draft vocabulary; ``target_hidden_size`` (EAGLE-3) is set when
    the target is wider than the draft; ``bias`` (EAGLE-1) controls ``fc.bias``; ``qkv_bias`` (EAGLE-1, Qwen2
    heads) adds q/k/v biases; ``attention_bias`` (Llama's field, read by EAGLE-3 heads) adds q/k/v and o_proj biases.
    ``rope_theta`` is ``None`` when the file has none: EAGLE then uses base 10000.
    Unknown keys are kept in ``extra`` and written back by :meth:`to_dict`.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    num_hidden_layers: int = 1
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    rope_theta: float | None = None
    rope_scaling: dict | None = None
    hidden_act: str = "silu"
    bias: bool = True
    qkv_bias: bool | None = None
    attention_bias: bool | None = None
    pad_token_id: int | None = None
    architectures: list[str] | None = None
    torch_dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"draft head config: hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"draft head config: num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.hidden_act not in ("silu", "swish"):
            raise ValueError(f"draft head config: hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in (None, "default"):
                raise ValueError(
                    f"draft head config: rope_scaling {self.rope_scaling} is not supported; EAGLE draft heads use "
                    "plain RoPE"
                )

    @property
    def head_dim(self) -> int:
        # EAGLE computes head_dim as hidden_size / num_heads and ignores a head_dim field.
        return self.hidden_size // self.num_attention_heads

    @property
    def rope_base(self) -> float:
        return 10000.0 if self.rope_theta is None else float(self.rope_theta)

    @property
    def effective_draft_vocab(self) -> int:
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @property
    def feature_size(self) -> int:
        """Width of one target hidden state (EAGLE-3 taps three of them)."""
        return self.target_hidden_size or self.hidden_size

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftHeadConfig:
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ValueError(f"draft head config.json lacks required field(s) {missing}")
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> DraftHeadConfig:
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"draft head config {path} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"draft head config {path} must hold a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d = {k: v for k, v in d.items() if v is not None}
        d.update(extra)
        return d
