"""Weight-product tiles timed as the target forward runs them: back to back inside one CUDA graph (GPU probe).

``bench/probes/target_linear_tune.py`` times one product per ``do_bench`` call, which for SmolLM2's tiny products
measures mostly the launch. Here each configuration runs as a chain of products captured in one CUDA graph
(distinct weights, so they stream from HBM as in a forward), with programmatic dependent launch off and on, at
``M = 1`` (decode) and ``M = 60`` (verify); the time per product and its weight-bytes floor are recorded.

    python bench/probes/target_linear_chain.py --model smollm2|8b --out chain.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

SHAPES = {  # name: (N, K, silu_mul, residual)
    "smollm2": {"qkv": (960, 576, False, False), "o": (576, 576, False, True), "gate_up": (1536, 576, True, False),
                "down": (576, 1536, False, True), "lm_head": (49152, 576, False, False)},
    "8b": {"qkv": (6144, 4096, False, False), "o": (4096, 4096, False, True), "gate_up": (14336, 4096, True, False),
           "down": (4096, 14336, False, True), "lm_head": (128256, 4096, False, False)},
}
# (block_n, block_k, prefetch, num_warps, num_stages); "default" = the library's current default_config
SMALL_CANDIDATES = [(16, 128, 2, 4, 2), (16, 256, 2, 4, 2), (32, 128, 2, 4, 2), (32, 256, 2, 4, 2),
                    (16, 64, 2, 4, 3), (64, 128, 2, 4, 2), (16, 512, 1, 4, 1), (16, 256, 1, 4, 3)]


def time_graph(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / reps)
    return sorted(ts)[len(ts) // 2]


def _chain(target_linear, x, ws, r_in, silu, outs, cfg, launches):
    def fn():
        for i in range(launches):
            target_linear(x, ws[i % len(ws)], residual=r_in, silu_mul=silu, out=outs[i % 2], config=cfg,
                          validate=False)
    return fn


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=list(SHAPES), default="smollm2")
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="1,60")
    p.add_argument("--budget-s", type=float, default=250)
    p.add_argument("--shapes", default=None, help="comma-separated product names (default: all of the model's)")
    p.add_argument("--widths", default=None,
                   help="8b: comma-separated output-tile widths BN to time besides the default (BK 256 then 128, "
                        "stages as fit 200 KiB, two chunks asked of L2), e.g. 64,128")
    p.add_argument("--candidates", default=None,
                   help="explicit tiles to time besides the default, ';'-separated 'BN:BK:warps:stages[:prefetch]' "
                        "(two chunks asked of L2), e.g. '128:64:4:4;64:128:8:4'")
    p.add_argument("--pdl", default="0,1", help="programmatic dependent launch settings to time (0 off, 1 on)")
    args = p.parse_args(argv)
    from eagle_triton.ops.target_linear import LinearConfig, default_config, target_linear

    dev, dt = torch.device("cuda"), torch.bfloat16
    x0 = torch.empty(1 << 20, device=dev, dtype=dt).copy_(torch.randn(1 << 20) * 0.01)
    bw_t = torch.empty(1 << 28, device=dev, dtype=torch.uint8)
    ms = time_graph(lambda: bw_t[: 1 << 27].copy_(bw_t[1 << 27:]), reps=5)
    bw = 2 * (1 << 27) / (ms * 1e-3)
    res = {"model": args.model, "device": torch.cuda.get_device_name(), "copy_bandwidth": bw,
           "torch": torch.__version__, "triton": __import__("triton").__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv), "runs": []}
    t_end = time.time() + args.budget_s
    todo = args.shapes.split(",") if args.shapes else list(SHAPES[args.model])
    for name, (N, K, silu, resid) in SHAPES[args.model].items():
        if name not in todo:
            continue
        rows_w = 2 * N if silu else N
        wbytes = rows_w * K * 2
        n_w = max(1, min(32, (256 << 20) // wbytes))  # distinct weights: more than L2 holds
        ws = [torch.randn(rows_w, K, device=dev, dtype=dt) * 0.02 for _ in range(n_w)]
        launches = max(n_w, 24)
        default = default_config(N, K, dev, dt, silu_mul=silu)
        cands = [("default", default)]
        if args.model == "smollm2":
            cands += [(f"{bn}x{bk}/pre{pre}/w{nw}/s{st}", LinearConfig(64, bn, bk, nw, st, pre))
                      for bn, bk, pre, nw, st in SMALL_CANDIDATES]
        elif args.candidates or args.widths:
            specs = args.candidates.split(";") if args.candidates else [
                # each width in BK 256 then 128 chunks, 4 warps, as many stages (2-4) as fit 200 KiB
                f"{bn}:{bk}:4:{max(2, min(4, (200 * 1024) // ((64 + (2 if silu else 1) * bn) * bk * 2)))}"
                for bn in map(int, args.widths.split(",")) for bk in (256, 128)]
            for spec in specs:
                bn, bk, nw, st, *pre = map(int, spec.split(":"))
                pre = pre[0] if pre else 0
                cands.append((f"{bn}x{bk}/w{nw}/s{st}/pre{pre}", LinearConfig(64, bn, bk, nw, st, pre, 2)))
        else:
            for pre in (1, 2):
                c = default
                cands.append((f"default/pre{pre}", LinearConfig(c.block_m, c.block_n, c.block_k, c.num_warps,
                                                                 max(2, c.num_stages - 1), pre)))
        for M in map(int, args.rows.split(",")):
            x = x0[: M * K].view(M, K)
            r_in = x0[: M * N].view(M, N) if resid else None
            outs = [torch.empty(M, N, device=dev, dtype=dt) for _ in range(2)]
            for label, cfg in cands:
                for pdl in args.pdl.split(","):
                    if time.time() > t_end:
                        break
                    os.environ["EAGLE_TRITON_PDL"] = pdl
                    try:
                        ms = time_graph(_chain(target_linear, x, ws, r_in, silu, outs, cfg, launches))
                        us = ms * 1e3 / launches
                        r = {"shape": name, "M": M, "config": label, "cfg": list(cfg.__dict__.values()),
                             "pdl": pdl == "1", "us": us, "floor_us": wbytes / bw * 1e6}
                    except Exception as e:  # noqa: BLE001 - a probe records what failed
                        r = {"shape": name, "M": M, "config": label, "pdl": pdl == "1", "error": repr(e)[:300]}
                    print(json.dumps(r), flush=True)
                    res["runs"].append(r)
        del ws
        torch.cuda.empty_cache()
    os.environ.pop("EAGLE_TRITON_PDL", None)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
