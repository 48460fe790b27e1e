"""``eagle_triton.fileio``: atomic writes, default permissions, ownership markers, publishing into folders."""

import os
from pathlib import Path

import pytest

from eagle_triton import fileio
from eagle_triton.fileio import UnsafeOutputError, check_output_dir, publish_dir


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p) -> int:
    return os.stat(p).st_mode & 0o777


def test_atomic_write_replaces_with_default_mode(tmp_path, umask022):
    p = tmp_path / "out.json"
    fileio.atomic_write_json(p, {"a": 1})
    assert p.read_text() == '{\n  "a": 1\n}\n' and _mode(p) == 0o644
    fileio.atomic_write_text(p, "new")
    assert p.read_text() == "new" and _mode(p) == 0o644
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]


def test_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "bench.json"
    p.write_text("old results")

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fileio.atomic_write_text(p, "half-written new results")
    assert p.read_text() == "old results"
    assert [x.name for x in tmp_path.iterdir()] == ["bench.json"]  # no temporary file left behind


def test_default_mode_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        fileio.atomic_write_bytes(tmp_path / "f", b"x")
        d = tmp_path / "d"
        d.mkdir(mode=0o700)
        (d / "g").write_bytes(b"y")
        os.chmod(d / "g", 0o600)
        fileio.apply_default_mode(d)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == 0o640 and _mode(d) == 0o750 and _mode(d / "g") == 0o640


def _head_files(folder: Path, tag: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_text(f"{tag} {name}")
    return folder


def test_publish_into_new_then_own_folder(tmp_path, umask022):
    dest = tmp_path / "head"
    publish_dir(_head_files(tmp_path / "a", "v1"), dest, "draft-head")
    assert (dest / "config.json").read_text() == "v1 config.json" and _mode(dest / "model.safetensors") == 0o644
    assert fileio.owner_kind(dest) == "draft-head" and fileio.foreign_files(dest) == []
    check_output_dir(dest, "draft-head", overwrite=False)  # our own head: replacing it needs no --overwrite
    src2 = _head_files(tmp_path / "b", "v2")
    (src2 / "model.safetensors").unlink()
    (src2 / "model-00001-of-00001.safetensors").write_text("v2 shard")
    publish_dir(src2, dest, "draft-head")
    assert sorted(x.name for x in dest.iterdir()) == [fileio.MARKER, "config.json", "model-00001-of-00001.safetensors"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a", "b", "head"]  # no temporary folders left


def test_foreign_folder_is_refused_and_overwrite_keeps_foreign_files(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("my notes")
    (dest / "config.json").write_text("my config")
    with pytest.raises(UnsafeOutputError, match="not empty and was not written by eagle-triton"):
        check_output_dir(dest, "draft-head", overwrite=False)
    check_output_dir(dest, "draft-head", overwrite=True)
    publish_dir(_head_files(tmp_path / "a", "v1"), dest, "draft-head")
    assert (dest / "notes.txt").read_text() == "my notes"  # kept
    assert (dest / "config.json").read_text() == "v1 config.json"  # the same name: replaced, as --overwrite says
    # still refused without --overwrite: notes.txt is not ours
    with pytest.raises(UnsafeOutputError):
        check_output_dir(dest, "draft-head", overwrite=False)
    src2 = tmp_path / "b"
    src2.mkdir()
    (src2 / "config.json").write_text("v2")
    publish_dir(src2, dest, "draft-head")  # our stale model.safetensors goes, notes.txt stays
    assert sorted(x.name for x in dest.iterdir()) == [fileio.MARKER, "config.json", "notes.txt"]


def test_file_and_other_kind_are_refused(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UnsafeOutputError, match="is a file"):
        check_output_dir(f, "draft-head", overwrite=True)
    d = tmp_path / "d"
    d.mkdir()
    fileio.mark_owned(d, "train-work-dir")
    with pytest.raises(UnsafeOutputError, match="train-work-dir"):
        check_output_dir(d, "draft-head", overwrite=False)


def test_is_inside(tmp_path):
    assert fileio.is_inside(tmp_path / "a" / "b", tmp_path / "a")
    assert fileio.is_inside(tmp_path, tmp_path)
    assert not fileio.is_inside(tmp_path / "a", tmp_path / "a" / "b")
    assert not fileio.is_inside(tmp_path / "ab", tmp_path / "a")
