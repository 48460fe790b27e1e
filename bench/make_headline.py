"""Writes bench/results/headline.json: the figures the README quotes, each copied from its result file.

The list below says which figure comes from which file and where the README prints it. After a new result set
(bench/gpu_check.sh --out bench/results/<set>): point the constants at it, run `python bench/make_headline.py`,
update the README's figures, and run tests/test_headline.py, which names every figure that disagrees.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results/"
H100 = "NVIDIA H100 80GB HBM3"
CPU = "CPU of this project's machine"

# the current fused drafter sweep (the README's drafter table) and the commit that added it
# the README's drafter table (bench_fused_drafter.py's default sweep); the commit is the one that added the file
DRAFTER_SWEEP, DRAFTER_DATE = "session28_2026-11-28/fused_drafter.json", "2026-11-28"
DRAFTER_NOTE = "the code measured is c370fb7 (session 27's last commit)"
DRAFTER_ROWS = ([("60/7/10", "decode", b) for b in (1, 2, 4, 8, 16)]
                + [("60/7/10", "prefill", b) for b in (1, 2, 4, 8, 16)]
                + [("60/5/10", "decode", 1), ("60/5/10", "decode", 16), ("60/5/10", "prefill", 1),
                   ("60/5/10", "prefill", 16)])
# the engine runs (the README's engine table): (source, drafter as printed, name suffix, commit, note)
# the engine runs of the README's former engine table (replaced by the step-graph table of bench_engine.py's parts)
ENGINE_RUNS: list = []
S7 = "gpu_2026-11-25/"  # session 7's result set (bench/results/gpu_2026-11-25/README.md)
S8 = "step_graph_2026-11-25/"  # session 8's result set (bench/results/step_graph_2026-11-25/README.md)
S9 = "session9_2026-11-25/"  # session 9's benchmarks (bench/results/session9_2026-11-25/README.md)
S9P = "pdl_2026-11-25/"  # session 9's probes (bench/results/pdl_2026-11-25/README.md)
S12 = "session12_2026-11-26/"  # session 12's set (bench/results/session12_2026-11-26/README.md)
S13 = "session13_2026-11-26/"  # session 13's set (bench/results/session13_2026-11-26/README.md)
S14 = "session14_2026-11-27/"  # session 14's set (bench/results/session14_2026-11-27/README.md)
S15 = "session15_2026-11-27/"  # session 15's set (bench/results/session15_2026-11-27/README.md)
S16 = "session16_2026-11-27/"  # session 16's set (bench/results/session16_2026-11-27/README.md)
S22 = "session22_2026-11-27/"  # session 22's set: the round-5 SmolLM2 head (bench/results/session22_2026-11-27/)
S23 = "session23_2026-11-27/"  # session 23's set: the round-6 SmolLM2 head, measured on an H200
S24 = "session24_2026-11-27/"  # session 24's set: the round-7 SmolLM2 head (acceptance on an H200, engine on an H100)
H200 = "NVIDIA H200"
# The engine benchmark of issue 18 (a bench_engine.json with "parts": bench/bench_engine.py since schema 2). Its README
# tables are printed by bench/engine_table.py, and every figure they print is an entry (engine_parts_entries).
# None: the newest such file committed under bench/results/ (by its "date"); name one ("<set>/bench_engine.json") to
# pin it.
ENGINE_PARTS_SOURCE = None
# The batched-generation benchmark of issue 21 (bench/bench_batch.py, not --smoke). None: the newest committed one.
BATCH_SOURCE = None


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


def entry(name, unit, source, path, decimals, device, commit, readme, ref_path=None, ref_kind=None, note=None,
          date="2026-11-22"):
    doc = json.loads((ROOT / RESULTS / source).read_text())
    raw = resolve(doc, path)
    e = {"name": name, "value": raw if isinstance(raw, str) else round(raw, decimals), "unit": unit}
    if ref_kind:  # "floor" or "baseline", from the same file
        raw_ref = resolve(doc, ref_path)
        e[ref_kind] = round(raw_ref, decimals)
        e["ratio"] = round(raw / raw_ref, 3)
    e.update(device=device, date=date, commit=commit, source=RESULTS + source, source_path=path)
    if ref_kind:
        e[ref_kind + "_source_path"] = ref_path
    e["readme"] = readme
    if note:
        e["note"] = note
    return e


def prose_entry(name, unit, source, path, decimals, commit, text, printed, note=None, ref_path=None, ref_kind=None,
                ref_printed=None, ratio_printed=None, date="2026-11-25"):
    """An H100 figure printed in the README's prose as ``printed`` inside ``text`` (its floor or baseline and its
    ratio too, when those are printed there)."""
    readme = [{"text": text, "printed": printed}]
    if ref_printed:
        readme.append({"text": text, "printed": ref_printed, "field": ref_kind})
    if ratio_printed:
        readme.append({"text": text, "printed": ratio_printed, "field": "ratio"})
    return entry(name, unit, source, path, decimals, H100, commit, readme, ref_path, ref_kind, note, date=date)


def drafter_entries() -> list[dict]:
    commit = _adding_commit(ROOT / RESULTS / DRAFTER_SWEEP) or "uncommitted"
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
            out.append(entry(name + suffix, "ms", DRAFTER_SWEEP, ["rows", sel, field], 3, H100, commit,
                             readme, floor, "floor",
                             "the reference drafter's time varies from run to run (see "
                             "draft_8b_60_7_10_b1_reference_session6)" if suffix == "_reference" else DRAFTER_NOTE,
                             date=DRAFTER_DATE))
    quoted = {"fused_ms": ("", "the fused kernel takes 0.44 to 1.41 ms from batch 1 to batch 16", ("0.44", "1.41")),
              "graph_ms": ("_graph", "against 2.66 to 4.53 ms for the graph version", ("2.66", "4.53"))}
    for field, (suffix, text, printed) in quoted.items():
        for b, p in zip((1, 16), printed, strict=True):
            sel = {"shape": "smollm2-135m", "peaked": False, "tree": "60/7/10", "scenario": "decode", "batch": b}
            out.append(entry(f"draft_smollm2_60_7_10_b{b}{suffix}", "ms", DRAFTER_SWEEP, ["rows", sel, field], 3,
                             H100, commit, [{"text": text, "printed": p}], ["rows", sel, "floor_ms"], "floor",
                             DRAFTER_NOTE, date=DRAFTER_DATE))
    sel = {"shape": "llama31-8b", "peaked": False, "tree": "60/7/10", "scenario": "decode", "batch": 1}
    out.append(entry("draft_8b_60_7_10_b1_reference_session6", "ms", "gpu_2026-11-22g/fused_drafter.json",
                     ["rows", sel, "ref_ms"], 3, H100, "cc4e62f",
                     [{"text": "24.2 ms in session 6's sweep", "printed": "24.2"}],
                     note="session 6's sweep (another machine, the code of 2026-11-22)"))
    return out


def engine_entries() -> list[dict]:
    out = []
    for source, drafter, label, commit, note, date in ENGINE_RUNS:
        for dtype, short in (("bfloat16", "bf16"), ("float32", "fp32")):
            row, sel = [short, drafter], {"dtype": dtype}
            plain = ["runs", sel, "plain_tokens_per_second"]
            out.append(entry(f"smollm2_plain_tok_s_{short}{label}", "tok/s", source, plain, 1, H100, commit,
                             [{"row": row, "column": "plain tok/s", "field": "value"}], note=note, date=date))
            out.append(entry(f"smollm2_spec_tok_s_{short}{label}", "tok/s", source,
                             ["runs", sel, "speculative_tokens_per_second"], 1, H100, commit,
                             [{"row": row, "column": "speculative tok/s", "field": "value"},
                              {"row": row, "column": "plain tok/s", "field": "baseline"},
                              {"row": row, "column": "speedup", "field": "ratio"}], plain, "baseline", note,
                             date=date))
            out.append(entry(f"smollm2_accepted_length_{short}{label}", "tokens per step", source,
                             ["runs", sel, "mean_accepted_length"], 2, H100, commit,
                             [{"row": row, "column": "mean accepted length", "field": "value"}], note=note,
                             date=date))
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


def session7_entries() -> list[dict]:
    """The figures the issues name, from session 7's result set (each printed in the README's prose)."""
    def s7(name, unit, source, path, decimals, commit, text, printed, ref_path=None, ref_kind=None, ref_printed=None,
           ratio_printed=None, note=None):
        return prose_entry(name, unit, S7 + source, path, decimals, commit, text, printed, note, ref_path, ref_kind,
                           ref_printed, ratio_printed)

    t8 = ["parts", "8b"]
    floor8 = t8 + ["floor_all_params_ms"]
    sm = ["parts", "smollm2", "new"]
    fused = {"llama31-8b": "fused_drafter_8b.json"}

    def drafter(name, shape, weights, batch, text, printed, ref_printed=None, ratio_printed=None):
        sel = {"shape": shape, "weights": weights, "batch": batch, "tree": "60/7/10", "scenario": "decode"}
        src = fused.get(shape, "fused_drafter_shapes.json")
        commit = "fb3e113" if shape == "llama31-8b" else "80a77ea"
        return s7(name, "ms", src, ["rows", sel, "fused_ms"], 3, commit, text, printed,
                  ["rows", sel, "floor_ms"] if ref_printed else None, "floor" if ref_printed else None,
                  ref_printed, ratio_printed)

    return [
        s7("target_8b_plain_step", "ms", "target_8b.json", t8 + ["new", "decode_step_ms"], 2, "1a6e9d1",
           "plain decode step 6.04 ms against a floor of 5.32 ms (1.13x;", "6.04", floor8, "floor", "5.32", "1.13"),
        s7("target_8b_verify60", "ms", "target_8b.json", t8 + ["new", "verify_ms"], 2, "1a6e9d1",
           "60-row verify forward 7.09 ms (1.33x the same floor)", "7.09", floor8, "floor", None, "1.33"),
        s7("target_8b_bf16_identical", "prompts of 20", "target_8b.json", ["parts", "8b-identical", "identical"], 0,
           "1a6e9d1", "identical to plain greedy output on 20 of 20 random prompts", "20"),
        s7("smollm2_prefill_1k", "ms", "target_smollm2.json", sm + ["prefill_1000_ms"], 2, "80a77ea",
           "a 1,000-token prefill takes 5.26 ms", "5.26"),
        s7("smollm2_bf16_identical", "prompts of 20", "target_smollm2.json",
           ["parts", "smollm2-identical", "identical"], 0, "80a77ea",
           "bf16 speculative output is identical to plain on 20 of 20 MT-bench prompts", "20"),
        drafter("draft_8b_fp8_60_7_10_b1", "llama31-8b", "fp8", 1, "FP8 weights 2.21 ms (floor 1.02 ms)", "2.21",
                "1.02"),
        drafter("draft_qwen3_8b_60_7_10_b1", "qwen3-8b", "bf16", 1, "Qwen3-8B head shape 2.39 ms (floor 1.90 ms)",
                "2.39", "1.90"),
        drafter("draft_70b_60_7_10_b1", "llama33-70b", "bf16", 1, "Llama-3.3-70B head shape 7.10 ms (floor 6.53 ms)",
                "7.10", "6.53"),
        entry("smollm2_cpu_default_tree_spec_tok_s", "tok/s", "cpu_tree/cpu_tree.json",
              ["runs", {"tree": "8/1/4"}, "speculative_tokens_per_second"], 1, CPU + " (2 cores, fp32, quiet)",
              "5696e0a", [{"text": "8/1/4 tree on the CPU: 17.0 vs 15.0 tok/s (1.14x)", "printed": "17.0"},
                          {"text": "8/1/4 tree on the CPU: 17.0 vs 15.0 tok/s (1.14x)", "printed": "15.0",
                           "field": "baseline"},
                          {"text": "8/1/4 tree on the CPU: 17.0 vs 15.0 tok/s (1.14x)", "printed": "1.14",
                           "field": "ratio"}],
              ["plain_tokens_per_second"], "baseline", "6 MT-bench prompts x 64 tokens, 2 timed runs each",
              date="2026-11-25"),
    ]


def session8_entries() -> list[dict]:
    """The step-graph session's figures printed in the README's prose (bench/results/step_graph_2026-11-25/)."""
    def s8(name, unit, source, path, decimals, commit, text, printed, note=None, ref_path=None, ref_kind=None,
           ref_printed=None):
        return prose_entry(name, unit, S8 + source, path, decimals, commit, text, printed, note, ref_path, ref_kind,
                           ref_printed)

    head = ["results", "headline"]
    return [
        s8("drafter_in_step_8b", "ms", "step_probe.json", ["runs", {"norm_mode": "kernel"},
                                                           "spec_60/7/10_draft_in_step_ms"], 2, "823ea60",
           "the draft inside it costs 2.48 ms", "2.48",
           "the 60/7/10 step graph replayed minus the same graph without its draft (the last tree reused)"),
        s8("smollm2_plain_tok_s", "tok/s", "bench_engine.json",
           ["parts", "smollm2", "runs", {"dtype": "bfloat16"}, "plain", "tokens_per_second"], 1, "91789b9",
           "plain decoding 890.2 tok/s in the engine benchmark below", "890.2",
           "the engine benchmark (20 MT-bench prompts x 128 tokens); same figure as engine_smollm2_bf16_plain_tok_s"),
        s8("safeailab_8b_step_unpatched", "ms", "bench_safeailab_replayed.json", head + ["safeailab_8b_step_unpatched"],
           1, "bd6bf6b", "`eagenerate` step: 59.4 ms", "59.4"),
        s8("safeailab_8b_step_drafter_patched", "ms", "bench_safeailab_replayed.json",
           head + ["safeailab_8b_step_drafter_patched"], 1, "bd6bf6b", "35.8 ms with the drafter patch", "35.8"),
        s8("safeailab_8b_step_optimized", "ms", "bench_safeailab_replayed.json", head + ["safeailab_8b_step_optimized"],
           2, "bd6bf6b", "10.71 ms after `optimize_eagle_with_triton`", "10.71"),
        s8("safeailab_8b_topk_call_patched", "ms", "bench_safeailab_replayed.json",
           head + ["safeailab_8b_topk_call_patched"], 2, "bd6bf6b",
           "`topK_genrate` with the drafter patch: 2.81 ms per call", "2.81"),
        s8("spec_step_8b_60_7_10_safeailab_run", "ms", "bench_safeailab_replayed.json", head + ["spec_step_8b_60_7_10"],
           2, "bd6bf6b", "our engine's own speculative step at that shape in the same run, 9.84 ms", "9.84",
           "measured by bench/bench_safeailab.py; spec_step_8b_60_7_10 is the engine benchmark's"),
    ]


def session9_entries() -> list[dict]:
    """Session 9's figures printed in the README's prose (programmatic dependent launch, the tree kernel without
    pipeline stages, the SafeAILab glue cut); they replace the earlier entries of the same names."""
    s9 = prose_entry

    probe = S9P + "step_probe_8b_tree_stages1.json"
    run = ["runs", {"norm_mode": "kernel"}]
    head = ["results", "headline"]
    smol = ["parts", "smollm2", "runs", {"dtype": "bfloat16"}]
    return [
        s9("target_8b_plain_step", "ms", probe, run + ["decode_step_ms"], 2, "c2c5e13",
           "plain decode step 5.80 ms against a floor of 5.32 ms (1.09x;", "5.80",
           "the target's decode graph (bench/probes/step_probe.py); commit: the code measured is 700ff0b",
           ["floor_ms"], "floor", "5.32", "1.09"),
        s9("target_8b_verify60", "ms", probe, run + ["verify_ms"], 2, "c2c5e13",
           "60-row verify forward 6.50 ms (1.22x the same floor)", "6.50",
           "the target's 60-row verify graph; commit: the code measured is 700ff0b", ["floor_ms"], "floor", None,
           "1.22"),
        s9("drafter_in_step_8b", "ms", probe, run + ["spec_60/7/10_draft_in_step_ms"], 2, "c2c5e13",
           "the draft inside it costs 2.48 ms", "2.48",
           "the 60/7/10 step graph replayed minus the same graph without its draft (the last tree reused); "
           "the code measured is 700ff0b"),
        s9("smollm2_plain_tok_s", "tok/s", S9 + "bench_engine.json", smol + ["plain", "tokens_per_second"], 1,
           "014d841", "plain decoding 1134.8 tok/s in the engine benchmark below", "1134.8",
           "the engine benchmark (20 MT-bench prompts x 128 tokens); same figure as engine_smollm2_bf16_plain_tok_s"),
        s9("smollm2_bf16_identical", "prompts of 20", S9 + "bench_engine.json",
           smol + ["trees", {"tree": "60/7/10"}, "identical_prompts"], 0, "014d841",
           "bf16 speculative output is identical to plain on 20 of 20 MT-bench prompts", "20",
           "the engine benchmark's best tree (every tree: 20 of 20)"),
        s9("smollm2_prefill_1k", "ms", S9 + "target_smollm2.json", ["parts", "smollm2", "new", "prefill_1000_ms"], 2,
           "014d841", "a 1,000-token prefill takes 6.49 ms", "6.49"),
        s9("safeailab_8b_step_unpatched", "ms", S9 + "bench_safeailab.json", head + ["safeailab_8b_step_unpatched"],
           1, "014d841", "`eagenerate` step: 64.6 ms", "64.6"),
        s9("safeailab_8b_step_drafter_patched", "ms", S9 + "bench_safeailab.json",
           head + ["safeailab_8b_step_drafter_patched"], 1, "014d841", "56.0 ms with the drafter patch", "56.0"),
        s9("safeailab_8b_step_optimized", "ms", S9 + "bench_safeailab.json", head + ["safeailab_8b_step_optimized"],
           2, "014d841", "10.40 ms after `optimize_eagle_with_triton`", "10.40"),
        s9("safeailab_8b_topk_call_patched", "ms", S9 + "bench_safeailab.json",
           head + ["safeailab_8b_topk_call_patched"], 2, "014d841",
           "`topK_genrate` with the drafter patch: 2.60 ms per call", "2.60"),
        s9("spec_step_8b_60_7_10_safeailab_run", "ms", S9 + "bench_safeailab.json", head + ["spec_step_8b_60_7_10"],
           2, "014d841", "our engine's own speculative step at that shape in the same run, 9.26 ms", "9.26",
           "measured by bench/bench_safeailab.py; spec_step_8b_60_7_10 is the engine benchmark's"),
    ]


def session12_entries() -> list[dict]:
    """Session 12's figures printed in the README's prose (RoPE in the q/k/v product's epilogue, the verify's
    attention as two launches); they replaced session 11's entries of the same names (the README no longer prints
    those; they stay in bench/results/session11_2026-11-26/)."""
    def s12(*a, **kw):
        return prose_entry(*a, date="2026-11-26", **kw)

    probe = S12 + "step_8b_merge_in_tree.json"
    run = ["runs", {"norm_mode": "folded"}]
    probe_commit = _adding_commit(ROOT / RESULTS / probe) or "uncommitted"
    measured = "the code measured is 7e12e93's"
    probe_measured = "the code measured is 3ad858a's"
    return [
        s12("target_8b_plain_step", "ms", probe, run + ["decode_step_ms"], 2, probe_commit,
            "decode step 5.64 ms against a floor of 5.32 ms", "5.64",
            "the target's decode graph (bench/probes/step_probe.py), norms folded, RoPE in the q/k/v epilogue; "
            + probe_measured, ["floor_ms"], "floor", "5.32", None),
        s12("target_8b_verify60", "ms", probe, run + ["verify_ms"], 2, probe_commit,
            "60-row verify forward 6.15 ms (1.16x the same floor)", "6.15",
            "the target's 60-row verify graph; " + probe_measured, ["floor_ms"], "floor", None, "1.16"),
        s12("drafter_in_step_8b", "ms", S12 + "step_8b_rope_h100.json",
            ["runs", {"fuse_rope": True}, "spec_60/7/10_draft_in_step_ms"], 2,
            _adding_commit(ROOT / RESULTS / S12 / "step_8b_rope_h100.json") or "uncommitted",
            "draft inside it costs 2.48 ms", "2.48",
            "the 60/7/10 step graph replayed minus the same graph without its draft (the last tree reused); "
            + measured),
        s12("target_8b_bf16_identical", "prompts of 20", S12 + "target_8b_identical.json",
            ["parts", "8b-identical", "identical"], 0,
            _adding_commit(ROOT / RESULTS / S12 / "target_8b_identical.json") or "uncommitted",
            "identical to plain greedy output on 20 of 20 random prompts at", "20",
            "60/7/10, 128 tokens, random weights, norms folded, RoPE fused (" + measured + ")"),
    ]


def session13_entries() -> list[dict]:
    """Session 13's figures printed in the README's prose (the small models' 64-wide reduction chunks); they replace
    session 12's entries of the same names (kept in its results set)."""
    def s13(*a, **kw):
        return prose_entry(*a, date="2026-11-26", **kw)

    smol = ["parts", "smollm2", "runs", {"dtype": "bfloat16"}]
    engine = S13 + "bench_engine.json"
    added = _adding_commit(ROOT / RESULTS / engine) or "uncommitted"
    return [
        s13("smollm2_plain_tok_s", "tok/s", engine, smol + ["plain", "tokens_per_second"], 1, added,
            "plain decoding 1448.4 tok/s in the engine benchmark", "1448.4",
            "the engine benchmark (40 MT-bench prompts x 128 tokens, the code measured is 13f908a's); same figure as "
            "engine_smollm2_bf16_plain_tok_s"),
        s13("smollm2_bf16_identical", "prompts of 40", engine,
            smol + ["trees", {"tree": "16/3/4"}, "identical_prompts"], 0, added,
            "bf16 speculative output is identical to plain on 40 of 40 MT-bench", "40",
            "the engine benchmark's best tree, 40 prompts (every tree: 40 of 40)"),
    ]


def session14_entries() -> list[dict]:
    """Session 14's figures printed in the README's prose (attention launches planned from a host bound, greedy
    acceptance in two kernels); they replace the earlier entries of the same names (kept in their results sets)."""
    def s14(*a, **kw):
        return prose_entry(*a, date="2026-11-27", **kw)

    def added(name):
        return _adding_commit(ROOT / RESULTS / S14 / name) or "uncommitted"

    probe, run = S14 + "step_8b_e370970.json", ["runs", {"prompt_len": 64}]
    smol = ["parts", "smollm2", "runs", {"dtype": "bfloat16"}]
    engine = S14 + "bench_engine.json"
    return [
        s14("target_8b_plain_step", "ms", probe, run + ["decode_step_ms"], 2, added("step_8b_e370970.json"),
            "decode step 5.63 ms against a floor of 5.32 ms", "5.63",
            "the target's decode graph at a 64-token prefix (bench/probes/step_probe.py); the code measured is "
            "e370970's (the target forward of 33c1aa5)", ["floor_ms"], "floor", "5.32", None),
        s14("target_8b_verify60", "ms", probe, run + ["verify_ms"], 2, added("step_8b_e370970.json"),
            "60-row verify forward 6.09 ms (1.145x the same floor", "6.09",
            "the target's 60-row verify graph at a 64-token prefix (every row within one attention split); at a "
            "300-token prefix 6.61 ms (step_8b_33c1aa5_a.json); the code measured is e370970's", ["floor_ms"],
            "floor", None, "1.145"),
        s14("target_8b_bf16_identical", "prompts of 20", S14 + "target_8b_identical.json",
            ["parts", "8b-identical", "identical"], 0, added("target_8b_identical.json"),
            "identical to plain greedy output on 20 of 20 random prompts at", "20",
            "60/7/10, 128 tokens after 24-199-token prompts, random weights (the code measured is 33c1aa5's)"),
        s14("smollm2_prefill_1k", "ms", S14 + "target_smollm2.json", ["parts", "smollm2", "new", "prefill_1000_ms"],
            2, added("target_smollm2.json"), "a 1,000-token prefill takes 4.43 ms", "4.43",
            "the code measured is 33c1aa5's"),
        s14("smollm2_plain_tok_s", "tok/s", engine, smol + ["plain", "tokens_per_second"], 1,
            added("bench_engine.json"),
            "plain decoding 1537.5 tok/s in the engine benchmark", "1537.5",
            "the engine benchmark (40 MT-bench prompts x 128 tokens, the code measured is 1f1c38c's); same figure as "
            "engine_smollm2_bf16_plain_tok_s"),
        s14("smollm2_bf16_identical", "prompts of 40", engine,
            smol + ["trees", {"tree": "16/3/4"}, "identical_prompts"], 0, added("bench_engine.json"),
            "bf16 speculative output is identical to plain on 40 of 40 MT-bench", "40",
            "the engine benchmark's best tree, 40 prompts (every tree: 40 of 40)"),
    ]


def session15_entries() -> list[dict]:
    """Session 15's figures printed in the README's prose (the FP8 weights converted with integer operations, the
    small-head tiles); they replace the earlier entries of the same names (kept in their results sets)."""
    def s15(*a, **kw):
        return prose_entry(*a, date="2026-11-27", **kw)

    def added(name):
        return _adding_commit(ROOT / RESULTS / S15 / name) or "uncommitted"

    def row(shape, weights, batch, tree="60/7/10"):
        return ["rows", {"shape": shape, "weights": weights, "batch": batch, "tree": tree, "scenario": "decode"}]

    fp8 = row("llama31-8b", "fp8", 1)
    smol = row("smollm2-135m", "bf16", 1, "16/3/4")
    return [
        s15("draft_8b_fp8_60_7_10_b1", "ms", S15 + "s15_8b_new.json", fp8 + ["fused_ms"], 3,
            added("s15_8b_new.json"), "the 8B shape with FP8 weights takes 1.964 ms (floor 1.016 ms", "1.964",
            "60/7/10 decode, batch 1; 2.213 ms before the integer conversion in the same lease (s15_8b_base.json)",
            fp8 + ["floor_ms"], "floor", "1.016", None),
        s15("draft_smollm2_16_3_4_b1", "ms", S15 + "s15_smollm2_new.json", smol + ["fused_ms"], 3,
            added("s15_smollm2_new.json"), "SmolLM2 head shape, 16/3/4: 0.186 ms", "0.186",
            "decode, batch 1; 0.201 ms with the 64-wide tiles in the same lease (s15_smollm2_base.json)",
            smol + ["floor_ms"], "floor", None, None),
    ]


def session16_entries() -> list[dict]:
    """Session 16's figures printed in the README's prose (SafeAILab's own eagenerate, optimized and patched, in one
    run); they replace session 10's entries of the same names (kept in bench/results/session10b_2026-11-26/)."""
    safe = S16 + "bench_safeailab.json"
    commit = _adding_commit(ROOT / RESULTS / safe) or "uncommitted"
    measured = "bench/bench_safeailab.py, SafeAILab EAGLE cb7e084; code 69d7512"
    # (entry name, key under results.headline, decimals, README text, printed value, note beyond `measured`)
    figures = [
        ("safeailab_8b_step_unpatched", None, 1, "55.8 ms unpatched", "55.8", ""),
        ("safeailab_8b_step_drafter_patched", None, 1, "37.5 ms with the drafter patch", "37.5", ""),
        ("safeailab_8b_step_optimized", None, 2, "8.85 ms after `optimize_eagle_with_triton`", "8.85",
         "; our engine's step in the same run is spec_step_8b_60_7_10_safeailab_run (ratio 1.01)"),
        ("safeailab_8b_topk_call_unpatched", None, 1, "2.58 ms per call (18.5 ms unpatched)", "18.5", ""),
        ("safeailab_8b_topk_call_patched", None, 2, "`topK_genrate` with the drafter patch: 2.58 ms", "2.58", ""),
        ("spec_step_8b_60_7_10_safeailab_run", "spec_step_8b_60_7_10", 2,
         "own speculative step at that shape in the same run, 8.75 ms", "8.75",
         "; spec_step_8b_60_7_10 is the engine benchmark's"),
    ]
    return [prose_entry(name, "ms", safe, ["results", "headline", key or name], decimals, commit, text, printed,
                        measured + note, date="2026-11-27")
            for name, key, decimals, text, printed, note in figures]


def shipped_head_entries() -> list[dict]:
    """The shipped SmolLM2 head's mean accepted length (round 7, session 24) against round 6's, same prompts, same
    run (issue 22's headline names). Measured on an H200: a mean accepted length counts tokens, not time (greedy
    outputs equal plain decoding's on either card)."""
    src = S24 + "acceptance_heads.json"
    commit = _adding_commit(ROOT / RESULTS / src) or "uncommitted"
    measured = "bench/bench_acceptance.py, 40 prompts x 128 tokens, greedy, 60/7/10, bf16 engine, fused drafter"
    out = []
    for name, key, text, printed, ref_printed in (
            ("smollm2_tau_mtbench", "mtbench", "accepts 4.14 tokens per step on MT-bench (round 6: 3.91)", "4.14",
             "3.91"),
            ("smollm2_tau_humaneval", "humaneval", "and 5.70 on HumanEval (round 6: 5.30)", "5.70", "5.30")):
        run = ["engine", "tau_by_head", f"{key}/60/7/10/T=0", "tau"]
        readme = [{"text": text, "printed": printed}, {"text": text, "printed": ref_printed, "field": "baseline"}]
        out.append(entry(name, "tokens per step", src, run + ["new"], 2, H200, commit, readme, run + ["old"],
                         "baseline", measured + "; baseline: the round-6 head", date="2026-11-27"))
    return out


def session24_entries() -> list[dict]:
    """Session 24's H100 figures printed in prose: fp8_tau_ratio (issue 19: the shipped head's mean accepted length
    with FP8 draft weights over bf16's, same prompts, same run; the round-1 head's was 0.991 in session 8) and
    drafter_in_step_8b (issue 18: the 8B step graph replayed with and without its draft)."""
    fp8 = S24 + "acceptance_fp8.json"
    probe = "session24b_2026-11-27/step_probe_8b.json"
    return [prose_entry("fp8_tau_ratio", "FP8 / bf16 mean accepted length", fp8,
                        ["engine", "fp8_tau_ratio", "mtbench/60/7/10", "ratio"], 3,
                        _adding_commit(ROOT / RESULTS / fp8) or "uncommitted", "(fp8_tau_ratio 1.001;", "1.001",
                        "shipped SmolLM2 head (round 7), 40 MT-bench prompts x 128 tokens, greedy, 60/7/10, "
                        "bf16 engine",
                        date="2026-11-27"),
            prose_entry("drafter_in_step_8b", "ms", probe, ["runs", {"norm_mode": "folded"},
                                                            "spec_60/7/10_draft_in_step_ms"], 2,
                        _adding_commit(ROOT / RESULTS / probe) or "uncommitted",
                        "the draft costs 2.48 ms inside the step", "2.48",
                        "bench/probes/step_probe.py, code 84ca879: the 60/7/10 step graph replayed minus the same "
                        "graph without its draft (the last tree reused); the drafter alone: 2.51 ms in the same lease",
                        date="2026-11-27")]


def session25_entries() -> list[dict]:
    """Session 25's 8B step on two more H100 leases (issue 18's 1.15x), printed in prose: the same code on other
    machines, each run beside session 24's code in the same lease."""
    out = []
    tree = ["parts", "llama8b", "trees", {"tree": "60/7/10"}]
    for name, ab, text, printed, floor, ratio in (
            ("spec_step_8b_60_7_10_s25_lease_b", "ab2", "8.447 ms against a floor of 7.345 ms (1.150x) on one",
             "8.447", "7.345", "1.150x"),
            ("spec_step_8b_60_7_10_s25_lease_c", "ab3", "8.481 ms against 7.340 ms (1.155x) on another", "8.481",
             "7.340", "1.155x")):
        src = f"session25_2026-11-28/bench_engine_8b_{ab}_new.json"
        out.append(prose_entry(name, "ms", src, tree + ["step_ms"], 3, _adding_commit(ROOT / RESULTS / src)
                               or "uncommitted", text, printed,
                               "bench/bench_engine.py --parts b --trees-8b 60/7/10 --no-drafter-alone, the working "
                               "tree after b00e51d (one graph per step; the tree attention's table reads)",
                               tree + ["spec_floor_ms"], "floor", floor, ratio.rstrip("x"), date="2026-11-28"))
    return out


def session26_entries() -> list[dict]:
    """Session 26's 8B step (issue 18's 1.15x), printed in prose: the rotated gate/up and q/k/v products on one
    lease, beside session 25's code, and the greedy steps' argmax keys on another, beside the rotation's code."""
    tree = ["parts", "llama8b", "trees", {"tree": "60/7/10"}]
    out = []
    for name, src, text, printed, floor, ratio, code in (
            ("spec_step_8b_60_7_10_s26_lease_d", "bench_engine_8b_d_new.json",
             "the committed code measured 8.445 ms against 7.339 ms (1.151x)", "8.445", "7.339", "1.151",
             "the working tree after 80c9e4f (gate/up and q/k/v+RoPE in rotated chunk order)"),
            ("spec_step_8b_60_7_10_s26_lease_e", "bench_engine_8b_e2_new.json",
             "argmax key instead of its logits measured 8.403 ms against 7.343 ms (1.144x)", "8.403", "7.343",
             "1.144", "the working tree after 7dbf41d (the lm_head's argmax keys in greedy steps)")):
        src = "session26_2026-11-28/" + src
        out.append(prose_entry(name, "ms", src, tree + ["step_ms"], 3, _adding_commit(ROOT / RESULTS / src)
                               or "uncommitted", text, printed,
                               "bench/bench_engine.py --parts b --trees-8b 60/7/10 --no-drafter-alone, " + code,
                               tree + ["spec_floor_ms"], "floor", floor, ratio, date="2026-11-28"))
    return out


def session27_entries() -> list[dict]:
    """Session 27's 8B step: the drafter's hidden half computed early, by default at batch 1, one lease, alternated
    with the same code without it (``--drafter-option hidden_half_early=0``)."""
    tree = ["parts", "llama8b", "trees", {"tree": "60/7/10"}]
    src = "session27_2026-11-28/bench_engine_8b_c_on1.json"
    return [prose_entry("spec_step_8b_60_7_10_s27_lease_c", "ms", src, tree + ["step_ms"], 3,
                        _adding_commit(ROOT / RESULTS / src) or "uncommitted",
                        "the step measured 8.358 ms against 7.345 ms (1.138x)", "8.358",
                        "bench/bench_engine.py --parts b --trees-8b 60/7/10 --no-drafter-alone, the working tree "
                        "after 95e6913 (the drafter's hidden half early by default at batch 1)",
                        tree + ["spec_floor_ms"], "floor", "7.345", "1.138", date="2026-11-28")]


S29_70B = "session29_2026-11-28/drafter_70b.json"  # the README's Llama-3.3-70B head-shape rows


def session28_entries() -> list[dict]:
    """Session 28's H100 figures: the draft inside the 8B step (issue 18, the step probe beside the engine benchmark's
    run of the same code) and the drafter at each head shape and weight dtype (issue 19's names), from the README's
    head-shape table (bench_fused_drafter.py --shapes ... --weights bf16,fp8 --batches 1,16; its 70B rows from
    session 29's rerun of that shape, ``S29_70B``)."""
    s28 = "session28_2026-11-28/"
    probe, shapes = s28 + "step_probe_8b.json", s28 + "drafter_shapes.json"
    out = [prose_entry("drafter_in_step_8b", "ms", probe, ["runs", 0, "spec_60/7/10_draft_in_step_ms"], 2,
                       _adding_commit(ROOT / RESULTS / probe) or "uncommitted",
                       "the draft costs 2.44 ms inside the step", "2.44",
                       "bench/probes/step_probe.py, code c370fb7: the 60/7/10 step graph replayed minus the same graph "
                       "without its draft (the last tree reused); the drafter alone: 2.47 ms in the same lease",
                       date="2026-11-28")]
    commit = _adding_commit(ROOT / RESULTS / shapes) or "uncommitted"
    names = {"llama31-8b": "Llama-3.1-8B", "qwen3-8b": "Qwen3-8B", "llama33-70b": "Llama-3.3-70B",
             "llama32-1b": "Llama-3.2-1B"}
    for name, shape, weights in (("draft_qwen3_8b_60_7_10_b1", "qwen3-8b", "bf16"),
                                 ("draft_70b_60_7_10_b1", "llama33-70b", "bf16"),
                                 ("draft_1b_60_7_10_b1", "llama32-1b", "bf16"),
                                 ("draft_8b_fp8_60_7_10_b1", "llama31-8b", "fp8"),
                                 ("draft_70b_fp8_60_7_10_b1", "llama33-70b", "fp8")):
        sel = ["rows", {"shape": shape, "weights": weights, "batch": 1, "tree": "60/7/10", "scenario": "decode"}]
        row = [names[shape], weights, "1"]
        if shape == "llama33-70b":  # the README's 70B rows: session 29's run after the 32-key attention blocks
            out.append(entry(name, "ms", S29_70B, sel + ["fused_ms"], 3, H100,
                             _adding_commit(ROOT / RESULTS / S29_70B) or "uncommitted",
                             [{"row": row, "column": "fused ms"}, {"row": row, "column": "floor ms", "field": "floor"}],
                             sel + ["floor_ms"], "floor",
                             "random head, decode (4 new rows on a 512-row prefix), code d1e52f2", date="2026-11-28"))
            continue
        out.append(entry(name, "ms", shapes, sel + ["fused_ms"], 3, H100, commit,
                         [{"row": row, "column": "fused ms"}, {"row": row, "column": "floor ms", "field": "floor"}],
                         sel + ["floor_ms"], "floor",
                         "random head, decode (4 new rows on a 512-row prefix), code c370fb7",
                         date="2026-11-28"))
    return out


S39 = "session39_2026-11-29/sweep/fused_drafter.json"  # the README's H200 head-shape table (session 39's defaults)
S40_BATCHES = "session40_2026-11-29/call2/sweep/fused_drafter.json"  # the same defaults, 60/7/10, batch 2, 4 and 8
S40_TREE = "session40_2026-11-29/call3/sweep/fused_drafter.json"  # the same defaults, 60/5/10, batch 1 and 16
S40_TREE_BATCHES = "session40_2026-11-29/call4/sweep/fused_drafter.json"  # 60/5/10, batch 2, 4 and 8
S34_ENGINE = "session34_2026-11-28/engine_8b/bench_engine.json"  # the 8B-shape engine step on the H200


def session30_entries() -> list[dict]:
    """The H200 figures of the drafter at each head shape (the README's H200 table; the only device lent since
    session 30), names as issue 19's with ``_h200``, bf16 and FP8: 60/7/10 batch 1 and 16 from session 39's sweep
    of the defaults at d8618d8; 60/7/10 batch 2, 4 and 8 and 60/5/10 batch 1-16 from session 40's (b1e805d and
    d2ac502: the same kernel code). The defaults measured: bf16's tail taken in one pass with the last full tile in
    o, gate/up and down; session 38's tail row tile: 160 rows as 128 + 32; session 37's lm_head keys ranked by
    warps at every FP8 row tile; session 36's RM on int32 keys; session 35's FP8 gate/up tiles 128 wide at
    4096-wide heads; session 34's final tree phase by tl.topk; session 33's q/k/v table, the hidden half early at
    batch 1 and 2; stream-K products, FP8 128-deep chunks and, at 128-row tiles of 4096-wide heads, the L2 prefetch
    from sessions 30-32. The floors
    count the bytes that code moves (with the table a tree step streams q/k/v's hidden half only). Also the
    8B-shape engine step on the H200 (``*_h200``: plain decode and the speculative step at 60/7/10 beside their
    floors), quoted in the README's prose."""
    names = {"llama31-8b": ("8b", "Llama-3.1-8B"), "qwen3-8b": ("qwen3_8b", "Qwen3-8B"),
             "llama33-70b": ("70b", "Llama-3.3-70B"), "llama32-1b": ("1b", "Llama-3.2-1B")}
    runs = [(S39, "60/7/10", (1, 16), "d8618d8", ""), (S40_BATCHES, "60/7/10", (2, 4, 8), "b1e805d", ""),
            (S40_TREE, "60/5/10", (1, 16), "b1e805d", "60/5/10 "),
            (S40_TREE_BATCHES, "60/5/10", (2, 4, 8), "d2ac502", "60/5/10 ")]
    out = []
    for src, tree, batches, code, column in runs:
        for shape in names:
            for weights in ("bf16", "fp8"):
                for batch in batches:
                    short, label = names[shape]
                    sel = ["rows", {"shape": shape, "weights": weights, "batch": batch, "tree": tree}]
                    name = (f"draft_{short}_" + ("fp8_" if weights == "fp8" else "")
                            + f"{tree.replace('/', '_')}_b{batch}_h200")
                    row = [label, weights, str(batch)]
                    out.append(entry(name, "ms", src, sel + ["fused_ms"], 3, H200,
                                     _adding_commit(ROOT / RESULTS / src) or "uncommitted",
                                     [{"row": row, "column": f"{column}H200 ms"},
                                      {"row": row, "column": f"{column}H200 floor ms", "field": "floor"}],
                                     sel + ["floor_ms"], "floor",
                                     f"random head, {tree} decode (4 new rows on a 512-row prefix), code {code}",
                                     date="2026-11-29"))
    eng = ["parts", "llama8b"]
    text = ("On the H200 the 8B-shape engine (random weights, bf16, batch 1, `bench_engine.py --parts b`, "
            "`session34_2026-11-28/engine_8b/`) decodes a plain token in 4.203 ms (floor 3.759) and takes 6.544 ms "
            "per speculative 60/7/10 step (floor 5.106: 1.28x)")
    commit = _adding_commit(ROOT / RESULTS / S34_ENGINE) or "uncommitted"
    out.append(entry("plain_step_8b_h200", "ms", S34_ENGINE, eng + ["plain", "step_ms"], 3, H200, commit,
                     [{"text": text, "printed": "4.203"}, {"text": text, "printed": "3.759", "field": "floor"}],
                     eng + ["plain", "floor_ms"], "floor", "random Llama-3.1-8B target, code b9ab6b2",
                     date="2026-11-28"))
    out.append(entry("spec_step_8b_60_7_10_h200", "ms", S34_ENGINE, eng + ["trees", {"tree": "60/7/10"}, "step_ms"],
                     3, H200, commit,
                     [{"text": text, "printed": "6.544"}, {"text": text, "printed": "5.106", "field": "floor"},
                      {"text": text, "printed": "1.28", "field": "ratio"}],
                     eng + ["trees", {"tree": "60/7/10"}, "spec_floor_ms"], "floor",
                     "random Llama-3.1-8B target and EAGLE-3 head, fused drafter, code b9ab6b2", date="2026-11-28"))
    return out


ENGINE_TABLES = ("smollm2", "llama8b")  # the parts of bench_engine.json that each print a README table


def engine_parts_sources() -> dict[str, str]:
    """The issue-18 engine result file of each part ("smollm2", "llama8b"), relative to bench/results/:
    ENGINE_PARTS_SOURCE for every part, else the newest committed bench_engine.json holding that part."""
    newest: dict[str, tuple[str, str]] = {}
    for path in (ROOT / RESULTS).glob("*/bench_engine.json"):
        doc = json.loads(path.read_text())
        if doc.get("benchmark") != "bench_engine" or "parts" not in doc:
            continue
        rel = path.relative_to(ROOT / RESULTS).as_posix()
        for part in set(doc["parts"]) & set(ENGINE_TABLES):
            if ENGINE_PARTS_SOURCE:
                newest[part] = ("", ENGINE_PARTS_SOURCE)
            elif part not in newest or doc["date"] > newest[part][0]:
                newest[part] = (doc["date"], rel)
    return {part: src for part, (_, src) in newest.items()}


def _adding_commit(path: Path) -> str | None:
    """The commit that gave ``path`` its current content (the one that added it, unless a later commit replaced it;
    None when it is not committed)."""
    import subprocess

    r = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=ROOT, capture_output=True, text=True)
    commits = r.stdout.split() if r.returncode == 0 else []
    return commits[0] if commits else None


def engine_parts_entries() -> list[dict]:
    """Every figure of the README's engine tables (bench/engine_table.py prints them from the same descriptions):
    issue 18's spec_step_8b_60_7_10 (with its floor), drafter_in_step_8b (when the engine timed the draft phase),
    smollm2_spec_tok_s (baseline: our plain decoding), smollm2_spec_speedup, smollm2_best_tree and
    projected_8b_tok_s_tau6 (a projection), and the other cells of those tables."""
    sys.path.insert(0, str(ROOT / "bench"))
    from engine_table import figures

    out = []
    for part, source in sorted(engine_parts_sources().items()):
        doc = json.loads((ROOT / RESULTS / source).read_text())
        measured = (doc["versions"].get("git_commit") or "")[:7]
        commit = _adding_commit(ROOT / RESULTS / source) or measured
        note = (f"commit: the commit that added the source; the code measured is {measured}" if measured != commit
                else None)
        # this table's part and the parts it reads (transformers' generate beside SmolLM2), not the other table's
        parts = {k: v for k, v in doc["parts"].items() if k == part or k not in ENGINE_TABLES}
        for f in figures({**doc, "parts": parts}):
            ref = (f["ref_path"], f["ref_kind"]) if "ref_kind" in f else (None, None)
            e = entry(f["name"], f["unit"], source, f["path"], f["decimals"], doc["versions"]["device_name"],
                      commit, f["readme"], *ref, "; ".join(x for x in (f.get("note"), note) if x) or None,
                      date=doc["date"][:10])
            if f.get("projection"):
                e["projection"] = True
            out.append(e)
    return out


def batch_source() -> str | None:
    """The issue-21 result file, relative to bench/results/: BATCH_SOURCE, else the newest committed
    bench_batch.json that is not a smoke run; None while there is none."""
    if BATCH_SOURCE:
        return BATCH_SOURCE
    found = []
    for path in (ROOT / RESULTS).glob("*/bench_batch.json"):
        doc = json.loads(path.read_text())
        if doc.get("benchmark") == "bench_batch" and not doc.get("smoke") and _adding_commit(path):
            found.append((doc["date"], path.relative_to(ROOT / RESULTS).as_posix()))
    return max(found)[1] if found else None


def batch_entries() -> list[dict]:
    """smollm2_spec_speedup_b{1,2,4,8,16} (best tree's total tok/s over plain, per batch size) and
    smollm2_throughput_b16_tok_s, each quoted in the README by its row of bench_batch.py's table."""
    source = batch_source()
    if source is None:
        return []
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_batch import table_row

    doc = json.loads((ROOT / RESULTS / source).read_text())
    device = doc["versions"].get("device_name", "")
    commit = _adding_commit(ROOT / RESULTS / source) or (doc["versions"].get("git_commit") or "")[:7]
    out = []
    for run in doc["parts"].get("smollm2", {}).get("runs", []):
        if "spec_speedup" not in run:
            continue
        b, row = run["batch"], table_row(run)
        runs = ["parts", "smollm2", "runs", {"batch": b}]
        out.append(entry(f"smollm2_spec_speedup_b{b}", "speculative / plain total tok/s", source,
                         runs + ["spec_speedup"], 2, device, commit,
                         [{"text": row, "printed": f"{run['spec_speedup']:.2f}"}], date=doc["date"][:10],
                         note=f"best tree {run['best_tree']} of {', '.join(doc['parts']['smollm2']['trees'])}, "
                              f"{doc['parts']['smollm2']['num_prompts']} MT-bench prompts, continuous batching"))
        if b == 16:
            best = run["trees"][run["best_tree"]]["tokens_per_second"]
            out.append(entry("smollm2_throughput_b16_tok_s", "tok/s", source,
                             runs + ["trees", run["best_tree"], "tokens_per_second"], 1, device, commit,
                             [{"text": row, "printed": f"{best:.1f}"}], date=doc["date"][:10],
                             note="total new tokens / wall time of the whole batch job, best tree"))
    return out


def _latest(entries: list[dict]) -> list[dict]:
    """One entry per name: a later session's entry replaces an earlier one of the same name (in place)."""
    last = {e["name"]: e for e in entries}
    seen, out = set(), []
    for e in entries:
        if e["name"] not in seen:
            seen.add(e["name"])
            out.append(last[e["name"]])
    return out


def main() -> None:
    doc = {"about": "The figures the project README quotes, one entry each. value, floor/baseline: copied from "
                    "`source` at `source_path`, rounded; ratio = value / floor (or baseline); commit: the commit that "
                    "added the source file; readme: where the README prints the figure (tests/test_headline.py "
                    "checks all of it). Written by bench/make_headline.py.",
           "entries": _latest(drafter_entries() + engine_entries() + session7_entries() + session8_entries()
                              + session9_entries() + session12_entries()
                              + session13_entries() + session14_entries() + session15_entries() + session16_entries()
                              + shipped_head_entries() + session24_entries() + session25_entries() + session26_entries()
                              + session27_entries() + session28_entries() + session30_entries()
                              + engine_parts_entries()
                              + batch_entries())}
    path = ROOT / RESULTS / "headline.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(doc['entries'])} entries to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
