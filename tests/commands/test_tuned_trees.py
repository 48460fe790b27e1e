"""The shipped head's measured default tree (tuned_trees.json): reading, writing, and the CLI's use of it."""

import argparse
import json

import pytest

from eagle_triton.cli import build_parser, main
from eagle_triton.commands._tuned_trees import (
    TUNED_TREES_FILE,
    WRITER,
    TunedTreesError,
    parse_tree,
    read_tuned_batch_trees,
    read_tuned_trees,
    tuned_batch_trees,
    tuned_tree,
    write_tuned_batch_trees,
    write_tuned_tree,
)
from eagle_triton.commands.generate import DEFAULT_TREES, check_model_args, default_batch_trees, register
from eagle_triton.config import TreeConfig
from eagle_triton.engine import default_model


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A stand-in for the shipped head's folder (the real asset is never written by the tests)."""
    head = tmp_path / "shipped-head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    monkeypatch.setattr(default_model, "DEFAULT_HEAD_DIR", head)
    return head


def _tree(argv):
    args = build_parser().parse_args(["generate", "--device", "cpu", *argv])
    t = check_model_args(args, tree_needed=True)
    return t.total_tokens, t.depth, t.top_k


def test_parse_tree():
    assert parse_tree("60/7/10") == (60, 7, 10)
    for bad in ("60/7", "60/7/x", "a", 60, "60/7/10/1", "-1/2/3"):
        with pytest.raises(ValueError):
            parse_tree(bad)


def test_missing_file_keeps_the_built_in_defaults(shipped):
    assert read_tuned_trees(shipped) == {} and tuned_tree(shipped, "cpu") is None
    assert _tree([]) == DEFAULT_TREES["cpu"]


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not a readable JSON file"),
    ('["60/7/10"]', "expected an object with a 'trees' object"),
    ('{"cuda": "60/7/10"}', "expected an object with a 'trees' object"),
    ('{"trees": {"tpu": "60/7/10"}}', "unknown device kind 'tpu'"),
    ('{"trees": {"cpu": "8/1"}}', "trees.cpu: a tree is 'TOTAL/DEPTH/TOP_K'"),
    ('{"trees": {"cpu": 8}}', "trees.cpu"),
])
def test_malformed_file_is_a_clear_error(shipped, capsys, text, problem):
    (shipped / TUNED_TREES_FILE).write_text(text)
    with pytest.raises(TunedTreesError, match=problem) as e:
        read_tuned_trees(shipped)
    assert str(shipped / TUNED_TREES_FILE) in str(e.value)
    with pytest.raises(TunedTreesError, match=problem):
        _tree([])
    # the CLI stops before loading anything, naming the file and the problem
    assert main(["generate", "--device", "cpu", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "TunedTreesError" in err and TUNED_TREES_FILE in err


def test_cli_default_tree_is_the_measured_one_for_the_shipped_head(shipped, tmp_path):
    write_tuned_tree(shipped, "cpu", "6/2/3", {"source": "test"})
    assert _tree([]) == (6, 2, 3)
    assert _tree(["--target", "smollm2"]) == (6, 2, 3)
    assert _tree(["--draft", str(shipped)]) == (6, 2, 3)
    # explicit options still win, one by one
    assert _tree(["--depth", "4"]) == (6, 4, 3)
    assert _tree(["--total-tokens", "60", "--depth", "7", "--draft-top-k", "10"]) == (60, 7, 10)
    # another head keeps the built-in defaults
    other = tmp_path / "other-head"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert _tree(["--draft", str(other)]) == DEFAULT_TREES["cpu"]
    # a measured CUDA tree does not change the CPU default
    (shipped / TUNED_TREES_FILE).unlink()
    write_tuned_tree(shipped, "cuda", "32/5/6", {"source": "test"})
    assert _tree([]) == DEFAULT_TREES["cpu"]


def test_help_names_the_tuned_tree_file():
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    text = " ".join(sub.choices["generate"].format_help().split())
    assert TUNED_TREES_FILE in text and "60/7/10 (total/depth/top-k) on CUDA" in text


def test_write_merges_device_kinds_and_refuses_foreign_files(shipped):
    write_tuned_tree(shipped, "cuda", "60/7/10", {"tok_s": 1.0})
    write_tuned_tree(shipped, "cpu", "8/1/4", {"tok_s": 2.0})
    write_tuned_tree(shipped, "cuda", "32/5/6", {"tok_s": 3.0})
    doc = json.loads((shipped / TUNED_TREES_FILE).read_text())
    assert doc["written_by"] == WRITER
    assert doc["trees"] == {"cuda": "32/5/6", "cpu": "8/1/4"}
    assert doc["measured"] == {"cuda": {"tok_s": 3.0}, "cpu": {"tok_s": 2.0}}
    assert read_tuned_trees(shipped) == {"cuda": (32, 5, 6), "cpu": (8, 1, 4)}
    with pytest.raises(ValueError):
        write_tuned_tree(shipped, "tpu", "8/1/4", {})
    with pytest.raises(ValueError):
        write_tuned_tree(shipped, "cpu", "8/1", {})
    foreign = '{"trees": {"cpu": "8/1/4"}}'
    (shipped / TUNED_TREES_FILE).write_text(foreign)
    with pytest.raises(TunedTreesError, match="not overwriting"):
        write_tuned_tree(shipped, "cpu", "6/2/3", {})
    assert (shipped / TUNED_TREES_FILE).read_text() == foreign


# -- per-bucket trees (bench/bench_batch.py --write-batch-trees) ------------------------------------------------------
def test_batch_trees_round_trip_and_keep_the_rest(shipped):
    with pytest.raises(TunedTreesError, match="record the head's default tree first"):
        write_tuned_batch_trees(shipped, "cuda", {16: "8/2/3"}, {})
    write_tuned_tree(shipped, "cuda", "16/3/4", {"tok_s": 1.0})
    write_tuned_batch_trees(shipped, "cuda", {16: "8/2/3", 1: "16/3/4"}, {"source": "a"})
    write_tuned_batch_trees(shipped, "cpu", {2: "6/2/2"}, {"source": "b"})
    write_tuned_tree(shipped, "cpu", "8/1/4", {"tok_s": 2.0})  # the default-tree writer keeps the batch trees
    assert read_tuned_batch_trees(shipped) == {"cuda": {1: (16, 3, 4), 16: (8, 2, 3)}, "cpu": {2: (6, 2, 2)}}
    assert tuned_batch_trees(shipped, "cuda") == {1: (16, 3, 4), 16: (8, 2, 3)}
    assert read_tuned_trees(shipped) == {"cuda": (16, 3, 4), "cpu": (8, 1, 4)}
    doc = json.loads((shipped / TUNED_TREES_FILE).read_text())
    assert doc["batch_measured"] == {"cuda": {"source": "a"}, "cpu": {"source": "b"}}
    write_tuned_batch_trees(shipped, "cuda", {8: "8/2/3"}, {"source": "c"})  # a kind's entries are replaced whole
    assert tuned_batch_trees(shipped, "cuda") == {8: (8, 2, 3)}
    with pytest.raises(ValueError, match="3 is not a batch bucket"):
        write_tuned_batch_trees(shipped, "cuda", {3: "8/2/3"}, {})
    with pytest.raises(ValueError, match="32 is not a batch bucket of speculation"):  # a plain-only bucket
        write_tuned_batch_trees(shipped, "cuda", {32: "8/2/3"}, {})
    with pytest.raises(ValueError):
        write_tuned_batch_trees(shipped, "cuda", {4: "8/2"}, {})


@pytest.mark.parametrize("batch_trees, problem", [
    ('[1]', "'batch_trees' must be an object"),
    ('{"tpu": {"4": "8/2/3"}}', "batch_trees: unknown device kind 'tpu'"),
    ('{"cuda": "8/2/3"}', "batch_trees.cuda must be an object"),
    ('{"cuda": {"3": "8/2/3"}}', "'3' is not a batch bucket"),
    ('{"cuda": {"4": "8/2"}}', "batch_trees.cuda.4: a tree is"),
])
def test_malformed_batch_trees_are_a_clear_error(shipped, batch_trees, problem):
    (shipped / TUNED_TREES_FILE).write_text(f'{{"written_by": "{WRITER}", "trees": {{}}, '
                                            f'"batch_trees": {batch_trees}}}')
    with pytest.raises(TunedTreesError, match=problem) as e:
        read_tuned_batch_trees(shipped)
    assert str(shipped / TUNED_TREES_FILE) in str(e.value)


def test_prompts_file_default_trees_per_bucket_for_the_shipped_head(shipped, tmp_path):
    """The shipped head without tree options: its measured tree per bucket; tree options (one tree everywhere),
    another head, or no record: none."""
    def trees(argv):
        return default_batch_trees(build_parser().parse_args(["generate", "--device", "cpu", *argv]))

    assert trees([]) is None  # no file
    write_tuned_tree(shipped, "cpu", "6/2/3", {})
    assert trees([]) is None  # no batch trees recorded
    write_tuned_batch_trees(shipped, "cpu", {4: "4/1/3", 16: "3/1/2"}, {})
    assert trees([]) == {4: TreeConfig(4, 1, 3), 16: TreeConfig(3, 1, 2)}
    assert trees(["--target", "smollm2"]) == trees(["--draft", str(shipped)]) == trees([])
    assert trees(["--depth", "2"]) is None
    other = tmp_path / "other-head"
    other.mkdir()
    assert trees(["--draft", str(other)]) is None
    write_tuned_batch_trees(shipped, "cuda", {4: "8/2/3"}, {})
    assert trees([]) == {4: TreeConfig(4, 1, 3), 16: TreeConfig(3, 1, 2)}  # the CPU's, not CUDA's
