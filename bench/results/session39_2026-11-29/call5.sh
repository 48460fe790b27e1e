# session 39 call 5: lm_head's tail in one pass too (tail_one_pass=o/gate_up/down/lm_head, built this session) at the
# 8B shape, bf16, batch 16: bits against the default, then the A/B alternated
export PYTHONPATH=$PWD/src:$PWD/bench:$PWD/tests/fused
timeout 170 python3 - <<'PY' 2>&1 | grep -v Warn | tee $OUT/lm1.log
import time, torch
from triton.testing import do_bench
from bench_fused_drafter import make_head
from eagle_triton import TreeConfig
from eagle_triton.fused import Buffers, DrafterConfig, DraftInputs, Weights, launch_drafter
head = make_head("llama31-8b", False)
tc, B, S, prefix = TreeConfig(60, 7, 10), 16, 4, 512
w = Weights.from_head(head, 1024 + tc.depth + 2)
g = torch.Generator(device="cuda").manual_seed(1)
X = DraftInputs(torch.randn(B, S, head.feature_width, device="cuda", dtype=torch.bfloat16, generator=g),
                torch.randint(0, head.config.vocab_size, (B, S), device="cuda", generator=g))
k0 = torch.randn(1, generator=g, device="cuda")
runs, fns = [], []
for opt in (None, "o/gate_up/down/lm_head"):
    cfg = DrafterConfig.from_head(head, tc, max_batch=B, max_len=1024, max_new_rows=S, tail_one_pass=opt)
    bufs = Buffers.allocate(cfg, "cuda")
    torch.manual_seed(5); bufs.k_cache.normal_(); bufs.v_cache.normal_()
    bufs.kv_len.fill_(prefix)
    t = time.time(); out = launch_drafter(cfg, X, w, bufs, fallback=False); torch.cuda.synchronize()
    print(opt, "TP1", cfg.launch_params("cuda", B, S)["TP1"], f"first launch {time.time() - t:.1f}s", flush=True)
    runs.append(([x.clone() for x in out], bufs.k_cache.clone(), bufs.v_cache.clone()))
    def fn(cfg=cfg, bufs=bufs):
        bufs.kv_len.fill_(prefix); launch_drafter(cfg, X, w, bufs, fallback=False)
    fns.append(fn)
same = all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0])) and torch.equal(runs[0][1], runs[1][1]) \
    and torch.equal(runs[0][2], runs[1][2])
print("bit-identical outputs and KV:", same, flush=True)
for r in range(2):
    for name, fn in zip(("default", "lm_head too"), fns):
        print(f"round {r} {name}: {do_bench(fn, warmup=25, rep=300, return_mode='median'):.3f} ms", flush=True)
PY
