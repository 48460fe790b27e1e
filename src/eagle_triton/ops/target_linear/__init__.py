"""Batch-invariant weight products of the target forward (RMSNorm prologue, bias, SiLU·mul and residual
epilogues, partial sums of squares for the next RMSNorm), the standalone RMSNorm and the embedding gather, with
their PyTorch references."""

from .op import (
           KEY_EMPTY,
           LinearConfig,
           argmax_from_keys,
           default_config,
           fold_norm_weight,
           sumsq_width,
           target_embedding,
           target_linear,
           target_rms_norm,
)
from .reference import argmax_keys_ref, target_embedding_ref, target_linear_ref, target_rms_norm_ref

__all__ = ["target_linear", "target_linear_ref", "argmax_from_keys", "argmax_keys_ref", "KEY_EMPTY",
           "target_rms_norm", "target_rms_norm_ref", "target_embedding",
           "target_embedding_ref", "sumsq_width", "LinearConfig", "default_config", "fold_norm_weight"]
