"""Training EAGLE-3 draft heads by self-distillation (``eagle-triton train``).

Pipeline: :func:`generate_dataset` (prompts from a JSONL file or sampled from the target, responses written by
the target, resumable shards) -> :func:`train_eagle3` (draft vocabulary from token frequencies, training-time
test unrolled over ``ttt_steps``, AdamW with warm-up, bf16 autocast on CUDA, per-step top-1 validation,
resumable checkpoints in the published EAGLE-3 format) -> :func:`greedy_acceptance` (mean accepted length).
transformers is imported only when a target is loaded.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.default_model import DEFAULT_HEAD_DIR, default_draft_head_path
from .data import (
    INSTRUCTION_OPENERS,
    DataConfig,
    EvalPromptFilter,
    Sample,
    export_dataset,
    generate_dataset,
    import_dataset,
    load_dataset,
    read_prompts_jsonl,
    sample_user_prompts,
    user_prefix_ids,
)
from .evaluate import accepted_along_path, greedy_acceptance, greedy_continuation
from .target import eagle3_tap_layers, load_target, locate_smollm2, target_forward
from .trainer import TrainConfig, head_config_for_target, lr_at, make_batches, train_eagle3, validate
from .ttt import TTTBatch, ttt_hidden_states, ttt_loss
from .vocab import DraftVocab, build_draft_vocab, grow_draft_vocab, grown_positions, token_counts

__all__ = [
    "DataConfig",
    "DraftVocab",
    "EvalPromptFilter",
    "INSTRUCTION_OPENERS",
    "Sample",
    "TTTBatch",
    "TrainConfig",
    "accepted_along_path",
    "build_draft_vocab",
    "grow_draft_vocab",
    "grown_positions",
    "eagle3_tap_layers",
    "export_dataset",
    "generate_dataset",
    "greedy_acceptance",
    "greedy_continuation",
    "head_config_for_target",
    "import_dataset",
    "load_dataset",
    "load_target",
    "locate_smollm2",
    "lr_at",
    "make_batches",
    "read_prompts_jsonl",
    "sample_user_prompts",
    "smollm2_head_path",
    "target_forward",
    "token_counts",
    "train_eagle3",
    "ttt_hidden_states",
    "ttt_loss",
    "user_prefix_ids",
    "validate",
]


def smollm2_head_path() -> Path:
    """Directory of the EAGLE-3 head shipped for SmolLM2-135M-Instruct (``assets/smollm2-eagle3``)."""
    p = default_draft_head_path()
    if p is None:
        raise FileNotFoundError(f"the shipped SmolLM2 head is missing at {DEFAULT_HEAD_DIR}")
    return p
