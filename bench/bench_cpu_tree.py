"""Which draft tree makes speculation pay on the CPU: plain vs speculative tokens/s for a handful of trees.

The default target (SmolLM2-135M-Instruct, from its cached converted copy) and the shipped EAGLE-3 head, greedy,
fp32, over the first MT-bench first turns (chat template applied). Every prompt is decoded once plainly and once
per tree through the same engine, interleaved and repeated ``--repeats`` times (the median time of each counts), so
a slow spell of a shared machine hits every configuration alike. Each speculative output is checked token for
token against the plain one. The JSON (device, date, versions, commit, the exact command) goes to the path given;
``best_tree`` is the tree with the highest speedup (total tokens / total median seconds) among those with identical
outputs, the value the CLI's CPU default should take.

Example (the full measurement; about 20 minutes on a quiet 2-core machine)::

    python bench/bench_cpu_tree.py bench/results/cpu_tree/cpu_tree.json --num-prompts 8 --max-new-tokens 64 \\
        --repeats 3
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_engine import load_prompts  # the scripts of bench/ run with bench/ on sys.path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TREES = "60/7/10,32/5/6,16/3/4,12/4/2,8/3/2,6/5/1,10/2/4,8/2/3,6/1/5,4/1/3"


def parse_tree(text: str):
    from eagle_triton import TreeConfig

    try:
        total, depth, top_k = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a tree is TOTAL/DEPTH/TOP_K, e.g. 16/3/4, got {text!r}") from None
    return TreeConfig(total, depth, top_k)


def git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "transformers", "tokenizers", "eagle-triton"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="where to write the JSON result")
    p.add_argument("--trees", default=DEFAULT_TREES,
                   help=f"comma-separated TOTAL/DEPTH/TOP_K (default {DEFAULT_TREES})")
    p.add_argument("--questions", default=str(REPO / "bench" / "data" / "mt_bench_questions.jsonl"))
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per prompt and configuration (median kept)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: what the CLI would use)")
    args = p.parse_args(argv)
    trees = [parse_tree(t) for t in args.trees.split(",")]
    if args.num_prompts < 1 or args.max_new_tokens < 1 or args.repeats < 1:
        p.error("--num-prompts, --max-new-tokens and --repeats must be >= 1")

    sys.path.insert(0, str(REPO / "src"))
    from eagle_triton.commands.generate import cpu_threads, prompt_token_ids
    from eagle_triton.engine import EagleEngine, load_head, load_target, load_tokenizer
    from eagle_triton.engine.default_model import default_draft_head_path, default_target_source

    threads = cpu_threads(args.threads)
    head_dir = default_draft_head_path()
    if head_dir is None:
        p.error("no shipped draft head (src/eagle_triton/assets/smollm2-eagle3/): nothing to measure")
    source = default_target_source()
    target = load_target(str(source), device="cpu", dtype="float32")
    tok = load_tokenizer(source)
    head = load_head(str(head_dir), target)
    prompts = [(qid, prompt_token_ids(tok, text, True)) for qid, text in load_prompts(Path(args.questions),
                                                                                     args.num_prompts)]
    max_length = max(len(ids) for _, ids in prompts) + args.max_new_tokens + 8
    engines = {str(t): EagleEngine(target, head, t, max_length=max_length, drafter_backend="torch") for t in trees}
    plain_engine = next(iter(engines.values()))
    warm = prompts[0][1]
    for eng in engines.values():  # first-call costs (allocations, lazy imports) stay out of the numbers
        eng.generate(input_ids=warm, max_new_tokens=4)
    plain_engine.generate(input_ids=warm, max_new_tokens=4, speculative=False)

    configs = ["plain", *engines]
    times: dict[str, list[list[float]]] = {c: [[] for _ in prompts] for c in configs}
    tokens: dict[str, list[int]] = {c: [0] * len(prompts) for c in configs}
    outputs: dict[str, list[list[int]]] = {c: [[] for _ in prompts] for c in configs}
    accepted: dict[str, list[float]] = {c: [0.0] * len(prompts) for c in engines}
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        for i, (_, ids) in enumerate(prompts):
            for c in configs:
                eng = plain_engine if c == "plain" else engines[c]
                out, st = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, speculative=c != "plain")
                times[c][i].append(st.total_s)
                tokens[c][i], outputs[c][i] = st.new_tokens, out
                if c != "plain":
                    accepted[c][i] = st.mean_accepted_length
        print(f"round {rep + 1}/{args.repeats} done after {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    def tok_s(c: str) -> float:
        return sum(tokens[c]) / sum(statistics.median(ts) for ts in times[c])

    plain_rate = tok_s("plain")
    runs = []
    for c in engines:
        identical = sum(outputs[c][i] == outputs["plain"][i] for i in range(len(prompts)))
        per_prompt = [
            {"question_id": qid, "new_tokens": tokens[c][i], "identical": outputs[c][i] == outputs["plain"][i],
             "mean_accepted_length": accepted[c][i],
             "speedup": statistics.median(times["plain"][i]) / statistics.median(times[c][i])
             * tokens[c][i] / max(1, tokens["plain"][i])}
            for i, (qid, _) in enumerate(prompts)]
        rate = tok_s(c)
        runs.append({"tree": c, "speculative_tokens_per_second": rate, "speedup": rate / plain_rate,
                     "identical_prompts": identical,
                     "mean_accepted_length": statistics.fmean(accepted[c]), "prompts": per_prompt})
        print(f"{c:>9}: {rate:6.1f} tok/s vs plain {plain_rate:6.1f} (x{rate / plain_rate:.2f}), mean accepted "
              f"length {statistics.fmean(accepted[c]):.2f}, identical {identical}/{len(prompts)}", file=sys.stderr)
    lossless = [r for r in runs if r["identical_prompts"] == len(prompts)]
    best = max(lossless, key=lambda r: r["speedup"]) if lossless else None
    result = {
        "benchmark": "bench_cpu_tree",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git_commit(),
        "versions": versions(),
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "target": str(source),
        "draft": str(head_dir),
        "dtype": "float32",
        "drafter": "torch",
        "questions": args.questions,
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "plain_tokens_per_second": plain_rate,
        "runs": runs,
        "best_tree": best["tree"] if best else None,
        "best_speedup": best["speedup"] if best else None,
        "seconds": time.perf_counter() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)
    print(f"best tree {result['best_tree']} (x{result['best_speedup']:.2f}); wrote {out}" if best
          else f"no tree gave identical outputs on every prompt; wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
