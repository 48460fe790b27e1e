"""Batch-invariant weight products of the target forward (RMSNorm prologue, bias, SiLU·mul and residual
epilogues) and the standalone RMSNorm, with their PyTorch references."""

from .op import LinearConfig, default_config, target_linear, target_rms_norm
from .reference import target_linear_ref, target_rms_norm_ref

__all__ = ["target_linear", "target_linear_ref", "target_rms_norm", "target_rms_norm_ref", "LinearConfig",
           "default_config"]
