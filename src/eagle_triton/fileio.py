"""Safe writing of user-visible files: nothing is deleted or overwritten that we did not write.

* :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_write_json` write to a temporary name in
  the same folder and ``os.replace`` it into place, so an interrupted write leaves the old file intact.
* Files get the permissions of a plain ``open(..., "w")`` (``0o666`` less the umask, so 0644 under the usual 022):
  temporary files from :mod:`tempfile` (and safetensors' ``save_file``, which writes through one) are created
  0600, which is why trained heads used to be unreadable to other users.
* Folders we create carry an ownership marker (:data:`MARKER`, listing the files we wrote in them), so a later
  run can tell its own output from a user's folder: :func:`check_output_dir` refuses a non-empty folder that is
  not ours unless the caller passes ``overwrite``, and :func:`publish_dir` replaces only the files we own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "MARKER",
    "UnsafeOutputError",
    "apply_default_mode",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_output_dir",
    "foreign_files",
    "is_inside",
    "mark_owned",
    "owned_files",
    "owner_kind",
    "publish_dir",
    "read_marker",
]

MARKER = ".eagle-triton.json"


class UnsafeOutputError(ValueError):
    """Writing where asked would delete or overwrite files that eagle-triton did not write."""


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def apply_default_mode(path: str | os.PathLike) -> None:
    """Give ``path`` (a file, or a folder and everything in it) the mode a plain ``open``/``mkdir`` would."""
    mask = _umask()
    p = Path(path)
    if p.is_dir():
        os.chmod(p, 0o777 & ~mask)
        for sub in p.rglob("*"):
            os.chmod(sub, (0o777 if sub.is_dir() else 0o666) & ~mask)
    else:
        os.chmod(p, 0o666 & ~mask)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, renamed into place."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, p)
    except BaseException:  # also on KeyboardInterrupt: never leave the temporary file behind
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


# -- ownership of folders ----------------------------------------------------------------------------------------
def read_marker(folder: str | os.PathLike) -> dict | None:
    """The ownership marker of ``folder`` (``kind``, ``files`` and what else its writer recorded), or ``None``."""
    return _read_marker(Path(folder))


def _read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def owner_kind(folder: str | os.PathLike) -> str | None:
    """The kind recorded in ``folder``'s ownership marker (e.g. ``"draft-head"``), or ``None`` when it has none."""
    m = _read_marker(Path(folder))
    return m.get("kind") if m else None


def owned_files(folder: str | os.PathLike) -> set[str]:
    """Names of the files the marker says we wrote in ``folder`` (empty without a marker)."""
    m = _read_marker(Path(folder))
    return set(m.get("files", [])) if m else set()


def mark_owned(folder: str | os.PathLike, kind: str, files: list[str] | None = None, **extra) -> None:
    """Record that ``folder`` is an eagle-triton output of ``kind``, which of its files we wrote, and ``extra``
    JSON fields."""
    atomic_write_json(Path(folder) / MARKER, {"kind": kind, "files": sorted(files or []), **extra})


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """Entries of ``folder`` we did not write (not in its marker). A missing folder has none."""
    p = Path(folder)
    if not p.is_dir():
        return []
    ours = owned_files(p) | {MARKER}
    return sorted(x.name for x in p.iterdir() if x.name not in ours)


def is_inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (both resolved, symlinks followed)."""
    a, b = Path(path).resolve(), Path(folder).resolve()
    return a == b or b in a.parents


def check_output_dir(folder: str | os.PathLike, kind: str, overwrite: bool, option: str = "--out") -> None:
    """Refuse to write a ``kind`` output into ``folder`` when that could clobber what a user owns.

    Allowed: a missing or empty folder, or one holding only our own output of the same kind. A folder with
    other files is refused unless ``overwrite`` (then only the files we write are replaced; the rest are kept).
    A path that is a file is always refused.
    """
    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise UnsafeOutputError(f"{option} {folder} is a file, not a folder: name a new folder")
    if not p.is_dir():
        return
    foreign = foreign_files(p)
    theirs = owner_kind(p)
    if theirs is not None and theirs != kind and not overwrite:
        raise UnsafeOutputError(f"{option} {folder} holds an eagle-triton {theirs}, not a {kind}: choose another "
                                "folder (or pass --overwrite)")
    if foreign and not overwrite:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise UnsafeOutputError(f"{option} {folder} is not empty and was not written by eagle-triton (it holds "
                                f"{shown}): choose a new or empty folder, or pass --overwrite to write into it "
                                "(files of the same name are replaced, others are kept)")


def publish_dir(src: str | os.PathLike, dest: str | os.PathLike, kind: str) -> list[str]:
    """Copy the files of folder ``src`` into ``dest`` as a ``kind`` output, atomically where it can be.

    The copy is built in a temporary folder beside ``dest`` (same file system), with default permissions and an
    ownership marker. When ``dest`` is missing or holds only our files, the two folders are swapped by rename;
    otherwise (a folder the caller was allowed to write into, see :func:`check_output_dir`) each file is
    ``os.replace``-d into ``dest`` and only files of ours that the new output lacks are removed: other files are
    never touched. Returns the names written.
    """
    src, dest = Path(src), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        names = sorted(f.name for f in src.iterdir() if f.is_file() and f.name != MARKER)
        for name in names:
            shutil.copyfile(src / name, tmp / name)
        mark_owned(tmp, kind, names)
        apply_default_mode(tmp)
        if not dest.exists():
            os.replace(tmp, dest)
            return names
        previous = owned_files(dest)
        if not foreign_files(dest):  # all ours: swap the folders, then drop the old one
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
            os.replace(dest, old / "d")
            os.replace(tmp, dest)
            shutil.rmtree(old)
            return names
        for name in names + [MARKER]:
            os.replace(tmp / name, dest / name)
        for stale in previous - set(names):
            (dest / stale).unlink(missing_ok=True)
        tmp.rmdir()
        return names
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
