# session 39: does tail_one_pass hang or part at the Qwen3-8B / 70B shapes (batch 16, bench's decode inputs)?
# (as run; its imports and lines tidied for the linter afterwards)
# usage: probe.py SHAPE OPT   (OPT: 0, 1, o, gate_up, down, o/down); saves outputs, compares with OPT=0's
import sys
import time

import torch

sys.path.insert(0, "bench")
from bench_fused_drafter import make_head

from eagle_triton import TreeConfig
from eagle_triton.fused import Buffers, DrafterConfig, DraftInputs, Weights, launch_drafter

shape, opt = sys.argv[1], sys.argv[2]
top = {"0": False, "1": True}.get(opt, opt)
head = make_head(shape, True)
tc, B, S, prefix = TreeConfig(60, 7, 10), 16, 4, 512
cfg = DrafterConfig.from_head(head, tc, max_batch=B, max_len=1024, max_new_rows=S, tail_one_pass=top)
print(shape, opt, "TP1", cfg.launch_params("cuda", B, S)["TP1"], flush=True)
w = Weights.from_head(head, 1024 + tc.depth + 2)
bufs = Buffers.allocate(cfg, "cuda")
g = torch.Generator(device="cuda").manual_seed(1)
X = DraftInputs(torch.randn(B, S, head.feature_width, device="cuda", dtype=torch.bfloat16, generator=g),
                torch.randint(0, head.config.vocab_size, (B, S), device="cuda", generator=g))
bufs.k_cache.normal_(generator=g)
bufs.v_cache.normal_(generator=g)
outs = []
for i in range(3):
    bufs.kv_len.fill_(prefix)
    t = time.time()
    o = launch_drafter(cfg, X, w, bufs, fallback=False)
    torch.cuda.synchronize()
    print(f"launch {i}: {time.time() - t:.2f}s status {int(bufs.status[0])}", flush=True)
    outs.append([x.clone() for x in o])
name = f"/tmp/probe_{shape}_{opt.replace('/', '-')}.pt"
torch.save(outs, name)
try:
    base = torch.load(f"/tmp/probe_{shape}_0.pt")
    same = [all(torch.equal(a, b) for a, b in zip(x, y, strict=True)) for x, y in zip(outs, base, strict=True)]
    stable = all(torch.equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))
    print("same as 0:", same, "; repeat-stable:", stable, flush=True)
except FileNotFoundError:
    pass
