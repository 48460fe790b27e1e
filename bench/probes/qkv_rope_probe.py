"""Tiles for the q/k/v product with the RoPE/KV-write epilogue (GPU probe; random data).

Times, per layer, a chain of ``LAYERS`` launches (one weight and cache per layer, so weights stream from memory as
in a forward; ``target_linear_chain.time_graph``) of ``target_qkv_rope`` with each candidate tile config, against
the two kernels it replaces (``target_linear`` at its default tiles, then ``target_rope_kv``), at 1 and 60 rows.

    python bench/probes/qkv_rope_probe.py --shape 8b --out qkv_rope.json
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
from target_linear_chain import time_graph  # noqa: E402  (the chain's CUDA-graph timing: median ms of 5 x 20 replays)

SHAPES = {"8b": (32, 8, 128, 4096, 32), "smollm2": (9, 3, 64, 576, 30)}  # Hq, Hkv, D, hidden, layers
CANDIDATES = {  # block_n, block_k, num_stages, prefetch
    "8b": ["32:256:2:0", "32:128:4:0", "32:128:3:0", "16:256:3:0", "16:128:4:0", "32:256:3:0"],
    "smollm2": ["16:256:3:1", "16:128:4:1", "16:128:3:2", "16:256:2:1", "16:64:4:1"],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--configs", default="", help="';'-separated block_n:block_k:stages:prefetch (default: a list)")
    args = p.parse_args(argv)
    import bench_engine

    from eagle_triton.ops.rope_kv import qkv_rope_config, target_qkv_rope, target_rope_kv
    from eagle_triton.ops.target_linear import LinearConfig, target_linear

    hq, hkv, d, hidden, layers = SHAPES[args.shape]
    dev, dt = "cuda", torch.bfloat16
    N = (hq + 2 * hkv) * d
    ws = [torch.randn(N, hidden, device=dev, dtype=dt) / hidden ** 0.5 for _ in range(layers)]
    kcs = [torch.randn(1, 512, hkv, d, device=dev, dtype=dt) for _ in range(layers)]
    vcs = [torch.randn(1, 512, hkv, d, device=dev, dtype=dt) for _ in range(layers)]
    ang = torch.arange(600, device=dev)[:, None] * torch.rand(d // 2, device=dev)[None, :]
    ang = torch.cat((ang, ang), 1)
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    lens = torch.tensor([100], dtype=torch.int32, device=dev)
    default = qkv_rope_config(hq, hkv, d, hidden, dev, dt)
    cands = args.configs.split(";") if args.configs else CANDIDATES[args.shape]
    res = {"shape": args.shape, "layers": layers, "default_qkv_rope": str(default), "versions": bench_engine.versions(),
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    for M in (1, 60):
        x = torch.randn(M, hidden, device=dev, dtype=dt)
        pos = (100 + torch.arange(M, device=dev)).view(1, M)

        def two(x=x, pos=pos):
            for w, kc, vc in zip(ws, kcs, vcs, strict=True):
                qkv = target_linear(x, w, validate=False)
                target_rope_kv(qkv, kc, vc, lens, pos, cos, sin, hq, hkv, validate=False)

        r = {"M": M, "variant": "target_linear + target_rope_kv", "us_per_layer": time_graph(two) * 1e3 / layers}
        print(json.dumps(r), flush=True)
        res["rows"].append(r)
        for c in cands:
            bn, bk, st, pre = map(int, c.split(":"))
            cfg = LinearConfig(block_m=64, block_n=bn, block_k=bk, num_warps=4, num_stages=st, prefetch=pre)

            def fused(cfg=cfg, x=x, pos=pos):
                for w, kc, vc in zip(ws, kcs, vcs, strict=True):
                    target_qkv_rope(x, w, None, kc, vc, lens, pos, cos, sin, hq, hkv, config=cfg, validate=False)

            r = {"M": M, "variant": f"qkv_rope {c}", "default": cfg == default,
                 "us_per_layer": time_graph(fused) * 1e3 / layers}
            print(json.dumps(r), flush=True)
            res["rows"].append(r)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
