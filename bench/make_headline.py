"""Writes bench/results/headline.json: the figures the README quotes, each copied from its result file.

The list below says which figure comes from which file and where the README prints it. After a new result set
(bench/gpu_check.sh --out bench/results/<set>): point the constants at it, run `python bench/make_headline.py`,
update the README's figures, and run tests/test_headline.py, which names every figure that disagrees.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results/"
H100 = "NVIDIA H100 80GB HBM3"
CPU = "CPU of this project's machine"

# the current fused drafter sweep (the README's drafter table) and the commit that added it
DRAFTER_SWEEP, DRAFTER_COMMIT = "gpu_2026-11-22g/fused_drafter.json", "cc4e62f"
DRAFTER_NOTE = "commit: the commit that added the source; the code measured is its parent 09ceb31 (plus a docstring)"
DRAFTER_ROWS = ([("60/7/10", "decode", b) for b in (1, 2, 4, 8, 16)]
                + [("60/7/10", "prefill", b) for b in (1, 2, 4, 8, 16)]
                + [("60/5/10", "decode", 1), ("60/5/10", "decode", 16), ("60/5/10", "prefill", 1),
                   ("60/5/10", "prefill", 16)])
# the engine runs (the README's engine table): (source, drafter as printed, name suffix, commit, note)
ENGINE_RUNS = [
    ("gpu_2026-11-22b/bench_engine_fused_drafter.json", "fused (`triton`)", "", "22978ea",
     "measured at commit 5a29b43, with an earlier version of the fused kernel; "
     "commit: the commit that added the source"),
    ("gpu_2026-11-22/bench_engine.json", "reference (`torch`)", "_reference_drafter", "fd4b59a",
     "an earlier run (session 1), reference drafter"),
]


def resolve(doc, path):
    """Follow a path of keys, list indices and {field: value} filters that must match one list item."""
    for step in path:
        if isinstance(step, dict):
            hits = [item for item in doc if all(item.get(k) == v for k, v in step.items())]
            if len(hits) != 1:
                raise ValueError(f"filter {step} matches {len(hits)} items")
            doc = hits[0]
        else:
            doc = doc[step]
    return doc


def entry(name, unit, source, path, decimals, device, commit, readme, ref_path=None, ref_kind=None, note=None):
    doc = json.loads((ROOT / RESULTS / source).read_text())
    raw = resolve(doc, path)
    e = {"name": name, "value": round(raw, decimals), "unit": unit}
    if ref_kind:  # "floor" or "baseline", from the same file
        raw_ref = resolve(doc, ref_path)
        e[ref_kind] = round(raw_ref, decimals)
        e["ratio"] = round(raw / raw_ref, 3)
    e.update(device=device, date="2026-11-22", commit=commit, source=RESULTS + source, source_path=path)
    if ref_kind:
        e[ref_kind + "_source_path"] = ref_path
    e["readme"] = readme
    if note:
        e["note"] = note
    return e


def drafter_entries() -> list[dict]:
    out = []
    for tree, scen, b in DRAFTER_ROWS:
        name = f"draft_8b_{tree.replace('/', '_')}_" + ("" if scen == "decode" else "prefill_") + f"b{b}"
        sel = {"shape": "llama31-8b", "peaked": False, "tree": tree, "scenario": scen, "batch": b}
        row, floor = [tree, scen, str(b)], ["rows", sel, "floor_ms"]
        columns = [("", "fused_ms", "fused persistent kernel"), ("_graph", "graph_ms", "multi-kernel, CUDA graph")]
        if b == 1:
            columns.append(("_reference", "ref_ms", "reference (PyTorch)"))
        for suffix, field, column in columns:
            readme = [{"row": row, "column": column, "field": "value"}]
            if not suffix:
                readme.append({"row": row, "column": "floor", "field": "floor"})
            out.append(entry(name + suffix, "ms", DRAFTER_SWEEP, ["rows", sel, field], 3, H100, DRAFTER_COMMIT,
                             readme, floor, "floor",
                             "the reference drafter's time varies from run to run (see "
                             "draft_8b_60_7_10_b1_reference_run15)" if suffix == "_reference" else DRAFTER_NOTE))
    quoted = {"fused_ms": ("", "the fused kernel takes 0.47 to 1.68 ms from batch 1 to batch 16", ("0.47", "1.68")),
              "graph_ms": ("_graph", "against 2.68 to 4.53 ms for the graph version", ("2.68", "4.53"))}
    for field, (suffix, text, printed) in quoted.items():
        for b, p in zip((1, 16), printed, strict=True):
            sel = {"shape": "smollm2-135m", "peaked": False, "tree": "60/7/10", "scenario": "decode", "batch": b}
            out.append(entry(f"draft_smollm2_60_7_10_b{b}{suffix}", "ms", DRAFTER_SWEEP, ["rows", sel, field], 3,
                             H100, DRAFTER_COMMIT, [{"text": text, "printed": p}], ["rows", sel, "floor_ms"], "floor",
                             DRAFTER_NOTE))
    sel = {"shape": "llama31-8b", "peaked": False, "tree": "60/7/10", "scenario": "decode", "batch": 1}
    out.append(entry("draft_8b_60_7_10_b1_reference_run15", "ms", "gpu_2026-11-22f/run15/fused_drafter.json",
                     ["rows", sel, "ref_ms"], 3, H100, "2f28fe0",
                     [{"text": "16.4 ms in an earlier sweep", "printed": "16.4"}],
                     note="an earlier sweep (session 5, another machine)"))
    return out


def engine_entries() -> list[dict]:
    out = []
    for source, drafter, label, commit, note in ENGINE_RUNS:
        for dtype, short in (("bfloat16", "bf16"), ("float32", "fp32")):
            row, sel = [short, drafter], {"dtype": dtype}
            plain = ["runs", sel, "plain_tokens_per_second"]
            out.append(entry(f"smollm2_plain_tok_s_{short}{label}", "tok/s", source, plain, 1, H100, commit,
                             [{"row": row, "column": "plain tok/s", "field": "value"}], note=note))
            out.append(entry(f"smollm2_spec_tok_s_{short}{label}", "tok/s", source,
                             ["runs", sel, "speculative_tokens_per_second"], 1, H100, commit,
                             [{"row": row, "column": "speculative tok/s", "field": "value"},
                              {"row": row, "column": "plain tok/s", "field": "baseline"},
                              {"row": row, "column": "speedup", "field": "ratio"}], plain, "baseline", note))
            out.append(entry(f"smollm2_accepted_length_{short}{label}", "tokens per step", source,
                             ["runs", sel, "mean_accepted_length"], 2, H100, commit,
                             [{"row": row, "column": "mean accepted length", "field": "value"}], note=note))
    out.append(entry("smollm2_accepted_length_bf16_mtbench_256", "tokens per step", "gpu_2026-11-22/acceptance.json",
                     ["engine", "runs", {"dataset": "mtbench", "mode": "spec", "tree": "60/7/10"},
                      "mean_accepted_length"], 2, H100, "fd4b59a",
                     [{"text": "measured a mean accepted length of 3.59", "printed": "3.59"}],
                     note="52 of 80 MT-bench prompts (the run's time budget), 256 tokens, reference drafter"))
    for name, source, text, printed in (
            ("mtbench80", "acceptance_cpu_mtbench.json", "MT-bench first turns is 3.01", "3.01"),
            ("humaneval41", "acceptance_cpu_humaneval.json", "41 HumanEval prompts 3.26", "3.26")):
        out.append(entry(f"smollm2_accepted_length_cpu_{name}", "tokens per step", "train_smollm2/" + source,
                         ["trees", "60/7/10", "mean_accepted_length"], 2, CPU + " (fp32, 1 thread)", "c33e472",
                         [{"text": text, "printed": printed}]))
    for tree, text in (("60_7_10", "16.2 vs 27.1 tok/s at 60/7/10 (0.60x)"),
                       ("16_3_4", "26.4 vs 27.0 tok/s at 16/3/4 (0.98x)")):
        spec, rest = text.split(" vs ")
        out.append(entry(f"smollm2_spec_tok_s_cpu_fp32_{tree}", "tok/s", f"cpu_2026-11-22/tree_{tree}/bench.json",
                         ["modes", "speculative", "tokens_per_second"], 1, CPU + " (2 cores, fp32)", "6f4b41a",
                         [{"text": text, "printed": spec},
                          {"text": text, "printed": rest.split()[0], "field": "baseline"},
                          {"text": text, "printed": text.split("(")[1].rstrip("x)"), "field": "ratio"}],
                         ["modes", "plain", "tokens_per_second"], "baseline", "2 prompts, 64 tokens"))
    return out


def main() -> None:
    doc = {"about": "The figures the project README quotes, one entry each. value, floor/baseline: copied from "
                    "`source` at `source_path`, rounded; ratio = value / floor (or baseline); commit: the commit that "
                    "added the source file; readme: where the README prints the figure (tests/test_headline.py "
                    "checks all of it). Written by bench/make_headline.py.",
           "entries": drafter_entries() + engine_entries()}
    path = ROOT / RESULTS / "headline.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(doc['entries'])} entries to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
