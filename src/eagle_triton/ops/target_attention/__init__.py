"""Batch-invariant attention of the target forward: decode, prefill chunks and tree verification give a row the
same bits (:func:`target_attention`, with its PyTorch reference :func:`target_attention_ref`)."""

from .op import TargetAttentionConfig, target_attention, target_attention_config, tree_ancestors
from .reference import key_positions_ref, target_attention_ref, tree_ancestors_ref

__all__ = ["target_attention", "target_attention_ref", "key_positions_ref", "tree_ancestors", "tree_ancestors_ref",
           "TargetAttentionConfig", "target_attention_config"]
