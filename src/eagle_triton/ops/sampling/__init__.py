"""Sampling helpers: temperature softmax, top-k / top-p renormalisation, inverse-CDF sampling, Philox uniforms."""

from .op import philox_uniform, sampling_from_probs, softmax_with_temperature, top_k_renorm_probs, top_p_renorm_probs
from .reference import (
    philox_uniform_ref,
    sampling_from_probs_ref,
    softmax_with_temperature_ref,
    top_k_renorm_probs_ref,
    top_p_renorm_probs_ref,
)

__all__ = [
    "softmax_with_temperature", "softmax_with_temperature_ref",
    "top_k_renorm_probs", "top_k_renorm_probs_ref",
    "top_p_renorm_probs", "top_p_renorm_probs_ref",
    "sampling_from_probs", "sampling_from_probs_ref",
    "philox_uniform", "philox_uniform_ref",
]
