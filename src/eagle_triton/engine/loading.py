"""Loading targets, tokenizers and draft heads from paths, with clear errors for missing or corrupt files."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..heads import CheckpointError, DraftHead, Eagle1DraftHead, Eagle3DraftHead, load_draft_head
from .hf_target import HFTarget
from .target import SUPPORTED_MODEL_TYPES, LlamaTarget, TargetModel

__all__ = ["ModelLoadError", "load_target", "load_tokenizer", "load_head", "resolve_dtype", "resolve_device"]


class ModelLoadError(ValueError):
    """A target model or tokenizer cannot be found or read."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(names)}")
    return names[dtype]


def _split_source(source: str | os.PathLike, gguf_file: str | None) -> tuple[str, str | None, bool]:
    """``(directory or hub id, gguf file name, is_local)``."""
    p = Path(source)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelLoadError(f"GGUF file {p} does not exist")
        return str(p.parent), p.name, True
    if p.is_dir():
        if gguf_file is None and not (p / "config.json").is_file():
            ggufs = sorted(x.name for x in p.glob("*.gguf"))
            if len(ggufs) == 1:
                return str(p), ggufs[0], True
            raise ModelLoadError(f"{p} has no config.json (not a transformers model directory)"
                                 + (f"; it holds GGUF files {ggufs}: pass one of them" if ggufs else ""))
        return str(p), gguf_file, True
    if p.exists():
        raise ModelLoadError(f"{p} is neither a model directory nor a .gguf file")
    s = str(source)
    if s.startswith((".", "/", "~")) or s.count("/") > 1 or s.endswith((".json", ".safetensors", ".bin")):
        raise ModelLoadError(f"target model path {source} does not exist")
    return str(source), gguf_file, False  # a Hugging Face hub id


# tokenizer_config.json classes that AutoTokenizer maps to transformers' plain fast tokenizer (``TokenizersBackend``
# in transformers 5, ``PreTrainedTokenizerFast`` before): loading that class directly skips ~1 s of AutoTokenizer's
# imports (its processor and model-code modules), with the same tokenizer as a result.
_PLAIN_FAST_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _plain_fast_tokenizer(where: str) -> bool:
    import json

    root = Path(where)
    if not (root / "tokenizer.json").is_file():
        return False
    try:
        cfg = json.loads((root / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and cfg.get("tokenizer_class") in _PLAIN_FAST_TOKENIZERS


def load_tokenizer(source: str | os.PathLike, gguf_file: str | None = None):
    where, gguf, local = _split_source(source, gguf_file)
    try:
        if local and gguf is None and _plain_fast_tokenizer(where):
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(where)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(where, **({"gguf_file": gguf} if gguf else {}))
    except Exception as e:  # transformers raises many types for missing/corrupt tokenizer files
        raise ModelLoadError(f"cannot load a tokenizer from {source}: {type(e).__name__}: {e}") from e


def load_target(
    source,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    impl: str = "auto",
    gguf_file: str | None = None,
    **target_kwargs,
) -> TargetModel:
    """Build a target runner from a path (transformers directory, safetensors checkpoint, ``.gguf`` file), a hub
    id, a transformers model, or return a :class:`TargetModel` as is.

    ``impl``: ``"fast"`` (:class:`LlamaTarget`; Llama/Mistral/Qwen2/Qwen3 only), ``"generic"`` (:class:`HFTarget`)
    or ``"auto"`` (fast when the model type is supported).
    """
    if impl not in ("auto", "fast", "generic"):
        raise ValueError(f"target impl must be 'auto', 'fast' or 'generic', got {impl!r}")
    if isinstance(source, TargetModel):
        return source
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if isinstance(source, torch.nn.Module):
        return _wrap_model(source, impl, dev, dt, **target_kwargs)
    where, gguf, local = _split_source(source, gguf_file)
    root = Path(where)
    if local and gguf is None and impl != "generic" and (root / "config.json").is_file() and (
            (root / "model.safetensors").is_file() or (root / "model.safetensors.index.json").is_file()):
        model_type = _model_type(root)
        if model_type in SUPPORTED_MODEL_TYPES:
            try:
                return LlamaTarget.from_pretrained(root, device=dev, dtype=dt, **target_kwargs)
            except (OSError, KeyError, ValueError, RuntimeError) as e:
                raise ModelLoadError(f"cannot load target checkpoint {root}: {type(e).__name__}: {e}") from e
        if impl == "fast":
            raise ModelLoadError(f"{root}: model type {model_type!r} is not supported by the fast path "
                                 f"({', '.join(SUPPORTED_MODEL_TYPES)}); use impl='generic'")
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dt, **({"gguf_file": gguf} if gguf else {}))
    except Exception as e:
        raise ModelLoadError(f"cannot load target model from {source}: {type(e).__name__}: {e}") from e
    return _wrap_model(model.to(dev), impl, dev, dt, **target_kwargs)


def _model_type(root: Path) -> str | None:
    import json

    try:
        return json.loads((root / "config.json").read_text()).get("model_type")
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{root / 'config.json'} is not valid JSON: {e}") from e


def _wrap_model(model, impl, dev, dt, **target_kwargs) -> TargetModel:
    model_type = getattr(model.config, "model_type", None)
    if impl == "generic" or (impl == "auto" and model_type not in SUPPORTED_MODEL_TYPES):
        return HFTarget(model.to(device=dev, dtype=dt))
    return LlamaTarget.from_hf(model, device=dev, dtype=dt, **target_kwargs)


def load_head(source, target: TargetModel, kind: str | None = None) -> DraftHead:
    """Load a draft head for ``target`` from a checkpoint directory (or check a given head).

    ``kind`` (``"eagle3"``/``"eagle1"``) demands that kind; a checkpoint of the other kind is an error.
    The head takes the target's input embedding when its checkpoint has none, and is moved to the target's
    device and dtype.
    """
    if kind not in (None, "eagle3", "eagle1"):
        raise ValueError(f"draft kind must be 'eagle3' or 'eagle1', got {kind!r}")
    if isinstance(source, DraftHead):
        head = source
    else:
        path = Path(source)
        if not path.exists():
            raise CheckpointError(f"draft head path {path} does not exist")
        cls = {"eagle3": Eagle3DraftHead, "eagle1": Eagle1DraftHead}.get(kind)
        emb = target.input_embeddings()
        try:
            if cls is None:
                head = load_draft_head(path, embed_tokens=emb.detach().cpu())
            else:
                head = cls.from_pretrained(path, embed_tokens=emb.detach().cpu())
        except ValueError as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"draft head {path} does not fit the target: {e}") from e
    if kind is not None and head.kind != kind:
        raise ValueError(f"an {_pretty(head.kind)} draft head was given where an {_pretty(kind)} head is expected")
    return head.to(device=target.device, dtype=target.dtype).eval()


def _pretty(kind: str) -> str:
    return {"eagle3": "EAGLE-3", "eagle1": "EAGLE-1"}.get(kind, kind)
