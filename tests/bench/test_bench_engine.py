"""bench/bench_engine.py on a tiny CPU model (the JSON it writes), bench/engine_table.py (the README tables from that
JSON), the headline entries make_headline.py builds from the same cells, and --write-default-tree."""

import json
import re
import shutil
from pathlib import Path

import bench_engine
import engine_table
import make_headline
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny random Llama saved with a byte-level tokenizer, and a random EAGLE-3 head for it."""
    from cli_testlib import byte_tokenizer, tiny_head
    from engine_testlib import tiny_llama

    root = tmp_path_factory.mktemp("models")
    tiny_llama(vocab=257, hidden=32, layers=4, heads=4, kv_heads=2).save_pretrained(root / "target")
    byte_tokenizer().save_pretrained(root / "target")
    tiny_head().save_pretrained(root / "head")
    return root


def _run(models, out, *extra):
    argv = ["--target", str(models / "target"), "--draft", str(models / "head"), "--num-prompts", "2",
            "--max-new-tokens", "6", "--trees", "8/2/3,6/1/4", "--device", "cpu", "--max-length", "512",
            "--out", str(out), *extra]
    assert bench_engine.main(argv) == 0
    return json.loads((out / "bench_engine.json").read_text())


@pytest.fixture(scope="module")
def run(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return _run(models, out, "--parts", "a,b,c"), out


def test_json_schema(run):
    doc, out = run
    assert doc["benchmark"] == "bench_engine" and doc["schema"] == bench_engine.SCHEMA and doc["device"] == "cpu"
    assert {"torch", "triton", "transformers", "device_name", "git_commit", "git_dirty"} <= set(doc["versions"])
    assert "--parts a,b,c" in doc["command"] and doc["date"]
    assert set(doc["parts"]) == {"smollm2", "hf_generate"}  # no CUDA: the 8B part is skipped
    a = doc["parts"]["smollm2"]
    assert a["trees"] == ["8/2/3", "6/1/4"] and a["best_tree_dtype"] == "float32"
    (r,) = a["runs"]
    assert r["dtype"] == "float32" and r["prompts_measured"] == 2 == len(r["prompts"])
    assert r["plain"]["prompts"] == 2 and r["plain"]["mean_accepted_length"] == 1.0
    for key in ("tokens_per_second", "step_ms", "prefill_ms"):
        assert r["plain"][key] > 0
    assert [t["tree"] for t in r["trees"]] == a["trees"]
    for t in r["trees"]:
        assert t["prompts"] == 2 and t["tokens"] == r["plain"]["tokens"]
        assert t["identical_prompts"] == 2  # fp32 greedy speculation is lossless
        assert t["speculative_tokens_per_second"] > 0 and t["step_ms"] > 0 and t["prefill_ms"] > 0
        assert t["mean_accepted_length"] >= 1
        assert t["speedup"] == pytest.approx(t["speculative_tokens_per_second"] / r["plain"]["tokens_per_second"])
    best = max(r["trees"], key=lambda t: t["speculative_tokens_per_second"])["tree"]
    assert r["best_tree"] == a["best_tree"] == best
    c = doc["parts"]["hf_generate"]
    assert c["dtype"] == "float32" and c["prompts_measured"] == 2 and c["tokens_per_second"] > 0
    assert "cache_implementation" in c["cache"]
    assert (out / "bench_engine.png").stat().st_size > 1000


def test_time_budget_skips_instead_of_running_long(models, tmp_path):
    doc = _run(models, tmp_path, "--parts", "a", "--budget-smollm2", "0.001")
    (r,) = doc["parts"]["smollm2"]["runs"]
    assert r == {"dtype": "float32", "skipped": "time budget"} and "best_tree" not in doc["parts"]["smollm2"]
    assert "not measured" in engine_table.render(doc)


def test_update_keeps_the_other_parts(models, run, tmp_path):
    shutil.copy(run[1] / "bench_engine.json", tmp_path / "bench_engine.json")
    doc = _run(models, tmp_path, "--parts", "a", "--budget-smollm2", "0.001", "--update")
    assert doc["parts"]["hf_generate"] == run[0]["parts"]["hf_generate"]
    (tmp_path / "bench_engine.json").write_text('{"benchmark": "other"}')
    with pytest.raises(SystemExit):
        _run(models, tmp_path, "--parts", "a", "--update")
    assert (tmp_path / "bench_engine.json").read_text() == '{"benchmark": "other"}'


@pytest.mark.parametrize("argv", [["--parts", "x"], ["--trees", "8/2"], ["--trees-8b", "60/7/10,60/7/10"],
                                  ["--tune-from", "x.json"]])
def test_bad_options(argv):
    with pytest.raises(SystemExit) as e:
        bench_engine.main(argv)
    assert e.value.code == 2


def _cell(text: str, key: list[str], column: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    tables, cur = [], None
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set(line) <= set("|-"):
            continue
        if cur is None or (cells[0] in ("dtype", "step")):
            cur = (cells, [])
            tables.append(cur)
        else:
            cur[1].append(cells)
    hits = [row[header.index(column)] for header, rows in tables if column in header for row in rows
            if row[:len(key)] == key]
    assert len(hits) == 1, (key, column, hits)
    return hits[0]


def _check_printed(doc: dict) -> list[dict]:
    """Every figure is printed where its ``readme`` says, at its precision, and resolves in the JSON."""
    text = engine_table.render(doc)
    figs = engine_table.figures(doc)
    for f in figs:
        value = engine_table.resolve(doc, f["path"])
        for where in f["readme"]:
            field = where.get("field", "value")
            ref = value if field == "value" else engine_table.resolve(doc, f["ref_path"])
            stored = value / ref if field == "ratio" else ref
            if "text" in where:
                assert where["text"] in text and where["printed"] in where["text"]
                assert where["printed"] == (stored if isinstance(stored, str) else f"{stored:.{f['decimals']}f}")
                continue
            cell = _cell(text, where["row"], where["column"])
            decimals = 2 if field == "ratio" else f["decimals"]
            assert re.sub(r"x$", "", cell) == f"{stored:.{decimals}f}", (f["name"], cell, stored)
    names = [f["name"] for f in figs]
    assert len(names) == len(set(names))
    return figs


def test_smollm2_table_and_figures(run):
    doc = run[0]
    text = engine_table.render(doc)
    assert text.splitlines()[0] == "| " + " | ".join(engine_table.SMOLLM2_HEADER) + " |"
    best = doc["parts"]["smollm2"]["best_tree"]
    assert f"| fp32 | {best} (best) |" in text and "| fp32 | plain |" in text
    assert f"| fp32 | {engine_table.HF_ROW} |" in text and "2/2" in text
    figs = {f["name"]: f for f in _check_printed(doc)}
    assert figs["smollm2_spec_tok_s"]["ref_kind"] == "baseline"
    assert engine_table.resolve(doc, figs["smollm2_best_tree"]["path"]) == best
    assert {"smollm2_spec_speedup", "hf_generate_smollm2_fp32_tok_s", "smollm2_plain_tok_s"} <= set(figs)


def _with_8b(doc: dict, draft_ms) -> dict:
    """``doc`` plus a hand-made 8B part (the GPU's part b) in the layout bench_engine.part_llama8b writes."""
    doc = json.loads(json.dumps(doc))
    trees = []
    for tree, ms in (("60/7/10", 11.5), ("60/5/10", 10.7)):
        trees.append({"tree": tree, "step_ms": ms, "spec_floor_ms": 7.36, "draft_ms_per_step": draft_ms,
                      "drafter_alone_ms": 2.51, "break_even_accepted_length": ms / 6.04,
                      "projection": {"projection": True,
                                     "tokens_per_second": {str(t): t / (ms * 1e-3) for t in engine_table.TAUS}}})
    trees.append({"tree": "40/4/8", "skipped": "time budget"})
    doc["parts"]["llama8b"] = {"prompt_tokens": 64, "copy_bandwidth_B_per_s": 3.02e12, "target_floor_ms": 5.32,
                               "plain": {"step_ms": 6.04}, "trees": trees}
    return doc


@pytest.mark.parametrize("draft_ms", [3.17, None])
def test_llama8b_table_and_figures(run, draft_ms):
    doc = _with_8b(run[0], draft_ms)
    text = engine_table.render(doc)
    assert "| plain | — | 6.04 | 5.32 | 1.14x |" in text
    assert "| speculative | 60/7/10 | 11.50 | 7.36 | 1.56x |" in text and "not measured (time budget)" in text
    figs = {f["name"]: f for f in _check_printed(doc)}
    assert figs["spec_step_8b_60_7_10"]["ref_kind"] == "floor"
    assert figs["projected_8b_tok_s_tau6"]["projection"] and figs["projected_8b_60_5_10_tok_s_tau6"]["projection"]
    assert engine_table.resolve(doc, figs["projected_8b_tok_s_tau6"]["path"]) == pytest.approx(6 / 11.5e-3)
    assert ("drafter_in_step_8b" in figs) == (draft_ms is not None)  # never invented when the engine did not time it


def test_headline_entries_from_a_committed_result(run, tmp_path, monkeypatch):
    doc = _with_8b(run[0], 3.17)
    results = tmp_path / "bench" / "results"
    (results / "gpu_x").mkdir(parents=True)
    (results / "gpu_x" / "bench_engine.json").write_text(json.dumps(doc))
    (results / "gpu_y").mkdir()
    (results / "gpu_y" / "bench_engine.json").write_text('{"benchmark": "bench_engine", "runs": []}')  # schema 1
    monkeypatch.setattr(make_headline, "ROOT", tmp_path)
    both = {"smollm2": "gpu_x/bench_engine.json", "llama8b": "gpu_x/bench_engine.json"}
    assert make_headline.engine_parts_sources() == both
    entries = {e["name"]: e for e in make_headline.engine_parts_entries()}
    for name in ("spec_step_8b_60_7_10", "drafter_in_step_8b", "smollm2_spec_tok_s", "smollm2_spec_speedup",
                 "smollm2_best_tree", "projected_8b_tok_s_tau6"):
        assert name in entries, name
    e = entries["spec_step_8b_60_7_10"]
    assert (e["value"], e["floor"], e["ratio"]) == (11.5, 7.36, round(11.5 / 7.36, 3))
    assert entries["smollm2_best_tree"]["value"] == doc["parts"]["smollm2"]["best_tree"]
    assert entries["projected_8b_tok_s_tau6"]["projection"] is True
    assert entries["smollm2_spec_tok_s"]["source"] == "bench/results/gpu_x/bench_engine.json"
    assert entries["smollm2_spec_tok_s"]["commit"] == doc["versions"]["git_commit"][:7]
    # a newer run of one part only: that part's figures come from it, the other part's from the older run
    newer = {**doc, "date": "2999-01-01T00:00:00+00:00", "parts": {"smollm2": doc["parts"]["smollm2"]}}
    (results / "gpu_z").mkdir()
    (results / "gpu_z" / "bench_engine.json").write_text(json.dumps(newer))
    assert make_headline.engine_parts_sources() == {**both, "smollm2": "gpu_z/bench_engine.json"}
    entries = {e["name"]: e for e in make_headline.engine_parts_entries()}
    assert entries["smollm2_spec_tok_s"]["source"] == "bench/results/gpu_z/bench_engine.json"
    assert entries["spec_step_8b_60_7_10"]["source"] == "bench/results/gpu_x/bench_engine.json"
    for name in ("gpu_x", "gpu_z"):
        (results / name / "bench_engine.json").unlink()
    assert make_headline.engine_parts_sources() == {} and make_headline.engine_parts_entries() == []


def test_write_default_tree_from_a_result(run, models, tmp_path, monkeypatch):
    from eagle_triton.commands._tuned_trees import read_tuned_trees
    from eagle_triton.engine import default_model

    doc, out = run
    other = tmp_path / "smollm2-eagle3"  # the shipped head's folder name, but not the head the run measured
    other.mkdir()
    (other / "config.json").write_text("{}")
    monkeypatch.setattr(default_model, "DEFAULT_HEAD_DIR", other)
    with pytest.raises(SystemExit, match="not the shipped one"):
        bench_engine.main(["--write-default-tree", "--tune-from", str(out / "bench_engine.json")])
    monkeypatch.setattr(default_model, "DEFAULT_HEAD_DIR", models / "head")
    assert bench_engine.main(["--write-default-tree", "--tune-from", str(out / "bench_engine.json")]) == 0
    best = doc["parts"]["smollm2"]["best_tree"]
    assert read_tuned_trees(models / "head") == {"cpu": tuple(map(int, best.split("/")))}
    measured = json.loads((models / "head" / "tuned_trees.json").read_text())["measured"]["cpu"]
    assert measured["source"].endswith("bench_engine.json") and measured["dtype"] == "float32"
    (models / "head" / "tuned_trees.json").unlink()


def test_llama8b_part_runs_end_to_end_on_a_tiny_stand_in(monkeypatch):
    """Part b's code path (engine steps, floors, break-even, projection) on the CPU, with the 8B model, the 8B head
    and the copy bandwidth replaced by tiny stand-ins (the GPU runs the real ones)."""
    import argparse

    import bench_fused_drafter
    import bench_target
    import torch
    from engine_testlib import tiny_llama

    from eagle_triton.testing import random_eagle3_head

    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=257, draft_vocab_size=64, seed=0)  # head_dim 16: a fused-drafter shape
    monkeypatch.setattr(bench_target, "copy_bandwidth", lambda: 1e11)
    monkeypatch.setattr(bench_target, "build_8b", lambda: tiny_llama(vocab=257, hidden=32, layers=4).to(torch.bfloat16))
    monkeypatch.setattr(bench_fused_drafter, "make_head", lambda *a, **k: head)
    args = argparse.Namespace(trees_8b="8/2/3,6/1/4", prompt_len_8b=12, new_tokens_8b=6, reps_8b=3, drafter="torch",
                              drafter_alone=False, drafter_option=[])
    out = bench_engine.part_llama8b(args, 60.0, torch.device("cpu"))
    assert out["target_floor_ms"] == pytest.approx(out["target_bytes"] / 1e11 * 1e3)
    assert out["plain"]["step_ms"] > 0 and len(out["plain"]["reps"]) == 3
    for t in out["trees"]:
        assert t["spec_floor_ms"] == pytest.approx(out["target_floor_ms"] + t["drafter_floor_ms"])
        assert t["drafter_floor_ms"] > 0 and t["vs_floor"] == pytest.approx(t["step_ms"] / t["spec_floor_ms"])
        assert t["break_even_accepted_length"] == pytest.approx(t["step_ms"] / out["plain"]["step_ms"])
        assert t["projection"]["projection"] is True
        assert t["projection"]["tokens_per_second"]["6"] == pytest.approx(6e3 / t["step_ms"])
    assert bench_engine.part_llama8b(args, 0.0, torch.device("cpu"))["trees"][0]["skipped"] == "time budget"
    figs = {f["name"] for f in _check_printed({"parts": {"llama8b": out}})}  # what the part writes, the table reads
    assert {"plain_step_8b", "spec_step_8b_8_2_3", "projected_8b_8_2_3_tok_s_tau6"} <= figs


def test_drafter_options_are_parsed_as_integers():
    import argparse

    ns = argparse.Namespace(drafter_option=["hidden_half_early=1", "nprog=33"])
    assert bench_engine.drafter_options(ns) == {"hidden_half_early": 1, "nprog": 33}
    assert bench_engine.drafter_options(argparse.Namespace(drafter_option=[])) is None
    for bad in ("hidden_half_early", "nprog=many", "=3"):
        with pytest.raises(SystemExit, match="--drafter-option"):
            bench_engine.drafter_options(argparse.Namespace(drafter_option=[bad]))
