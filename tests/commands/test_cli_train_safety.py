"""``eagle-triton train`` never deletes or overwrites what it did not write (``--out``, ``--work-dir``).

The pipeline itself (target, data, training) is replaced by fakes: these tests are about the folders."""

import json
import os
import types
from pathlib import Path

import pytest

from eagle_triton import fileio
from eagle_triton.cli import main
from eagle_triton.testing import random_eagle3_head

ARGS = ["--num-prompts", "2", "--max-steps", "1", "--no-progress", "--device", "cpu"]


@pytest.fixture
def fake_pipeline(monkeypatch):
    """Fakes of the target loader, data generation and training; ``calls`` records what ran."""
    import eagle_triton.train as train_pkg

    calls = []

    def load_target(target, dtype=None, device=None):
        calls.append("load_target")
        return types.SimpleNamespace(config=types.SimpleNamespace()), None

    def generate_dataset(model, tok, cfg, data_dir, time_budget_s=None, progress=True):
        calls.append("generate_dataset")
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        return {"complete": True}

    def train_eagle3(target, tok, samples, cfg, out_dir, device=None, init_head=None, progress=True):
        calls.append("train_eagle3")
        head = random_eagle3_head(seed=0)
        head.save_pretrained(Path(out_dir) / "head")
        fileio.atomic_write_json(Path(out_dir) / "head" / "train_meta.json", {"step": 1})
        return head, {"step": 1, "complete": True, "train_seconds": 0.0, "validation": []}

    monkeypatch.setattr(train_pkg, "load_target", load_target)
    monkeypatch.setattr(train_pkg, "generate_dataset", generate_dataset)
    monkeypatch.setattr(train_pkg, "load_dataset", lambda d: [])
    monkeypatch.setattr(train_pkg, "train_eagle3", train_eagle3)
    return calls


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eagle-triton train: error: "), err
    assert "Traceback" not in err[0]
    return err[0]


def test_out_dot_is_refused_and_nothing_is_touched(tmp_path, monkeypatch, capsys, fake_pipeline):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "thesis.tex").write_text("years of work")
    before = _tree(tmp_path)
    assert main(["train", "--out", ".", "--work-dir", "work"] + ARGS) == 2
    assert "current folder" in _one_error_line(capsys)
    assert _tree(tmp_path) == before and not (tmp_path / "work").exists()
    assert fake_pipeline == []  # refused before loading anything
    assert main(["train", "--out", "..", "--work-dir", "work"] + ARGS) == 2  # a folder around the current one


def test_out_with_foreign_files_is_refused_then_overwrite_keeps_them(tmp_path, capsys, fake_pipeline):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["train", "--out", str(out), "--work-dir", str(tmp_path / "w")] + ARGS
    assert main(argv) == 2
    assert "--overwrite" in _one_error_line(capsys)
    assert _tree(out) == {"notes.txt": b"mine"} and fake_pipeline == []
    assert main(argv + ["--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_out_written_by_us_is_replaced_on_rerun(tmp_path, fake_pipeline):
    old = os.umask(0o022)
    try:
        argv = ["train", "--out", str(tmp_path / "head"), "--work-dir", str(tmp_path / "w")] + ARGS
        assert main(argv) == 0
        assert main(argv) == 0  # the same command again: our own head folder, no --overwrite needed
    finally:
        os.umask(old)
    head = tmp_path / "head"
    assert fileio.owner_kind(head) == "draft-head"
    for f in head.iterdir():  # safetensors writes 0600; the published head is readable like any file
        assert os.stat(f).st_mode & 0o777 == 0o644, f
    assert os.stat(head).st_mode & 0o777 == 0o755
    assert json.loads((head / "train_meta.json").read_text())["step"] == 1


@pytest.mark.parametrize("where", ["equal", "inside", "around"])
def test_out_overlapping_the_work_dir_is_refused(tmp_path, capsys, fake_pipeline, where):
    work = tmp_path / "w"
    out = {"equal": work, "inside": work / "head", "around": tmp_path}[where]
    if where == "around":
        work = tmp_path / "sub" / "w"
    assert main(["train", "--out", str(out), "--work-dir", str(work)] + ARGS) == 2
    assert "overlap" in _one_error_line(capsys)
    assert fake_pipeline == []


def test_work_dir_with_foreign_files_is_refused(tmp_path, capsys, fake_pipeline):
    work = tmp_path / "photos"
    work.mkdir()
    (work / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main(["train", "--work-dir", str(work)] + ARGS) == 2
    assert "not a train work folder" in _one_error_line(capsys)
    assert _tree(work) == {"cat.jpg": b"\xff\xd8"} and fake_pipeline == []
    assert main(["train", "--work-dir", str(work), "--overwrite"] + ARGS) == 0  # explicit: used, files kept
    assert (work / "cat.jpg").read_bytes() == b"\xff\xd8"


def test_work_dir_of_an_earlier_train_is_accepted(tmp_path, fake_pipeline):
    work = tmp_path / "w"
    (work / "data").mkdir(parents=True)
    (work / "data" / "manifest.json").write_text("{}")  # the layout of a work folder from before the marker
    assert main(["train", "--work-dir", str(work)] + ARGS) == 0
    assert fileio.owner_kind(work) == "train-work-dir"


def test_work_dir_started_with_other_settings_is_one_line(tmp_path, capsys, monkeypatch, fake_pipeline):
    import eagle_triton.train as train_pkg
    from eagle_triton.train.data import generate_dataset

    monkeypatch.setattr(train_pkg, "generate_dataset", generate_dataset)  # the real one: it checks the manifest
    work = tmp_path / "w"
    (work / "data").mkdir(parents=True)
    (work / "data" / "manifest.json").write_text(json.dumps({"config": {"num_prompts": 7}}))
    assert main(["train", "--work-dir", str(work)] + ARGS) == 2
    line = _one_error_line(capsys)
    assert "other data settings" in line and "num_prompts 7 -> 2" in line


def test_export_data_over_an_existing_file_is_refused(tmp_path, capsys, fake_pipeline):
    f = tmp_path / "pack.pt"
    f.write_text("keep")
    assert main(["train", "--work-dir", str(tmp_path / "w"), "--export-data", str(f)] + ARGS) == 2
    assert "--export-data" in _one_error_line(capsys) and f.read_text() == "keep"


def test_help_describes_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 12288)" in out and "(default: eagle_train_work)" in out and "(default: 0.0005)" in out
    assert "(default: None)" not in out and "(default: False)" not in out and "(default: 0.0,0.7)" in out
    import argparse

    from eagle_triton.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    train = sub.choices["train"]
    undocumented = [a.option_strings for a in train._actions if not a.help]
    assert undocumented == []
    fmt = train._get_formatter()
    no_default = [a.option_strings for a in train._actions
                  if a.nargs != 0 and "default" not in fmt._get_help_string(a)]  # flags (nargs 0) have none
    assert no_default == []


@pytest.mark.parametrize("argv", [["--num-prompts", "0"], ["--response-temperatures", "a,b"],
                                  ["--target", "/nonexistent/model.gguf"], ["--init-head", "/nonexistent"]])
def test_bad_arguments_fail_before_loading(tmp_path, capsys, fake_pipeline, argv):
    try:
        rc = main(["train", "--work-dir", str(tmp_path / "w")] + ARGS + argv)
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    assert rc == 2 and fake_pipeline == []
    assert not (tmp_path / "w").exists()


def test_ctrl_c_is_one_line_exit_130(tmp_path, capsys, monkeypatch, fake_pipeline):
    import eagle_triton.train as train_pkg

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_pkg, "train_eagle3", interrupted)
    assert main(["train", "--work-dir", str(tmp_path / "w")] + ARGS) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["eagle-triton train: interrupted (Ctrl-C)"]


def test_grow_draft_vocab_without_an_init_head_is_refused(tmp_path, capsys, fake_pipeline):
    argv = ["train", "--work-dir", str(tmp_path / "w"), "--grow-draft-vocab", "16384"] + ARGS
    assert main(argv) == 2
    assert "--grow-draft-vocab needs --init-head" in _one_error_line(capsys)
    assert fake_pipeline == [] and not (tmp_path / "w").exists()
