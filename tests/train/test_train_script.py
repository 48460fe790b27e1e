"""scripts/train_smollm2.sh's export stage writes only into a folder of its own: a user's folder given as OUT is
refused untouched, a new one is written and marked, and a later export into it is allowed."""

import os
import subprocess
import sys
from pathlib import Path

from eagle_triton import fileio

ROOT = Path(__file__).resolve().parents[2]


def _export(work: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORK=str(work), OUT=str(out), NO_DATA_EXPORT="1", TARGET="unused.gguf")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]  # its python3 is this one
    return subprocess.run(["bash", "scripts/train_smollm2.sh", "export"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_export_writes_only_into_its_own_folder(tmp_path):
    work = tmp_path / "work"
    (work / "run" / "head").mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("model.safetensors", os.urandom(64)), ("train_meta.json", b"{}")):
        (work / "run" / "head" / name).write_bytes(data)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    r = _export(work, mine)
    assert r.returncode == 2 and "OUT" in r.stderr and "notes.txt" in r.stderr, r.stdout + r.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep"

    out = tmp_path / "export"
    for _ in range(2):  # a new folder, then the folder of an earlier export
        r = _export(work, out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert fileio.owner_kind(out) == "train-export" and fileio.owner_kind(out / "head") == "draft-head"
        for name in ("config.json", "model.safetensors", "train_meta.json"):
            assert (out / "head" / name).read_bytes() == (work / "run" / "head" / name).read_bytes()
        assert (out / "train_log.txt").is_file()
