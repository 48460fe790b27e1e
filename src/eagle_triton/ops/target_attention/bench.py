"""GPU timing of target_attention against tree_attention (the non-invariant verify kernel) and the PyTorch reference.

    python -m eagle_triton.ops.target_attention.bench        # prints a table (needs a CUDA GPU)

:func:`cases` feeds bench/bench_kernels.py (``--only target_attention``); :func:`compare` is the standalone table:
Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128, bf16, batch 1), decode (1 row, causal) and
verify (60 tree rows, a random tree of depth <= 10), committed prefixes 1k/4k/8k. Timing:
``triton.testing.do_bench(median)``; ``floor_us`` is the K/V prefix read once at ``--bw`` TB/s (default 3.35, H100
SXM) for reference.
"""

from __future__ import annotations

import argparse

import torch

from ..attention import tree_attention
from .op import target_attention
from .reference import target_attention_ref

H_Q, H_KV, HEAD_DIM = 32, 8, 128


def _tree_mask(S: int, device, gen) -> torch.Tensor:
    """A random tree: each row's parent among the previous 6 rows, depth capped at 10 (EAGLE trees are <= 8 deep)."""
    parents, depth = [-1], [0]
    for j in range(1, S):
        cand = [p for p in range(max(0, j - 6), j) if depth[p] < 10] or [0]
        p = cand[int(torch.randint(0, len(cand), (1,), generator=gen))]
        parents.append(p)
        depth.append(depth[p] + 1)
    m = torch.zeros(S, S, dtype=torch.bool)
    for i in range(S):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m[None].to(device)


def _inputs(prefix: int, S: int, device, gen, dtype=torch.bfloat16):
    Lmax = prefix + 64
    q = torch.randn(1, S, H_Q, HEAD_DIM, generator=gen).to(device, dtype)
    k = torch.randn(1, Lmax, H_KV, HEAD_DIM, generator=gen).to(device, dtype)
    v = torch.randn(1, Lmax, H_KV, HEAD_DIM, generator=gen).to(device, dtype)
    lens = torch.tensor([prefix], dtype=torch.int32, device=device)
    mask = _tree_mask(S, device, gen) if S > 1 else None
    return q, k, v, lens, mask


def _kv_bytes(prefix: int, S: int) -> int:
    return 2 * (prefix + S) * H_KV * HEAD_DIM * 2 + 2 * S * H_Q * HEAD_DIM * 2


def cases(device) -> list[dict]:
    """bench_kernels.py cases: target_attention (triton) vs the reference, with tree_attention as a baseline."""
    out = []
    gen = torch.Generator().manual_seed(0)
    for S in (1, 60):
        for prefix in (1024, 4096, 8192):
            a = _inputs(prefix, S, device, gen)
            out.append({"name": "target_attention" + ("[verify60]" if S > 1 else "[decode]"),
                        "shape": f"L={prefix} S={S} Hq={H_Q} Hkv={H_KV} D={HEAD_DIM} bf16",
                        "triton": lambda a=a: target_attention(*a, validate=False),
                        "ref": lambda a=a: target_attention_ref(*a),
                        "bytes": _kv_bytes(prefix, S),
                        "baselines": {"tree_attention": lambda a=a: tree_attention(*a, validate=False)}})
    return out


def compare(prefixes=(1024, 4096, 8192), rows=(1, 60), bw_tbps: float = 3.35) -> list[dict]:
    """Time target_attention and tree_attention at each (rows, prefix); print and return the table rows."""
    import triton

    gen = torch.Generator().manual_seed(0)
    table = []
    print(f"{'rows':>4} {'prefix':>6} {'target_attention us':>20} {'tree_attention us':>18} {'ratio':>6} "
          f"{'floor us':>8}")
    for S in rows:
        for prefix in prefixes:
            a = _inputs(prefix, S, "cuda", gen)
            t_new = triton.testing.do_bench(lambda a=a: target_attention(*a, validate=False), return_mode="median")
            t_old = triton.testing.do_bench(lambda a=a: tree_attention(*a, validate=False), return_mode="median")
            floor = _kv_bytes(prefix, S) / (bw_tbps * 1e12) * 1e6
            r = {"rows": S, "prefix": prefix, "target_attention_us": t_new * 1e3, "tree_attention_us": t_old * 1e3,
                 "floor_us": floor}
            table.append(r)
            print(f"{S:>4} {prefix:>6} {r['target_attention_us']:>20.1f} {r['tree_attention_us']:>18.1f} "
                  f"{t_new / t_old:>6.2f} {floor:>8.1f}", flush=True)
    return table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="target_attention vs tree_attention (GPU)")
    p.add_argument("--prefixes", type=int, nargs="*", default=[1024, 4096, 8192])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 60])
    p.add_argument("--bw", type=float, default=3.35, help="HBM bandwidth for the floor column, TB/s")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    compare(tuple(args.prefixes), tuple(args.rows), args.bw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
