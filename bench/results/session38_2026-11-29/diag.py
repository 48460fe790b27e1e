"""session 38: where the tail row tile's outputs part from the launch without it (GPU)."""
import os
import sys
import time

import torch

from eagle_triton import TreeConfig
from eagle_triton.fused import Buffers, DrafterConfig, DraftInputs, Weights, launch_drafter, launch_drafter_ref
from eagle_triton.testing import llama31_8b_eagle3_config, random_eagle3_head, random_eagle3_head_on

DEV = os.environ.get("DEV", "cuda")
FIELDS = ("hbuf", "h1", "act", "attn", "lm_key", "lm_ms", "ch_lp", "ch_id", "qbuf")


def run(head, tc, batch, X, w, **kw):
    cfg = DrafterConfig.from_head(head, tc, max_batch=batch, max_len=256, max_new_rows=16, **kw)
    p = cfg.launch_params(DEV, batch, 16)
    bufs = Buffers.allocate(cfg, DEV)
    outs = [[t.clone() for t in launch_drafter(cfg, x, w, bufs)] for x in X]
    if DEV == "cuda":
        torch.cuda.synchronize()
    n = batch * tc.top_k
    sc = {k: (bufs.scratch[k][:, :n] if k == "hbuf" else bufs.scratch[k][:n] if k in ("h1", "act", "attn", "qbuf")
              else bufs.scratch[k]).clone() for k in FIELDS}
    sc["lm_key"] = sc["lm_key"].view(-1, p["NPP"], p["KP"])[:n, :p["NPROG"]]
    sc["lm_ms"] = sc["lm_ms"].view(-1, p["NPP"], 2)[:n, :p["NPROG"]]
    return dict(p=p, outs=outs, k=bufs.k_cache.clone(), v=bufs.v_cache.clone(), kvl=bufs.kv_len.clone(), sc=sc)


def same_calls(oa, ob):
    return all(torch.equal(x, y) for x, y in zip(oa, ob, strict=True))


def cmp(name, a, b, batch, K, D):
    t0 = [same_calls(oa, ob) for oa, ob in zip(a["outs"], b["outs"], strict=True)]
    line = [f"{name}: trees same per call {t0}"]
    for f in FIELDS:
        x, y = a["sc"][f], b["sc"][f]
        if x.dtype.is_floating_point:
            d = (x.float() - y.float()).abs()
            d = torch.nan_to_num(d, nan=1e9)
            line.append(f"{f}:{int((d > 0).sum())}/{d.numel()} max{float(d.max()):.3g}")
        else:
            line.append(f"{f}:{int((x != y).sum())}/{x.numel()}")
    print("  ".join(line))
    # the draft KV of the last call, by slot region: prompt rows, then each tree step's K rows
    kd = (a["k"].float() - b["k"].float()).abs().amax(dim=(2, 3))  # [B, L]
    vd = (a["v"].float() - b["v"].float()).abs().amax(dim=(2, 3))
    diffrows = ((kd > 0) | (vd > 0)).nonzero().tolist()
    print(f"  kv rows differing: {len(diffrows)}; first {diffrows[:12]}; kv_len {a['kvl'].tolist()[:4]}")


def case(label, head, tc, batch, pairs, ref=False):
    V = head.config.vocab_size
    fdt = torch.float32 if label.startswith("small") else torch.bfloat16
    X = [DraftInputs(torch.randn(batch, 16, head.feature_width, device=DEV, dtype=fdt),
                     torch.randint(0, V, (batch, 16), device=DEV)),
         DraftInputs(torch.randn(batch, 1, head.feature_width, device=DEV, dtype=fdt),
                     torch.randint(0, V, (batch, 1), device=DEV))]
    w = Weights.from_head(head, 260)
    runs = {}
    for tag, kw in pairs:
        t = time.time()
        runs[tag] = run(head, tc, batch, X, w, **kw)
        p = runs[tag]["p"]
        print(f"[{label}] {tag}: BM {p['BM']} BMT {p['BMT']} SKL {p['SKL']} LMW {p['LMW']} NSEGL {p['NSEGL']} "
              f"({time.time() - t:.0f}s)", flush=True)
    tags = list(runs)
    for t in tags[1:]:
        cmp(f"[{label}] {tags[0]} vs {t}", runs[tags[0]], runs[t], batch, tc.top_k, tc.depth)
    if ref:
        cfg = DrafterConfig.from_head(head, tc, max_batch=batch, max_len=256, max_new_rows=16)
        bufs = Buffers.allocate(cfg, DEV)
        refo = [[t.clone() for t in launch_drafter_ref(cfg, x, w, bufs)] for x in X]
        for t in tags:
            print(f"[{label}] ref vs {t}: trees same per call",
                  [same_calls(oa, ob) for oa, ob in zip(refo, runs[t]["outs"], strict=True)])


which = sys.argv[1:] or ["small", "fp8", "fp8lmw0"]
torch.backends.cuda.matmul.allow_tf32 = False
if "small" in which:
    for b in map(int, os.environ.get("BATCHES", "13,16").split(",")):
        head = random_eagle3_head(hidden_size=int(os.environ.get("HS", 256)), intermediate_size=512,
                                  num_attention_heads=8, num_key_value_heads=2,
                                  vocab_size=1024, draft_vocab_size=512, lm_head_scale=6.0).to(DEV)
        case(f"small-b{b}", head, TreeConfig(*map(int, os.environ.get("TC", "60,7,10").split(","))), b,
             [("none", dict(stream_k_linear=True)), ("tail", dict(stream_k_linear=True, tail_row_tile=True)),
              ("tail2", dict(stream_k_linear=True, tail_row_tile=True)),
              ("tail-noskl", dict(stream_k_linear=False, tail_row_tile=True)),
              ("none-noskl", dict(stream_k_linear=False))], ref=True)
if any(x.startswith("fp8") for x in which):
    head = random_eagle3_head_on(DEV, llama31_8b_eagle3_config(), peaked=True, dtype=torch.bfloat16, seed=0)
    head = head.quantize_fp8()
    tc = TreeConfig(60, 7, 10)
    if "fp8" in which:
        case("fp8-b16", head, tc, 16, [("none", {}), ("tail", dict(tail_row_tile=True)),
                                        ("tail2", dict(tail_row_tile=True))])
    if "fp8lmw0" in which:
        case("fp8-b16-lmw0", head, tc, 16, [("none", dict(lm_warp_rank=False)),
                                             ("tail", dict(lm_warp_rank=False, tail_row_tile=True))])
    if "fp8skl0" in which:
        case("fp8-b16-skl0", head, tc, 16, [("none", dict(stream_k_linear=False)),
                                             ("tail", dict(stream_k_linear=False, tail_row_tile=True))])
