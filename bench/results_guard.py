"""Benchmarks write their results under fixed names in a folder the user picks; they never overwrite a file they did
not write. A JSON result is a benchmark's own when it names the script (its ``command``, ``meta.command`` or
``benchmark``); a PNG is when the JSON beside it (same stem) is. :func:`refuse_foreign` runs before any measuring."""

from __future__ import annotations

import json
from pathlib import Path


def written_by(path: Path, script: str) -> bool:
    """Whether ``path`` is a result file of the benchmark ``script`` (e.g. ``"bench_batch"``)."""
    path = Path(path)
    if path.suffix != ".json":
        path = path.with_suffix(".json")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict):
        return False
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    named = [doc.get("command"), meta.get("command"), doc.get("benchmark")]
    return any(isinstance(n, str) and script in n for n in named)


def refuse_foreign(script: str, *paths) -> None:
    """Stop (SystemExit naming the file) if any of ``paths`` exists and is not ``script``'s own result file."""
    for p in map(Path, paths):
        if p.exists() and not written_by(p, script):
            raise SystemExit(f"{p} exists and was not written by {script}.py: it is left as it is; pass another "
                             "--out (or remove it yourself)")
