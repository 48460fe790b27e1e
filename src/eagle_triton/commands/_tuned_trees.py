"""The measured best draft tree of a draft head, per device kind: ``tuned_trees.json`` in the head's folder.

``bench/bench_engine.py --write-default-tree`` writes it from a measured run (the tree with the highest speculative
tokens/s), and ``eagle-triton generate`` takes its default tree from it for the shipped head. The file::

    {"written_by": "bench/bench_engine.py",
     "trees": {"cuda": "32/5/6", "cpu": "8/1/4"},
     "measured": {"cuda": {"device_name": ..., "date": ..., "dtype": ..., "source": ..., ...}},
     "batch_trees": {"cuda": {"4": "8/2/3", "16": "8/2/3"}},
     "batch_measured": {"cuda": {...}}}

``trees`` maps a device kind to ``total/depth/top_k``; ``measured`` says where each choice comes from. The optional
``batch_trees`` gives, per device kind, the measured best tree of some batch buckets (``bench/bench_batch.py
--write-batch-trees``: continuous batching, where smaller trees pay at larger batches); ``eagle-triton generate
--prompts-file`` uses them for the shipped head unless tree options or ``--batch-trees`` are given. A missing
file means "nothing measured": the caller keeps its built-in defaults. A file that is there but malformed is an
error (:class:`TunedTreesError`), never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DEVICE_KINDS", "TUNED_TREES_FILE", "WRITER", "BATCH_WRITER", "TunedTreesError", "parse_tree",
           "read_tuned_trees", "tuned_tree", "write_tuned_tree", "read_tuned_batch_trees", "tuned_batch_trees",
           "write_tuned_batch_trees"]

TUNED_TREES_FILE = "tuned_trees.json"
DEVICE_KINDS = ("cuda", "cpu")
WRITER = "bench/bench_engine.py"  # the file's writer; a file without this mark is not ours to rewrite
BATCH_WRITER = "bench/bench_batch.py"  # writes the batch_trees entries of a file marked as WRITER's


class TunedTreesError(RuntimeError):
    """A ``tuned_trees.json`` that exists but cannot be used (malformed JSON, unknown keys, a bad tree)."""


def parse_tree(text: str) -> tuple[int, int, int]:
    """``"60/7/10"`` -> ``(60, 7, 10)`` (total tokens incl. the root, depth, top-k), checked by ``TreeConfig``."""
    from ..config import TreeConfig

    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"a tree is 'TOTAL/DEPTH/TOP_K' (e.g. '60/7/10'), got {text!r}")
    tree = tuple(int(p) for p in parts)
    TreeConfig(*tree)  # raises ValueError for a tree the drafter cannot build
    return tree


def read_tuned_trees(head_dir: str | Path) -> dict[str, tuple[int, int, int]]:
    """The measured trees of the head in ``head_dir`` by device kind; ``{}`` when it has no tuned-tree file.

    Raises :class:`TunedTreesError` naming the file and the problem when the file is malformed."""
    path = Path(head_dir) / TUNED_TREES_FILE
    if not path.is_file():
        return {}
    hint = f" (rewrite it with `python {WRITER} --write-default-tree`, or remove it to use the built-in defaults)"
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TunedTreesError(f"{path}: not a readable JSON file: {e}{hint}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("trees"), dict):
        raise TunedTreesError(f"{path}: expected an object with a 'trees' object (device kind -> "
                              f"'TOTAL/DEPTH/TOP_K'){hint}")
    out = {}
    for kind, text in doc["trees"].items():
        if kind not in DEVICE_KINDS:
            raise TunedTreesError(f"{path}: unknown device kind {kind!r} (known: {', '.join(DEVICE_KINDS)}){hint}")
        try:
            out[kind] = parse_tree(text)
        except (TypeError, ValueError) as e:
            raise TunedTreesError(f"{path}: trees.{kind}: {e}{hint}") from e
    return out


def read_tuned_batch_trees(head_dir: str | Path) -> dict[str, dict[int, tuple[int, int, int]]]:
    """The measured per-bucket trees of the head in ``head_dir``: device kind -> {batch bucket: tree}; ``{}`` when
    there are none. Raises :class:`TunedTreesError` naming the file and the problem when they are malformed."""
    from ..engine.batch import not_a_speculative_bucket

    read_tuned_trees(head_dir)  # the file as a whole first
    path = Path(head_dir) / TUNED_TREES_FILE
    if not path.is_file():
        return {}
    hint = f" (rewrite it with `python {BATCH_WRITER} --write-batch-trees`, or remove the 'batch_trees' entry)"
    doc = json.loads(path.read_text()).get("batch_trees", {})
    if not isinstance(doc, dict):
        raise TunedTreesError(f"{path}: 'batch_trees' must be an object (device kind -> {{bucket: tree}}){hint}")
    out = {}
    for kind, trees in doc.items():
        if kind not in DEVICE_KINDS:
            raise TunedTreesError(f"{path}: batch_trees: unknown device kind {kind!r} (known: "
                                  f"{', '.join(DEVICE_KINDS)}){hint}")
        if not isinstance(trees, dict):
            raise TunedTreesError(f"{path}: batch_trees.{kind} must be an object (bucket -> tree){hint}")
        out[kind] = {}
        for bucket, text in trees.items():
            why = not_a_speculative_bucket(int(bucket) if isinstance(bucket, str) and bucket.isdigit() else None)
            if why:
                raise TunedTreesError(f"{path}: batch_trees.{kind}: {bucket!r} {why}{hint}")
            try:
                out[kind][int(bucket)] = parse_tree(text)
            except (TypeError, ValueError) as e:
                raise TunedTreesError(f"{path}: batch_trees.{kind}.{bucket}: {e}{hint}") from e
    return out


def tuned_batch_trees(head_dir: str | Path, device_kind: str) -> dict[int, tuple[int, int, int]]:
    """The measured per-bucket trees of the head in ``head_dir`` for ``device_kind``; ``{}`` when none."""
    return read_tuned_batch_trees(head_dir).get(device_kind, {})


def write_tuned_batch_trees(head_dir: str | Path, device_kind: str, trees: dict[int, str], measured: dict) -> Path:
    """Record ``trees`` (batch bucket -> tree) as the measured best per bucket for ``device_kind``, replacing that
    kind's earlier ones, with ``measured``; everything else in the file is kept. Refuses to touch a file another
    program wrote (and needs the file: the head's default tree is recorded first, by :data:`WRITER`)."""
    from ..engine.batch import not_a_speculative_bucket

    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device kind must be one of {DEVICE_KINDS}, got {device_kind!r}")
    for bucket, tree in trees.items():
        if why := not_a_speculative_bucket(bucket):
            raise ValueError(f"{bucket} {why}")
        parse_tree(tree)
    path = Path(head_dir) / TUNED_TREES_FILE
    if not path.exists():
        raise TunedTreesError(f"{path} does not exist: record the head's default tree first (python {WRITER} "
                              "--write-default-tree)")
    read_tuned_batch_trees(head_dir)  # a malformed file is reported, not replaced
    doc = json.loads(path.read_text())
    if doc.get("written_by") != WRITER:
        raise TunedTreesError(f"{path} was not written by {WRITER} (no 'written_by' mark): not overwriting it")
    doc["batch_trees"] = {**doc.get("batch_trees", {}), device_kind: {str(b): t for b, t in sorted(trees.items())}}
    doc["batch_measured"] = {**doc.get("batch_measured", {}), device_kind: measured}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def tuned_tree(head_dir: str | Path, device_kind: str) -> tuple[int, int, int] | None:
    """The measured tree of the head in ``head_dir`` for ``device_kind`` (``"cuda"``/``"cpu"``), or ``None``."""
    return read_tuned_trees(head_dir).get(device_kind)


def write_tuned_tree(head_dir: str | Path, device_kind: str, tree: str, measured: dict) -> Path:
    """Record ``tree`` as the measured best for ``device_kind``, with ``measured`` (where it comes from); the other
    device kinds' entries are kept. Refuses to touch a file another program wrote."""
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device kind must be one of {DEVICE_KINDS}, got {device_kind!r}")
    parse_tree(tree)
    path = Path(head_dir) / TUNED_TREES_FILE
    doc = {"written_by": WRITER, "trees": {}, "measured": {}}
    if path.exists():
        read_tuned_trees(head_dir)  # a malformed file is reported, not replaced
        old = json.loads(path.read_text())
        if old.get("written_by") != WRITER:
            raise TunedTreesError(f"{path} was not written by {WRITER} (no 'written_by' mark): not overwriting it")
        doc.update(old)
    doc["trees"] = {**doc.get("trees", {}), device_kind: tree}
    doc["measured"] = {**doc.get("measured", {}), device_kind: measured}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
