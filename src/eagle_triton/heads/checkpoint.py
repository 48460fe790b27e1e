"""Reading and writing draft-head checkpoints in the published EAGLE format.

A checkpoint is a directory with ``config.json`` and weights in one of: ``pytorch_model.bin``,
``pytorch_model.bin.index.json`` (+ shards), ``model.safetensors``, ``model.safetensors.index.json`` (+ shards).
The reference tries ``pytorch_model.bin`` first; so do we.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import torch

from ..fileio import apply_default_mode

__all__ = ["read_state_dict", "write_state_dict", "check_state_dict", "CheckpointError"]


class CheckpointError(ValueError):
    """A draft-head checkpoint is missing, malformed, or does not fit the head it is loaded into."""


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"cannot read safetensors file {path}: {e}") from e


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a corrupt pickle/zip
        raise CheckpointError(f"cannot read PyTorch checkpoint {path}: {e}") from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return sd


def _load_sharded(index_path: Path, loader) -> dict[str, torch.Tensor]:
    try:
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"malformed shard index {index_path}: {e}") from e
    sd: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / shard
        if not shard_path.is_file():
            raise CheckpointError(f"shard {shard} named by {index_path.name} is missing from {index_path.parent}")
        part = loader(shard_path)
        for key in part:
            if weight_map.get(key) != shard:
                raise CheckpointError(f"shard {shard} holds key {key!r} that {index_path.name} does not map to it")
        sd.update(part)
    absent = sorted(set(weight_map) - set(sd))
    if absent:
        raise CheckpointError(f"{index_path.name} maps key(s) {absent[:5]} that no shard holds")
    return sd


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load every tensor of a checkpoint directory onto the CPU."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"draft head checkpoint {root} is not a directory")
    candidates = [
        ("pytorch_model.bin", _load_bin, False),
        ("pytorch_model.bin.index.json", _load_bin, True),
        ("model.safetensors", _load_safetensors, False),
        ("model.safetensors.index.json", _load_safetensors, True),
    ]
    for name, loader, sharded in candidates:
        p = root / name
        if p.is_file():
            return _load_sharded(p, loader) if sharded else loader(p)
    raise CheckpointError(
        f"no weights in {root}: expected one of {', '.join(name for name, _, _ in candidates)}"
    )


def write_state_dict(
    state_dict: dict[str, torch.Tensor], path: str | os.PathLike, max_shard_bytes: int | None = None
) -> list[str]:
    """Write ``model.safetensors``, or shards plus ``model.safetensors.index.json`` when larger than
    ``max_shard_bytes``. Returns the file names written."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    meta = {"format": "pt"}
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(tensors, str(root / "model.safetensors"), metadata=meta)
        apply_default_mode(root / "model.safetensors")  # safetensors creates its files 0600
        return ["model.safetensors"]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(tensors):
        nbytes = tensors[k].numel() * tensors[k].element_size()
        if nbytes > max_shard_bytes:
            raise CheckpointError(f"tensor {k!r} ({nbytes} bytes) is larger than max_shard_bytes={max_shard_bytes}")
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = tensors[k]
        size += nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, str(root / name), metadata=meta)
        apply_default_mode(root / name)
        weight_map.update({k: name for k in shard})
    with open(root / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    return names + ["model.safetensors.index.json"]


def check_state_dict(
    loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], optional: set[str], where: str
) -> None:
    """Strict comparison: every expected key present (unless optional), no unexpected key, every shape equal."""
    missing = sorted(k for k in expected if k not in loaded and k not in optional)
    unexpected = sorted(k for k in loaded if k not in expected)
    problems = []
    for k in unexpected:
        close = difflib.get_close_matches(k, list(expected), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unexpected key {k!r} with shape {list(loaded[k].shape)}{hint}")
    for k in missing:
        problems.append(f"missing key {k!r} (expected shape {list(expected[k].shape)})")
    for k in sorted(set(loaded) & set(expected)):
        if tuple(loaded[k].shape) != tuple(expected[k].shape):
            problems.append(
                f"key {k!r} has shape {list(loaded[k].shape)} in the checkpoint but the head expects "
                f"{list(expected[k].shape)}"
            )
    if problems:
        raise CheckpointError(f"checkpoint {where} does not fit the draft head:\n  " + "\n  ".join(problems))
