"""The kernel benchmark: every Triton op against its PyTorch reference at real shapes (GPU only).

    python bench/bench_kernels.py [--out DIR] [--only SUBSTR ...] [--budget-s 330]

Cases: this file's own (tree / draft attention, KV append / compaction, LM-head top-k at Llama-3.1-8B shapes:
32 query heads, 8 KV heads, head_dim 128, prefixes 1k-8k, 60 tree tokens, vocabularies 32000 and 128256) plus the
``cases(device)`` lists of every ``eagle_triton.ops.<op>.bench`` module (dicts with ``name``, ``shape``,
``triton``, ``ref``, ``bytes`` and optionally ``baselines``: more ``{label: fn}`` timed the same way).

Timing: ``triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")`` (CUDA events, after warm-up),
each case on fresh random inputs, rotating between input copies when one copy would sit in L2 (50 MB on H100).
Achieved bandwidth is ``bytes / median time`` where ``bytes`` is the fewest bytes the op must move (each input
read once, each output written once). Writes ``kernels.json`` and ``kernels.png`` to ``--out`` (default ``$OUT``
or ``bench/results/``) with device, date, versions and the command, and prints a fixed-width table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import math
import os
import pkgutil
import platform
import sys
import time
import traceback

import torch

L2_BYTES = 50 * 2**20


def _rotating(make, nbytes: int):
    """``make()`` returns a zero-argument callable on its own fresh inputs; cycle through enough copies that
    consecutive calls do not find their inputs in L2 (at most 4 copies)."""
    n = 1 if nbytes >= 2 * L2_BYTES else min(4, max(2, math.ceil(2 * L2_BYTES / max(nbytes, 1))))
    fns = [make() for _ in range(n)]
    state = {"i": 0}

    def run():
        state["i"] = (state["i"] + 1) % n
        return fns[state["i"]]()

    return run


def _own_cases(device: str) -> list[dict]:
    from eagle_triton.ops.attention import (
        draft_tree_attention,
        draft_tree_attention_ref,
        tree_attention,
        tree_attention_ref,
    )
    from eagle_triton.ops.kv_cache import (
        append_kv_cache,
        append_kv_cache_ref,
        compact_kv_cache,
        compact_kv_cache_ref,
    )
    from eagle_triton.ops.lm_head_topk import lm_head_topk, lm_head_topk_ref

    dt = torch.bfloat16
    Hq, Hkv, D, Tq, K = 32, 8, 128, 60, 10
    cases = []

    def tree_inputs(L):
        g = torch.Generator(device=device).manual_seed(L)
        q = torch.randn(1, Tq, Hq, D, device=device, dtype=dt, generator=g)
        k = torch.randn(1, L + Tq, Hkv, D, device=device, dtype=dt, generator=g)
        v = torch.randn(1, L + Tq, Hkv, D, device=device, dtype=dt, generator=g)
        lens = torch.tensor([L], dtype=torch.int32, device=device)
        par = torch.cat([torch.tensor([-1]), (torch.rand(Tq - 1, generator=torch.Generator().manual_seed(L))
                                              * torch.arange(1, Tq)).long()])
        mask = torch.zeros(Tq, Tq, dtype=torch.bool)
        for i in range(Tq):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = int(par[j])
        return q, k, v, lens, mask[None].to(device)

    for L in (1024, 2048, 4096, 8192):
        nbytes = 2 * (L + Tq) * Hkv * D * 2 + 2 * Tq * Hq * D * 2 + Tq * Tq
        shape = f"B=1 Tq={Tq} Hq={Hq} Hkv={Hkv} D={D} prefix={L}"

        def make(L=L, fn=tree_attention):
            a = tree_inputs(L)
            return lambda: fn(*a, validate=False) if fn is tree_attention else fn(*a)

        def sdpa(L=L):
            q, k, v, lens, mask = tree_inputs(L)
            full = torch.cat([torch.ones(Tq, L, dtype=torch.bool, device=device), mask[0]], 1)
            qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            return lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=full,
                                                                            enable_gqa=True)

        cases.append({"name": "tree_attention", "shape": shape, "bytes": nbytes,
                      "triton": _rotating(make, nbytes), "ref": _rotating(lambda L=L: make(L, tree_attention_ref),
                                                                          nbytes),
                      "baselines": {"torch_sdpa_bf16": _rotating(sdpa, nbytes)}})

    A = 8
    for L in (1024, 4096, 8192):
        nbytes = 2 * L * Hkv * D * 2 + 2 * K * A * Hkv * D * 2 + 2 * K * Hq * D * 2

        def make(L=L, fn=draft_tree_attention):
            g = torch.Generator(device=device).manual_seed(L + 1)
            r = lambda *s: torch.randn(*s, device=device, dtype=dt, generator=g)  # noqa: E731
            q, kc, vc = r(1, K, Hq, D), r(1, L, Hkv, D), r(1, L, Hkv, D)
            ak, av, kn, vn = r(1, K, A, Hkv, D), r(1, K, A, Hkv, D), r(1, K, Hkv, D), r(1, K, Hkv, D)
            lens = torch.tensor([L], dtype=torch.int32, device=device)
            alen = torch.full((1, K), A - 1, dtype=torch.int32, device=device)
            pos = torch.full((1, K), L + A - 1, device=device)
            inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=device).float() / D))
            f = torch.outer(torch.arange(L + 64, device=device).float(), inv)
            cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
            args = (q, kc, vc, lens, ak, av, alen, cos, sin, pos, kn, vn)
            if fn is draft_tree_attention:
                return lambda: fn(*args, validate=False)
            return lambda: fn(*args)

        cases.append({"name": "draft_tree_attention", "shape": f"B=1 N={K} anc={A - 1} prefix={L}", "bytes": nbytes,
                      "triton": _rotating(make, nbytes),
                      "ref": _rotating(lambda L=L: make(L, draft_tree_attention_ref), nbytes)})

    Lmax = 8192
    nbytes = 2 * 2 * Tq * Hkv * D * 2

    def make_append(fn):
        kc = torch.randn(1, Lmax, Hkv, D, device=device, dtype=dt)
        vc = torch.randn_like(kc)
        kn, vn = torch.randn(1, Tq, Hkv, D, device=device, dtype=dt), torch.randn(1, Tq, Hkv, D, device=device,
                                                                                    dtype=dt)
        lens = torch.tensor([4000], dtype=torch.int32, device=device)
        if fn is append_kv_cache:
            return lambda: fn(kc, vc, kn, vn, lens, validate=False)
        return lambda: fn(kc, vc, kn, vn, lens)

    cases.append({"name": "append_kv_cache", "shape": f"B=1 Tn={Tq} Hkv={Hkv} D={D}", "bytes": nbytes,
                  "triton": make_append(append_kv_cache), "ref": make_append(append_kv_cache_ref)})

    NL, A = 32, 8
    nbytes = NL * 2 * 2 * (A - 1) * Hkv * D * 2  # K and V, read + write, the A-1 rows that move

    def make_compact(fn):
        kc = torch.randn(NL, 1, 1024, Hkv, D, device=device, dtype=dt)
        vc = torch.randn_like(kc)
        lens = torch.tensor([900], dtype=torch.int32, device=device)
        idx = torch.tensor([[0, 3, 9, 17, 25, 33, 41, 52]], device=device)
        n = torch.tensor([A], dtype=torch.int32, device=device)
        if fn is compact_kv_cache:
            return lambda: fn(kc, vc, lens, idx, n, validate=False)
        return lambda: fn(kc, vc, lens, idx, n)

    cases.append({"name": "compact_kv_cache", "shape": f"NL={NL} B=1 path={A} Hkv={Hkv} D={D}", "bytes": nbytes,
                  "triton": make_compact(compact_kv_cache), "ref": make_compact(compact_kv_cache_ref)})

    H = 4096
    for V in (32000, 128256):
        for M in (1, 10, 60):
            nbytes = V * H * 2 + M * H * 2

            def make_lm(fn, V=V, M=M):
                g = torch.Generator(device=device).manual_seed(V + M)
                x = torch.randn(M, H, device=device, dtype=dt, generator=g)
                w = torch.randn(V, H, device=device, dtype=dt, generator=g) * 0.02
                return lambda: fn(x, w, K)

            def torch_bf16(x_w):
                x, w = x_w
                return lambda: torch.topk(torch.log_softmax((x @ w.T).float(), -1), K)

            def make_torch(V=V, M=M):
                g = torch.Generator(device=device).manual_seed(V + M)
                x = torch.randn(M, H, device=device, dtype=dt, generator=g)
                w = torch.randn(V, H, device=device, dtype=dt, generator=g) * 0.02
                return torch_bf16((x, w))

            cases.append({"name": "lm_head_topk", "shape": f"M={M} V={V} H={H} k={K}", "bytes": nbytes,
                          "triton": _rotating(lambda V=V, M=M: make_lm(lm_head_topk, V, M), nbytes),
                          "ref": make_lm(lm_head_topk_ref),
                          "baselines": {"torch_bf16_matmul_topk": _rotating(make_torch, nbytes)}})
    return cases


def _other_cases(device: str) -> list[dict]:
    import eagle_triton.ops as ops

    out = []
    for info in pkgutil.iter_modules(ops.__path__):
        if not info.ispkg or importlib.util.find_spec(f"eagle_triton.ops.{info.name}.bench") is None:
            continue
        try:
            mod = importlib.import_module(f"eagle_triton.ops.{info.name}.bench")
            out.extend(mod.cases(device))
        except Exception as e:  # one broken module must not hide the others
            out.append({"name": f"{info.name}.bench", "shape": "-", "error": f"cases() failed: {e!r}"})
    return out


def _time(fn) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--only", nargs="*", default=None, help="run cases whose name contains one of these")
    p.add_argument("--budget-s", type=float, default=330.0, help="stop starting new cases after this many seconds")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from results_guard import refuse_foreign

    refuse_foreign("bench_kernels", os.path.join(args.out, "kernels.json"), os.path.join(args.out, "kernels.png"))
    import triton

    device = "cuda"
    t_start = time.time()
    torch.manual_seed(0)
    cases = _own_cases(device) + _other_cases(device)
    if args.only:
        cases = [c for c in cases if any(s in c["name"] for s in args.only)]
    rows = []
    for c in cases:
        row = {"name": c["name"], "shape": c["shape"], "bytes": c.get("bytes")}
        if "error" in c:
            row["error"] = c["error"]
        elif time.time() - t_start > args.budget_s:
            row["error"] = "skipped: time budget"
        else:
            try:
                row["triton_ms"] = _time(c["triton"])
                row["ref_ms"] = _time(c["ref"])
                row["speedup"] = row["ref_ms"] / row["triton_ms"]
                for label, fn in (c.get("baselines") or {}).items():
                    row.setdefault("baselines_ms", {})[label] = _time(fn)
                if row["bytes"]:
                    row["triton_tbps"] = row["bytes"] / (row["triton_ms"] * 1e-3) / 1e12
            except Exception as e:
                row["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()[-500:]
            torch.cuda.empty_cache()
        rows.append(row)
        _print_row(row)

    meta = {
        "device": torch.cuda.get_device_name(0),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "command": " ".join([sys.executable] + sys.argv),
        "timing": "triton.testing.do_bench(warmup=25 ms, rep=100 ms, return_mode='median'); inputs rotated past L2",
        "bytes": "fewest bytes each op must move; triton_tbps = bytes / triton median time",
        "wall_s": round(time.time() - t_start, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernels.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    png = _plot(rows, meta, os.path.join(args.out, "kernels.png"))
    wrote = os.path.join(args.out, "kernels.json")
    print(f"\nwrote {wrote}" + (f" and {png}" if png else " (no PNG: matplotlib missing)"))
    _print_table(rows, meta)
    return 0


def _print_row(r):
    if "error" in r:
        print(f"{r['name']:<38} {r['shape']:<44} ERROR {r['error'][:120]}", flush=True)
    else:
        print(f"{r['name']:<38} {r['shape']:<44} {r['triton_ms']:.4f} ms (ref {r['ref_ms']:.4f})", flush=True)


def _print_table(rows, meta):
    print(f"\n{meta['device']} | torch {meta['torch']} | triton {meta['triton']} | {meta['date']}")
    hdr = f"{'op':<38} {'shape':<44} {'triton ms':>10} {'ref ms':>10} {'speedup':>8} {'TB/s':>6}  baselines ms"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<38} {r['shape']:<44} {'error':>10}")
            continue
        tb = f"{r['triton_tbps']:.2f}" if r.get("triton_tbps") else "-"
        base = " ".join(f"{k}={v:.4f}" for k, v in (r.get("baselines_ms") or {}).items())
        print(f"{r['name']:<38} {r['shape']:<44} {r['triton_ms']:>10.4f} {r['ref_ms']:>10.4f} "
              f"{r['speedup']:>7.1f}x {tb:>6}  {base}")


def _plot(rows, meta, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return None
    labels = [f"{r['name']}\n{r['shape']}" for r in ok]
    fig, axes = plt.subplots(1, 2, figsize=(16, max(4, 0.38 * len(ok) + 1.5)), sharey=True)
    y = range(len(ok))
    axes[0].barh(y, [r["speedup"] for r in ok], color="tab:blue")
    axes[0].set_xscale("log")
    axes[0].axvline(1.0, color="k", lw=0.8)
    axes[0].set_xlabel("speedup over the PyTorch reference (median, log scale)")
    axes[0].set_yticks(list(y))
    axes[0].set_yticklabels(labels, fontsize=6)
    axes[0].invert_yaxis()
    axes[1].barh(y, [r.get("triton_tbps") or 0 for r in ok], color="tab:green")
    axes[1].set_xlabel("achieved bandwidth of the Triton kernel (TB/s, fewest bytes / time)")
    fig.suptitle(f"eagle-triton kernels on {meta['device']} (torch {meta['torch']}, triton {meta['triton']}, "
                 f"{meta['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
