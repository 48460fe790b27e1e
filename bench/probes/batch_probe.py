"""Where a batched SmolLM2 job spends its time (issue 21), on random weights at SmolLM2-135M's shape (GPU).

    python bench/probes/batch_probe.py --out batch_probe.json [--parts drafter,steady,job]

Parts:

- ``drafter``: the fused drafter alone at the SmolLM2 head shape (the shipped head's config, random weights), per
  tree and batch, for several resident-program counts (``--nprogs``): is one program per SM right for a head this
  small?
- ``steady``: steady-state ms per batched step (plain and each tree) for batch 1-16: ``B`` equal prompts, no EOS,
  no refills and no bucket moves; two job lengths, the time difference over the step difference (prefills cancel).
- ``prefill``: the target's prefill of one prompt per length (host and device ms; ``--profile``: its kernels).
- ``job``: a continuous-batching job like the benchmark's (64 prompts of random length, per-sequence caps standing
  in for EOS), run four times: cold, warm, warm with the host timing its parts (synchronising around each:
  CUDA graph captures, prefills, bucket moves, the prompts' draft-KV rows), so the whole-job time can be split,
  and warm with CUDA events around the same parts and every step, recorded without synchronising (``timeline``:
  each kind's device time and the device's idle time before it, i.e. waiting for the host). ``--job-prompt-lens``,
  ``--job-new-tokens`` and ``--job-temperature`` shape it like the training data's generation (long prompts and
  answers, sampled).
- ``hfgen``: transformers' ``generate`` over such prompts (``--hf-batch`` rows, left-padded), the other writer of
  the training data, for comparison with the engine's job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "probes"))


def drafter_cases(args) -> list[tuple[str, int, int]]:
    """(tree, batch, nprog): every tree at batch 1 with every ``--nprogs``; ``--drafter-b16-trees`` at batch 16
    with the first and last ``--nprogs``."""
    nprogs = [int(x) for x in args.nprogs.split(",")]
    cases = [(t, 1, n) for t in args.trees.split(",") for n in nprogs]
    cases += [(t, 16, n) for t in args.drafter_b16_trees.split(",") if t for n in sorted({nprogs[0], nprogs[-1]})]
    return cases


def _drafter_case(head, case, rep_ms):
    import bench_fused_drafter as bfd

    from eagle_triton import TreeConfig

    tree, b, n = case
    return bfd.bench_case(head, TreeConfig(*map(int, tree.split("/"))), b, 4, 256, False, False, rep_ms=rep_ms,
                          tuning={"nprog": n})


def part_drafter(args) -> list[dict]:
    import subprocess

    import bench_fused_drafter as bfd

    cases = drafter_cases(args)
    procs = []  # compile every variant in parallel first (Triton's disk cache serves the timed runs)
    for c in cases:
        while len([p for p in procs if p.poll() is None]) >= 8:
            time.sleep(0.5)
        spec = ":".join(map(str, c))
        procs.append(subprocess.Popen([sys.executable, __file__, "--out", "-", "--warm-drafter", spec]))
    for p in procs:
        p.wait()
    head = bfd.make_head("smollm2-135m", False)
    rows = []
    for tree, b, n in cases:
        try:
            r = _drafter_case(head, (tree, b, n), 200)
        except ValueError as exc:
            rows.append({"tree": tree, "batch": b, "nprog": n, "error": str(exc)})
            continue
        rows.append({"tree": tree, "batch": b, "nprog": n, "fused_ms": r["fused_ms"],
                     "fused_ms_again": r["fused_ms_again"]})
        print(f"drafter {tree} b{b} nprog {n}: {r['fused_ms']:.3f} ms", flush=True)
    return rows


def part_promptdraft(args) -> list[dict]:
    """A prompt's way into the drafter at the SmolLM2 head shape, per batch and prompt rows: one eager draft over
    every slot's rows (``draft_rows`` with the prompts' row counts: how ``generate_batch`` ingested prompts before
    ``start_rows``), against ``start_rows`` of one slot's rows but the last (what it does now; its first draft is
    then a step's one-row draft), and against the engine's way of running ``start_rows`` since session 18: static
    128-row chunks of ``start_rows_chunk``, each replayed from a CUDA graph (``DeviceSteps._start_in_chunks``).
    Median of ``do_bench`` (host and device)."""
    from types import SimpleNamespace

    import bench_fused_drafter as bfd
    from triton.testing import do_bench

    from eagle_triton import TreeConfig, TreeDrafter
    from eagle_triton.engine.step import DeviceSteps

    head = bfd.make_head("smollm2-135m", False)
    tc = TreeConfig(16, 3, 4)
    rows = []
    for B, S in [(8, 100), (16, 250)]:
        d = TreeDrafter(head, tc, backend="triton")
        d.reset()
        d.reserve(1200, S, batch=B)
        g = torch.Generator(device="cuda").manual_seed(0)
        feats = torch.randn(B, S, head.feature_width, device="cuda", dtype=head.dtype, generator=g)
        ids = torch.randint(0, head.config.vocab_size, (B, S), device="cuda", generator=g)
        num = torch.randint(1, S + 1, (B,), device="cuda", generator=g).to(torch.int32)
        zero = torch.zeros(B, dtype=torch.int32, device="cuda")

        def eager(d=d, feats=feats, ids=ids, num=num, zero=zero):
            d.forget_rows(zero)
            d.draft_rows(feats, ids, num)

        def start(d=d, f=feats[0, :S - 1], i=ids[0, :S - 1]):
            d.start_rows(0, f, i)

        # the engine's step runner around this drafter (a stand-in target: the runner reads only these fields)
        host = SimpleNamespace(device=torch.device("cuda"), device_lengths=True, use_cuda_graphs=True, cache=None,
                               feature_mode=None)
        steps = DeviceSteps(host, d, torch.zeros(4, dtype=torch.int64, device="cuda"))

        def chunks(steps=steps, f=feats[0, :S - 1], i=ids[0, :S - 1]):
            steps._start_in_chunks(0, f, i)

        r = {"batch": B, "rows": S}
        for name, fn in (("eager_draft_ms", eager), ("start_rows_ms", start), ("start_chunk_graphs_ms", chunks)):
            for _ in range(3):  # (the chunk runner captures its graph at its second call)
                fn()
            torch.cuda.synchronize()
            r[name] = do_bench(fn, warmup=5, rep=100, return_mode="median")
        rows.append(r)
        print(f"prompt b{B} x {S} rows: eager draft {r['eager_draft_ms']:.3f} ms, start_rows "
              f"{r['start_rows_ms']:.3f} ms, in graphed chunks {r['start_chunk_graphs_ms']:.3f} ms", flush=True)
        del d
        torch.cuda.empty_cache()
    return rows


def part_prefill(args) -> list[dict]:
    """The target's prefill alone (one prompt into slot 0, chunk graphs warm) per prompt length: host wall time
    (synchronised) and device time (CUDA events), and the kernels of one 256-row chunk (``--profile``)."""
    from step_probe import profile_kernels, smollm2_random

    from eagle_triton.engine import LlamaTarget
    from eagle_triton.engine import target as target_mod

    model, _ = smollm2_random()
    target = LlamaTarget.from_hf(model)
    del model
    target.setup(1200, "eagle3")
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in [int(x) for x in args.prefill_lengths.split(",")]:
        ids = torch.randint(0, 49152, (1, n), generator=g).cuda()

        def run(ids=ids):
            target.reset(0)
            return target.prefill(ids)

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        walls, devs = [], []
        for _ in range(20):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            run()
            e1.record()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            devs.append(e0.elapsed_time(e1))
        walls.sort()
        devs.sort()
        row = {"prompt_len": n, "chunks": target_mod.PREFILL_CHUNKS, "wall_ms": 1e3 * walls[10],
               "device_ms": devs[10]}
        if args.profile and n == 256:
            row["kernels"] = profile_kernels(run, top=15)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        rows.append(row)
    return rows


def _engines(trees, max_length: int = 1024):
    from step_probe import smollm2_random

    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine, LlamaTarget

    model, head = smollm2_random()
    target = LlamaTarget.from_hf(model)
    del model
    engines = {t: EagleEngine(target, head, TreeConfig(*map(int, t.split("/"))), max_length=max_length)
               for t in trees}
    return target, engines


def _real_engines(args, trees):
    """``--target``: the SmolLM2 GGUF (or a checkpoint) with the shipped head, one warmed engine per tree, and the
    first ``--job-prompts`` MT-bench prompts (bench_batch.py's job)."""
    import bench_engine

    from eagle_triton import TreeConfig
    from eagle_triton.commands.generate import prompt_token_ids
    from eagle_triton.engine import EagleEngine, load_tokenizer
    from eagle_triton.engine.default_model import default_draft_head_path

    target_src, draft_src = args.target, str(default_draft_head_path())
    tok = load_tokenizer(target_src)
    qpath = bench_engine.default_questions()
    prompts = [prompt_token_ids(tok, text, True) for _, text in bench_engine.load_prompts(qpath, args.job_prompts)]
    engines = {}
    for t in trees:
        engines[t] = EagleEngine.from_pretrained(target_src, draft_src, TreeConfig(*map(int, t.split("/"))),
                                                 device="cuda", dtype="bfloat16", max_length=1024, tokenizer=tok)
        engines[t].warmup()
    return engines, prompts


def _job(eng, prompts, b, speculative, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = eng.generate_batch(input_ids=prompts, max_new_tokens=n, batch_size=b, speculative=speculative,
                             eos_token_id=None)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, res


def part_steady(args, engines) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        prompts = [torch.randint(0, 49152, (64,), generator=g).tolist() for _ in range(b)]
        row = {"batch": b}
        for name, eng, spec in [("plain", next(iter(engines.values())), False)] + [
                (t, e, True) for t, e in engines.items()]:
            _job(eng, prompts, b, spec, 8)
            t_s, r_s = _job(eng, prompts, b, spec, 24)
            t_l, r_l = _job(eng, prompts, b, spec, 120)
            steps = max(s.steps for _, s in r_l) - max(s.steps for _, s in r_s)
            row[name] = {"step_ms": (t_l - t_s) * 1e3 / max(steps, 1),
                         "tokens_per_step": sum(len(t) for t, _ in r_l) / max(s.steps for _, s in r_l)}
        print(f"steady b{b}: " + ", ".join(f"{k} {v['step_ms']:.3f}" for k, v in row.items() if k != "batch"),
              flush=True)
        rows.append(row)
    return rows


@contextlib.contextmanager
def _wrapped(recorder, targets):
    """``recorder.wrap(obj, name, kind)`` on each ``(obj, name, kind)`` of ``targets`` for the ``with`` body, the
    originals put back after it."""
    undo = [(obj, name, recorder.wrap(obj, name, kind)) for obj, name, kind in targets]
    try:
        yield recorder
    finally:
        for obj, name, fn in reversed(undo):
            setattr(obj, name, fn)


class _Timers:
    """Host timers around the parts of a job (each synchronises the device before and after)."""

    def __init__(self):
        self.t: dict[str, list[float]] = {}

    def wrap(self, obj, name: str, key: str):
        fn = getattr(obj, name)

        def timed(*a, **k):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            torch.cuda.synchronize()
            v = self.t.setdefault(key, [0.0, 0])
            v[0] += time.perf_counter() - t0
            v[1] += 1
            return out

        setattr(obj, name, timed)
        return fn


class _GpuTimeline:
    """CUDA events around the parts of a job, recorded without synchronising (the job runs as it does unobserved):
    afterwards, each kind of part's device time (from the device reaching its first work to finishing its last) and
    the device's idle time between consecutive parts, charged to the part it waited for (the host was still
    preparing it)."""

    def __init__(self):
        self.marks: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def wrap(self, obj, name: str, kind: str):
        fn = getattr(obj, name)

        def marked(*a, **k):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*a, **k)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((kind, start, end))
            return out

        setattr(obj, name, marked)
        return fn

    def summary(self) -> dict:
        torch.cuda.synchronize()
        parts: dict[str, dict] = {}
        for i, (kind, start, end) in enumerate(self.marks):
            v = parts.setdefault(kind, {"calls": 0, "device_ms": 0.0, "idle_before_ms": 0.0})
            v["calls"] += 1
            v["device_ms"] += start.elapsed_time(end)
            if i:
                v["idle_before_ms"] += self.marks[i - 1][2].elapsed_time(start)
        total = self.marks[0][1].elapsed_time(self.marks[-1][2]) if self.marks else 0.0
        return {"total_ms": total, "parts": parts}


def _random_prompts(args, n: int) -> tuple[list[list[int]], list[int]]:
    """``n`` random prompts of ``--job-prompt-lens`` tokens and their caps of ``--job-new-tokens`` new tokens (the
    same prompts for the same ``n``, whichever part draws them)."""
    g = torch.Generator().manual_seed(1)
    (p_lo, p_hi), (c_lo, c_hi) = (tuple(map(int, r.split(":"))) for r in (args.job_prompt_lens, args.job_new_tokens))
    prompts = [torch.randint(0, 49152, (int(k),), generator=g).tolist()
               for k in torch.randint(p_lo, p_hi, (n,), generator=g)]
    return prompts, [int(k) for k in torch.randint(c_lo, c_hi + 1, (n,), generator=g)]


def part_hfgen(args) -> dict:
    """transformers' ``generate`` (the training data's other writer, :class:`TransformersGenerator`) on random
    weights at SmolLM2's shape: ``--hf-batch`` random prompts of ``--job-prompt-lens`` tokens, left-padded, each
    writing the largest ``--job-new-tokens`` cap (no stop token), at ``--job-temperature``; generated tokens/s after
    a short warm-up call."""
    from step_probe import smollm2_random

    from eagle_triton.train.generation import TransformersGenerator

    model, _ = smollm2_random()
    rows, _ = _random_prompts(args, args.hf_batch)
    c_hi = int(args.job_new_tokens.split(":")[1])
    gen = TransformersGenerator(model, pad_token_id=0)
    gen(rows[:8], 8, args.job_temperature, 1.0, 0)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = gen(rows, c_hi, args.job_temperature, 1.0, 1)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = sum(len(r) for r in out)
    r = {"batch": args.hf_batch, "new_tokens": n, "s": dt, "tok_s": n / dt, "temperature": args.job_temperature}
    print(f"transformers generate b{args.hf_batch}: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s", flush=True)
    return r


def part_job(args, engines, prompts=None) -> list[dict]:
    """``prompts``: real prompts (``--target``: 128 new tokens each, EOS stops them); else random prompts of
    ``--job-prompt-lens`` tokens (default 30-250) with caps of ``--job-new-tokens`` new tokens (default 32-128)
    standing in for EOS. ``--job-temperature`` > 0 samples every sequence (seeded) instead of greedy decoding."""
    from eagle_triton.engine import batch as batch_mod
    from eagle_triton.engine import engine as engine_mod
    from eagle_triton.engine import target as target_mod

    eos = "default" if prompts is not None else None
    if prompts is None:
        prompts, caps = _random_prompts(args, args.job_prompts)
    else:
        caps = 128
    sampling = dict(temperature=args.job_temperature, seeds=0) if args.job_temperature > 0 else {}
    rows = []
    for b in [int(x) for x in args.job_batches.split(",")]:
        for name, eng, spec in [("plain", next(iter(engines.values())), False)] + [
                (t, e, True) for t, e in engines.items() if t in args.job_trees.split(",")]:
            r = {"batch": b, "tree": name}
            for run in ("cold", "warm"):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=b, speculative=spec,
                                         eos_token_id=eos, **sampling)
                torch.cuda.synchronize()
                r[run + "_s"] = time.perf_counter() - t0
                r["new_tokens"] = sum(len(t) for t, _ in res)
            parts = [(target_mod.LlamaTarget, "prefill", "prefill"), (target_mod.LlamaTarget, "keep_slots", "move"),
                     (batch_mod.BatchStepRunner, "_start_draft", "prompt_kv")]
            captures = []  # host seconds from each capture's begin to its end (the capture's whole launch work)
            orig_begin, orig_end = torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end

            def begin(self, *a, _orig=orig_begin, **k):
                self._probe_t0 = time.perf_counter()
                return _orig(self, *a, **k)

            def end(self, *a, _orig=orig_end, _log=captures, **k):
                out = _orig(self, *a, **k)
                _log.append(time.perf_counter() - self._probe_t0)
                return out

            with _wrapped(_Timers(), parts + [(engine_mod.EagleEngine, "_batch_runner", "batch_runner_setup")]) as tm:
                torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end = begin, end
                try:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=b, speculative=spec,
                                       eos_token_id=eos, **sampling)
                    torch.cuda.synchronize()
                    r["timed_s"] = time.perf_counter() - t0
                finally:
                    torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end = orig_begin, orig_end
            # the same job unobserved by the host: device time and idle gaps per kind of part
            steps = [(batch_mod.BatchStepRunner, "release", "release"),
                     (batch_mod.BatchStepRunner, "speculative_step", "step"),
                     (batch_mod.BatchStepRunner, "plain_step", "step")]
            with _wrapped(_GpuTimeline(), parts + steps) as tl:
                eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=b, speculative=spec,
                                   eos_token_id=eos, **sampling)
            r["timeline"] = tl.summary()
            r["captures"] = len(captures)
            r["capture_s"] = sum(captures)
            r["parts_s"] = {k: {"s": v[0], "calls": v[1]} for k, v in tm.t.items()}
            r["warm_tok_s"] = r["new_tokens"] / r["warm_s"]
            print(f"job b{b} {name}: cold {r['cold_s']:.2f} s, warm {r['warm_s']:.2f} s "
                  f"({r['warm_tok_s']:.0f} tok/s), timed {r['timed_s']:.2f} s, {len(captures)} captures "
                  f"{sum(captures):.2f} s, "
                  + ", ".join(f"{k} {v[0]:.2f} s/{v[1]}" for k, v in tm.t.items()), flush=True)
            print(f"  device timeline {r['timeline']['total_ms']:.1f} ms: " + ", ".join(
                f"{k} {v['device_ms']:.1f} ms/{v['calls']} (idle before {v['idle_before_ms']:.1f})"
                for k, v in r["timeline"]["parts"].items()), flush=True)
            rows.append(r)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="drafter,steady,job")
    p.add_argument("--trees", default="60/7/10,32/5/6,16/3/4,8/2/3")
    p.add_argument("--nprogs", default="132,66,33,16")
    p.add_argument("--drafter-b16-trees", default="16/3/4,8/2/3")
    p.add_argument("--warm-drafter", default=None, help=argparse.SUPPRESS)
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--job-batches", default="16,4")
    p.add_argument("--job-trees", default="16/3/4")
    p.add_argument("--job-prompts", type=int, default=64)
    p.add_argument("--job-prompt-lens", default="30:250", help="job, random weights: prompt lengths MIN:MAX")
    p.add_argument("--job-new-tokens", default="32:128", help="job, random weights: new-token caps MIN:MAX")
    p.add_argument("--hf-batch", type=int, default=256, help="hfgen: rows per transformers generate call")
    p.add_argument("--max-length", type=int, default=1024, help="random-weight engines' max_length")
    p.add_argument("--job-temperature", type=float, default=0.0, help="job: sample at this temperature (0: greedy)")
    p.add_argument("--prefill-lengths", default="16,40,100,200,256,257,600,1000")
    p.add_argument("--profile", action="store_true", help="prefill: the kernels of a 256-row prompt's prefill")
    p.add_argument("--target", default=None,
                   help="job: the real SmolLM2 target (GGUF or checkpoint) with the shipped head on MT-bench prompts "
                        "(128 new tokens, EOS) instead of random weights and prompts; --job-trees are its trees")
    args = p.parse_args(argv)
    if args.warm_drafter:
        import bench_fused_drafter as bfd

        tree, b, n = args.warm_drafter.split(":")
        _drafter_case(bfd.make_head("smollm2-135m", False), (tree, int(b), int(n)), 1)
        return 0
    import bench_engine

    parts = args.parts.split(",")
    res = {"versions": bench_engine.versions(), "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "weights": "random, SmolLM2-135M shape"}
    if "prefill" in parts:
        res["prefill"] = part_prefill(args)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if "promptdraft" in parts:
        res["promptdraft"] = part_promptdraft(args)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if "hfgen" in parts:
        res["hfgen"] = part_hfgen(args)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if "drafter" in parts:
        res["drafter"] = part_drafter(args)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if args.target and "job" in parts:
        engines, prompts = _real_engines(args, args.job_trees.split(","))
        res["weights"] = f"{args.target} with the shipped head, {len(prompts)} MT-bench prompts"
        res["job"] = part_job(args, engines, prompts)
    elif "steady" in parts or "job" in parts:
        _, engines = _engines(args.trees.split(","), args.max_length)
        if "steady" in parts:
            res["steady"] = part_steady(args, engines)
            Path(args.out).write_text(json.dumps(res, indent=1))
        if "job" in parts:
            res["job"] = part_job(args, engines)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
