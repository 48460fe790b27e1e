"""Do the target's weight products round a row the same with other output-tile widths? (GPU probe, bf16.)

Batch invariance fixes a product's tile configuration by the weight alone, so a 256-row prefill chunk runs the
narrow tiles chosen for 1-row decode latency (SmolLM2: 16 output columns per program), which stream poorly at 256
rows. If the bits of a row do not depend on the tile's width ``BN`` (only on the reduction chunk ``BK`` and the
row tile ``BM``), prefill and verify could use wider tiles and still equal decode bit for bit. This probe compares,
for each product shape, every candidate configuration's output against the decode configuration's on the same rows
(1, 60 and 256 rows, rows at every tile position), and times each at 256 rows.

    python bench/probes/tile_invariance.py --out tile_invariance.json [--model smollm2|8b]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {  # name: (N, K, silu_mul)
    "smollm2": {"qkv": (960, 576, False), "o": (576, 576, False), "gate_up": (1536, 576, True),
                "down": (576, 1536, False)},
    "8b": {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (14336, 4096, True),
           "down": (4096, 14336, False)},
}


def _time(do_bench, fn, x, w, silu, cfg) -> float:
    """Median us of one product over all of ``x``'s rows."""
    return 1e3 * do_bench(lambda: fn(x, w, silu_mul=silu, config=cfg), warmup=10, rep=50, return_mode="median")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", choices=list(SHAPES), default="smollm2")
    p.add_argument("--widths", default="16,32,64,128")
    args = p.parse_args(argv)
    import bench_engine
    from triton.testing import do_bench

    from eagle_triton.ops.target_linear import LinearConfig, default_config, target_linear

    res = {"model": args.model, "versions": bench_engine.versions(), "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (N, K, silu) in SHAPES[args.model].items():
        base = default_config(N, K, "cuda", torch.bfloat16, silu_mul=silu)
        w = (torch.randn(2 * N if silu else N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
        x = torch.randn(256, K, device="cuda", generator=g).to(torch.bfloat16)
        ref = target_linear(x, w, silu_mul=silu, config=base)
        for bn in [int(v) for v in args.widths.split(",")]:
            for bk in sorted({base.block_k, 128}):
                cfg = LinearConfig(block_m=base.block_m, block_n=bn, block_k=bk, num_warps=4,
                                   num_stages=2 if (silu and bn >= 128) else 3)
                row = {"product": name, "N": N, "K": K, "block_n": bn, "block_k": bk,
                       "decode_config": [base.block_m, base.block_n, base.block_k]}
                try:
                    same = {}
                    for lo, hi in ((0, 1), (0, 60), (0, 256), (37, 38), (100, 160)):
                        y = target_linear(x[lo:hi], w, silu_mul=silu, config=cfg)
                        same[f"{lo}:{hi}"] = bool(torch.equal(y, ref[lo:hi]))
                    row["bitwise_equal_to_decode_config"] = same
                    row["us_256_rows"] = _time(do_bench, target_linear, x, w, silu, cfg)
                except Exception as e:  # a config that does not fit (shared memory): recorded, not fatal
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(json.dumps(row), flush=True)
                res["rows"].append(row)
        res["rows"].append({"product": name,
                            "decode_config_us_256_rows": _time(do_bench, target_linear, x, w, silu, base)})
        print(json.dumps(res["rows"][-1]), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
