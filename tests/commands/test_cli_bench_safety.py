"""``eagle-triton bench``: existing results are not overwritten, bad input fails before loading, bench.json's
fields (the command, units). The models are the tiny ones of tests/cli_testlib.py."""

import json

import pytest
from cli_testlib import byte_tokenizer, tiny_head, tiny_target

from eagle_triton.cli import main


@pytest.fixture
def no_loading(monkeypatch):
    import eagle_triton.engine.loading as loading

    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded although the arguments were bad")

    for name in ("load_target", "load_tokenizer", "load_head"):
        monkeypatch.setattr(loading, name, fail)


@pytest.fixture
def tiny_argv(monkeypatch, tmp_path):
    import eagle_triton.engine.loading as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda source, gguf_file=None: byte_tokenizer())
    monkeypatch.setattr(loading, "load_target", lambda source, **kw: tiny_target())
    monkeypatch.setattr(loading, "load_head", lambda source, target, kind=None: tiny_head())
    for name in ("target", "head"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    return ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "head"), "--device", "cpu",
            "--threads", "1", "--no-chat-template", "--total-tokens", "8", "--depth", "2", "--draft-top-k", "3",
            "--prompt", "Name three colours.", "--max-new-tokens", "5", "--num-runs", "1", "--no-plot"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eagle-triton bench: error: "), err
    return err[0]


@pytest.mark.parametrize("name", ["bench.json", "bench.png"])
def test_existing_results_are_not_overwritten(tmp_path, capsys, no_loading, name):
    (tmp_path / name).write_text("last week's numbers")
    assert main(["bench", "--out", str(tmp_path)]) == 2
    assert "--overwrite" in _error_line(capsys)
    assert (tmp_path / name).read_text() == "last week's numbers"


@pytest.mark.parametrize("argv, words", [
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--num-runs", "0"], "--num-runs"),
    (["--temperature", "-1"], "--temperature"),
    (["--prompt", ""], "prompt is empty"),
    (["--prompts-file", "/nonexistent.jsonl"], "--prompts-file"),
    (["--draft", "/nonexistent"], "--draft"),
])
def test_bad_input_fails_fast(tmp_path, capsys, no_loading, argv, words):
    assert main(["bench", "--out", str(tmp_path)] + argv) == 2
    assert words in _error_line(capsys)


def test_bad_prompts_file_line(tmp_path, capsys, no_loading):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    assert main(["bench", "--out", str(tmp_path), "--prompts-file", str(f)]) == 2
    assert "line 2" in _error_line(capsys)


def test_bench_json_fields_and_overwrite(tmp_path, capsys, tiny_argv):
    argv = ["bench", "--out", str(tmp_path)] + tiny_argv
    assert main(argv) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["command"].startswith("eagle-triton bench --out ")
    assert set(result["modes"]) == {"plain", "speculative"} and result["identical_greedy_output"] is True
    phases = result["modes"]["speculative"]["phases_ms_per_token"]
    assert set(phases) == {"prefill_ms", "step_ms"}  # milliseconds say so
    capsys.readouterr()
    assert main(argv) == 2  # the second run does not silently replace the first one's results
    assert main(argv + ["--overwrite"]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary files left
