"""SafeAILab EAGLE's own ``eagenerate`` at the Llama-3.1-8B shape: unpatched, drafter-patched, and optimized.

Builds, with random weights drawn on the device (nothing downloaded), a Llama-3.1-8B target as SafeAILab's
``KVLlamaForCausalLM`` and an 8B EAGLE-3 head as SafeAILab's ``cnets.Model`` (the published head's config), wraps
them in SafeAILab's ``EaModel`` (its ``__init__`` reads files from a hub path, so the object is assembled from the
same parts: ``base_model``, ``ea_layer``, ``tokenizer``, ``use_eagle3``), and measures, greedy, batch 1, tree
60/7/10 (``EaModel.from_pretrained``'s defaults):

- ms per step of ``eagenerate`` unpatched (``safeailab_8b_step_unpatched``), with
  :func:`eagle_triton.patch_ea_model_with_triton_drafter` (``safeailab_8b_step_drafter_patched``) and after
  :func:`eagle_triton.optimize_eagle_with_triton` (``safeailab_8b_step_optimized``); ms per token of
  ``naivegenerate`` unpatched and optimized;
- ms per ``ea_layer.topK_genrate`` call unpatched and patched (``safeailab_8b_topk_call_{unpatched,patched}``)
  and, on the same inputs, of eagle_triton's drafter alone (``TreeDrafter.draft``, the fused kernel plus its own
  bookkeeping) and of the fused kernel alone (one ``launch_drafter`` call, timed like a ``topK_genrate`` call:
  host launch, kernel, synchronisation; and its device time alone, launches back to back), in the decode scenario
  of ``bench_fused_drafter.py`` (512 rows in the draft KV, 4 new rows). ``topk_patch_glue_ms`` = patched call -
  fused kernel call is what the patch adds around the launch; ``topk_patch_over_kernel_ms`` = patched call -
  kernel device time also counts Triton's launch and the wait for the kernel;
- eagle_triton's own engine (``EagleEngine.generate``) on the same weights: ms per speculative step
  (``spec_step_8b_60_7_10``);
- whether the optimized ``eagenerate`` returns SafeAILab's tokens (greedy; bf16 rounding of two different target
  implementations may part them after a near-tie, so the common prefix is reported, not asserted).

Per-step figures come from two runs of different lengths: ``(t_long - t_short) / (steps_long - steps_short)``,
which cancels the prefill (steps from ``log=True``'s step index). Writes ``bench_safeailab.json`` to ``--out``
(default ``$OUT`` or ``bench/results/``) with the device, date, versions, SafeAILab commit and the exact command.

SafeAILab's code is read from a checkout given on the command line (fetched outside this repository, never
committed). The script copies its ``eagle/`` package into a temporary directory and applies there the two local
edits SafeAILab commit cb7e084 needs under transformers 5 (the checkout itself is not modified):

1. ``eagle/model/ea_model.py``: the imports of ``modeling_qwen2_kv`` and ``modeling_qwen3_kv`` fail under
   transformers 5 (``transformers.modeling_attn_mask_utils`` and ``transformers.utils.LossKwargs`` are gone); they
   are wrapped in ``try/except ImportError`` (unused for a Llama target).
2. ``eagle/model/cnets.py``, ``LlamaAttention._init_rope``: under transformers 5 ``config.rope_scaling`` aliases
   ``rope_parameters`` (``{"rope_type": "default", "rope_theta": ...}``) and ``config.rope_theta`` is gone, so
   the original raises ``KeyError: 'type'``; the edit treats a ``"default"`` rope type as no scaling and reads the
   base from ``rope_parameters["rope_theta"]``.

(SafeAILab's ``modeling_llama_kv.py`` needs no edit: its ``except`` falls back to its transformers-based rotary
class, which handles Llama-3.1's ``llama3`` scaling; ``'default'`` is no longer in ``ROPE_INIT_FUNCTIONS``, so a
target *without* RoPE scaling would need a third edit.)

Run on one GPU (H100, about 40 GB used), from the repository root::

    git clone https://github.com/SafeAILab/EAGLE /somewhere/EAGLE && git -C /somewhere/EAGLE checkout cb7e084
    python bench/bench_safeailab.py --eagle-repo /somewhere/EAGLE

``--shape tiny --device cpu`` runs the same code on a small random model (a smoke test; figures meaningless).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
from bench_engine import versions  # the scripts of bench/ run with bench/ on sys.path

REPO = Path(__file__).resolve().parent.parent

EDITS = [
    ("eagle/model/ea_model.py",
     "from .modeling_qwen2_kv import Qwen2ForCausalLM as KVQwen2ForCausalLM\n",
     "try:\n    from .modeling_qwen2_kv import Qwen2ForCausalLM as KVQwen2ForCausalLM\n"
     "except ImportError:  # transformers 5; unused for a Llama target\n    KVQwen2ForCausalLM = None\n"),
    ("eagle/model/ea_model.py",
     "from .modeling_qwen3_kv import Qwen3ForCausalLM as KVQwen3ForCausalLM\n",
     "try:\n    from .modeling_qwen3_kv import Qwen3ForCausalLM as KVQwen3ForCausalLM\n"
     "except ImportError:  # transformers 5; unused for a Llama target\n    KVQwen3ForCausalLM = None\n"),
    ("eagle/model/cnets.py",
     "    def _init_rope(self):\n"
     "        if self.config.rope_scaling is None:\n"
     "            if hasattr(self.config, \"rope_theta\"):\n"
     "                self.rotary_emb = LlamaRotaryEmbedding(self.head_dim,\n"
     "                                                       max_position_embeddings=self.max_position_embeddings,\n"
     "                                                       base=self.config.rope_theta)\n",
     "    def _init_rope(self):\n"
     "        _rp = getattr(self.config, \"rope_parameters\", None) or {}  # transformers 5: rope_theta lives here\n"
     "        if self.config.rope_scaling is None or self.config.rope_scaling.get(\"rope_type\") == \"default\":\n"
     "            if hasattr(self.config, \"rope_theta\") or \"rope_theta\" in _rp:\n"
     "                self.rotary_emb = LlamaRotaryEmbedding(self.head_dim,\n"
     "                                                       max_position_embeddings=self.max_position_embeddings,\n"
     "                                                       base=getattr(self.config, \"rope_theta\", None)"
     " or _rp[\"rope_theta\"])\n"),
]

SHAPES = {
    # Llama-3.1-8B-Instruct and its published EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json).
    "llama31-8b": dict(
        target=dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0,
                    max_position_embeddings=131072, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        head=dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                  num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, draft_vocab_size=32000,
                  max_position_embeddings=2048, pad_token_id=0, bos_token_id=128000, eos_token_id=128001),
    ),
    "tiny": dict(
        target=dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
                    max_position_embeddings=131072, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        head=dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, draft_vocab_size=256,
                  max_position_embeddings=2048, pad_token_id=0),
    ),
}


def prepare_safeailab(checkout: Path, work: Path) -> Path:
    """Copy the checkout's ``eagle`` package to ``work`` and apply :data:`EDITS` there; returns ``work``."""
    src = checkout / "eagle"
    if not (src / "model" / "ea_model.py").is_file():
        raise SystemExit(f"{checkout} is not a SafeAILab EAGLE checkout (no eagle/model/ea_model.py)")
    shutil.copytree(src, work / "eagle", ignore=shutil.ignore_patterns("train*", "evaluation", "*.pyc"))
    for rel, old, new in EDITS:
        path = work / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{rel}: the text a local edit replaces was not found once (another SafeAILab "
                             f"version?):\n{old}")
        path.write_text(text.replace(old, new))
    return work


def safeailab_commit(checkout: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def _randomize(module: torch.nn.Module, std: float = 0.02) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)


def build_ea_model(shape: str, device: str, dtype: torch.dtype, tree: tuple[int, int, int], seed: int):
    """SafeAILab's ``EaModel`` assembled from random-weight parts on ``device`` (SafeAILab's classes)."""
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig
    from eagle.model.ea_model import EaModel
    from eagle.model.modeling_llama_kv import LlamaForCausalLM as KVLlamaForCausalLM
    from transformers import LlamaConfig

    torch.manual_seed(seed)
    spec = SHAPES[shape]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            base = KVLlamaForCausalLM(LlamaConfig(**spec["target"]))
            _randomize(base)
            base.model.embed_tokens.weight.data.normal_()
            econf = EConfig(**spec["head"])
            total, depth, top_k = tree
            ea_layer = Model(econf, load_emb=False, total_tokens=total, depth=depth, top_k=top_k)
            _randomize(ea_layer)
    finally:
        torch.set_default_dtype(default_dtype)
    with torch.no_grad():
        ea_layer.embed_tokens.weight.copy_(base.model.embed_tokens.weight)  # SafeAILab loads it from the target
        V, Vd = econf.vocab_size, econf.draft_vocab_size
        used = torch.randperm(V, device=device)[:Vd].sort().values
        ea_layer.d2t.copy_(used - torch.arange(Vd, device=device))
        ea_layer.t2d.zero_()
        ea_layer.t2d[used] = True
    base.eval()
    model = EaModel.__new__(EaModel)
    torch.nn.Module.__init__(model)
    model.base_model = base
    model.config = base.config
    model.hidden_size = base.lm_head.weight.shape[-1]
    model.vocab_size = base.lm_head.weight.shape[0]
    model.base_model_name_or_path = None
    model.tokenizer = types.SimpleNamespace(eos_token_id=None)  # random weights: no EOS stop
    model.use_eagle3 = True
    model.ea_layer = ea_layer
    ea_layer.diff_device = False
    ea_layer.to(dtype).to(device)
    ea_layer.init_tree()
    return model.eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def per_step(fn, prompt, short: int, long: int, device: str, reps: int) -> dict:
    """ms per step of ``fn(prompt, max_new_tokens=n, log=True) -> (ids, new_token, idx)`` by differencing."""
    fn(prompt, max_new_tokens=short, log=True)  # warm-up (CUDA graphs, Triton compiles, caches)
    rows = []
    for _ in range(reps):
        runs = []
        for n in (short, long):
            _sync(device)
            t0 = time.perf_counter()
            ids, new_token, idx = fn(prompt, max_new_tokens=n, log=True)
            _sync(device)
            runs.append((time.perf_counter() - t0, int(idx) + 1, int(new_token)))
        (ts, ss, _), (tl, sl, nl) = runs
        rows.append(dict(ms_per_step=1e3 * (tl - ts) / max(1, sl - ss), steps=sl, new_tokens=nl))
    best = min(rows, key=lambda r: r["ms_per_step"])
    return dict(ms_per_step=statistics.median(r["ms_per_step"] for r in rows), best_ms_per_step=best["ms_per_step"],
                steps_long=rows[0]["steps"], tokens_per_step=rows[0]["new_tokens"] / rows[0]["steps"], runs=rows)


def per_call(call, reset, make_inputs, device: str, calls: int) -> dict:
    """ms per drafter call in the decode scenario: a 512-row prefill call, then ``calls`` calls of 4 new rows."""
    times = []
    for rep in range(2):  # the first pass warms up
        reset()
        feats, ids = make_inputs(512, None)
        call(feats, ids)
        for _ in range(calls):
            feats, ids = make_inputs(4, ids)
            _sync(device)
            t0 = time.perf_counter()
            call(feats, ids)
            _sync(device)
            if rep:
                times.append(1e3 * (time.perf_counter() - t0))
    return dict(ms=statistics.median(times), min_ms=min(times), calls=len(times))


def fused_device_ms(launch, reset, make_inputs, device: str, calls: int) -> float | None:
    """Device ms per launch of the fused kernel alone: ``calls`` launches enqueued back to back after a 512-row
    prefill (the host's launch work hides behind the kernels), timed with CUDA events."""
    if not device.startswith("cuda"):
        return None
    reset()
    feats, ids = make_inputs(512, None)
    launch(feats, ids)
    steps = []
    for _ in range(calls):
        feats, ids = make_inputs(4, ids)
        steps.append((feats, ids))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _sync(device)
    start.record()
    for feats, ids in steps:
        launch(feats, ids)
    end.record()
    _sync(device)
    return start.elapsed_time(end) / calls


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eagle-repo", required=True, type=Path, help="a SafeAILab EAGLE checkout (commit cb7e084)")
    p.add_argument("--shape", default="llama31-8b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--tree", default="60,7,10", help="total_token,depth,top_k")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--short", type=int, default=16, help="max_new_tokens of the short run")
    p.add_argument("--long", type=int, default=144, help="max_new_tokens of the long run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--calls", type=int, default=30, help="timed topK_genrate calls per variant")
    p.add_argument("--eagle-commit", default=None, help="the checkout's commit, when it is not a git work tree")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    tree = tuple(int(x) for x in args.tree.split(","))
    out_dir = args.out or Path(os.environ.get("OUT") or REPO / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    from results_guard import refuse_foreign

    refuse_foreign("bench_safeailab", out_dir / "bench_safeailab.json")
    sys.path.insert(0, str(REPO / "src"))

    from eagle_triton import TreeConfig, optimize_eagle_with_triton, patch_ea_model_with_triton_drafter, restore_eagle
    from eagle_triton.drafter import TreeDrafter
    from eagle_triton.engine import EagleEngine, LlamaTarget
    from eagle_triton.fused import DraftInputs, FusedDraftBackend, launch_drafter
    from eagle_triton.integrations.safeailab import head_from_ea_layer

    work = Path(tempfile.mkdtemp(prefix="safeailab_eagle_"))
    try:
        sys.path.insert(0, str(prepare_safeailab(args.eagle_repo, work)))
        t0 = time.perf_counter()
        model = build_ea_model(args.shape, args.device, dtype, tree, args.seed)
        build_s = time.perf_counter() - t0
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        V = model.vocab_size
        prompt = torch.randint(0, V, (1, args.prompt_len), generator=g).to(args.device)
        res: dict = {"shape": args.shape, "dtype": args.dtype, "tree": args.tree, "prompt_len": args.prompt_len,
                     "build_s": round(build_s, 1)}
        ea = model.ea_layer

        # -- whole steps -------------------------------------------------------------------------------------
        res["eagenerate_unpatched"] = per_step(model.eagenerate, prompt, args.short, args.long, args.device,
                                               args.reps)
        ref_ids = model.eagenerate(prompt, max_new_tokens=args.long)
        res["naivegenerate_unpatched"] = per_step(model.naivegenerate, prompt, args.short, args.long, args.device,
                                                  1)
        patch_ea_model_with_triton_drafter(model)
        res["eagenerate_drafter_patched"] = per_step(model.eagenerate, prompt, args.short, args.long, args.device,
                                                     args.reps)
        patched_ids = model.eagenerate(prompt, max_new_tokens=args.long)
        patch_ea_model_with_triton_drafter(model, use_triton=False)
        model, originals = optimize_eagle_with_triton(model)
        res["optimized_parts"] = sorted(originals)
        res["eagenerate_optimized"] = per_step(model.eagenerate, prompt, args.short, args.long, args.device,
                                               args.reps)
        opt_ids = model.eagenerate(prompt, max_new_tokens=args.long)
        res["naivegenerate_optimized"] = per_step(model.naivegenerate, prompt, args.short, args.long, args.device,
                                                  1)
        restore_eagle(model, originals)

        def common_prefix(a, b):
            n = min(a.shape[1], b.shape[1])
            eq = (a[0, :n] == b[0, :n]).tolist() + [False]
            return eq.index(False) - args.prompt_len

        res["tokens_equal_unpatched_vs_drafter_patched"] = bool(torch.equal(ref_ids, patched_ids))
        res["tokens_equal_unpatched_vs_optimized"] = bool(torch.equal(ref_ids, opt_ids))
        res["common_new_tokens_unpatched_vs_optimized"] = common_prefix(ref_ids, opt_ids)

        # -- eagle_triton's own engine on the same weights ---------------------------------------------------
        head = head_from_ea_layer(ea, lm_head=model.base_model.lm_head)
        engine = EagleEngine(LlamaTarget.from_hf(model.base_model), head, TreeConfig(*tree), max_length=2048)

        def engine_fn(ids, max_new_tokens, log, engine=engine):
            toks, stats = engine.generate(input_ids=ids, max_new_tokens=max_new_tokens, eos_token_id=None)
            return None, len(toks), stats.steps - 1

        res["engine_spec_step"] = per_step(engine_fn, prompt, args.short, args.long, args.device, args.reps)
        res["engine_drafter_backend"] = engine.drafter.backend
        engine = engine_fn = None  # frees its fused q/k/v and gate/up copies

        # -- topK_genrate per call ---------------------------------------------------------------------------
        W = ea.fc.weight.shape[1]
        gen = torch.Generator(device=args.device).manual_seed(args.seed)

        def make_inputs(rows, ids):
            feats = torch.randn(1, rows, W, generator=gen, device=args.device, dtype=dtype)
            new = torch.randint(0, V, (1, rows + (1 if ids is None else 0)), generator=gen, device=args.device)
            return feats, new if ids is None else torch.cat([ids, new], 1)

        lm_head = model.base_model.lm_head
        res["topk_call_unpatched"] = per_call(lambda f, i: ea.topK_genrate(f, i, lm_head, None), ea.reset_kv,
                                              make_inputs, args.device, args.calls)
        patch_ea_model_with_triton_drafter(model)
        res["topk_call_patched"] = per_call(lambda f, i: ea.topK_genrate(f, i, lm_head, None), ea.reset_kv,
                                            make_inputs, args.device, args.calls)
        res["topk_patched_backend"] = ea.topK_genrate.drafter.backend
        patch_ea_model_with_triton_drafter(model, use_triton=False)
        alone = TreeDrafter(head, TreeConfig(*tree), backend="triton" if args.device.startswith("cuda") else "torch")
        res["drafter_alone_call"] = per_call(lambda f, i: alone.draft(f, i), alone.reset, make_inputs, args.device,
                                             args.calls)
        res["topk_patch_overhead_ms"] = res["topk_call_patched"]["ms"] - res["drafter_alone_call"]["ms"]
        fused = alone._impl  # the FusedDraftBackend: its config, weights and buffers now fit the decode scenario
        if isinstance(fused, FusedDraftBackend) and fused.bufs is not None:
            def launch(f, i, fused=fused):  # what the drafter launches for a call: the new rows' features and ids
                return launch_drafter(fused._cfg, DraftInputs(f, i[:, -f.shape[1]:]), fused.weights, fused.bufs,
                                      fallback=False)

            res["fused_alone_call"] = per_call(launch, fused.reset, make_inputs, args.device, args.calls)
            res["fused_kernel_device_ms"] = fused_device_ms(launch, fused.reset, make_inputs, args.device,
                                                            args.calls)
            res["topk_patch_glue_ms"] = res["topk_call_patched"]["ms"] - res["fused_alone_call"]["ms"]
            if res["fused_kernel_device_ms"] is not None:
                res["topk_patch_over_kernel_ms"] = res["topk_call_patched"]["ms"] - res["fused_kernel_device_ms"]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    tag = "8b" if args.shape == "llama31-8b" else args.shape
    tree_tag = args.tree.replace(",", "_")
    res["headline"] = {
        f"safeailab_{tag}_step_unpatched": res["eagenerate_unpatched"]["ms_per_step"],
        f"safeailab_{tag}_step_drafter_patched": res["eagenerate_drafter_patched"]["ms_per_step"],
        f"safeailab_{tag}_step_optimized": res["eagenerate_optimized"]["ms_per_step"],
        f"safeailab_{tag}_topk_call_unpatched": res["topk_call_unpatched"]["ms"],
        f"safeailab_{tag}_topk_call_patched": res["topk_call_patched"]["ms"],
        f"spec_step_{tag}_{tree_tag}": res["engine_spec_step"]["ms_per_step"],
    }
    res["optimized_over_engine"] = res["eagenerate_optimized"]["ms_per_step"] / res["engine_spec_step"]["ms_per_step"]
    record = {
        "device": versions().get("device_name", args.device), "date": _dt.date.today().isoformat(),
        "versions": versions(), "safeailab_commit": args.eagle_commit or safeailab_commit(args.eagle_repo),
        "safeailab_local_edits": [
            "eagle/model/ea_model.py: modeling_qwen2_kv / modeling_qwen3_kv imports in try/except ImportError",
            "eagle/model/cnets.py: _init_rope treats rope_type 'default' as no scaling, base from rope_parameters",
        ],
        "eagle_triton_commit": safeailab_commit(REPO),
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "results": res,
    }
    path = out_dir / "bench_safeailab.json"
    path.write_text(json.dumps(record, indent=1))
    for k, v in res["headline"].items():
        print(f"{k:45s} {v:9.3f} ms")
    if "fused_alone_call" in res:
        kernel = res.get("fused_kernel_device_ms")
        print(f"topK_genrate patched {res['topk_call_patched']['ms']:.3f} ms per call; fused kernel alone "
              f"{res['fused_alone_call']['ms']:.3f} ms per call ({'n/a' if kernel is None else f'{kernel:.3f}'} ms "
              f"on the device); glue {res['topk_patch_glue_ms']:.3f} ms")
    print(f"optimized / engine step: {res['optimized_over_engine']:.2f}x; tokens equal (unpatched vs optimized): "
          f"{res['tokens_equal_unpatched_vs_optimized']}; written {path}")
    return record


if __name__ == "__main__":
    main()
