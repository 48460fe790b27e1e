"""Common base of the EAGLE draft heads: input checks and checkpoint loading/saving."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from .checkpoint import CheckpointError, check_state_dict, read_state_dict, write_state_dict
from .config import DraftHeadConfig
from .layers import build_attention_mask

__all__ = ["DraftHead", "detect_head_kind", "load_draft_head"]


def detect_head_kind(config: DraftHeadConfig, keys=None) -> str:
    """``"eagle3"`` or ``"eagle1"`` from the config's architectures/draft vocab, or from the weight names."""
    arch = " ".join(config.architectures or []).lower()
    if "eagle3" in arch or config.draft_vocab_size is not None:
        return "eagle3"
    if keys is not None:
        if any(k.startswith("midlayer.") for k in keys):
            return "eagle3"
        if any(k.startswith("layers.") for k in keys):
            return "eagle1"
    return "eagle1"


class DraftHead(nn.Module):
    """Base of :class:`Eagle3DraftHead` and :class:`Eagle1DraftHead`.

    Subclasses define ``kind``, ``forward(hidden_states, input_ids, position_ids, past_key_values, tree_mask)``
    returning ``(h, kv)``, ``compute_logits(h)``, ``draft_to_target(ids)`` and the properties ``feature_width``
    (width of the target feature the head ingests), ``draft_vocab_size``, ``has_vocab_map``, ``embed_is_external``.
    """

    kind: str = ""

    def __init__(self, config: DraftHeadConfig):
        super().__init__()
        self.config = config

    # -- shared forward helpers -------------------------------------------------------------------------------
    def _check_inputs(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, allowed_widths) -> None:
        if hidden_states.dim() != 3:
            raise ValueError(f"hidden_states must be [B, S, W], got shape {list(hidden_states.shape)}")
        if input_ids.dim() != 2 or input_ids.shape != hidden_states.shape[:2]:
            raise ValueError(
                f"input_ids must be [B, S] = {list(hidden_states.shape[:2])} to pair with hidden_states, got "
                f"{list(input_ids.shape)}"
            )
        if hidden_states.shape[-1] not in allowed_widths:
            raise ValueError(
                f"{type(self).__name__}: hidden_states width {hidden_states.shape[-1]} is none of the widths it "
                f"takes {sorted(set(allowed_widths))}"
            )
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be int64 or int32, got {input_ids.dtype}")

    @staticmethod
    def _positions(position_ids, past_len: int, seq: int, device) -> torch.Tensor:
        if position_ids is None:
            return torch.arange(past_len, past_len + seq, dtype=torch.long, device=device).view(1, seq)
        return position_ids.view(-1, seq).long()

    def _forward_inputs(self, hidden_states, input_ids, position_ids, past_key_values, tree_mask, allowed_widths):
        """What every draft forward starts with: checked inputs, ``(position_ids, additive mask, embeddings)``.

        The embeddings are looked up without gradient (they are the target's, frozen) and cast to the features'
        dtype, as the reference does."""
        self._check_inputs(hidden_states, input_ids, allowed_widths=allowed_widths)
        seq = hidden_states.shape[1]
        past_len = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        position_ids = self._positions(position_ids, past_len, seq, hidden_states.device)
        mask = build_attention_mask(seq, past_len, tree_mask, hidden_states.device)
        with torch.no_grad():
            emb = self.embed_tokens(input_ids)
        return position_ids, mask, emb.to(hidden_states.dtype)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The compute (activation) dtype; FP8 weights (:class:`~eagle_triton.heads.fp8.Fp8Linear`) keep theirs."""
        return self.embed_tokens.weight.dtype

    # -- checkpoints -----------------------------------------------------------------------------------------
    def _optional_keys(self, loaded_keys) -> set[str]:
        optional = {"t2d"}  # derivable from d2t; SpecForge-style checkpoints may omit it
        if self.embed_is_external:
            optional.add("embed_tokens.weight")
        if not getattr(self, "has_vocab_map", False):
            optional |= {"d2t", "t2d"}
        return optional

    def _set_embeddings(self, embed_tokens) -> None:
        weight = embed_tokens.weight if isinstance(embed_tokens, nn.Embedding) else embed_tokens
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"embed_tokens must be a Tensor or nn.Embedding, got {type(embed_tokens).__name__}")
        want = tuple(self.embed_tokens.weight.shape)
        if tuple(weight.shape) != want:
            raise ValueError(
                f"embed_tokens has shape {list(weight.shape)} but the draft head expects {list(want)} "
                "(target vocab_size x draft hidden_size): vocab or hidden mismatch between target and draft"
            )
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight.detach().to(self.embed_tokens.weight.device))

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        embed_tokens: torch.Tensor | nn.Embedding | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        weight_dtype: str | None = None,
        **kwargs,
    ) -> DraftHead:
        """Load a head saved in the published EAGLE format, strictly.

        ``weight_dtype="fp8"`` stores the linear layers of an EAGLE-3 head in FP8 (``Eagle3DraftHead.quantize_fp8``,
        quantised from the checkpoint's values before any ``dtype`` cast). A checkpoint written from an FP8 head
        (``*.weight_scale`` keys) loads as an FP8 head whatever ``weight_dtype`` says.

        A missing, unexpected or mis-shaped key raises :class:`CheckpointError` naming the key and both shapes
        (SafeAILab loads with ``strict=False`` and ignores such keys). ``embed_tokens`` (the target's input
        embedding) is required when the checkpoint lacks ``embed_tokens.weight``. On the base class the kind
        (EAGLE-3 or EAGLE-1) is detected; on a subclass a checkpoint of the other kind is an error.
        """
        root = Path(path)
        if not root.is_dir():
            raise CheckpointError(f"draft head checkpoint {root} is not a directory")
        cfg_path = root / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"draft head checkpoint {root} has no config.json")
        config = DraftHeadConfig.from_json(cfg_path)
        sd = read_state_dict(root)
        kind = detect_head_kind(config, sd.keys())
        from .eagle1 import Eagle1DraftHead
        from .eagle3 import Eagle3DraftHead

        classes = {"eagle3": Eagle3DraftHead, "eagle1": Eagle1DraftHead}
        target_cls = classes[kind]
        if cls is not DraftHead and not issubclass(target_cls, cls):
            raise CheckpointError(
                f"{root} holds an {kind.upper().replace('EAGLE', 'EAGLE-')} head but {cls.__name__} was asked "
                f"for; use {target_cls.__name__} or load_draft_head()"
            )
        if weight_dtype not in (None, "model", "fp8"):
            raise ValueError(f"weight_dtype must be None / 'model' (the model dtype) or 'fp8', got {weight_dtype!r}")
        fp8 = weight_dtype == "fp8"
        head = target_cls(config, **kwargs)
        stored_fp8 = any(k.endswith(".weight_scale") for k in sd)
        if (fp8 or stored_fp8) and not hasattr(head, "quantize_fp8"):
            raise CheckpointError(f"{root}: FP8 weights are supported for EAGLE-3 heads only, this is {kind}")
        if stored_fp8:
            head.quantize_fp8(structure_only=True)
        expected = head.state_dict()
        check_state_dict(sd, expected, head._optional_keys(sd.keys()), str(root))
        head.load_state_dict(sd, strict=False)
        if "embed_tokens.weight" not in sd:
            if embed_tokens is None:
                raise CheckpointError(
                    f"{root} has no embed_tokens.weight: pass embed_tokens= (the target's input embedding)"
                )
            head._set_embeddings(embed_tokens)
        if getattr(head, "has_vocab_map", False) and "t2d" not in sd:
            t2d = torch.zeros_like(head.t2d)
            t2d[torch.arange(head.d2t.numel()) + head.d2t] = True
            head.t2d.copy_(t2d)
        if fp8:
            head.quantize_fp8()
        if dtype is not None or device is not None:
            head.to(device=device, dtype=dtype)
        return head.eval()

    def save_pretrained(
        self, path: str | os.PathLike, max_shard_bytes: int | None = None, include_embeddings: bool | None = None
    ) -> list[str]:
        """Write ``config.json`` and safetensors weights in the published layout.

        The input embedding is left out when it comes from the target (as in the published heads) unless
        ``include_embeddings=True``. The weights go to one ``model.safetensors`` (the file SafeAILab EAGLE's
        ``EaModel.from_pretrained`` reads) unless ``max_shard_bytes`` is given and exceeded: then shards plus
        ``model.safetensors.index.json``.
        """
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        cfg = self.config.to_dict()
        cfg.setdefault("architectures", ["LlamaForCausalLMEagle3" if self.kind == "eagle3" else "LlamaForCausalLM"])
        with open(root / "config.json", "w") as f:
            json.dump(cfg, f, indent=2)
        sd = self.state_dict()
        keep_emb = (not self.embed_is_external) if include_embeddings is None else include_embeddings
        if not keep_emb:
            sd.pop("embed_tokens.weight", None)
        return ["config.json"] + write_state_dict(sd, root, max_shard_bytes)


def load_draft_head(path, embed_tokens=None, dtype=None, device=None, weight_dtype=None, **kwargs) -> DraftHead:
    """Load an EAGLE-3 or EAGLE-1 head, detecting which from the checkpoint (``weight_dtype="fp8"``: FP8 linear
    layers, see :meth:`DraftHead.from_pretrained`)."""
    return DraftHead.from_pretrained(path, embed_tokens=embed_tokens, dtype=dtype, device=device,
                                     weight_dtype=weight_dtype, **kwargs)
