"""Does programmatic dependent launch (PDL) shorten a chain of small weight products in a CUDA graph? (GPU probe)

A chain of 1-row products at SmolLM2-135M's shapes (30 layers x q/k/v 576->960, o 576->576, gate/up 576->3072,
down 1536->576; each product reads the previous one's output), captured in one CUDA graph and replayed, timed per
product, three ways: (a) a plain launch, (b) ``launch_pdl=True`` with ``gdc_wait`` first, (c) ``launch_pdl=True``
with the program's weight tile loaded *before* ``gdc_wait`` (weights do not depend on the previous kernel), and
(d) the project's ``target_linear`` op, for reference.

    python bench/probes/pdl_probe.py --out pdl_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, N, K, BN: tl.constexpr, KP: tl.constexpr, MODE: tl.constexpr):
    # MODE 0: no PDL; 1: wait first; 2: weights before the wait
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, KP)
    wmask = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    if MODE == 1:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=wmask, other=0.0)
    if MODE == 2:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
    y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def time_graph(fn, reps=50):
    """Median ms per replay of ``fn`` captured in a CUDA graph (target_linear_chain's timer), and the graph."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from target_linear_chain import time_graph as chain_time

    return chain_time(fn, reps), None


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--bn", default="8,16,32")
    args = p.parse_args(argv)
    dev, dt = "cuda", torch.bfloat16
    # scaled by 1/sqrt(K) so that 120 chained products neither overflow nor vanish (the outputs are compared)
    ws = [torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5 for _ in range(args.layers) for n, k in SHAPES]
    bufs = [torch.randn(4096, device=dev, dtype=dt) for _ in range(2)]
    nk = len(ws)
    res = {"triton": triton.__version__, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
           "products": nk, "runs": []}

    def chain(mode, bn):
        def fn():
            for i, w in enumerate(ws):
                n, k = w.shape
                x, y = bufs[i % 2], bufs[(i + 1) % 2]
                kw = {"launch_pdl": True} if mode else {}
                _gemv[(triton.cdiv(n, bn),)](x, w, y, n, k, BN=bn, KP=triton.next_power_of_2(k), MODE=mode,
                                             num_warps=4, **kw)
        return fn

    ref = None
    for bn in map(int, args.bn.split(",")):
        for mode in (0, 1, 2):
            try:
                ms, _ = time_graph(chain(mode, bn))
                out = bufs[nk % 2][:576].float().clone()
                ok = None
                if ref is None:
                    ref = out
                else:
                    ok = bool(torch.allclose(out, ref, rtol=2e-2, atol=2e-2))
                r = {"bn": bn, "mode": ["plain", "pdl_wait_first", "pdl_weights_first"][mode], "ms": ms,
                     "us_per_product": ms * 1e3 / nk, "same_as_first": ok}
            except Exception as e:  # noqa: BLE001 - a probe records what failed
                r = {"bn": bn, "mode": mode, "error": repr(e)[:500]}
            print(r, flush=True)
            res["runs"].append(r)
    try:
        from eagle_triton.ops.target_linear import target_linear

        xs = [torch.randn(1, 4096, device=dev, dtype=dt) for _ in range(2)]

        def op_chain():
            for i, w in enumerate(ws):
                n, k = w.shape
                target_linear(xs[i % 2][:, :k], w, validate=False)

        ms, _ = time_graph(op_chain)
        r = {"mode": "target_linear op (outputs not chained)", "ms": ms, "us_per_product": ms * 1e3 / nk}
    except Exception as e:  # noqa: BLE001
        r = {"mode": "target_linear op", "error": repr(e)[:500]}
    print(r, flush=True)
    res["runs"].append(r)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
