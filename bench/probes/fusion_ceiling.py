"""How much each launch of the target forward costs in the captured step (GPU probe; timing only, wrong results).

Times the target's decode step and 60-row verify (``bench_target.time_steps``: graph replays) with kernels of the
layer removed one kind at a time: the RMSNorm kernels (the product reads the un-normalised row), the RoPE/KV-write
kernel (q is a view of the q/k/v output, nothing written to the cache), the attention's combine kernel (the output
left unwritten). The difference to the unpatched forward is the most a fusion of that kernel into its neighbour
can gain. The patches are module attributes set for one target at a time and restored after.

    python bench/probes/fusion_ceiling.py --out fusion.json [--shape smollm2|8b]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class _NoLaunch:
    """A stand-in for a Triton kernel: ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


@contextlib.contextmanager
def removed(kinds: set[str]):
    import eagle_triton.ops  # noqa: F401  (the submodules below are loaded; some names are shadowed by functions)

    rope_mod = sys.modules["eagle_triton.ops.rope_kv"]
    attn_op = sys.modules["eagle_triton.ops.target_attention.op"]
    lin_mod = sys.modules["eagle_triton.ops.target_linear"]

    saved = (lin_mod.target_rms_norm, rope_mod.target_rope_kv, attn_op._combine_kernel)
    if "norm" in kinds:
        lin_mod.target_rms_norm = lambda x, *a, **k: x
    if "rope" in kinds:
        def no_rope(qkv, k_cache, v_cache, seqlens, pos, cos, sin, nh, nkv, *a, **k):
            return qkv[:, : nh * k_cache.shape[-1]]
        rope_mod.target_rope_kv = no_rope
    if "combine" in kinds:
        attn_op._combine_kernel = _NoLaunch()
    try:
        yield
    finally:
        lin_mod.target_rms_norm, rope_mod.target_rope_kv, attn_op._combine_kernel = saved


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=["8b", "smollm2"], default="smollm2")
    p.add_argument("--variants", default="none;norm;rope;combine;norm,rope,combine")
    args = p.parse_args(argv)
    import bench_engine
    import bench_target as bt
    from step_probe import smollm2_random

    from eagle_triton.engine import LlamaTarget

    bw = bt.copy_bandwidth()
    model = bt.build_8b() if args.shape == "8b" else smollm2_random()[0]
    floor = sum(q.numel() * q.element_size() for q in model.parameters()) / bw * 1e3
    res = {"shape": args.shape, "floor_ms": floor, "copy_bandwidth": bw, "versions": bench_engine.versions(),
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    for var in args.variants.split(";"):
        kinds = set() if var == "none" else set(var.split(","))
        with removed(kinds):
            target = LlamaTarget.from_hf(model)
            r = {"removed": sorted(kinds)}
            r.update(bt.time_steps(target, 64, 60, 8))
        print(json.dumps(r), flush=True)
        res["runs"].append(r)
        del target
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
