"""bench/bench_acceptance.py on the CPU: two heads on the same prompts, greedy and sampled, MT-bench and the
self-sampled held-out set, with the per-depth acceptance curve (a tiny target and random heads built in code)."""

import json

import bench_acceptance
import pytest
from chat_testlib import save_tiny_chat_target

from eagle_triton.testing import random_eagle3_head

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def target_and_heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("acceptance")
    save_tiny_chat_target(root / "target")
    heads = {}
    for name, seed in (("old", 1), ("new", 2)):
        head = random_eagle3_head(hidden_size=48, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  vocab_size=112, draft_vocab_size=40, target_hidden_size=48, seed=seed)
        head.save_pretrained(root / name)
        heads[name] = str(root / name)
    return str(root / "target"), heads


def test_two_heads_two_temperatures_and_the_heldout_set(tmp_path, target_and_heads):
    target, heads = target_and_heads
    argv = ["--target", target, "--heads", ",".join(f"{k}={v}" for k, v in heads.items()), "--trees", "6/2/2",
            "--datasets", "mtbench,selfheldout", "--limit", "2", "--temperatures", "0,0.7", "--max-new-tokens", "6",
            "--budget-s", "1000", "--device", "cpu", "--drafter", "torch", "--method", "engine",
            "--out", str(tmp_path)]
    assert bench_acceptance.main(argv) == 0
    res = json.loads((tmp_path / "acceptance.json").read_text())
    assert "engine_error" not in res, res.get("engine_error")
    runs = res["engine"]["runs"]
    spec = [r for r in runs if r["mode"] == "spec"]
    # every (dataset, head, temperature) ran on the same prompts
    assert {(r["dataset"], r["head"], r["temperature"]) for r in spec} == {
        (d, h, t) for d in ("mtbench", "selfheldout") for h in ("old", "new") for t in (0.0, 0.7)}
    assert len(res["engine"]["selfheldout_prompts"]) == 2
    for r in spec:
        assert r["prompts"] == 2 and r["steps"] > 0
        hist, curve = r["accept_length_histogram"], r["acceptance_by_depth"]
        assert len(curve) == len(hist) - 1 and all(a >= b for a, b in zip(curve, curve[1:], strict=False))
        assert curve == pytest.approx([sum(hist[d:]) / sum(hist) for d in range(1, len(hist))])
        if r["temperature"] == 0.0:  # greedy speculation is lossless
            assert r["outputs_differing_from_plain"] == 0 and r["outputs_compared"] == 2
        else:
            assert "outputs_differing_from_plain" not in r
    by_head = res["engine"]["tau_by_head"]
    assert set(by_head) == {f"{d}/6/2/2/T={t}" for d in ("mtbench", "selfheldout") for t in ("0", "0.7")}
    for v in by_head.values():
        assert v["prompts"] == 2 and set(v["tau"]) == {"old", "new"} and all(t >= 1.0 for t in v["tau"].values())
    assert (tmp_path / "acceptance.png").stat().st_size > 0


def test_estimate_counts_steps_ended_outside_the_vocabulary(tmp_path, target_and_heads):
    target, heads = target_and_heads
    argv = ["--target", target, "--head", heads["old"], "--trees", "6/2/2", "--datasets", "mtbench", "--limit", "2",
            "--max-new-tokens", "8", "--budget-s", "1000", "--device", "cpu", "--method", "estimate",
            "--out", str(tmp_path)]
    assert bench_acceptance.main(argv) == 0
    (run,) = json.loads((tmp_path / "acceptance.json").read_text())["estimate"]["runs"]
    assert run["prompts"] == 2 and run["steps"] > 0
    assert run["continuation_tokens"] == run["tokens"] == sum(k * n for k, n in enumerate(run["histogram"]))
    assert 0 <= run["ended_out_of_vocab"] <= min(run["steps"], run["tokens_out_of_vocab"])
    assert run["tokens_out_of_vocab"] <= run["continuation_tokens"]


def test_refuses_bad_arguments_and_foreign_files(tmp_path, target_and_heads):
    target, heads = target_and_heads
    base = ["--target", target, "--out", str(tmp_path), "--device", "cpu"]
    with pytest.raises(SystemExit, match="NAME=DIR"):
        bench_acceptance.main(base + ["--heads", "old=" + heads["old"] + ",old=" + heads["new"]])
    with pytest.raises(SystemExit, match="not both"):
        bench_acceptance.main(base + ["--heads", "a=" + heads["old"], "--head", heads["new"]])
    with pytest.raises(SystemExit, match="temperatures"):
        bench_acceptance.main(base + ["--head", heads["old"], "--temperatures", "-1"])
    (tmp_path / "acceptance.json").write_text("my own notes")
    with pytest.raises(SystemExit, match="not written by bench_acceptance"):
        bench_acceptance.main(base + ["--head", heads["old"], "--datasets", "mtbench", "--limit", "1"])
    assert (tmp_path / "acceptance.json").read_text() == "my own notes"
