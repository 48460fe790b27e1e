"""Drafter back ends on the GPU at the shipped SmolLM2 head's shape: trees against the reference, and latency.

Random target features and a random stand-in embedding (the target's is not needed for drafting). For each dtype,
the "graph" (multi-kernel CUDA graph) drafter drafts the same sequence of calls as the reference ("torch") and
the trees are compared; then each back end's draft latency (decode call: 4 new rows) is timed with CUDA events.
Writes drafters_gpu.json to --out.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from eagle_triton import Eagle3DraftHead, TreeConfig, TreeDrafter  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
p.add_argument("--backends", default="graph")
args = p.parse_args()
from results_guard import refuse_foreign  # noqa: E402

refuse_foreign("check_drafters_gpu", os.path.join(args.out, "drafters_gpu.json"))
dev = "cuda"
path = os.path.join(os.path.dirname(__file__), "..", "src", "eagle_triton", "assets", "smollm2-eagle3")
emb = torch.randn(49152, 576) * 0.05
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%F %T"),
       "command": " ".join(sys.argv), "rows": []}
tc = TreeConfig(60, 7, 10)
for dtype in (torch.float32, torch.bfloat16):
    head = Eagle3DraftHead.from_pretrained(path, embed_tokens=emb, dtype=dtype, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    calls = []
    L = 48
    ids = torch.randint(0, 49152, (1, L + 1), device=dev, generator=g)
    calls.append((torch.randn(1, L, 1728, device=dev, dtype=dtype, generator=g), ids))
    for _ in range(4):
        ids = torch.cat([ids, torch.randint(0, 49152, (1, 4), device=dev, generator=g)], 1)
        calls.append((torch.randn(1, 4, 1728, device=dev, dtype=dtype, generator=g), ids))
    ref = TreeDrafter(head, tc, backend="torch")
    ref_trees = [ref.draft(f, i) for f, i in calls]
    for backend in ["torch"] + args.backends.split(","):
        row = {"dtype": str(dtype), "backend": backend}
        try:
            d = TreeDrafter(head, tc, backend=backend)
            trees = [d.draft(f, i) for f, i in calls]
            row["identical_trees"] = sum(
                bool(torch.equal(a.draft_tokens, b.draft_tokens) and torch.equal(a.parents, b.parents))
                for a, b in zip(trees, ref_trees, strict=True))
            row["calls"] = len(calls)
            f, i = calls[-1]
            ts = []
            for _ in range(25):
                d.reset()
                d.draft(*calls[0])
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
                d.draft(calls[1][0], calls[1][1])
                ev1.record()
                torch.cuda.synchronize()
                ts.append(ev0.elapsed_time(ev1))
            ts.sort()
            row["draft_ms_median"] = ts[len(ts) // 2]
        except Exception as e:  # record and go on
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        print(row, flush=True)
        res["rows"].append(row)
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "drafters_gpu.json"), "w") as fh:
    json.dump(res, fh, indent=2)
