"""Wider product tiles for verify and prefill rows: same bits as the decode tiles, and how much faster? (GPU probe.)

The target's weight products take their tiles from the weight shape alone (``default_config``), chosen for 1-row
decode latency. The session-11 probe (``tile_invariance.py``, H200) found a row's bits independent of the output
tile width and the reduction chunk (the tensor-core k-steps accumulate in one order whatever the tiling). This
probe times each product of a forward layer as the target runs it (folded RMSNorm arguments, residual and partial
sums of squares, the q/k/v product with its RoPE/KV-write epilogue), chained over the model's layers in one CUDA
graph (``target_linear_chain.time_graph``), at 1, 60 and 128 rows, for the default and candidate tiles, and checks
that every candidate's output rows equal the default's bit for bit.

    python bench/probes/wide_tiles.py --shape 8b|smollm2 --out wide.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from target_linear_chain import time_graph  # noqa: E402

SHAPES = {  # Hq, Hkv, D, hidden, intermediate, layers, vocabulary
    "8b": (32, 8, 128, 4096, 14336, 32, 128256), "smollm2": (9, 3, 64, 576, 1536, 30, 49152)}
CANDIDATES = {  # product: block_n:block_k:stages:prefetch
    "qkv_rope": ["64:64:4:0", "64:128:3:0", "32:64:5:0", "16:128:4:0", "32:128:3:0"],
    "gate_up": ["64:64:5:0", "128:64:3:0", "128:128:2:0", "32:128:4:0", "64:128:3:0", "16:128:4:0"],
    "o": ["32:128:4:0", "32:64:6:0", "64:128:4:0", "64:64:6:0", "16:128:4:0"],
    "down": ["32:128:4:0", "32:64:6:0", "64:128:4:0", "64:64:6:0", "16:128:4:0"],
    "lm_head": ["64:64:4:2", "64:64:6:0", "128:64:4:0", "128:128:3:0", "64:128:3:2"],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--rows", default="1,60,128")
    p.add_argument("--products", default="qkv_rope,gate_up,o,down")
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--candidates", default="", help="product=bn:bk:stages:prefetch[:bm[:warps]];... "
                   "(','-separated products; replaces that product's default list)")
    args = p.parse_args(argv)
    for item in filter(None, args.candidates.split(",")):
        prod, _, cands = item.partition("=")
        CANDIDATES[prod] = cands.split(";")
    import bench_engine

    from eagle_triton.ops.rope_kv import qkv_rope_config
    from eagle_triton.ops.target_linear import default_config

    hq, hkv, d, hid, inter, layers, vocab = SHAPES[args.shape]
    dev, dt = "cuda", torch.bfloat16
    t_end = time.time() + args.budget_s
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dt)

    res = {"shape": args.shape, "layers": layers, "versions": bench_engine.versions(), "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    n_qkv = (hq + 2 * hkv) * d
    specs = {  # product: (N, K, silu, default config)
        "qkv_rope": (n_qkv, hid, False, qkv_rope_config(hq, hkv, d, hid, dev, dt)),
        "gate_up": (inter, hid, True, default_config(inter, hid, dev, dt, silu_mul=True)),
        "o": (hid, hq * d, False, default_config(hid, hq * d, dev, dt)),
        "down": (hid, inter, False, default_config(hid, inter, dev, dt)),
        "lm_head": (vocab, hid, False, default_config(vocab, hid, dev, dt)),
    }
    ang = torch.arange(1024, device=dev)[:, None] * torch.rand(d // 2, device=dev, generator=g)[None, :]
    ang = torch.cat((ang, ang), 1)
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    for prod in args.products.split(","):
        res["rows"] += _probe_product(prod, specs[prod], args, (hq, hkv, d, layers), cos, sin, rnd, t_end)
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


def _candidate(text: str):
    """``bn:bk:stages:prefetch[:bm[:warps]]`` as a LinearConfig (``bm`` 64 and 4 warps unless given)."""
    from eagle_triton.ops.target_linear import LinearConfig

    v = list(map(int, text.split(":")))
    bn, bk, stages, prefetch = v[:4]
    bm = v[4] if len(v) > 4 else 64
    warps = v[5] if len(v) > 5 else 4
    return LinearConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, prefetch=prefetch)


def _probe_product(prod, spec, args, heads, cos, sin, rnd, t_end) -> list[dict]:
    """Time ``prod`` chained over the layers at each row count, default and candidate tiles (bits compared)."""
    from eagle_triton.ops.rope_kv import target_qkv_rope
    from eagle_triton.ops.target_linear import sumsq_width, target_linear

    N, K, silu, base = spec
    hq, hkv, d, layers = heads
    dev = "cuda"
    if prod == "lm_head":  # one per forward: a chain of 4 distinct weights (more than L2 holds)
        layers = 4
    ws = [rnd(2 * N if silu else N, K, scale=K ** -0.5) for _ in range(layers)]
    kcs = [rnd(1, 640, hkv, d) for _ in range(layers)] if prod == "qkv_rope" else None
    vcs = [rnd(1, 640, hkv, d) for _ in range(layers)] if prod == "qkv_rope" else None
    lens = torch.tensor([300], dtype=torch.int32, device=dev)
    rows = []
    for M in map(int, args.rows.split(",")):
        x = rnd(M, K)
        ss_in = torch.rand(M, 64, device=dev) * K / 64  # partial sums of squares (folded norm)
        pos = (300 + torch.arange(M, device=dev)).view(1, M)
        resid = rnd(M, N)

        def run(cfg, i, x=x, ss_in=ss_in, pos=pos, resid=resid, M=M):
            if prod == "qkv_rope":
                return target_qkv_rope(x, ws[i], None, kcs[i], vcs[i], lens, pos, cos, sin, hq, hkv,
                                       sumsq=ss_in, norm_folded=True, config=cfg, validate=False)
            if prod == "lm_head":
                return target_linear(x, ws[i], config=cfg, validate=False)
            if prod == "gate_up":
                return target_linear(x, ws[i], silu_mul=True, sumsq=ss_in, norm_folded=True, config=cfg,
                                     validate=False)
            ss_out = torch.empty(M, sumsq_width(N, cfg), device=dev, dtype=torch.float32)
            return target_linear(x, ws[i], residual=resid, sumsq_out=ss_out, config=cfg, validate=False)

        ref = run(base, 0).clone()
        cands = [("default", base)] + [(c, _candidate(c)) for c in CANDIDATES[prod]]
        for label, cfg in cands:
            if time.time() > t_end:
                break
            r = {"product": prod, "M": M, "config": label, "cfg": str(cfg)}
            try:
                r["bitwise_equal_to_default"] = bool(torch.equal(run(cfg, 0), ref))
                r["us_per_layer"] = time_graph(lambda cfg=cfg, run=run: [run(cfg, i) for i in range(layers)]) \
                    * 1e3 / layers
                r["floor_us_at_3tbps"] = ws[0].numel() * 2 / 3.0e12 * 1e6
            except Exception as e:  # noqa: BLE001 - a config that does not fit is recorded, not fatal
                r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(json.dumps(r), flush=True)
            rows.append(r)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
