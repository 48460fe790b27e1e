"""A cached transformers-format copy of a GGUF model, converted once and checked on every load.

transformers reads a GGUF file three times (config, tokenizer, weights) and parses its metadata slowly (about 18 s
for the 135M default on a 2-core CPU). The copy holds what transformers itself makes of the file: ``config.json``,
``generation_config.json``, ``model.safetensors`` (the dequantised weights, fp32) and the tokenizer files, so the fast
target path and the fast tokenizer load it in about a second, with the same numbers as the GGUF path.

Layout: ``<cache root>/<gguf stem>-<first 16 hex digits of the GGUF's sha256>/`` with a manifest
(:data:`MANIFEST`) listing every file's size, mtime and sha256. A folder is built in a temporary folder beside it and
renamed into place, so a reader never sees a partial copy. A folder that fails its check is rebuilt only when it
carries our marker file (:data:`MARKER`); anything else in the cache root is never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CACHE_ENV", "MANIFEST", "MARKER", "CacheError", "cache_root", "cached_checkpoint_dir", "check_cached_checkpoint",
    "convert_gguf", "ensure_cached_checkpoint", "file_sha256",
]

CACHE_ENV = "EAGLE_TRITON_CACHE"
MANIFEST = "eagle-triton-cache.json"
MARKER = ".eagle-triton-cache"  # written first into a folder we build: proves the folder is ours to rebuild
FORMAT = 1  # bump when the folder's contents change meaning
_KIND = "eagle-triton converted GGUF"
_TMP_PREFIX = ".building-"
# Files up to this size are hashed in full on every load; larger ones (the weights) by size, mtime and the sha256
# of their first and last MiB (the safetensors header sits at the start): a full hash of 540 MB costs ~0.5 s a call.
_FULL_HASH_LIMIT = 64 << 20
_EDGE = 1 << 20


class CacheError(OSError):
    """The cache folder cannot be used or built (not writable, or a folder there that is not ours)."""


def cache_root() -> Path:
    """``$EAGLE_TRITON_CACHE``, else ``$XDG_CACHE_HOME/eagle-triton``, else ``~/.cache/eagle-triton``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "eagle-triton"


def file_sha256(path: str | os.PathLike, limit: int | None = None) -> str:
    """sha256 of a file (of its first ``limit`` bytes and last ``limit`` bytes when ``limit`` is given)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if limit is None:
            while block := f.read(1 << 20):
                h.update(block)
        else:
            h.update(f.read(limit))
            size = os.fstat(f.fileno()).st_size
            f.seek(max(limit, size - limit))
            h.update(f.read(limit))
    return h.hexdigest()


def cached_checkpoint_dir(gguf: str | os.PathLike, root: str | os.PathLike | None = None,
                          digest: str | None = None) -> Path:
    """The cache folder for ``gguf``: named after its stem and content hash (computed when not given)."""
    gguf = Path(gguf)
    digest = digest or file_sha256(gguf)
    return (Path(root) if root is not None else cache_root()) / f"{gguf.stem.lower()}-{digest[:16]}"


def _file_record(path: Path) -> dict:
    st = path.stat()
    rec = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if st.st_size <= _FULL_HASH_LIMIT:
        rec["sha256"] = file_sha256(path)
    else:
        rec["edge_sha256"] = file_sha256(path, _EDGE)
    return rec


def check_cached_checkpoint(folder: str | os.PathLike, source_sha256: str | None = None) -> str | None:
    """``None`` when ``folder`` is a complete, unmodified copy (of the GGUF with that sha256, when given), else the
    reason it is not."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return f"{MANIFEST} is missing"
    except (OSError, ValueError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    if not isinstance(manifest, dict) or manifest.get("kind") != _KIND or manifest.get("format") != FORMAT:
        return f"{MANIFEST} is not a format-{FORMAT} manifest"
    if source_sha256 is not None and manifest.get("source_sha256") != source_sha256:
        return "it was converted from a different GGUF file"
    files = manifest.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        return f"{MANIFEST} lists no files"
    for name, want in files.items():
        path = folder / name
        try:
            st = path.stat()
        except OSError:
            return f"{name} is missing"
        if st.st_size != want.get("size"):
            return f"{name} has {st.st_size} bytes, {want.get('size')} expected"
        if "sha256" in want:
            if file_sha256(path) != want["sha256"]:
                return f"{name} does not match its sha256"
        elif st.st_mtime_ns != want.get("mtime_ns") or file_sha256(path, _EDGE) != want.get("edge_sha256"):
            return f"{name} was modified after it was written"
    return None


def convert_gguf(gguf: str | os.PathLike, out: str | os.PathLike) -> None:
    """Write transformers' reading of ``gguf`` into the folder ``out``: ``config.json``, ``generation_config.json``,
    ``model.safetensors`` (fp32) and the tokenizer files.

    transformers refuses ``save_pretrained`` on a model loaded from a GGUF (it counts as quantised), so the pieces are
    written one by one: the config without its GGUF ``quantization_config`` and the state dict without the tied
    ``lm_head.weight`` (the fast path and transformers both take it from the embedding when tied).
    """
    import copy

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf), Path(out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # fp32 holds the dequantised GGUF values exactly; a later cast to bf16/fp16 rounds them as the GGUF path does.
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer.save_pretrained(str(out))


def _is_ours(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def _remove_ours(folder: Path) -> None:
    """Delete a folder we built (it carries our marker); anything else is left alone."""
    if _is_ours(folder):
        shutil.rmtree(folder, ignore_errors=True)


def _remove_stale_builds(root: Path, max_age_s: float = 3600.0) -> None:
    """Temporary build folders of ours left by interrupted runs (an hour old: a running build is younger)."""
    now = time.time()
    for p in root.glob(_TMP_PREFIX + "*"):
        try:
            if p.is_dir() and now - p.stat().st_mtime > max_age_s:
                _remove_ours(p)
        except OSError:
            pass


def _log(msg: str) -> None:
    print(f"eagle-triton: {msg}", file=sys.stderr)


def ensure_cached_checkpoint(gguf: str | os.PathLike, root: str | os.PathLike | None = None,
                             convert: Callable[[Path, Path], None] = convert_gguf,
                             log: Callable[[str], None] = _log) -> Path:
    """The checked cache folder for ``gguf``, converting it first when it is absent or fails its check.

    ``root``: the cache root (default :func:`cache_root`). ``convert(gguf, folder)`` writes the checkpoint files.
    Raises :class:`CacheError` when the cache cannot be written, or when the folder's name is taken by something
    that is not ours (it is never deleted).
    """
    gguf = Path(gguf)
    root = Path(root) if root is not None else cache_root()
    digest = file_sha256(gguf)
    dest = cached_checkpoint_dir(gguf, root, digest)
    if dest.exists():
        reason = check_cached_checkpoint(dest, digest)
        if reason is None:
            return dest
        if not _is_ours(dest):
            raise CacheError(f"{dest} exists but was not made by eagle-triton ({reason}); it is left alone: "
                             f"move it away or set {CACHE_ENV} to another folder")
        log(f"the cached copy {dest} is damaged ({reason}): converting again")
    else:
        log(f"first use of {gguf.name}: converting it once into {dest} (later runs start in seconds)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{dest.name}-", dir=root))
    except OSError as e:
        raise CacheError(f"cannot write the model cache in {root}: {e}; set {CACHE_ENV} to a writable folder") from e
    try:
        (tmp / MARKER).write_text("built by eagle-triton; safe to delete\n")
        convert(gguf, tmp)
        files = {p.name: _file_record(p) for p in sorted(tmp.iterdir()) if p.is_file() and p.name != MARKER}
        manifest = {"kind": _KIND, "format": FORMAT, "source": str(gguf), "source_sha256": digest,
                    "source_size": gguf.stat().st_size, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "versions": _versions(), "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _apply_umask(tmp)
        _swap_into_place(tmp, dest, digest)
    except BaseException:
        _remove_ours(tmp)
        raise
    return dest


def _apply_umask(folder: Path) -> None:
    """mkdtemp (and some writers) create owner-only modes; give the folder the modes the user's umask asks for."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for p in folder.iterdir():
        os.chmod(p, 0o666 & ~umask)


def _swap_into_place(tmp: Path, dest: Path, digest: str) -> None:
    """Rename the finished build to ``dest``; a damaged ``dest`` of ours is moved aside first, then deleted."""
    old = None
    if dest.exists():
        old = dest.with_name(f"{_TMP_PREFIX}old-{dest.name}-{os.getpid()}")
        os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except OSError:
        # Another process finished the same build first: keep its copy when it checks out.
        if check_cached_checkpoint(dest, digest) is not None:
            raise
        _remove_ours(tmp)
    if old is not None:
        _remove_ours(old)


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in ("transformers", "gguf", "torch", "safetensors", "tokenizers"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out
