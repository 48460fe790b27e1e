"""LM-head top-k log-probabilities without materialising logits: :func:`lm_head_topk` (+ ``lm_head_topk_ref``)."""

from .op import lm_head_topk
from .reference import lm_head_topk_ref

__all__ = ["lm_head_topk", "lm_head_topk_ref"]
