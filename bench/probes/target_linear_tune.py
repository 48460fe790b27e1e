"""Probe: tile configurations of the batch-invariant target linear at the Llama-3.1-8B shapes (GPU only).

For each weight shape and each config, times ``target_linear`` at M = 1 (decode) and M = 60 (verify) with the
median of ``triton.testing.do_bench``, rotating over enough weight copies that L2 (50 MB) cannot hold them, next
to ``F.linear`` (cuBLAS) on the same data. The normed products (q/k/v, gate/up) run without the norm, with the
row-sum prologue (``norm=row``) and with the norm read from 128 partial sums of squares (``norm=partials``, what
the fused forward does); the residual products (o, down) with and without writing those partials
(``sumsq_out``). Prints weight TB/s; writes JSON to ``--out``.

    python bench/probes/target_linear_tune.py --out /tmp/tune.json [--quick]
    python bench/probes/target_linear_tune.py --model smollm2 --norms none --out /tmp/tune_smollm2.json

``--model smollm2``: SmolLM2-135M's shapes and a grid for small products (more, narrower tiles: few programs
stream a small weight at one SM's bandwidth). ``--norms none``: the normed products without a norm (the default
``norm_mode="kernel"`` runs the norm as its own kernel).
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from eagle_triton.ops.target_linear import LinearConfig, sumsq_width, target_linear  # noqa: E402

SHAPES = {  # name: (N rows of W, K, flags)
    "qkv": (6144, 4096, dict(norm=True)),
    "o": (4096, 4096, dict(res=True)),
    "gate_up": (28672, 4096, dict(norm=True, silu=True)),
    "down": (4096, 14336, dict(res=True)),
    "lm_head": (128256, 4096, {}),
}
SHAPES_SMOLLM2 = {
    "qkv": (960, 576, dict(norm=True)),
    "o": (576, 576, dict(res=True)),
    "gate_up": (3072, 576, dict(norm=True, silu=True)),
    "down": (576, 1536, dict(res=True)),
    "lm_head": (49152, 576, {}),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--shapes", default=None)
    p.add_argument("--model", choices=["8b", "smollm2"], default="8b")
    p.add_argument("--norms", default="none,row,partials", help="norm variants of the normed products")
    p.add_argument("--grid", default=None, help="the configs as block_m/block_n/block_k/stages lists, e.g. "
                   "'64/32,64,128/128,256/3,4' (default: the model's grid below)")
    a = p.parse_args()
    dev, dt = "cuda", torch.bfloat16
    shapes = SHAPES if a.model == "8b" else SHAPES_SMOLLM2
    a.shapes = a.shapes or ",".join(shapes)
    norms = a.norms.split(",")
    grid = list(itertools.product((16, 64), (32, 64, 128), (128, 256), (3, 4), (4,)))
    if a.model == "smollm2":
        grid = list(itertools.product((16, 64), (16, 32), (64, 128, 256), (2, 4), (4,)))
    if a.quick:
        grid = [(64, 32, 128, 4, 4), (64, 64, 256, 4, 4), (16, 64, 256, 4, 4)]
    if a.grid:
        lists = [[int(v) for v in part.split(",")] for part in a.grid.split("/")]
        if len(lists) != 4:
            p.error(f"--grid takes four /-separated lists (block_m/block_n/block_k/stages), got {a.grid!r}")
        grid = list(itertools.product(*lists, (4,)))
    rows = []
    for name in a.shapes.split(","):
        N, K, fl = shapes[name]
        copies = max(2, int(150e6 // (N * K * 2)) + 1)
        ws = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        nw = torch.rand(K, device=dev, dtype=dt) + 0.5 if fl.get("norm") else None
        n_out = N // 2 if fl.get("silu") else N
        for M in (1, 60):
            x = torch.randn(M, K, device=dev, dtype=dt)
            res = torch.randn(M, n_out, device=dev, dtype=dt) if fl.get("res") else None
            it = itertools.cycle(ws)
            t = do_bench(lambda x=x, it=it: F.linear(x, next(it)), warmup=25, rep=100, return_mode="median")
            rows.append(dict(shape=name, M=M, variant="cublas", us=t * 1e3, TBps=N * K * 2 / t / 1e9))
            print(f"{name:8s} M={M:3d} cublas {t*1e3:8.1f} us {N*K*2/t/1e9:5.2f} TB/s", flush=True)
            # partial sums of squares of x as the previous residual product (o/down tiles, BN 32) writes them
            ss_in = torch.rand(M, sumsq_width(K, LinearConfig(block_n=32)), device=dev) * K
            for bm, bn, bk, st, nwp in grid:
                cfg = LinearConfig(block_m=bm, block_n=bn, block_k=bk, num_stages=st, num_warps=nwp)
                ss_out = torch.empty(M, sumsq_width(n_out, cfg), device=dev)
                variants = ([(n, False) for n in norms] if fl.get("norm")
                            else [("none", False), ("none", True)] if fl.get("res") else [("none", False)])
                for norm, write_ss in variants:
                    def fn(cfg=cfg, norm=norm, write_ss=write_ss, x=x, it=it, nw=nw, res=res, fl=fl, ss_in=ss_in,
                           ss_out=ss_out):
                        return target_linear(x, next(it), norm_weight=nw if norm != "none" else None,
                                             sumsq=ss_in if norm == "partials" else None, residual=res,
                                             sumsq_out=ss_out if write_ss else None, silu_mul=bool(fl.get("silu")),
                                             config=cfg, validate=False)
                    try:
                        t = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    except Exception as e:  # a config over the shared-memory budget
                        print(f"{name} M={M} {cfg} norm={norm} sumsq_out={write_ss}: {type(e).__name__}", flush=True)
                        continue
                    tb = N * K * 2 / t / 1e9
                    rows.append(dict(shape=name, M=M, variant=f"bm{bm} bn{bn} bk{bk} st{st} w{nwp}", norm=norm,
                                     sumsq_out=write_ss, us=t * 1e3, TBps=tb))
                    print(f"{name:8s} M={M:3d} bm{bm:3d} bn{bn:3d} bk{bk:3d} st{st} w{nwp} norm={norm:8s} "
                          f"ss_out={int(write_ss)} {t*1e3:8.1f} us {tb:5.2f} TB/s", flush=True)
        del ws
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), date=time.strftime("%F %T"),
                                           model=a.model,
                                           torch=torch.__version__, command=" ".join(sys.argv), rows=rows),
                                      indent=1))
    best = {}
    for r in rows:
        k = (r["shape"], r["M"], r.get("norm"), r.get("sumsq_out"))
        if k not in best or r["us"] < best[k]["us"]:
            best[k] = r
    for k, r in sorted(best.items(), key=lambda kv: str(kv[0])):
        print("BEST", k, r["variant"], f"{r['us']:.1f} us {r['TBps']:.2f} TB/s")


if __name__ == "__main__":
    main()
