"""``eagle-triton bench``: tokens/s with and without speculation, mean accepted length, time per phase, a plot.

The baseline is the same engine decoding one token per step (``speculative=False``); greedy runs also check that
both produce identical tokens. Timings are wall-clock per ``generate`` call after one warm-up run.
``bench.json`` and ``bench.png`` are written to ``--out``; existing ones are replaced only with ``--overwrite``.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import time
from pathlib import Path

from ..fileio import atomic_write_bytes, atomic_write_json
from .generate import (
    DEFAULT_PROMPT,
    add_model_arguments,
    add_tree_arguments,
    build_engine,
    check_model_args,
    check_prompt_length,
    check_prompt_text,
    prompt_token_ids,
)

PHASES = ("prefill", "step")  # GenerationStats fields <phase>_s


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
    p.add_argument("--overwrite", action="store_true", help="replace bench.json / bench.png already in --out")
    p.add_argument("--no-plot", action="store_true", help="write no bench.png")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is shown only when stderr is a terminal)")
    p.add_argument("--json", action="store_true", help="print the result JSON")
    p.set_defaults(func=run, no_speculation=False)


def _prompts(args) -> list[str]:
    from ..cli import UsageError

    prompts = list(args.prompt or [])
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise UsageError(f"--prompts-file {path} is not a file")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    prompts.append(row["prompt"] if "prompt" in row else row["turns"][0])
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise UsageError(f"--prompts-file {path} line {n}: expected a JSON object with a 'prompt' "
                                     f"string or a 'turns' list ({type(e).__name__}: {e})") from e
    prompts = prompts or [DEFAULT_PROMPT]
    for p in prompts:
        check_prompt_text(p)
    return prompts


def _outputs(args) -> list[Path]:
    """The files this run will write; existing ones are refused unless ``--overwrite``."""
    from ..fileio import UnsafeOutputError

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UnsafeOutputError(f"--out {out} is a file, not a folder")
    paths = [out / "bench.json"] + ([] if args.no_plot else [out / "bench.png"])
    existing = [str(p) for p in paths if p.exists()]
    if existing and not args.overwrite:
        raise UnsafeOutputError(f"{' and '.join(existing)} already exist: pass --out NEW_FOLDER, or --overwrite to "
                                "replace them")
    return paths


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
        vals = [result["modes"][m]["phases_ms_per_token"][f"{ph}_ms"] for m in modes]
        a2.bar(modes, vals, bottom=bottom, label=ph)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    a2.set_ylabel("ms per new token")
    a2.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def run(args) -> int:
    from ..cli import UsageError

    if args.num_runs < 1:
        raise UsageError(f"--num-runs must be >= 1, got {args.num_runs}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1 (tokens per timed run), got {args.max_new_tokens}")
    if not args.temperature >= 0:
        raise UsageError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    texts = _prompts(args)
    paths = _outputs(args)
    tree = check_model_args(args, tree_needed=True)
    import torch

    prompts: list[list[int]] = []

    def tokenize_prompts(tok) -> None:  # before the weights load: a too-long prompt fails fast
        for text in texts:
            prompts.append(prompt_token_ids(tok, text, not args.no_chat_template))
            check_prompt_length(prompts[-1], args.max_length)

    engine, tok, target_src, draft_src = build_engine(args, tree, check_tokenizer=tokenize_prompts)
    modes = {"plain": False} | ({"speculative": True} if engine.speculative else {})
    runs: dict[str, list] = {m: [] for m in modes}
    identical = True
    bar = None
    if not args.no_progress and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts) * len(modes) * args.num_runs, desc="bench", unit="run")
    engine.generate(input_ids=prompts[0], max_new_tokens=min(8, args.max_new_tokens))  # warm-up (compilation)
    for ids in prompts:
        outs = {}
        for mode, spec in modes.items():
            for r in range(args.num_runs):
                tokens, st = engine.generate(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                             temperature=args.temperature, seed=args.seed + r, speculative=spec)
                runs[mode].append(st)
                outs.setdefault(mode, tokens)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(mode=mode, tok_s=f"{st.tokens_per_second:.1f}")
        if args.temperature <= 1e-5 and len(outs) == 2:
            identical &= outs["plain"] == outs["speculative"]
    if bar is not None:
        bar.close()
    result = {
        "command": "eagle-triton " + shlex.join(getattr(args, "argv", None) or ["bench"]),
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
            "tokens_per_second": new / total if total > 0 else 0.0,
            "mean_accepted_length": sum(s.mean_accepted_length * s.steps for s in stats) / max(steps, 1),
            "new_tokens": new,
            "phases_ms_per_token": {f"{ph}_ms": 1e3 * sum(getattr(s, f"{ph}_s") for s in stats) / max(new, 1)
                                    for ph in PHASES},
        }
    if "speculative" in result["modes"]:
        result["speedup"] = result["modes"]["speculative"]["tokens_per_second"] / result["modes"]["plain"][
            "tokens_per_second"]
        result["identical_greedy_output"] = identical if args.temperature <= 1e-5 else None
    _outputs(args)  # again: files may have appeared while the benchmark ran
    atomic_write_json(paths[0], result)
    if not args.no_plot:
        _plot(result, paths[1])
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for mode, r in result["modes"].items():
            print(f"{mode:<12} {r['tokens_per_second']:8.1f} tok/s  accepted/step {r['mean_accepted_length']:.2f}  "
                  + "  ".join(f"{ph[:-3]} {v:.2f}" for ph, v in r["phases_ms_per_token"].items()) + " ms/token")
        if "speedup" in result:
            print(f"speedup {result['speedup']:.2f}x, identical greedy output: {result['identical_greedy_output']}")
        print("wrote " + " and ".join(str(p) for p in paths))
    return 0
