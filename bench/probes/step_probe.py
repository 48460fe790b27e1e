"""Where the engine's step time goes at the Llama-3.1-8B shape (GPU probe, random weights, bf16, batch 1).

Times, in one run: the target's own decode and verify graphs (``LlamaTarget._run`` / ``verify``), the engine's
captured plain and speculative step graphs replayed back to back, the same steps through ``generate`` (lagged
read), and the speculative step graph without its draft (the tree of the last draft reused) so that the draft's
share of the step is the difference. Norm modes are compared with ``--norm-modes``.

    python bench/probes/step_probe.py --out step_probe.json [--shape 8b|smollm2] [--norm-modes folded,kernel]
        [--fuse-rope on,off]
        [--trees 60/7/10] [--profile]

``--shape smollm2``: SmolLM2-135M-Instruct's architecture with random weights and the shipped head (step times do not
depend on the weights). ``--profile``: the kernels of 5 replays of each step graph (torch.profiler), top 30 by
device time, and the last replay's launches in order (run with ``EAGLE_TRITON_PDL=0`` for durations that do not
overlap).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--norm-modes", default="folded")
    p.add_argument("--fuse-rope", default="on", help="comma-separated on/off: LlamaTarget(fuse_rope=...)")
    p.add_argument("--trees", default="60/7/10")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--prompt-lens", default="64",
                   help="comma-separated prompt lengths; each is a run (a prompt plus new tokens within one "
                        "attention split replays the steps planned for one split, see LlamaTarget.attention_bucket)")
    p.add_argument("--shape", choices=["8b", "smollm2"], default="8b")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--timeline", action="store_true",
                   help="the launches of one replay of the speculative step graph without its draft and of the "
                        "target's own verify graph at the same cache length, each as [name, start us after the "
                        "first launch's start, device us] (PDL as configured): where the step's graph spends the "
                        "time the verify alone does not")
    p.add_argument("--attn-variants", default="",
                   help="';'-separated target-attention config changes to time, each 'field=value[,field=value]' "
                        "(e.g. 'split_blocks=1;num_stages=2'; probe only: patches the module's GPU config, the "
                        "library default is unchanged)")
    p.add_argument("--linear-variants", default="",
                   help="';'-separated weight-product config changes, each 'field=value[,field=value]' applied to "
                        "every product of the target (e.g. 'l2_prefetch=0;l2_prefetch=2'); crossed with "
                        "--attn-variants (probe only: the library defaults are unchanged)")
    args = p.parse_args(argv)
    import bench_engine
    import bench_fused_drafter as bfd
    import bench_target as bt

    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine, LlamaTarget

    bw = bt.copy_bandwidth()
    if args.shape == "8b":
        model = bt.build_8b()
        head = bfd.make_head("llama31-8b", False)
    else:
        model, head = smollm2_random()
    floor = sum(q.numel() * q.element_size() for q in model.parameters()) / bw * 1e3
    prompt_lens = [int(x) for x in args.prompt_lens.split(",")]
    all_ids = torch.randint(0, model.config.vocab_size, (max(prompt_lens),),
                            generator=torch.Generator().manual_seed(0)).tolist()
    res = {"shape": args.shape, "floor_ms": floor, "copy_bandwidth": bw, "versions": bench_engine.versions(),
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    import dataclasses

    from eagle_triton.ops.target_attention import op as attn_op

    default_attn = attn_op.GPU_CONFIG
    def parse(spec):
        return [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in v.split(",") if kv)
                for v in spec.split(";")] if spec else [{}]

    variants, lin_variants = parse(args.attn_variants), parse(args.linear_variants)
    for var, lvar, mode, fr, pl in [(var, lvar, mode, fr, pl) for var in variants for lvar in lin_variants
                                    for mode in args.norm_modes.split(",") for fr in args.fuse_rope.split(",")
                                    for pl in prompt_lens]:
        attn_op.GPU_CONFIG = dataclasses.replace(default_attn, **var)
        target = LlamaTarget.from_hf(model, norm_mode=mode, fuse_rope=fr == "on")
        # every product's tiles with the variant's fields (before anything is captured)
        target._linear_configs = {k: c if c is None else dataclasses.replace(c, **lvar)
                                  for k, c in target._linear_configs.items()}
        r = {"norm_mode": mode, "fuse_rope": fr == "on", "qkv_rope_config": str(target._linear_configs["qkv_rope"]),
             "linear_variant": lvar, "linear_configs": {k: str(c) for k, c in target._linear_configs.items()},
             "attn_config": dataclasses.asdict(attn_op.GPU_CONFIG)}
        r.update(bt.time_steps(target, pl, 60, 8))
        r["attention_bucket_of_the_verify"] = target.attention_bucket(pl + 60)
        ids = all_ids[:pl]
        for tree in args.trees.split(","):
            tc = TreeConfig(*map(int, tree.split("/")))
            eng = EagleEngine(target, head, tc, max_length=max(512, pl + args.new_tokens + 2 * tc.total_tokens + 64))
            for spec in (False, True):
                name = f"{'spec_' + tree if spec else 'plain'}"
                eng.generate(input_ids=ids, max_new_tokens=8, eos_token_id=None, speculative=spec)
                t0 = time.perf_counter()
                _, st = eng.generate(input_ids=ids, max_new_tokens=args.new_tokens, eos_token_id=None,
                                     speculative=spec)
                wall = time.perf_counter() - t0 - st.prefill_s
                r[name + "_generate_ms_per_step"] = 1e3 * st.step_s / st.steps
                r[name + "_wall_ms_per_step"] = 1e3 * wall / st.steps
                run = eng._runners[spec]
                # the step graphs of the generation's last bucket (its longest context): kind[-1] is the bound
                most, rows = (tc.max_levels + 1, tc.total_tokens + 1) if spec else (1, 1)
                bucket = target.attention_bucket(pl + args.new_tokens + 2 * most + rows)
                r[name + "_attention_bucket"] = bucket
                graphs = {kind[0]: (kind, entry[0]) for kind, entry in run._graphs.items() if kind[-1] == bucket}
                if spec:
                    kind, step_g = graphs["step"]
                    step = step_g.replay
                    r[name + "_graph_replay_ms"] = bt.median_ms(step)
                    # the step without its draft: verify + accept + commit + next inputs on a tree drafted once
                    # (probe only: its own graph of the step's second half)
                    tree = run._draft()
                    torch.cuda.synchronize()
                    run._verify_accept(kind[1], tree, kind[2])  # compiles nothing new; warms the capture
                    rest_g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(rest_g):
                        run._verify_accept(kind[1], tree, kind[2])
                    r[name + "_graph_without_draft_ms"] = bt.median_ms(rest_g.replay)
                    r[name + "_draft_in_step_ms"] = r[name + "_graph_replay_ms"] - r[name + "_graph_without_draft_ms"]
                    if args.timeline:
                        r[name + "_step_timeline"] = timeline(step)
                        r[name + "_rest_timeline"] = timeline(rest_g.replay)
                        mask, depths = bt.random_tree(tc.total_tokens + 1, tc.max_levels, 1)
                        toks = torch.randint(0, model.config.vocab_size, (1, tc.total_tokens + 1)).cuda()
                        mask, depths = mask.cuda(), depths.cuda()
                        r[name + "_verify_timeline"] = timeline(
                            lambda t=eng.target, a=toks, d=depths, m=mask: t.verify(a, d, m))
                else:
                    step = graphs["plain"][1].replay
                    r[name + "_graph_replay_ms"] = bt.median_ms(step)
                if args.profile:
                    r[name + "_kernels"] = profile_kernels(step)
            del eng
        print(json.dumps(r, indent=1), flush=True)
        res["runs"].append(r)
        del target
        torch.cuda.empty_cache()
    attn_op.GPU_CONFIG = default_attn
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


def smollm2_random():
    """SmolLM2-135M-Instruct's architecture (bf16, random weights) and the shipped head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle_triton.engine.default_model import DEFAULT_HEAD_DIR
    from eagle_triton.heads import load_draft_head

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    head = load_draft_head(DEFAULT_HEAD_DIR, embed_tokens=model.get_input_embeddings().weight, dtype=torch.bfloat16,
                           device="cuda")
    return model, head


def _profiled(fn, reps: int, sync_each: bool):
    """torch.profiler (CUDA activity) over ``reps`` calls of ``fn``, after one call outside it."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return prof


def timeline(fn, reps: int = 3) -> dict:
    """The launches of the last of ``reps`` calls of ``fn`` in start order: ``[name, start us after the first
    launch's start, device us]``, and the span from the first start to the last end."""
    prof = _profiled(fn, reps, sync_each=True)
    ev = sorted((e for e in prof.events() if getattr(e, "device_type", None) is not None
                 and str(e.device_type).endswith("CUDA") and e.time_range.elapsed_us() > 0),
                key=lambda e: e.time_range.start)
    n = len(ev) // reps
    last = ev[-n:] if n else []
    if not last:
        return {"span_us": None, "launches": []}
    t0 = last[0].time_range.start
    return {"span_us": round(max(e.time_range.end for e in last) - t0, 2),
            "launches": [[e.name[:40], round(e.time_range.start - t0, 2), round(e.time_range.elapsed_us(), 2)]
                         for e in last]}


def profile_kernels(fn, reps: int = 5, top: int = 30) -> list[dict]:
    """Device time per kernel name over ``reps`` calls of ``fn`` (per call), the ``top`` most expensive."""
    prof = _profiled(fn, reps, sync_each=False)
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if t:
            rows.append({"kernel": e.key[:120], "calls_per_step": e.count / reps, "us_per_step": t / reps})
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    per_step = round(sum(r["calls_per_step"] for r in rows))
    # the last replay's launches in order (name, device us): with EAGLE_TRITON_PDL=0 the durations do not
    # overlap, so each product and attention of a layer can be told apart by its place in the step
    kernels = sorted((e for e in prof.events() if getattr(e, "device_type", None) is not None
                      and str(e.device_type).endswith("CUDA")), key=lambda e: e.time_range.start)
    seq = [[e.name[:48], round(e.time_range.elapsed_us(), 2)] for e in kernels[-per_step:]] if per_step else []
    return [{"total_us_per_step": total, "kernels_per_step": per_step, "sequence": seq}] + rows[:top]


if __name__ == "__main__":
    raise SystemExit(main())
