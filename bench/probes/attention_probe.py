"""What the target attention's kernels cost inside a step (GPU probe; the removal variants give wrong results).

Captures one CUDA graph of ``LAYERS`` target_attention calls (one q and K/V cache per layer, as in a forward),
at a model's attention shape, decode (1 causal row) or verify (60 tree rows of a random EAGLE-like tree), and times
its replay (``target_linear_chain.time_graph``: CUDA events, median of 5 runs of 20 replays). Variants remove one
kernel kind (``shared``, ``tree``, ``combine``: the launch does nothing) so the difference to ``none`` is that
kernel's cost in the chain, launch included; ``--tree-configs`` times other launch settings of the tree kernel
(``warps:stages[:tokens]``).

    python bench/probes/attention_probe.py --shape 8b --prefixes 64,200 --out attn.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from target_linear_chain import time_graph  # noqa: E402  (the chain's CUDA-graph timing: median ms of 5 x 20 replays)

SHAPES = {"8b": (32, 8, 128, 32), "smollm2": (9, 3, 64, 30)}  # Hq, Hkv, D, layers


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None


@contextlib.contextmanager
def patched(remove: set[str], tree_cfg: tuple[int, int] | None):
    import eagle_triton.ops  # noqa: F401  (loads the submodule; the package attribute is shadowed by a function)

    op = sys.modules["eagle_triton.ops.target_attention.op"]

    saved = (op._shared_kernel, op._tree_kernel, op._combine_kernel, op.target_attention_config)
    for name in remove:
        setattr(op, f"_{name}_kernel", _NoLaunch())
    if tree_cfg is not None:
        base = op.target_attention_config

        def cfg(*a, **k):
            c = base(*a, **k)
            tokens = tree_cfg[2] if len(tree_cfg) > 2 else c.tree_tokens
            return dataclasses.replace(c, tree_stages=tree_cfg[1], tree_tokens=min(tokens, c.block_m // a[2]))
        op.target_attention_config = cfg
        if tree_cfg[0]:
            kern = op._tree_kernel

            class _Warps:
                def __getitem__(self, grid):
                    return lambda *a, **k: kern[grid](*a, **dict(k, num_warps=tree_cfg[0]))
            op._tree_kernel = _Warps()
    try:
        yield
    finally:
        op._shared_kernel, op._tree_kernel, op._combine_kernel, op.target_attention_config = saved


def build(shape: str, prefix: int, rows: int, cap: int, seed: int):
    from eagle_triton.ops.target_attention.bench import _tree_mask

    hq, hkv, d, layers = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    qs = [torch.randn(1, rows, hq, d, generator=gen).to(dev, dt) for _ in range(layers)]
    ks = [torch.randn(1, cap, hkv, d, generator=gen).to(dev, dt) for _ in range(layers)]
    vs = [torch.randn(1, cap, hkv, d, generator=gen).to(dev, dt) for _ in range(layers)]
    lens = torch.tensor([prefix], dtype=torch.int32, device=dev)
    mask = _tree_mask(rows, dev, gen) if rows > 1 else None
    return qs, ks, vs, lens, mask


def time_chain(args_) -> float:
    from eagle_triton.ops.target_attention import target_attention

    qs, ks, vs, lens, mask = args_

    def step():
        for q, k, v in zip(qs, ks, vs, strict=True):
            target_attention(q, k, v, lens, mask, validate=False)

    return time_graph(step) * 1e3  # us per chain


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--prefixes", default="64,200")
    p.add_argument("--rows", default="1,60")
    p.add_argument("--cap", type=int, default=2048, help="cache capacity (Lmax) of every layer")
    p.add_argument("--variants", default="none;tree;combine;shared;tree,combine")
    p.add_argument("--tree-configs", default="",
                   help="';'-separated warps:stages[:tokens] launches of the tree kernel (warps 0: the default)")
    args = p.parse_args(argv)
    import bench_engine

    res = {"shape": args.shape, "layers": SHAPES[args.shape][3], "versions": bench_engine.versions(),
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    for rows in [int(x) for x in args.rows.split(",")]:
        for prefix in [int(x) for x in args.prefixes.split(",")]:
            inputs = build(args.shape, prefix, rows, args.cap, seed=prefix + rows)
            todo = [(v, None) for v in args.variants.split(";")]
            if rows > 1:
                todo += [("none", tuple(int(x) for x in c.split(":"))) for c in args.tree_configs.split(";") if c]
            for var, tcfg in todo:
                if rows == 1 and "tree" in var.split(","):
                    continue
                remove = set() if var == "none" else set(var.split(","))
                with patched(remove, tcfg):
                    us = time_chain(inputs)
                r = {"rows": rows, "prefix": prefix, "removed": sorted(remove), "tree_warps_stages": tcfg,
                     "us_per_layer": us / SHAPES[args.shape][3], "us_chain": us}
                print(json.dumps(r), flush=True)
                res["runs"].append(r)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
