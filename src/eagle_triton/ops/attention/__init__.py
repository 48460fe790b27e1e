"""Attention for the speculative step: tree verification (:func:`tree_attention`) and frontier drafting
(:func:`draft_tree_attention`), each with its PyTorch reference (``*_ref``)."""

from .op import draft_tree_attention, tree_attention
from .reference import draft_tree_attention_ref, rope_ref, tree_attention_ref

__all__ = ["tree_attention", "tree_attention_ref", "draft_tree_attention", "draft_tree_attention_ref", "rope_ref"]
