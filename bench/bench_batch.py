"""Batched generation benchmark (issue 21): throughput and the speculative/plain ratio per batch size.

Parts (``--parts``, comma-separated, default both; each has its own time budget, and what a part did not measure is
recorded as skipped):

- ``smollm2`` (a): SmolLM2-135M-Instruct (the cached default model) + the shipped head on ``--num-prompts``
  MT-bench first turns (chat template), greedy, ``--max-new-tokens`` each, through
  :meth:`EagleEngine.generate_batch` (continuous batching) at each batch size of ``--batches``: plain decoding once
  per batch size, then speculation with each tree of ``--trees``. Each job runs twice on the same engine: the
  first (``first_job_tokens_per_second``) includes the engine's one-time costs (CUDA-graph captures of the buckets
  it visits, compilation), the second is the figure. Per run: total tokens/s (all new tokens / wall time of the
  whole batch job, prefills and refills included), mean accepted length, and whether every sequence's tokens equal
  plain decoding's.
  Per batch size the best tree is the one with the highest measured tokens/s (``best_tree``), and
  ``spec_speedup`` = its tokens/s / plain tokens/s.
- ``llama8b`` (b, GPU only): the Llama-3.1-8B shape with random bf16 weights (``bench_target.build_8b``) and a random
  8B-shape EAGLE-3 head: ms per batched step, plain and speculative (each tree of ``--trees-8b``), per batch size,
  from ``generate_batch`` jobs of ``B`` random prompts (two job lengths: the time difference over the step
  difference, so the prefills cancel); and the tokens/s an accepted length of 3-6 would give
  (``B * tau / step``; ``"projection": true``: random weights accept about one token per step, so these are not
  measurements).

``--smoke``: a tiny random Llama built in code on the CPU with the model-free ``stub`` drafter, random prompts, a
few tokens: checks that the script runs end to end (its numbers mean nothing). ``--quick``: fewer prompts, tokens,
batch sizes and trees.

Writes ``bench_batch.json`` and ``bench_batch.png`` to ``--out`` (default ``$OUT``, else ``bench/results/``), and
prints the README table (``--table FILE`` prints it from a result file without measuring). The headline names
``smollm2_spec_speedup_b{1,2,4,8,16}`` and ``smollm2_throughput_b16_tok_s`` are in the JSON's ``headline``
(``bench/make_headline.py`` reads them from the committed result file).

Example (GPU)::

    python bench/bench_batch.py --out bench/results/<set>
    python bench/bench_batch.py --table bench/results/<set>/bench_batch.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from bench_engine import (  # noqa: E402
    default_questions,
    empty_cache,
    git_commit,
    load_prompts,
    parse_trees,
    smollm2_sources,
    sync,
    versions,
)
from results_guard import refuse_foreign  # noqa: E402

PARTS = {"a": "smollm2", "b": "llama8b"}
BATCHES = "1,2,4,8,16"
TREES = "60/7/10,32/5/6,16/3/4,8/2/3"
TREES_8B = "60/7/10,16/3/4"
TAUS = (3, 4, 5, 6)
TABLE_HEADER = ["batch", "total tok/s, plain", "total tok/s, speculative", "speculative / plain", "best tree",
                "mean accepted length", "identical output", "first job tok/s, plain / speculative"]


def parse_batches(text: str) -> list[int]:
    from eagle_triton.engine.batch import batch_bucket

    out = [int(x) for x in text.split(",") if x.strip()]
    for b in out:
        batch_bucket(b, speculative=True)  # every batch size runs speculative and plain: a clear error beyond
    if not out:
        raise SystemExit("--batches is empty")
    return out


def run_job(eng, prompts: list[list[int]], batch: int, max_new: int, speculative: bool, dev,
            temperature: float = 0.0, top_p: float = 1.0) -> dict:
    """One ``generate_batch`` job over every prompt: total tokens/s, mean accepted length, the tokens. Sampled
    (``temperature > 0``): prompt ``i`` seeded with ``i``."""
    sync(dev)
    t0 = time.perf_counter()
    res = eng.generate_batch(input_ids=prompts, max_new_tokens=max_new, batch_size=batch, speculative=speculative,
                             temperature=temperature, top_p=top_p, seeds=0)
    sync(dev)
    wall = time.perf_counter() - t0
    tokens = sum(len(t) for t, _ in res)
    steps = sum(s.steps for _, s in res)
    emitted = sum(s.mean_accepted_length * s.steps for _, s in res)
    return {"wall_s": wall, "new_tokens": tokens, "tokens_per_second": tokens / wall,
            "mean_accepted_length": emitted / steps if steps else 0.0, "tokens": [t for t, _ in res]}


def _smoke_engines(trees: list[str], max_length: int):
    """A tiny random Llama (built in code) with a random EAGLE-3 head and the stub drafter, one engine per tree."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle_triton import TreeConfig, TreeDrafter
    from eagle_triton.engine import EagleEngine, LlamaTarget
    from eagle_triton.testing import random_eagle3_head

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaTarget.from_hf(LlamaForCausalLM(cfg).eval())
    head = random_eagle3_head(hidden_size=32, vocab_size=128, draft_vocab_size=48, seed=1)
    return {tree: EagleEngine(target, drafter=TreeDrafter(head, TreeConfig(*map(int, tree.split("/"))),
                                                          backend="stub"), max_length=max_length)
            for tree in trees}


def part_smollm2(args, dev: torch.device, budget_s: float) -> dict:
    from eagle_triton import TreeConfig
    from eagle_triton.commands.generate import prompt_token_ids
    from eagle_triton.engine import EagleEngine, load_tokenizer

    t_end = time.perf_counter() + budget_s
    trees = parse_trees(args.trees)
    batches = parse_batches(args.batches)
    if args.smoke:
        engines = _smoke_engines(trees, args.max_length)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 128, (int(n),), generator=g).tolist()
                   for n in torch.randint(2, 12, (args.num_prompts,), generator=g)]
        out = {"target": "tiny random Llama (--smoke)", "draft": "stub drafter (--smoke)", "questions": None}
    else:
        target_src, draft_src = smollm2_sources(args)
        if draft_src is None:
            raise SystemExit("the smollm2 part needs a draft head: the shipped head is absent; pass --draft DIR")
        tok = load_tokenizer(target_src)
        qpath = Path(args.questions) if args.questions else default_questions()
        prompts = [prompt_token_ids(tok, text, True) for _, text in load_prompts(qpath, args.num_prompts)]
        engines = {}
        for tree in trees:  # one engine (and target) per tree: nothing shared between their CUDA graphs
            engines[tree] = EagleEngine.from_pretrained(
                target_src, draft_src, TreeConfig(*map(int, tree.split("/"))), device=dev, dtype=args.dtype,
                max_length=args.max_length, drafter_backend=args.drafter, tokenizer=tok)
        for eng in engines.values():  # every prefill chunk kind captured and compiled before the first job
            eng.warmup()
        out = {"target": target_src, "draft": draft_src, "questions": str(qpath)}
    out.update(num_prompts=len(prompts), max_new_tokens=args.max_new_tokens, trees=trees, batches=batches,
               budget_s=budget_s, greedy=args.temperature == 0, temperature=args.temperature, top_p=args.top_p,
               dtype=None if args.smoke else args.dtype, runs=[])
    plain_engine = engines[trees[0]]
    for b in batches:
        if time.perf_counter() > t_end:
            out["runs"].append({"batch": b, "skipped": "time budget"})
            continue
        # each configuration runs the whole job twice: the first includes the one-time costs of this engine at this
        # batch size (the CUDA-graph captures of each bucket the job visits, compiling the drafter for a batch),
        # the second is the throughput of a warmed engine (graphs kept across jobs and buckets); both are
        # recorded, the second is the figure
        sampling = dict(temperature=args.temperature, top_p=args.top_p)
        first = run_job(plain_engine, prompts, b, args.max_new_tokens, False, dev, **sampling)
        plain = run_job(plain_engine, prompts, b, args.max_new_tokens, False, dev, **sampling)
        row = {"batch": b, "plain": dict({k: v for k, v in plain.items() if k != "tokens"},
                                          first_job_tokens_per_second=first["tokens_per_second"]),
               "trees": {}}
        print(f"batch {b}: plain {plain['tokens_per_second']:.1f} tok/s (first job "
              f"{first['tokens_per_second']:.1f})", flush=True)
        for tree, eng in engines.items():
            if time.perf_counter() > t_end:
                row["trees"][tree] = {"skipped": "time budget"}
                continue
            first = run_job(eng, prompts, b, args.max_new_tokens, True, dev, **sampling)
            spec = run_job(eng, prompts, b, args.max_new_tokens, True, dev, **sampling)
            # sampled outputs are not compared: speculation draws other coins than plain decoding (same distribution)
            same = (spec.pop("tokens") == plain["tokens"] and first["tokens"] == plain["tokens"]
                    if args.temperature == 0 else None)
            row["trees"][tree] = dict(spec, identical_output=same,
                                      first_job_tokens_per_second=first["tokens_per_second"])
            print(f"batch {b}: {tree} {spec['tokens_per_second']:.1f} tok/s (first job "
                  f"{first['tokens_per_second']:.1f}), accepted {spec['mean_accepted_length']:.2f}, identical "
                  f"{same}", flush=True)
        measured = {t: r for t, r in row["trees"].items() if "skipped" not in r}
        if measured:
            best = max(measured, key=lambda t: measured[t]["tokens_per_second"])
            row["best_tree"] = best
            row["spec_speedup"] = measured[best]["tokens_per_second"] / plain["tokens_per_second"]
        out["runs"].append(row)
        if not args.smoke:
            empty_cache(dev)
    best = {r["batch"]: r["best_tree"] for r in out["runs"] if "best_tree" in r}
    out["best_trees"] = {str(b): t for b, t in best.items()}
    # the measured choice, as `eagle-triton generate --batch-trees` (and EagleEngine(batch_trees=...)) take it
    out["batch_trees_option"] = ",".join(f"{b}={t}" for b, t in best.items())
    return out


def part_llama8b(args, dev: torch.device, budget_s: float) -> dict:
    """Batched step times at the 8B shape with random weights (GPU), and projected tok/s at accepted lengths 3-6."""
    import bench_fused_drafter as bfd
    import bench_target as bt

    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine

    if dev.type != "cuda" and not args.smoke:
        return {"skipped": "needs a CUDA GPU"}
    t_end = time.perf_counter() + budget_s
    trees = parse_trees(args.trees_8b)
    batches = parse_batches(args.batches)
    n_new = args.new_tokens_8b
    max_len = args.prompt_len_8b + n_new + 64
    if args.smoke:  # the code path only, on the tiny model (its numbers mean nothing)
        engines = _smoke_engines(trees, max_len)
        V = 128
        out = {"shape": "tiny random Llama (--smoke)", "head": "stub drafter (--smoke)"}
    else:
        from eagle_triton.engine import load_target

        empty_cache(dev)
        model = bt.build_8b()
        V = model.config.vocab_size
        target = load_target(model, device=dev, dtype="bfloat16")  # one target shared by the trees' engines
        del model
        empty_cache(dev)
        head = bfd.make_head("llama31-8b", False)
        engines = {tree: EagleEngine(target, head, TreeConfig(*map(int, tree.split("/"))), max_length=max_len,
                                     drafter_backend=args.drafter) for tree in trees}
        out = {"shape": "llama-3.1-8b", "weights": "random (transformers init)", "head": "random EAGLE-3, 8B shape",
               "dtype": "bfloat16"}
    g = torch.Generator().manual_seed(0)
    out.update(prompt_tokens=args.prompt_len_8b, new_tokens=n_new, trees=trees, batches=batches, budget_s=budget_s,
               runs=[])

    def job(eng, prompts, b, speculative, n) -> tuple[float, int]:
        sync(dev)
        t0 = time.perf_counter()
        res = eng.generate_batch(input_ids=prompts, max_new_tokens=n, batch_size=b, speculative=speculative,
                                 eos_token_id=None)
        sync(dev)
        return time.perf_counter() - t0, max(s.steps for _, s in res)

    def step_ms(eng, prompts, b, speculative) -> float:
        """ms per step of ``b`` sequences: two jobs of different lengths, the difference of their times over the
        difference of their steps (the prefills, the same in both, cancel)."""
        job(eng, prompts, b, speculative, 8)  # warm-up: capture, compilation
        t_short, s_short = job(eng, prompts, b, speculative, max(2, n_new // 4))
        t_long, s_long = job(eng, prompts, b, speculative, n_new)
        return (t_long - t_short) * 1e3 / max(s_long - s_short, 1)

    for b in batches:
        if time.perf_counter() > t_end:
            out["runs"].append({"batch": b, "skipped": "time budget"})
            continue
        prompts = [torch.randint(0, V, (args.prompt_len_8b,), generator=g).tolist() for _ in range(b)]
        plain = step_ms(engines[trees[0]], prompts, b, False)
        row = {"batch": b, "plain_step_ms": plain, "plain_tok_s": b * 1e3 / plain, "trees": {}}
        for tree, eng in engines.items():
            if time.perf_counter() > t_end:
                row["trees"][tree] = {"skipped": "time budget"}
                continue
            ms = step_ms(eng, prompts, b, True)
            row["trees"][tree] = {"step_ms": ms, "break_even_accepted_length": ms / plain, "projection": True,
                                  "projected_tok_s": {str(t): b * t * 1e3 / ms for t in TAUS}}
        print(f"8b batch {b}: plain {plain:.2f} ms/step, " + ", ".join(
            f"{t} {r['step_ms']:.2f}" for t, r in row["trees"].items() if "step_ms" in r), flush=True)
        out["runs"].append(row)
    return out


def headline(doc: dict) -> dict:
    """``smollm2_spec_speedup_b{B}`` for each measured batch size and ``smollm2_throughput_b16_tok_s`` (the best
    tree's total tokens/s at batch 16)."""
    out = {}
    for run in doc.get("parts", {}).get("smollm2", {}).get("runs", []):
        if "spec_speedup" in run:
            out[f"smollm2_spec_speedup_b{run['batch']}"] = run["spec_speedup"]
            if run["batch"] == 16:
                out["smollm2_throughput_b16_tok_s"] = run["trees"][run["best_tree"]]["tokens_per_second"]
    return out


def table_row(run: dict) -> str:
    """One batch size's README table row (``make_headline.py`` quotes it as the text of its figures)."""
    best = run["trees"][run["best_tree"]]
    firsts = [r.get("first_job_tokens_per_second") for r in (run["plain"], best)]
    first = " / ".join(f"{v:.1f}" for v in firsts) if None not in firsts else "not measured"
    return (f"| {run['batch']} | {run['plain']['tokens_per_second']:.1f} | {best['tokens_per_second']:.1f} | "
            f"{run['spec_speedup']:.2f}x | {run['best_tree']} | {best['mean_accepted_length']:.2f} | "
            f"{ {True: 'yes', False: 'no', None: 'sampled'}[best['identical_output']]} | {first} |")


def table(doc: dict) -> str:
    """The README table of part a (one row per batch size)."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += [table_row(run) for run in doc.get("parts", {}).get("smollm2", {}).get("runs", [])
              if "spec_speedup" in run]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> bool:
    """Total tokens/s per batch size (plain and every tree) and the best speed-up; False when nothing to plot."""
    runs = [r for r in doc.get("parts", {}).get("smollm2", {}).get("runs", []) if "plain" in r]
    if not runs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["batch"] for r in runs]
    ax1.plot(xs, [r["plain"]["tokens_per_second"] for r in runs], "k--o", label="plain")
    for tree in doc["parts"]["smollm2"]["trees"]:
        pts = [(r["batch"], r["trees"][tree]["tokens_per_second"]) for r in runs
               if "tokens_per_second" in r["trees"].get(tree, {})]
        if pts:
            ax1.plot(*zip(*pts, strict=True), "-o", label=f"speculative {tree}")
    ax1.set(xscale="log", xlabel="batch size", ylabel="total tokens/s", title="SmolLM2-135M, continuous batching")
    ax1.set_xticks(xs, [str(x) for x in xs])
    ax1.legend(fontsize=8)
    sp = [(r["batch"], r["spec_speedup"]) for r in runs if "spec_speedup" in r]
    if sp:
        ax2.plot(*zip(*sp, strict=True), "-o")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set(xscale="log", xlabel="batch size", ylabel="speculative / plain (best tree)", title="speed-up")
    ax2.set_xticks(xs, [str(x) for x in xs])
    fig.suptitle(f"{doc['versions'].get('device_name', '')} {doc['date'][:10]}" + (" (smoke)" if doc["smoke"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_batch_trees(source: Path) -> Path:
    """The best tree per batch size of ``source`` (a bench_batch.json whose SmolLM2 part ran the shipped head on
    CUDA) into the shipped head's ``tuned_trees.json``, with where it comes from."""
    from eagle_triton.commands._tuned_trees import write_tuned_batch_trees
    from eagle_triton.engine.default_model import DEFAULT_HEAD_DIR

    doc = json.loads(source.read_text())
    part = doc.get("parts", {}).get("smollm2")
    if doc.get("benchmark") != "bench_batch" or doc.get("smoke") or not part:
        raise SystemExit(f"{source}: not a bench_batch.json with a measured SmolLM2 part")
    if Path(part["draft"]).resolve() != DEFAULT_HEAD_DIR.resolve():
        raise SystemExit(f"{source}: its draft head is {part['draft']}, not the shipped head")
    if not doc["versions"].get("cuda"):
        raise SystemExit(f"{source}: not measured on a CUDA device")
    runs = [r for r in part["runs"] if "best_tree" in r]
    trees = {r["batch"]: r["best_tree"] for r in runs}
    measured = {"device_name": doc["versions"]["device_name"], "date": doc["date"],
                "dtype": part.get("dtype", "bfloat16"), "git_commit": doc["versions"].get("git_commit"),
                "source": source.resolve().relative_to(REPO).as_posix() if source.resolve().is_relative_to(REPO)
                else str(source), "num_prompts": part["num_prompts"],
                "speculative_over_plain": {str(r["batch"]): round(r["spec_speedup"], 3) for r in runs}}
    return write_tuned_batch_trees(DEFAULT_HEAD_DIR, "cuda", trees, measured)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="smollm2,llama8b", help="comma-separated: smollm2 (a), llama8b (b)")
    p.add_argument("--smoke", action="store_true", help="tiny random model on the CPU, stub drafter (runs only)")
    p.add_argument("--quick", action="store_true", help="16 prompts x 64 tokens, batches 1,4,16, two trees")
    p.add_argument("--target"), p.add_argument("--draft"), p.add_argument("--questions")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batches", default=BATCHES)
    p.add_argument("--trees", default=TREES, help="candidate trees per batch size (the best is chosen by tok/s)")
    p.add_argument("--trees-8b", default=TREES_8B)
    p.add_argument("--prompt-len-8b", type=int, default=128)
    p.add_argument("--new-tokens-8b", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample every sequence at this temperature (prompt i seeded with i); 0: greedy, and the "
                        "outputs are checked against plain decoding's")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of the sampled runs")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--drafter", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--budget-a", type=float, default=300.0, help="seconds for part a's measurements")
    p.add_argument("--budget-b", type=float, default=120.0, help="seconds for part b's measurements")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    p.add_argument("--table", help="print the README table of this bench_batch.json and exit")
    p.add_argument("--write-batch-trees", metavar="JSON",
                   help="record the best tree per batch size of this bench_batch.json (SmolLM2 part, shipped head) "
                        "in the shipped head's tuned_trees.json (eagle-triton generate --prompts-file's default) and "
                        "exit; measures nothing")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    if args.write_batch_trees:
        print(f"wrote {write_batch_trees(Path(args.write_batch_trees))}")
        return 0
    if args.quick:
        args.num_prompts, args.max_new_tokens = min(args.num_prompts, 16), min(args.max_new_tokens, 64)
        args.batches, args.trees, args.trees_8b = "1,4,16", "60/7/10,16/3/4", "16/3/4"
    if args.smoke:
        args.num_prompts, args.max_new_tokens, args.max_length = min(args.num_prompts, 6), 6, 64
        args.batches, args.trees, args.trees_8b = "1,2,4", "6/2/2,4/1/3", "6/2/2"
        args.prompt_len_8b, args.new_tokens_8b = 5, 8
    parts = [PARTS.get(x.strip(), x.strip()) for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS.values()]
    if bad:
        raise SystemExit(f"unknown part(s) {bad}: choose from {', '.join(PARTS.values())}")
    if args.smoke:
        dev = torch.device("cpu")
    else:
        dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                           (args.device if args.device != "auto" else "cpu"))
    refuse_foreign("bench_batch", Path(args.out) / "bench_batch.json", Path(args.out) / "bench_batch.png")
    doc = {"benchmark": "bench_batch", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "smoke": bool(args.smoke), "quick": bool(args.quick), "versions": {**versions(), **git_commit()},
           "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else
           "bench_batch.py " + " ".join(argv), "parts": {}}
    for part in parts:
        if part == "smollm2":
            doc["parts"]["smollm2"] = part_smollm2(args, dev, args.budget_a)
        else:
            doc["parts"]["llama8b"] = part_llama8b(args, dev, args.budget_b)
    doc["headline"] = headline(doc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_batch.json").write_text(json.dumps(doc, indent=1) + "\n")
    if plot(doc, out / "bench_batch.png"):
        print(f"wrote {out / 'bench_batch.png'}")
    print(f"wrote {out / 'bench_batch.json'}")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
