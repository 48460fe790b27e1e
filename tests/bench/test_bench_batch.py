"""bench/bench_batch.py --smoke on the CPU (a tiny random model built in code, the stub drafter, for both parts): the
JSON, the PNG, the headline figures and the README table it writes."""

import contextlib
import io
import json
from pathlib import Path

import bench_batch
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One ``--smoke`` run for the module (its output folder laid out as a committed result set, for
    ``make_headline``): ``(root, out folder, what it printed)``."""
    root = tmp_path_factory.mktemp("smoke")
    out = root / "bench" / "results" / "set"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert bench_batch.main(["--smoke", "--out", str(out)]) == 0
    return root, out, printed.getvalue()


def test_smoke_run_writes_json_png_headline_and_table(smoke):
    _, out, printed = smoke
    doc = json.loads((out / "bench_batch.json").read_text())
    assert (out / "bench_batch.png").stat().st_size > 0
    assert doc["benchmark"] == "bench_batch" and doc["smoke"] is True
    a = doc["parts"]["smollm2"]
    assert [r["batch"] for r in a["runs"]] == [1, 2, 4] and a["num_prompts"] == 6
    for run in a["runs"]:
        assert run["plain"]["new_tokens"] == 6 * 6 and run["plain"]["mean_accepted_length"] == 1.0
        for tree in a["trees"]:
            r = run["trees"][tree]
            assert r["identical_output"] is True and r["new_tokens"] == 36 and r["mean_accepted_length"] >= 1.0
        best = run["best_tree"]
        assert run["trees"][best]["tokens_per_second"] == max(t["tokens_per_second"] for t in run["trees"].values())
        assert abs(run["spec_speedup"] - run["trees"][best]["tokens_per_second"]
                   / run["plain"]["tokens_per_second"]) < 1e-9
    b = doc["parts"]["llama8b"]  # the 8B part's code path on the tiny model
    assert b["shape"] == "tiny random Llama (--smoke)" and [r["batch"] for r in b["runs"]] == [1, 2, 4]
    for run in b["runs"]:
        assert run["plain_tok_s"] == run["batch"] * 1e3 / run["plain_step_ms"]
        r = run["trees"]["6/2/2"]
        assert r["projection"] is True and r["projected_tok_s"]["3"] == run["batch"] * 3e3 / r["step_ms"]
    assert a["batch_trees_option"] == ",".join(f"{r['batch']}={r['best_tree']}" for r in a["runs"])
    assert set(doc["headline"]) == {"smollm2_spec_speedup_b1", "smollm2_spec_speedup_b2", "smollm2_spec_speedup_b4"}
    table = bench_batch.table(doc)
    assert table in printed and len(table.splitlines()) == 2 + 3
    assert f"{a['runs'][2]['spec_speedup']:.2f}x" in table.splitlines()[-1]


def test_headline_entries_quote_the_table_rows(smoke, monkeypatch):
    """make_headline.batch_entries on a (smoke) result file posing as a committed one: one speed-up per batch size,
    each its file's number, quoted by its table row."""
    import make_headline

    root, out, _ = smoke
    monkeypatch.setattr(make_headline, "ROOT", root)
    monkeypatch.setattr(make_headline, "BATCH_SOURCE", "set/bench_batch.json")
    monkeypatch.setattr(make_headline, "_adding_commit", lambda path: "abc1234")
    entries = make_headline.batch_entries()
    doc = json.loads((out / "bench_batch.json").read_text())
    assert [e["name"] for e in entries] == [f"smollm2_spec_speedup_b{b}" for b in (1, 2, 4)]
    for e, run in zip(entries, doc["parts"]["smollm2"]["runs"], strict=True):
        assert e["value"] == round(run["spec_speedup"], 2) and e["commit"] == "abc1234"
        (where,) = e["readme"]
        assert where["text"] == bench_batch.table_row(run) and where["printed"] + "x" in where["text"]


def test_batches_beyond_the_buckets_are_refused():
    import pytest

    with pytest.raises(ValueError, match="beyond the largest batch bucket"):
        bench_batch.parse_batches("4,32")


def test_write_batch_trees_records_the_best_tree_per_batch(tmp_path, monkeypatch):
    """--write-batch-trees: the committed session-11 result's best trees into (a stand-in of) the shipped head's
    tuned_trees.json; a smoke run, another head's run or a CPU run is refused and writes nothing."""
    from eagle_triton.commands._tuned_trees import WRITER, tuned_batch_trees
    from eagle_triton.engine import default_model

    head = tmp_path / "head"
    head.mkdir()
    (head / "tuned_trees.json").write_text(json.dumps({"written_by": WRITER, "trees": {"cuda": "16/3/4"}}))
    monkeypatch.setattr(default_model, "DEFAULT_HEAD_DIR", head)
    src = ROOT / "bench/results/session11_2026-11-26/bench_batch.json"
    doc = json.loads(src.read_text())
    doc["parts"]["smollm2"]["draft"] = str(head)
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(doc))
    assert bench_batch.main(["--write-batch-trees", str(measured)]) == 0
    want = {r["batch"]: tuple(map(int, r["best_tree"].split("/"))) for r in doc["parts"]["smollm2"]["runs"]}
    assert tuned_batch_trees(head, "cuda") == want and want[16] == (8, 2, 3)
    before = (head / "tuned_trees.json").read_text()
    for change in ({"smoke": True}, {"versions": {**doc["versions"], "cuda": None}}):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**doc, **change}))
        with pytest.raises(SystemExit):
            bench_batch.main(["--write-batch-trees", str(bad)])
    doc["parts"]["smollm2"]["draft"] = str(tmp_path / "other-head")
    bad.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="not the shipped head"):
        bench_batch.main(["--write-batch-trees", str(bad)])
    assert (head / "tuned_trees.json").read_text() == before


def test_sampled_smoke_run_records_its_temperature_and_compares_nothing(tmp_path):
    out = tmp_path / "sampled"
    with contextlib.redirect_stdout(io.StringIO()):
        assert bench_batch.main(["--smoke", "--parts", "smollm2", "--batches", "2", "--temperature", "0.7",
                                 "--top-p", "0.9", "--out", str(out)]) == 0
    a = json.loads((out / "bench_batch.json").read_text())["parts"]["smollm2"]
    assert (a["temperature"], a["top_p"], a["greedy"]) == (0.7, 0.9, False)
    run = a["runs"][0]
    assert all(r["identical_output"] is None and r["new_tokens"] == 36 for r in run["trees"].values())
    assert "| sampled |" in bench_batch.table_row(run)
