"""Draft latency of the fused persistent drafter vs the multi-kernel CUDA-graph drafter vs the reference drafter,
with the HBM floor measured in the same run. GPU only.

    python bench/bench_fused_drafter.py --quick          # 8B shape, 60/7/10, decode, batch 1
    python bench/bench_fused_drafter.py                  # the full sweep (8B: 60/7/10 and 60/5/10, random and
                                                         # peaked heads, decode and prefill, batch 1-16; SmolLM2)
    # the head-shape x weight-dtype sweep (issue 19), decode, random heads; select subsets to fit a device call:
    python bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b,llama32-1b \
        --trees 60/7/10,60/5/10 --weights bf16,fp8 --batches 1,2,4,8,16 --no-ref --name shapes_fp8

With any of ``--shapes``, ``--trees``, ``--weights``, ``--scenarios``, ``--heads`` the cases are the product of
those lists (defaults: llama31-8b, 60/7/10, bf16, decode, random). FP8 (``--weights fp8``): the head's linear
layers quantised with ``Eagle3DraftHead.quantize_fp8`` (one byte per weight plus fp32 per-row scales, which the
floor counts). Every row records its floor (bytes / the copy bandwidth measured in the same run).

Writes ``fused_drafter.json`` and ``fused_drafter.png`` under ``$OUT`` (else bench/results/). Kernels are compiled
first in parallel subprocesses (``--jobs``), one per shape variant, so that compile time stays out of the lease.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch

# (bench_engine puts the repository's src on sys.path unless PYTHONPATH names another version of the library)
from bench_engine import git_commit  # noqa: E402  (the scripts of bench/ run with bench/ on sys.path)

from eagle_triton import DraftHeadConfig, Eagle3DraftHead, TreeConfig, TreeDrafter  # noqa: E402
from eagle_triton.fused import (  # noqa: E402
    Buffers,
    DrafterConfig,
    DraftInputs,
    MultiKernelDrafter,
    Weights,
    launch_drafter,
    profile_phases,
)
from eagle_triton.testing import random_eagle3_head_on  # noqa: E402

SHAPES = {
    "llama31-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=128256, draft_vocab_size=32000),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                         vocab_size=49152, draft_vocab_size=12288),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                     vocab_size=151936, draft_vocab_size=32000),
    "llama33-70b": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                        vocab_size=128256, draft_vocab_size=32000),
    # Llama-3.2-1B-class head: head_dim 64
    "llama32-1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=128256, draft_vocab_size=32000),
}


def make_head(shape: str, peaked: bool, dtype=torch.bfloat16, seed=0, weights: str = "bf16") -> Eagle3DraftHead:
    """A random head of ``shape``; ``weights="fp8"``: its linear layers quantised to FP8 (activations in ``dtype``)."""
    cfg = DraftHeadConfig(rms_norm_eps=1e-5, architectures=["LlamaForCausalLMEagle3"], **SHAPES[shape])
    head = random_eagle3_head_on("cuda", cfg, peaked=peaked, dtype=dtype, seed=seed)
    return head.quantize_fp8() if weights == "fp8" else head


def floor_bytes(c: DrafterConfig, batch: int, S: int, prefix: int) -> int:
    """Bytes a draft must move: fc once, every midlayer + lm_head weight once per forward (root + depth),
    the features, and the draft KV read by each forward (prefix + tree rows). With the q/k/v table
    (``DrafterConfig.token_qkv_table``) a tree step streams q/k/v's hidden half and reads a table row (fp32) per
    tree row instead of the embedding half. FP8 weights: one byte each plus an fp32 scale per output row."""
    steps = c.depth + 1
    kv_row = 2 * 2 * c.num_kv_heads * c.head_dim
    kv = batch * kv_row * (steps * (prefix + S) + c.top_k * c.depth * (c.depth + 1) // 2)
    if c.uses_token_table():
        table_rows = batch * c.top_k * c.depth * c.token_table_bytes // c.draft_vocab
        steps_bytes = c.step_weight_bytes() + c.depth * c.step_weight_bytes(qkv_halves=1) + table_rows
    else:
        steps_bytes = steps * c.step_weight_bytes()
    return c.fc_weight_bytes + steps_bytes + 2 * batch * S * c.feature_width + kv


def copy_bandwidth() -> float:
    from triton.testing import do_bench

    a = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * (1 << 30) * 2 / (ms * 1e-3)


def bench_case(head, tc, batch, S, prefix, do_ref, do_graph, rep_ms=300, tuning=None, profile=False):
    """Time one case; its buffers are freed (and the allocator's cache emptied) before the next case.
    ``profile``: True, or "programs" for every program's arrival at every barrier too."""
    res = _measure_case(head, tc, batch, S, prefix, do_ref, do_graph, rep_ms, tuning, profile)
    torch.cuda.empty_cache()
    return res


def _measure_case(head, tc, batch, S, prefix, do_ref, do_graph, rep_ms, tuning, profile):
    from triton.testing import do_bench

    dt = head.dtype
    max_len = max(256, 1 << (prefix + S + tc.depth * tc.top_k + 1).bit_length())
    cfg = DrafterConfig.from_head(head, tc, max_batch=batch, max_len=max_len, max_new_rows=S, **(tuning or {}))
    w = Weights.from_head(head, max_len + tc.depth + 2)
    bufs = Buffers.allocate(cfg, "cuda")
    feats = [torch.randn(batch, S, head.feature_width, device="cuda", dtype=dt) for _ in range(2)]
    ids = torch.randint(0, head.config.vocab_size, (batch, S), device="cuda")
    kv0 = torch.full((batch,), prefix, dtype=torch.int32, device="cuda")
    bufs.k_cache.normal_()
    bufs.v_cache.normal_()
    X = DraftInputs(feats[0], ids)
    res = {}

    def fused():
        bufs.kv_len.copy_(kv0)
        launch_drafter(cfg, X, w, bufs, fallback=False)

    fused()
    torch.cuda.synchronize()
    assert int(bufs.status[0]) == 0
    res["fused_ms"] = do_bench(fused, warmup=25, rep=rep_ms, return_mode="median")
    res["fused_ms_again"] = do_bench(fused, warmup=10, rep=rep_ms, return_mode="median")
    res["fused_max_depth"] = float(bufs.max_depth.float().mean())
    if profile:  # the variant that stamps every barrier arrival: where the time goes, phase by phase
        for _ in range(3):
            bufs.kv_len.copy_(kv0)
            launch_drafter(cfg, X, w, bufs, fallback=False, profile=True)
        torch.cuda.synchronize()
        res["phases"] = profile_phases(cfg, bufs, per_program=profile == "programs")
    if do_graph:
        mk = MultiKernelDrafter(cfg, w, batch, S, "cuda")
        mk.features.copy_(feats[0])
        mk.input_ids.copy_(ids)
        mk.k_cache.normal_()
        mk.v_cache.normal_()
        mk.kv_len.copy_(kv0)
        mk.capture()

        def graph():
            mk.kv_len.copy_(kv0)
            mk.replay()

        res["graph_ms"] = do_bench(graph, warmup=25, rep=rep_ms, return_mode="median")
        # same trees as the fused kernel on these inputs? (bf16: near-ties may differ)
        mk.kv_len.copy_(kv0)
        out = mk.replay()
        bufs.kv_len.copy_(kv0)
        bufs.k_cache[:, :prefix] = mk.k_cache[:, :prefix]
        bufs.v_cache[:, :prefix] = mk.v_cache[:, :prefix]
        launch_drafter(cfg, X, w, bufs)
        res["graph_fused_same_tokens"] = float((out.draft_tokens == bufs.draft_tokens).all(1).float().mean())
        del mk
    if do_ref and batch == 1:
        d = TreeDrafter(head, tc)
        pre_f = torch.randn(1, prefix, head.feature_width, device="cuda", dtype=dt) if prefix else None
        pre_ids = torch.randint(0, head.config.vocab_size, (1, prefix + 1), device="cuda")
        all_ids = torch.cat([pre_ids, ids[:1]], 1)

        def ref():
            d.reset()
            if prefix:
                d._impl.stable_kv = kv_state
            d.draft(feats[0][:1], all_ids)

        kv_state = None
        if prefix:
            d.draft(pre_f, pre_ids)
            kv_state = d._impl.stable_kv
        # the reference is slow: time a few calls with events after one warm-up
        ref()
        ts = []
        for _ in range(7):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            ref()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        res["ref_ms"] = sorted(ts)[len(ts) // 2]
    res["bytes"] = floor_bytes(cfg, batch, S, prefix)
    return res


def parse_tuning(t: str) -> tuple[dict, int, str]:
    """``block_k:num_warps:stages:programs_per_sm[:block_n[:batch]][+key=value...]`` -> (DrafterConfig options,
    batch, scenario); a 0 field = the default; keys are DrafterConfig fields (integers, e.g. ``nprog=33``, or a
    string option's value, e.g. ``tail_one_pass=o/down``) or ``scenario`` (decode/prefill); "" = every default,
    batch 1, decode."""
    if not t:
        return {}, 1, "decode"
    head, *extra = t.split("+")
    f = [int(x) for x in head.split(":")]
    bk, nw, st, pps = f[:4]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = dict(block_k=bk or None, num_warps=nw or None)
    if st:
        out["stages"] = st
    if pps:
        out["nprog"] = sms * pps
    if len(f) > 4 and f[4]:
        out["block_n"] = f[4]
    scenario = "decode"
    for kv in extra:
        k, _, v = kv.partition("=")
        if k == "scenario":
            scenario = v
        else:  # an integer, or a string option's value (tail_one_pass=o/down)
            out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out, (f[5] if len(f) > 5 else 1), scenario


def warm_variant(spec: str) -> None:
    """Compile one kernel variant (run in a subprocess): spec = shape:total:depth:topk:batch[:weights][/tuning]
    [@profile]."""
    spec, _, prof = spec.partition("@")
    spec, _, tun = spec.partition("/")
    shape, total, depth, k, batch, *wts = spec.split(":")
    head = make_head(shape, False, weights=wts[0] if wts else "bf16")
    tc = TreeConfig(int(total), int(depth), int(k))
    opts, tb, _ = parse_tuning(tun)
    bench_case(head, tc, max(int(batch), tb), 4, 8, False, False, rep_ms=1, tuning=opts, profile=bool(prof))


def print_phases(phases: list[dict]) -> None:
    """Phase table, plus the totals per phase kind over all steps."""
    tot: dict[str, list[float]] = {}
    for p in phases:
        kind = p["phase"].split(".")[-1]
        t = tot.setdefault(kind, [0.0, 0.0])
        t[0] += p["us"]
        t[1] += p["mean_us"]
    print("phase kind   total us (to last arrival)   to mean arrival", flush=True)
    for kind, (a, b) in tot.items():
        print(f"  {kind:10s} {a:9.1f} {b:9.1f}")
    print(f"  all        {sum(p['us'] for p in phases):9.1f}")
    print("  per phase: " + ", ".join(f"{p['phase']} {p['us']:.1f}/{p['mean_us']:.1f}" for p in phases), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--warm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--batches", default=None)
    ap.add_argument("--no-ref", action="store_true")
    ap.add_argument("--no-sweep", action="store_true", help="only the --tunings / --profile rows")
    ap.add_argument("--profile", action="store_true", help="also time each phase (barrier arrival stamps) of the "
                    "--tune-case, for the default tiling and every --tunings entry")
    ap.add_argument("--profile-programs", action="store_true", help="with --profile: every program's arrival at "
                    "every barrier in the JSON too (which programs arrive last, phase after phase)")
    ap.add_argument("--tunings", default="", help="comma list of block_k:num_warps:stages:programs_per_sm timed "
                    "on the --tune-case before the sweep")
    ap.add_argument("--tune-case", default="llama31-8b:60/7/10",
                    help="SHAPE:TOTAL/DEPTH/TOPK of the --tunings and --profile rows (decode, random head)")
    ap.add_argument("--shapes", default=None, help=f"comma list of head shapes among {', '.join(SHAPES)}")
    ap.add_argument("--trees", default=None, help="comma list of total/depth/top_k trees, e.g. 60/7/10,60/5/10")
    ap.add_argument("--weights", default=None, help="comma list of weight dtypes: bf16, fp8")
    ap.add_argument("--scenarios", default=None, help="comma list: decode (4 new rows on a 512-row prefix), "
                    "prefill (512 new rows)")
    ap.add_argument("--heads", default=None, help="comma list: random, peaked (lm_head x 12: deep trees)")
    ap.add_argument("--no-graph", action="store_true", help="do not time the multi-kernel CUDA-graph drafter")
    ap.add_argument("--name", default="fused_drafter", help="output files NAME.json and NAME.png")
    args = ap.parse_args(argv)
    if args.warm:
        warm_variant(args.warm)
        return 0
    from results_guard import refuse_foreign

    refuse_foreign("bench_fused_drafter", os.path.join(args.out, f"{args.name}.json"),
                   os.path.join(args.out, f"{args.name}.png"))
    import triton
    from triton.runtime.errors import OutOfResources

    t0 = time.time()
    cases = []  # (shape, peaked, tree, scenario, batch, weights)
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([1] if args.quick else [1, 2, 4, 8, 16])
    selected = any(v is not None for v in (args.shapes, args.trees, args.weights, args.scenarios, args.heads))
    if selected:  # the product of the selected lists
        lst = lambda v, d: (v or d).split(",")  # noqa: E731
        for shape in lst(args.shapes, "llama31-8b"):
            if shape not in SHAPES:
                ap.error(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
            for wt in lst(args.weights, "bf16"):
                if wt not in ("bf16", "fp8"):
                    ap.error(f"unknown weight dtype {wt!r}: bf16 or fp8")
                for tr in lst(args.trees, "60/7/10"):
                    for hd in lst(args.heads, "random"):
                        for scen in lst(args.scenarios, "decode"):
                            for b in batches:
                                cases.append((shape, hd == "peaked", tuple(int(x) for x in tr.split("/")), scen, b,
                                              wt))
    else:
        trees = [(60, 7, 10)] if args.quick else [(60, 7, 10), (60, 5, 10)]
        for tr in trees:
            for peaked in ([False] if args.quick else [False, True]):
                for scen in (["decode"] if args.quick else ["decode", "prefill"]):
                    for b in batches:
                        cases.append(("llama31-8b", peaked, tr, scen, b, "bf16"))
        if not args.quick:
            for b in batches:
                cases.append(("smollm2-135m", False, (60, 7, 10), "decode", b, "bf16"))
    if args.no_sweep:
        cases = []
    tunings = [t for t in args.tunings.split(",") if t]
    variants = sorted({f"{c[0]}:{c[2][0]}:{c[2][1]}:{c[2][2]}:{c[4]}:{c[5]}" for c in cases})
    prof_wt = (args.weights or "bf16").split(",")[0]  # the --tunings / --profile rows: the first --weights entry
    tune_shape, _, tune_tree = args.tune_case.partition(":")
    if tune_shape not in SHAPES:
        ap.error(f"unknown --tune-case shape {tune_shape!r}: one of {', '.join(SHAPES)}")
    tune_tc = TreeConfig(*(int(x) for x in tune_tree.split("/")))
    tune_var = f"{tune_shape}:{tune_tc.total_tokens}:{tune_tc.depth}:{tune_tc.top_k}:1:{prof_wt}"
    variants += [f"{tune_var}/{t}" for t in tunings]
    if args.profile:
        variants += [f"{tune_var}/{t}@p" for t in [""] + tunings]
    procs = []
    for v in (variants if len(variants) > 1 else []):
        while len([p for p in procs if p.poll() is None]) >= args.jobs:
            time.sleep(0.5)
        procs.append(subprocess.Popen([sys.executable, __file__, "--warm", v]))
    fails = [v for v, p in zip(variants if procs else [], procs, strict=True) if p.wait() != 0]
    print(f"compiled {len(variants)} variants in {time.time() - t0:.0f} s; failures: {fails}", flush=True)
    bw = copy_bandwidth()
    rows = []
    heads = {}
    if tunings or args.profile:
        head = make_head(tune_shape, False, weights=prof_wt)
        for t in ([""] if args.profile else []) + tunings:
            try:
                opts, tb, scen = parse_tuning(t)
                S, prefix = (4, 512) if scen == "decode" else (512, 0)
                r = bench_case(head, tune_tc, tb, S, prefix, False, (tb > 1 or scen != "decode") and not args.no_graph,
                               tuning=opts, profile="programs" if args.profile and args.profile_programs
                               else args.profile)
            except (ValueError, OutOfResources) as exc:  # a grid that cannot be resident,
                # a tiling past the shared memory (an explicit block_k)
                print(f"tuning {t}: {exc}", flush=True)
                rows.append(dict(tuning=t, error=str(exc)))
                continue
            r.update(shape=tune_shape, peaked=False, tree=tune_tree, scenario=scen, batch=tb,
                     tuning=t, weights=prof_wt,
                     floor_ms=r["bytes"] / bw * 1e3, fused_TBps=r["bytes"] / (r["fused_ms"] * 1e-3) / 1e12)
            print(f"tuning {t}: fused {r['fused_ms']:.3f} ({r['fused_ms_again']:.3f}) ms, graph "
                  f"{r.get('graph_ms', float('nan')):.3f}, floor {r['floor_ms']:.3f}, "
                  f"{r['fused_TBps']:.2f} TB/s", flush=True)
            if "phases" in r:
                print_phases(r["phases"])
            rows.append(r)
        del head
        torch.cuda.empty_cache()
    for shape, peaked, tr, scen, b, wt in cases:
        key = (shape, peaked, wt)
        if key not in heads:
            heads.clear()
            torch.cuda.empty_cache()
            heads[key] = make_head(shape, peaked, weights=wt)
        head = heads[key]
        S, prefix = (4, 512) if scen == "decode" else (512, 0)
        tc = TreeConfig(*tr)
        try:
            r = bench_case(head, tc, b, S, prefix, do_ref=not args.no_ref, do_graph=not args.no_graph)
        except Exception as exc:  # record the failure (e.g. out of memory) and go on with the sweep
            print(f"{shape} {tr} {scen} B={b}: {type(exc).__name__}: {exc}"[:300], flush=True)
            rows.append(dict(shape=shape, peaked=peaked, tree=f"{tr[0]}/{tr[1]}/{tr[2]}", scenario=scen, batch=b,
                             weights=wt, error=f"{type(exc).__name__}: {exc}"[:300]))
            torch.cuda.empty_cache()
            continue
        r.update(shape=shape, peaked=peaked, tree=f"{tr[0]}/{tr[1]}/{tr[2]}", scenario=scen, batch=b, weights=wt,
                 floor_ms=r["bytes"] / bw * 1e3, fused_TBps=r["bytes"] / (r["fused_ms"] * 1e-3) / 1e12)
        r["fused_over_floor"] = r["fused_ms"] / r["floor_ms"]
        rows.append(r)
        print(f"{shape:13s} {wt:4s} {'peaked' if peaked else 'random':6s} {r['tree']:8s} {scen:7s} B={b:2d} "
              f"ref {r.get('ref_ms', float('nan')):7.2f}  graph {r.get('graph_ms', float('nan')):6.3f}  "
              f"fused {r['fused_ms']:6.3f} ({r['fused_ms_again']:6.3f})  floor {r['floor_ms']:6.3f} ms  "
              f"{r['fused_TBps']:.2f} TB/s  depth {r['fused_max_depth']:.1f}", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                torch=torch.__version__, triton=triton.__version__, copy_TBps=bw / 1e12,
                command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                sms=torch.cuda.get_device_properties(0).multi_processor_count, wall_s=time.time() - t0,
                **git_commit())
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows_p = [r for r in rows if "tuning" not in r and "error" not in r]
        if not rows_p:
            raise RuntimeError("no sweep rows to plot")
        groups = sorted({(r["shape"], r["peaked"], r["tree"], r["scenario"], r.get("weights", "bf16"))
                         for r in rows_p})
        ncol = min(4, len(groups))
        nrow = -(-len(groups) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.5 * nrow), squeeze=False)
        for ax in axes.flat[len(groups):]:
            ax.set_visible(False)
        for ax, g in zip(axes.flat, groups, strict=False):
            rs = [r for r in rows_p
                  if (r["shape"], r["peaked"], r["tree"], r["scenario"], r.get("weights", "bf16")) == g]
            xs = [r["batch"] for r in rs]
            for col, lab in (("fused_ms", "fused"), ("graph_ms", "multi-kernel graph"), ("floor_ms", "floor")):
                ax.plot(xs, [r.get(col, float("nan")) for r in rs], "o-", label=lab)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{g[0]} {g[4]} {'peaked' if g[1] else 'random'}\n{g[2]} {g[3]}", fontsize=8)
            ax.set_xlabel("batch")
            ax.set_ylabel("ms per draft")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, f"{args.name}.png"), dpi=100)
    except Exception as exc:  # matplotlib missing on the device: JSON still written
        print("no plot:", exc)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
