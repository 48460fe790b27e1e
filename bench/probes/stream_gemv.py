"""Probe: how fast can one persistent Triton program per SM stream a weight matrix for a 10-row product?

Y[M, N] = X[M, K] @ W[N, K].T with M = 10 rows (a 16-row tile), the shape of the fused drafter's phases. Variants
change the unit tile, the pipeline and the operand order, and one streams W with no X at all. Prints TB/s of weight
bytes (median of triton.testing.do_bench) next to cuBLAS on the same product. GPU only.

    python bench/probes/stream_gemv.py [--out DIR]
"""

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def gemv_kernel(X, W, Y, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, TRANS: tl.constexpr,
                NOX: tl.constexpr, CG: tl.constexpr):
    pid = tl.program_id(0)
    offm = tl.arange(0, BM)
    offn = tl.arange(0, BN)
    offk = tl.arange(0, BK)
    rok = offm < M
    for t in range(pid, N // BN, NPROG):
        cols = t * BN + offn
        if TRANS:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
        else:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            w = tl.load(W + cols.to(tl.int64)[:, None] * K + k0 + offk[None, :])
            if NOX:
                x = tl.full([BM, BK], 1.0, dtype=tl.bfloat16)
            elif CG:
                x = tl.load(X + offm[:, None] * K + k0 + offk[None, :], mask=rok[:, None], other=0.0,
                            cache_modifier=".cg")
            else:
                x = tl.load(X + offm[:, None] * K + k0 + offk[None, :], mask=rok[:, None], other=0.0)
            if TRANS:
                acc = tl.dot(w, tl.trans(x), acc)
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        if TRANS:
            tl.store(Y + offm[None, :] * N + cols[:, None], acc.to(tl.bfloat16), mask=rok[None, :])
        else:
            tl.store(Y + offm[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=rok[:, None])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (N, K) in {"down 4096x14336": (4096, 14336), "gate 14336x4096": (14336, 4096),
                         "lm 32000x4096": (32000, 4096)}.items():
        M = 10
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        Y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        wbytes = N * K * 2
        ms = do_bench(lambda X=X, W=W: torch.matmul(X, W.t()), warmup=25, rep=200, return_mode="median")
        print(f"{name}: cuBLAS {ms * 1e3:.1f} us {wbytes / ms / 1e9:.2f} TB/s", flush=True)
        rows.append(dict(shape=name, variant="cublas", us=ms * 1e3, TBps=wbytes / ms / 1e9))
        ref = (X.float() @ W.float().t())
        variants = []
        for bn in (16, 32, 64):
            for bk in (128, 256):
                for st in (3, 4, 5):
                    variants.append(dict(BN=bn, BK=bk, STAGES=st, TRANS=False, NOX=False, CG=True, nw=4, pps=1))
        variants += [dict(BN=64, BK=128, STAGES=4, TRANS=True, NOX=False, CG=True, nw=4, pps=1),
                     dict(BN=64, BK=256, STAGES=3, TRANS=True, NOX=False, CG=True, nw=4, pps=1),
                     dict(BN=128, BK=128, STAGES=4, TRANS=True, NOX=False, CG=True, nw=4, pps=1),
                     dict(BN=16, BK=256, STAGES=3, TRANS=False, NOX=True, CG=True, nw=4, pps=1),
                     dict(BN=16, BK=256, STAGES=3, TRANS=False, NOX=False, CG=False, nw=4, pps=1),
                     dict(BN=16, BK=128, STAGES=3, TRANS=False, NOX=False, CG=True, nw=4, pps=2),
                     dict(BN=16, BK=128, STAGES=4, TRANS=False, NOX=False, CG=True, nw=4, pps=2),
                     dict(BN=32, BK=128, STAGES=3, TRANS=False, NOX=False, CG=True, nw=4, pps=2),
                     dict(BN=16, BK=256, STAGES=3, TRANS=False, NOX=False, CG=True, nw=8, pps=1)]
        for v in variants:
            nprog = sms * v["pps"]
            try:
                def fn(X=X, W=W, Y=Y, M=M, N=N, K=K, v=v, nprog=nprog):  # the loop's values, bound now
                    gemv_kernel[(nprog,)](X, W, Y, M, N, K, 16, v["BN"], v["BK"], v["STAGES"], nprog,
                                          v["TRANS"], v["NOX"], v["CG"], num_warps=v["nw"])

                fn()
                torch.cuda.synchronize()
                ok = v["NOX"] or torch.allclose(Y.float(), ref, atol=0.5, rtol=0.02)
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                r = dict(shape=name, variant=str(v), us=ms * 1e3, TBps=wbytes / ms / 1e9, correct=bool(ok))
            except Exception as e:
                r = dict(shape=name, variant=str(v), error=f"{type(e).__name__}: {e}"[:200])
            print(r, flush=True)
            rows.append(r)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "stream_gemv.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=time.strftime("%F %T"), triton=triton.__version__,
                       torch=torch.__version__, command="python bench/probes/stream_gemv.py", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
