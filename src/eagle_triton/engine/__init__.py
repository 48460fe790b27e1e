"""The lossless EAGLE engine: target runners (fast Llama family, generic transformers), static KV cache, tree
verification, sampling, statistics and :class:`EagleEngine`.

Importing this package does not import transformers; loading models does.
"""

from .accept import AcceptResult, accept_greedy, accept_sampling, accept_tree, accept_tree_probs
from .batch import BATCH_BUCKETS, BatchStepRunner, PendingBatch
from .engine import EagleEngine
from .hf_target import HFTarget
from .kv_cache import StaticKVCache
from .loading import ModelLoadError, load_head, load_target, load_tokenizer
from .sampling import (
    DeviceRNG,
    RowRNG,
    RowSampling,
    SamplingParams,
    probs_from_logits,
    probs_from_logits_rows,
    process_logits,
    process_logits_rows,
    sample_from_probs,
)
from .stats import GenerationStats
from .step import PendingTokens, StepRunner
from .target import LlamaTarget, TargetConfig, TargetModel, eagle3_tap_layers

__all__ = [
    "AcceptResult",
    "BATCH_BUCKETS",
    "BatchStepRunner",
    "DeviceRNG",
    "EagleEngine",
    "GenerationStats",
    "HFTarget",
    "LlamaTarget",
    "ModelLoadError",
    "PendingBatch",
    "PendingTokens",
    "RowRNG",
    "RowSampling",
    "SamplingParams",
    "StaticKVCache",
    "StepRunner",
    "TargetConfig",
    "TargetModel",
    "accept_greedy",
    "accept_sampling",
    "accept_tree",
    "accept_tree_probs",
    "eagle3_tap_layers",
    "load_head",
    "load_target",
    "load_tokenizer",
    "probs_from_logits",
    "probs_from_logits_rows",
    "process_logits",
    "process_logits_rows",
    "sample_from_probs",
]
