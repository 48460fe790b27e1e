"""``eagle-triton bench``: tokens/s with and without speculation, mean accepted length, time per phase, a plot.

The baseline is the same engine decoding one token per step (``speculative=False``); greedy runs also check that
both produce identical tokens. Timings are wall-clock per ``generate`` call after one warm-up run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .generate import (
    DEFAULT_PROMPT,
    add_model_arguments,
    add_tree_arguments,
    build_engine,
    prompt_token_ids,
    tree_from_args,
)

PHASES = ("prefill_s", "draft_s", "verify_s", "accept_s")


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure tokens/s with and without speculation",
                              description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    g = p.add_argument_group("benchmark")
    g.add_argument("--prompt", action="append", help=f"prompt (repeatable; default {DEFAULT_PROMPT!r})")
    g.add_argument("--prompts-file", help="JSONL with a 'prompt' or 'turns' field per line")
    g.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per run (default 128)")
    g.add_argument("--num-runs", type=int, default=3, help="timed runs per prompt and mode (default 3)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-chat-template", action="store_true")
    add_tree_arguments(p)
    p.add_argument("--out", default=".", help="folder for bench.json and bench.png (default: current folder)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result JSON")
    p.set_defaults(func=run, no_speculation=False)


def _prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        for line in Path(args.prompts_file).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                prompts.append(row["prompt"] if "prompt" in row else row["turns"][0])
    return prompts or [DEFAULT_PROMPT]


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("plain", "speculative") if m in result["modes"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    tps = [result["modes"][m]["tokens_per_second"] for m in modes]
    a1.bar(modes, tps, color=["#888", "#2a7"][: len(modes)])
    a1.set_ylabel("tokens / s")
    a1.set_title(f"{result['device']}: {result['speedup']:.2f}x" if result.get("speedup") else result["device"])
    bottom = [0.0] * len(modes)
    for ph in PHASES:
        vals = [result["modes"][m]["phases_ms_per_token"][ph] for m in modes]
        a2.bar(modes, vals, bottom=bottom, label=ph[:-2])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    a2.set_ylabel("ms per new token")
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    import torch

    if args.num_runs < 1:
        print("eagle-triton bench: error: --num-runs must be >= 1", file=sys.stderr)
        return 2
    try:
        tree = tree_from_args(args)
        engine, tok, target_src, draft_src = build_engine(args, tree)
        prompts = [prompt_token_ids(tok, p, not args.no_chat_template) for p in _prompts(args)]
    except (OSError, ValueError, TypeError) as e:
        print(f"eagle-triton bench: error: {e}", file=sys.stderr)
        return 2
    modes = {"plain": False} | ({"speculative": True} if engine.speculative else {})
    runs: dict[str, list] = {m: [] for m in modes}
    identical = True
    engine.generate(input_ids=prompts[0], max_new_tokens=min(8, args.max_new_tokens))  # warm-up (compilation)
    for ids in prompts:
        outs = {}
        for mode, spec in modes.items():
            for r in range(args.num_runs):
                tokens, st = engine.generate(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                             temperature=args.temperature, seed=args.seed + r, speculative=spec)
                runs[mode].append(st)
                outs.setdefault(mode, tokens)
        if args.temperature <= 1e-5 and len(outs) == 2:
            identical &= outs["plain"] == outs["speculative"]
    result = {
        "command": "eagle-triton " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": torch.cuda.get_device_name() if engine.target.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "target": target_src, "draft": draft_src, "tree": str(tree), "dtype": str(engine.target.dtype),
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "num_runs": args.num_runs,
        "temperature": args.temperature, "modes": {},
    }
    for mode, stats in runs.items():
        new = sum(s.new_tokens for s in stats)
        total = sum(s.total_s for s in stats)
        steps = sum(s.steps for s in stats)
        result["modes"][mode] = {
            "tokens_per_second": new / total,
            "mean_accepted_length": sum(s.mean_accepted_length * s.steps for s in stats) / max(steps, 1),
            "new_tokens": new,
            "phases_ms_per_token": {ph: 1e3 * sum(getattr(s, ph) for s in stats) / max(new, 1) for ph in PHASES},
        }
    if "speculative" in result["modes"]:
        result["speedup"] = result["modes"]["speculative"]["tokens_per_second"] / result["modes"]["plain"][
            "tokens_per_second"]
        result["identical_greedy_output"] = identical if args.temperature <= 1e-5 else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    if not args.no_plot:
        _plot(result, out / "bench.png")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for mode, r in result["modes"].items():
            print(f"{mode:<12} {r['tokens_per_second']:8.1f} tok/s  accepted/step {r['mean_accepted_length']:.2f}  "
                  + "  ".join(f"{ph[:-2]} {v:.2f}" for ph, v in r["phases_ms_per_token"].items()) + " ms/token")
        if "speedup" in result:
            print(f"speedup {result['speedup']:.2f}x, identical greedy output: {result['identical_greedy_output']}")
        print(f"wrote {out / 'bench.json'}" + ("" if args.no_plot else f" and {out / 'bench.png'}"))
    return 0
