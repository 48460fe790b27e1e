"""End-to-end engine benchmark (issue 18): speculative vs our plain decoding vs transformers, in one run.

Parts (``--parts``, comma-separated, default all; each has its own time budget so that one cannot starve the
others, and what a part did not measure is recorded as skipped):

- ``smollm2`` (a): SmolLM2-135M-Instruct (the cached default model) + the shipped head on MT-bench first turns (chat
  template), greedy, for each dtype (``--dtype``: bf16 and fp32 on CUDA) and each tree (``--trees``): speculative
  tok/s, mean accepted length, identical outputs (speculative tokens == plain tokens), steady step time and prefill
  time. Plain decoding through the same engine is measured once per dtype (it does not depend on the tree), on the
  same prompts, interleaved with the trees. ``best_tree``: the tree with the highest speculative tok/s (in bf16 on
  CUDA, the CLI's default dtype).
- ``llama8b`` (b, GPU only): the Llama-3.1-8B shape with random bf16 weights (``bench_target.build_8b``) and a random
  8B-shape EAGLE-3 head (``bench_fused_drafter.make_head``): plain and speculative ms per step, each beside its
  floor measured in the same run (weight bytes / copy bandwidth; speculative floor = the target's floor + the
  drafter's floor of ``bench_fused_drafter.floor_bytes``), for ``--trees-8b``; the break-even accepted length
  (speculative step / plain step) and the tok/s an accepted length of 3-6 would give (``"projection": true``:
  random weights accept about one token per step, so these are not measurements).
- ``hf_generate`` (c): transformers' own ``model.generate`` (greedy, its default cache, no torch.compile) on the
  same target and prompts: the everyday baseline.

Step times come from the engine's own statistics (``stats.step_s``, the decode steps without the prefill, when the
engine reports it; else ``total_s - prefill_s``) over whole generations, so they measure the real engine step.

Writes ``bench_engine.json`` and ``bench_engine.png`` to ``--out`` (default ``$OUT``, else ``bench/results/``);
``--update`` keeps the parts of an existing ``bench_engine.json`` that this run does not measure.
``python bench/engine_table.py bench_engine.json`` prints the README tables. ``--write-default-tree`` records the
best tree in the shipped head's ``tuned_trees.json`` (read by ``eagle-triton generate``), after a run or, with
``--tune-from FILE``, from a result file without measuring.

A budget bounds a part's measurements (prompts, trees, dtypes) but every started dtype measures at least one prompt,
and model loading and compilation come on top: the default budgets (220 + 150 + 50 s) leave about three minutes of a
10-minute device call for those (an estimate, not yet checked on the GPU; ``--parts`` and ``--update`` split a run).
Example (GPU)::

    python bench/bench_engine.py --num-prompts 20 --max-new-tokens 128 --out bench/results/<set>
    python bench/engine_table.py bench/results/<set>/bench_engine.json      # the README tables
    python bench/bench_engine.py --write-default-tree --tune-from bench/results/<set>/bench_engine.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
# The repository's src first, unless PYTHONPATH names a folder holding a version of the library: the A/B runs
# (bench/ab_libraries.py, gpu_check's treeab) point it at the base version's src. (An unconditional insert here ran
# the working tree's code in both arms of session 26's engine A/Bs.) Every script of bench/ imports this module.
if not any(os.path.isdir(os.path.join(p, "eagle_triton")) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
           if p):
    sys.path.insert(0, str(REPO / "src"))

PARTS = {"a": "smollm2", "b": "llama8b", "c": "hf_generate"}
TREES = "60/7/10,32/5/6,16/3/4"
TREES_8B = "60/7/10,60/5/10"
TAUS = (3, 4, 5, 6)
SCHEMA = 2  # 1: the single-tree runs of earlier result sets (no "parts")


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


def git_commit() -> dict:
    """The commit measured and whether it had edits: ``$EAGLE_TRITON_GIT_COMMIT`` when set (a copy of the tree whose
    ``.git`` is absent or stale, as on the lent GPU), else git's HEAD."""
    def git(*a: str) -> str | None:
        try:
            r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    import eagle_triton

    return {"git_commit": os.environ.get("EAGLE_TRITON_GIT_COMMIT") or git("rev-parse", "HEAD") or None,
            "git_dirty": None if status is None else bool(status),
            "library_src": str(Path(eagle_triton.__file__).resolve().parent)}  # which version ran (A/B runs)


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


def parse_trees(text: str) -> list[str]:
    from eagle_triton.commands._tuned_trees import parse_tree

    trees = [t.strip() for t in text.split(",") if t.strip()]
    for t in trees:
        parse_tree(t)
    if not trees or len(set(trees)) != len(trees):
        raise ValueError(f"trees must be distinct TOTAL/DEPTH/TOP_K entries, got {text!r}")
    return trees


def step_seconds(stats) -> float:
    """Seconds spent in the decode steps (prefill excluded)."""
    return getattr(stats, "step_s", None) or (stats.total_s - stats.prefill_s)


def draft_seconds(stats) -> float:
    """The draft phase's seconds where the engine times it per phase (0 where it does not, e.g. when a whole step
    is one CUDA graph): a draft time is never inferred."""
    return getattr(stats, "draft_s", 0.0) or 0.0


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def empty_cache(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


class Tally:
    """Sums over the generations of one configuration (one tree, or plain decoding)."""

    def __init__(self):
        self.tokens = self.steps = self.prompts = self.identical = 0
        self.seconds = self.step_s = self.prefill_s = self.draft_s = self.emitted = 0.0

    def add(self, stats, identical: bool | None = None) -> None:
        self.prompts += 1
        self.tokens += stats.new_tokens
        self.seconds += stats.total_s
        self.steps += stats.steps
        self.step_s += step_seconds(stats)
        self.prefill_s += stats.prefill_s
        self.draft_s += draft_seconds(stats)
        self.emitted += stats.mean_accepted_length * stats.steps
        self.identical += bool(identical)

    def figures(self) -> dict:
        return {"tokens_per_second": self.tokens / self.seconds if self.seconds else None,
                "step_ms": 1e3 * self.step_s / self.steps if self.steps else None,
                "prefill_ms": 1e3 * self.prefill_s / self.prompts if self.prompts else None,
                "mean_accepted_length": self.emitted / self.steps if self.steps else None,
                "prompts": self.prompts, "tokens": self.tokens, "seconds": self.seconds, "steps": self.steps,
                "step_seconds": self.step_s, "prefill_seconds": self.prefill_s}


# -- (a) SmolLM2 + the shipped head ---------------------------------------------------------------------------------
def smollm2_sources(args) -> tuple[str, str | None]:
    """(target, draft head) of parts a and c: the cached default model and the shipped head unless given."""
    from eagle_triton.engine.default_model import default_draft_head_path, default_target_source

    target = args.target or str(default_target_source())
    draft = args.draft or (str(default_draft_head_path()) if args.target is None and default_draft_head_path()
                           else None)
    return target, draft


def part_smollm2(args, dev: torch.device, budget_s: float, keep_tokens: dict) -> dict:
    from eagle_triton import TreeConfig
    from eagle_triton.commands.generate import prompt_token_ids
    from eagle_triton.engine import EagleEngine, load_tokenizer

    t_part = time.perf_counter()
    target_src, draft_src = smollm2_sources(args)
    if draft_src is None:
        raise SystemExit("the smollm2 part needs a draft head: the shipped head is absent; pass --draft DIR")
    trees = parse_trees(args.trees)
    dtypes = args.dtypes
    tok = load_tokenizer(target_src)
    qpath = Path(args.questions) if args.questions else default_questions()
    prompts = [(qid, prompt_token_ids(tok, text, True)) for qid, text in load_prompts(qpath, args.num_prompts)]
    out = {"target": target_src, "draft": draft_src, "questions": str(qpath), "num_prompts": len(prompts),
           "max_new_tokens": args.max_new_tokens, "trees": trees, "budget_s": budget_s, "greedy": True,
           "chat_template": True, "runs": []}
    for i, dtype in enumerate(dtypes):
        t_end = t_part + budget_s * (i + 1) / len(dtypes)  # each dtype its share, so fp32 is never starved
        if time.perf_counter() > t_end:
            out["runs"].append({"dtype": dtype, "skipped": "time budget"})
            continue
        engines = {}
        for tree in trees:  # one engine (and target) per tree: nothing shared between their CUDA graphs
            engines[tree] = EagleEngine.from_pretrained(
                target_src, draft_src, TreeConfig(*map(int, tree.split("/"))), device=dev, dtype=dtype,
                max_length=args.max_length, drafter_backend=args.drafter, tokenizer=tok,
                drafter_options=drafter_options(args))
        plain_engine = engines[trees[0]]
        for eng in engines.values():  # warm-up: graph capture (every prefill chunk kind) and compilation stay out
            eng.warmup(speculative=True)
        plain_engine.warmup(speculative=False)
        plain, spec = Tally(), {tree: Tally() for tree in trees}
        per_prompt, budget_hit = [], False
        for qid, ids in prompts:
            if per_prompt and time.perf_counter() > t_end:
                budget_hit = True
                break
            sync(dev)
            plain_tokens, ps = plain_engine.generate(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                                     speculative=False)
            plain.add(ps)
            keep_tokens.setdefault(dtype, {})[qid] = plain_tokens
            row = {"question_id": qid, "prompt_tokens": len(ids), "plain": {
                "new_tokens": ps.new_tokens, "tokens_per_second": ps.tokens_per_second}, "trees": {}}
            for tree, eng in engines.items():
                tokens, s = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, speculative=True)
                same = tokens == plain_tokens
                spec[tree].add(s, same)
                row["trees"][tree] = {"identical": same, "first_divergence": first_divergence(tokens, plain_tokens),
                                      "new_tokens": s.new_tokens, "tokens_per_second": s.tokens_per_second,
                                      "mean_accepted_length": s.mean_accepted_length, "steps": s.steps,
                                      "accept_counts": s.accept_counts}
            per_prompt.append(row)
        pf = plain.figures()
        run = {"dtype": dtype, "prompts_measured": len(per_prompt), "budget_reached": budget_hit,
               "attention_backend": getattr(getattr(plain_engine.target, "ops", None), "name", None),
               "cuda_graphs": bool(getattr(plain_engine.target, "use_cuda_graphs", False)),
               "plain": pf, "trees": []}
        for tree, eng in engines.items():
            f = spec[tree].figures()
            f.update(tree=tree, speculative_tokens_per_second=f.pop("tokens_per_second"),
                     identical_prompts=spec[tree].identical,
                     draft_ms_per_step=1e3 * spec[tree].draft_s / spec[tree].steps if spec[tree].draft_s else None,
                     drafter_backend=getattr(eng.drafter, "backend", None),
                     drafter_fallback=getattr(getattr(eng.drafter, "_impl", None), "fallback_reason", "") or "")
            f["speedup"] = f["speculative_tokens_per_second"] / pf["tokens_per_second"]
            run["trees"].append(f)
        run["best_tree"] = max(run["trees"], key=lambda r: r["speculative_tokens_per_second"])["tree"]
        run["prompts"] = per_prompt
        out["runs"].append(run)
        print(f"smollm2 {dtype}: {len(per_prompt)} prompts, plain {pf['tokens_per_second']:.1f} tok/s "
              f"(step {pf['step_ms']:.3f} ms, prefill {pf['prefill_ms']:.2f} ms)", flush=True)
        for f in run["trees"]:
            print(f"  {f['tree']:8s} speculative {f['speculative_tokens_per_second']:.1f} tok/s (x{f['speedup']:.2f}), "
                  f"accepted {f['mean_accepted_length']:.2f}, identical {f['identical_prompts']}/{f['prompts']}, "
                  f"step {f['step_ms']:.3f} ms", flush=True)
        del engines, plain_engine
        empty_cache(dev)
    measured = [r for r in out["runs"] if "best_tree" in r]
    if measured:
        # the CLI's default dtype on this device decides the default tree (bf16 on CUDA, fp32 on the CPU)
        from eagle_triton.engine.loading import resolve_dtype

        cli_dtype = str(resolve_dtype("auto", dev)).removeprefix("torch.")
        pick = next((r for r in measured if r["dtype"] == cli_dtype), measured[0])
        out["best_tree"], out["best_tree_dtype"] = pick["best_tree"], pick["dtype"]
    return out


# -- (b) Llama-3.1-8B shape, random weights --------------------------------------------------------------------------
def timed_steps(eng, ids: list[int], new_tokens: int, speculative: bool, reps: int) -> dict:
    """Median step time over ``reps`` whole generations of ``new_tokens`` (no EOS stop: random weights)."""
    runs = []
    for _ in range(reps):
        _, s = eng.generate(input_ids=ids, max_new_tokens=new_tokens, speculative=speculative, eos_token_id=None)
        runs.append({"step_ms": 1e3 * step_seconds(s) / s.steps, "steps": s.steps,
                     "mean_accepted_length": s.mean_accepted_length,
                     "draft_ms_per_step": 1e3 * draft_seconds(s) / s.steps if draft_seconds(s) else None})
    med = sorted(runs, key=lambda r: r["step_ms"])[len(runs) // 2]
    return {**med, "reps": runs}


def part_llama8b(args, budget_s: float, dev: torch.device) -> dict:
    import bench_fused_drafter as bfd  # the drafter floor and the drafter alone, as that benchmark measures them
    import bench_target as bt  # the 8B builder and the copy bandwidth

    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine
    from eagle_triton.fused import DrafterConfig

    t_part = time.perf_counter()
    trees = parse_trees(args.trees_8b)
    bw = bt.copy_bandwidth()
    empty_cache(dev)
    model = bt.build_8b()
    target_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head = bfd.make_head("llama31-8b", False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.prompt_len_8b,), generator=g).tolist()
    # the drafter floor and the drafter-alone timing use bench_fused_drafter's decode scenario (4 new rows on a
    # 512-row prefix), the scenario of the README's drafter table
    S, prefix = 4, 512
    out = {"shape": "llama-3.1-8b", "weights": "random (transformers init)", "head": "random EAGLE-3, 8B shape",
           "dtype": "bfloat16", "batch": 1, "prompt_tokens": len(ids), "new_tokens": args.new_tokens_8b,
           "reps": args.reps_8b, "copy_bandwidth_B_per_s": bw, "target_bytes": target_bytes,
           "target_floor_ms": target_bytes / bw * 1e3, "drafter_floor_scenario": {"new_rows": S, "prefix": prefix},
           "budget_s": budget_s, "trees": []}
    max_len = args.prompt_len_8b + args.new_tokens_8b + 64
    for tree in trees:
        if time.perf_counter() - t_part > budget_s:
            out["trees"].append({"tree": tree, "skipped": "time budget"})
            continue
        tc = TreeConfig(*map(int, tree.split("/")))
        eng = EagleEngine.from_pretrained(model, head, tc, device=dev, dtype="bfloat16", max_length=max_len,
                                          tokenizer=False, drafter_backend=args.drafter,
                                          drafter_options=drafter_options(args))
        eng.generate(input_ids=ids, max_new_tokens=8, eos_token_id=None)  # warm-up: capture, compilation
        if "plain" not in out:
            eng.generate(input_ids=ids, max_new_tokens=8, speculative=False, eos_token_id=None)
            out["plain"] = timed_steps(eng, ids, args.new_tokens_8b, False, args.reps_8b)
            out["plain"]["floor_ms"] = out["target_floor_ms"]
            print(f"8b plain: {out['plain']['step_ms']:.3f} ms/step (floor {out['target_floor_ms']:.3f})", flush=True)
        r = timed_steps(eng, ids, args.new_tokens_8b, True, args.reps_8b)
        cfg = DrafterConfig.from_head(head, tc, max_batch=1, max_len=max(256, 2 * (prefix + S + 1)),
                                      max_new_rows=S)
        r.update(tree=tree, drafter_backend=getattr(eng.drafter, "backend", None),
                 drafter_floor_ms=bfd.floor_bytes(cfg, 1, S, prefix) / bw * 1e3)
        r["spec_floor_ms"] = out["target_floor_ms"] + r["drafter_floor_ms"]
        r["vs_floor"] = r["step_ms"] / r["spec_floor_ms"]
        r["draft_timing"] = ("the engine's phase timer (CUDA events around the draft call), per step"
                             if r["draft_ms_per_step"] is not None else None)
        del eng
        empty_cache(dev)
        if args.drafter_alone and time.perf_counter() - t_part < budget_s:
            r["drafter_alone_ms"] = bfd.bench_case(head, tc, 1, S, prefix, do_ref=False, do_graph=False)["fused_ms"]
        r["break_even_accepted_length"] = r["step_ms"] / out["plain"]["step_ms"]
        r["projection"] = {"projection": True, "what": "tok/s at accepted length tau = tau / the measured "
                           "speculative step time; not a measurement (random weights accept about 1 token per step)",
                           "tokens_per_second": {str(t): t / (r["step_ms"] * 1e-3) for t in TAUS}}
        out["trees"].append(r)
        print(f"8b {tree}: {r['step_ms']:.3f} ms/step (floor {r['spec_floor_ms']:.3f}, x{r['vs_floor']:.2f}), "
              f"break-even accepted length {r['break_even_accepted_length']:.2f}, draft in step "
              f"{r['draft_ms_per_step'] or float('nan'):.3f} ms, alone {r.get('drafter_alone_ms', float('nan')):.3f}",
              flush=True)
    del model, head
    empty_cache(dev)
    return out


# -- (c) transformers' own generate ---------------------------------------------------------------------------------
def part_hf_generate(args, dev: torch.device, budget_s: float, engine_tokens: dict) -> dict:
    from transformers import AutoModelForCausalLM

    from eagle_triton.commands.generate import prompt_token_ids
    from eagle_triton.engine import load_tokenizer
    from eagle_triton.engine.loading import resolve_dtype

    t_part = time.perf_counter()
    target_src, _ = smollm2_sources(args)
    dtype = resolve_dtype(args.hf_dtype, dev)
    src = Path(target_src)
    kw = {"gguf_file": src.name} if src.suffix == ".gguf" else {}
    model = AutoModelForCausalLM.from_pretrained(str(src.parent) if kw else target_src, dtype=dtype, **kw)
    model = model.to(dev).eval()
    tok = load_tokenizer(target_src)
    qpath = Path(args.questions) if args.questions else default_questions()
    prompts = [(qid, prompt_token_ids(tok, text, True)) for qid, text in load_prompts(qpath, args.num_prompts)]
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = tok.eos_token_id if tok.eos_token_id is not None else 0

    def generate(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids], device=dev)
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                               pad_token_id=pad)
        return y[0, len(ids):].tolist()

    generate(prompts[0][1], 8)  # warm-up
    dname = str(dtype).removeprefix("torch.")
    same_as_engine = engine_tokens.get(dname, {})
    tokens = seconds = 0.0
    rows = []
    for qid, ids in prompts:
        if rows and time.perf_counter() - t_part > budget_s:
            break
        sync(dev)
        t0 = time.perf_counter()
        new = generate(ids, args.max_new_tokens)
        sync(dev)
        dt = time.perf_counter() - t0
        tokens += len(new)
        seconds += dt
        row = {"question_id": qid, "new_tokens": len(new), "tokens_per_second": len(new) / dt}
        if qid in same_as_engine:
            row["same_tokens_as_engine_plain"] = new == same_as_engine[qid]
        rows.append(row)
    cache = model.generation_config.cache_implementation  # None: transformers' default, a dynamic cache
    out = {"target": target_src, "dtype": dname,
           "cache": f"cache_implementation={cache!r} (transformers' default generate; no torch.compile)",
           "attn_implementation": getattr(model.config, "_attn_implementation", None), "greedy": True,
           "max_new_tokens": args.max_new_tokens, "prompts_measured": len(rows), "budget_s": budget_s,
           "tokens_per_second": tokens / seconds, "tokens": int(tokens), "seconds": seconds, "prompts": rows}
    compared = [r["same_tokens_as_engine_plain"] for r in rows if "same_tokens_as_engine_plain" in r]
    if compared:
        out["same_tokens_as_engine_plain"] = f"{sum(compared)}/{len(compared)}"
    print(f"hf generate {dname}: {out['tokens_per_second']:.1f} tok/s over {len(rows)} prompts", flush=True)
    return out  # the model is freed with this frame


# -- output ---------------------------------------------------------------------------------------------------------
def plot(doc: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    parts = doc["parts"]
    panels = [p for p in ("smollm2", "llama8b") if p in parts]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 3.8), squeeze=False)
    for ax, name in zip(axes[0], panels, strict=True):
        if name == "smollm2":
            labels, values = [], []
            for run in parts["smollm2"]["runs"]:
                if "plain" not in run:
                    continue
                short = {"bfloat16": "bf16", "float32": "fp32"}.get(run["dtype"], run["dtype"])
                labels.append(f"{short}\nplain")
                values.append(run["plain"]["tokens_per_second"])
                for tr in run["trees"]:
                    labels.append(f"{short}\n{tr['tree']}")
                    values.append(tr["speculative_tokens_per_second"])
            hf = parts.get("hf_generate")
            if hf:
                labels.append(f"{hf['dtype'].replace('bfloat16', 'bf16').replace('float32', 'fp32')}\nHF generate")
                values.append(hf["tokens_per_second"])
            colors = ["tab:gray" if "plain" in lab else "tab:orange" if "HF" in lab else "tab:blue"
                      for lab in labels]
            ax.bar(range(len(values)), values, color=colors)
            ax.set_xticks(range(len(values)), labels, fontsize=7)
            ax.set_ylabel("tokens/s")
            ax.set_title(f"SmolLM2-135M-Instruct + shipped head, MT-bench ({doc['versions']['device_name']})",
                         fontsize=8)
        else:
            p8 = parts["llama8b"]
            rows = [("plain", p8["plain"]["step_ms"], p8["target_floor_ms"])] if "plain" in p8 else []
            rows += [(t["tree"], t["step_ms"], t["spec_floor_ms"]) for t in p8["trees"] if "step_ms" in t]
            x = range(len(rows))
            ax.bar([i - 0.2 for i in x], [r[1] for r in rows], 0.4, label="measured")
            ax.bar([i + 0.2 for i in x], [r[2] for r in rows], 0.4, label="floor", color="tab:gray")
            ax.set_xticks(list(x), [r[0] for r in rows])
            ax.set_ylabel("ms per step")
            ax.set_title("Llama-3.1-8B shape, random weights, bf16, batch 1", fontsize=8)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def write_default_tree(doc: dict, source: str) -> None:
    """Record the run's best tree for the shipped head (only when the run measured the shipped head)."""
    from eagle_triton.commands._tuned_trees import write_tuned_tree
    from eagle_triton.engine.default_model import default_draft_head_path

    part = doc.get("parts", {}).get("smollm2")
    if not part or "best_tree" not in part:
        raise SystemExit("--write-default-tree: the result has no measured smollm2 part (no best tree)")
    shipped = default_draft_head_path()
    if shipped is None or Path(part["draft"]).resolve() != shipped.resolve():
        # the shipped head may have been measured from another checkout (the device's copy): compare by folder name
        if shipped is None or Path(part["draft"]).name != shipped.name:
            raise SystemExit(f"--write-default-tree: the run measured the head {part['draft']}, not the shipped one")
    kind = "cuda" if doc["device"].startswith("cuda") else "cpu"
    run = next(r for r in part["runs"] if r.get("dtype") == part["best_tree_dtype"])
    best = next(t for t in run["trees"] if t["tree"] == part["best_tree"])
    measured = {"device_name": doc["versions"]["device_name"], "date": doc["date"], "dtype": run["dtype"],
                "source": source, "git_commit": doc["versions"].get("git_commit"),
                "speculative_tokens_per_second": {t["tree"]: t["speculative_tokens_per_second"] for t in run["trees"]},
                "plain_tokens_per_second": run["plain"]["tokens_per_second"], "prompts": run["prompts_measured"],
                "identical_prompts": best["identical_prompts"]}
    path = write_tuned_tree(shipped, kind, part["best_tree"], measured)
    print(f"wrote the default tree {part['best_tree']} for {kind} to {path}")



def drafter_options(args) -> dict | None:
    """``--drafter-option KEY=VALUE`` entries as EagleEngine's ``drafter_options`` (integer values)."""
    out = {}
    for item in args.drafter_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--drafter-option takes KEY=VALUE, got {item!r}")
        try:
            out[key] = int(value)
        except ValueError:
            raise SystemExit(f"--drafter-option {key}: an integer value, got {value!r}") from None
    return out or None

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("questions", nargs="?", default=None, help="MT-bench question.jsonl (default: bench/data/ or "
                   "../shared/data/mt_bench_questions.jsonl)")
    p.add_argument("--parts", default="a,b,c", help="comma-separated parts: a/smollm2, b/llama8b, c/hf_generate "
                   "(default all; llama8b is skipped, said on stderr, without a GPU)")
    p.add_argument("--target", default=None, help="target of parts a and c (default: the cached SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft head of part a (default: the shipped SmolLM2 head)")
    p.add_argument("--trees", default=TREES, help=f"trees of part a (default {TREES})")
    p.add_argument("--trees-8b", default=TREES_8B, help=f"trees of part b (default {TREES_8B})")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto", help="dtypes of part a, comma-separated (auto: bfloat16,float32 on "
                   "CUDA; float32 on the CPU)")
    p.add_argument("--hf-dtype", default="auto", help="dtype of part c (auto: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--drafter", choices=["auto", "torch", "triton", "graph"], default="auto",
                   help="tree drafter back end")
    p.add_argument("--drafter-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the drafter back end, e.g. hidden_half_early=1 (integers; repeatable): "
                        "EagleEngine's drafter_options")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--budget-smollm2", type=float, default=220.0, help="seconds for part a (split over the dtypes)")
    p.add_argument("--budget-llama8b", type=float, default=150.0, help="seconds for part b")
    p.add_argument("--budget-hf", type=float, default=50.0, help="seconds for part c")
    p.add_argument("--prompt-len-8b", type=int, default=64, help="prompt tokens of part b")
    p.add_argument("--new-tokens-8b", type=int, default=128, help="new tokens per timed generation of part b")
    p.add_argument("--reps-8b", type=int, default=3, help="timed generations per configuration of part b (median)")
    p.add_argument("--no-drafter-alone", dest="drafter_alone", action="store_false",
                   help="part b: do not time the fused drafter alone beside the engine step")
    p.add_argument("--out", default=None, help="output dir (default: $OUT or bench/results)")
    p.add_argument("--update", action="store_true",
                   help="keep the parts of an existing bench_engine.json (written by this script) not measured now")
    p.add_argument("--write-default-tree", action="store_true",
                   help="record the best measured tree in the shipped head's tuned_trees.json (eagle-triton "
                   "generate's default tree for it)")
    p.add_argument("--tune-from", default=None, metavar="JSON",
                   help="with --write-default-tree: take the best tree from this bench_engine.json, measure nothing")
    args = p.parse_args(argv)
    if args.tune_from:
        if not args.write_default_tree:
            p.error("--tune-from goes with --write-default-tree")
        write_default_tree(json.loads(Path(args.tune_from).read_text()), args.tune_from)
        return 0
    names = [PARTS.get(x.strip(), x.strip()) for x in args.parts.split(",") if x.strip()]
    bad = sorted(set(names) - set(PARTS.values()))
    if bad or not names:
        p.error(f"unknown parts {bad}; choose from a/smollm2, b/llama8b, c/hf_generate")
    try:
        parse_trees(args.trees)
        parse_trees(args.trees_8b)
    except ValueError as e:
        p.error(str(e))

    from eagle_triton.engine.loading import resolve_device

    dev = resolve_device(args.device)
    args.dtypes = ((["bfloat16", "float32"] if dev.type == "cuda" else ["float32"]) if args.dtype == "auto"
                   else args.dtype.split(","))
    if "llama8b" in names and dev.type != "cuda":
        print("bench_engine: no CUDA device: skipping the llama8b part", file=sys.stderr)
        names.remove("llama8b")
    out_dir = Path(args.out or os.environ.get("OUT") or REPO / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_engine.json"
    doc = {"benchmark": "bench_engine", "schema": SCHEMA, "parts": {}}
    from results_guard import refuse_foreign

    refuse_foreign("bench_engine", path, out_dir / "bench_engine.png")
    if args.update and path.exists():
        old = json.loads(path.read_text())
        if old.get("schema") != SCHEMA:  # (refuse_foreign: a bench_engine.json of ours)
            p.error(f"{path} was not written by this version of bench_engine.py: choose another --out")
        doc = old
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    doc.update(date=now, device=str(dev), versions={**versions(), **git_commit()},
               command=" ".join([sys.executable, *sys.argv]) if argv is None else
               " ".join([sys.executable, __file__, *argv]))
    meta = {"date": now, "command": doc["command"], "git_commit": doc["versions"]["git_commit"]}
    plain_tokens: dict = {}
    budgets = {"smollm2": args.budget_smollm2, "llama8b": args.budget_llama8b, "hf_generate": args.budget_hf}
    for name in [n for n in PARTS.values() if n in names]:
        t0 = time.perf_counter()
        if name == "smollm2":
            res = part_smollm2(args, dev, budgets[name], plain_tokens)
        elif name == "llama8b":
            res = part_llama8b(args, budgets[name], dev)
        else:
            res = part_hf_generate(args, dev, budgets[name], plain_tokens)
        res["wall_s"] = time.perf_counter() - t0
        res["measured"] = meta
        doc["parts"][name] = res
        path.write_text(json.dumps(doc, indent=1))  # after every part: a killed run keeps what it measured
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")
    if plot(doc, out_dir / "bench_engine.png"):
        print(f"wrote {out_dir / 'bench_engine.png'}")
    if args.write_default_tree:
        write_default_tree(doc, str(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
