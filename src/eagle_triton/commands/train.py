"""``eagle-triton train``: self-distil a data set from the target and train an EAGLE-3 head on it (resumable).

Example (the embedded SmolLM2-135M-Instruct; prompts sampled from the target itself)::

    eagle-triton train --work-dir work --num-prompts 4096 --max-steps 3000 --out my-head

Every stage resumes from ``--work-dir``: re-running the same command continues data generation and training
where the last call stopped (``--data-time-budget`` / ``--train-time-budget`` bound one call).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise SystemExit(f"eagle-triton train: expected comma-separated numbers, got {text!r}") from e


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train an EAGLE-3 draft head for a Llama-family target by self-distillation",
        description=__doc__.split("\n\n")[0],
    )
    g = p.add_argument_group("target and data")
    g.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded SmolLM2-135M-Instruct), a .gguf file, or a transformers model dir/id")
    g.add_argument("--work-dir", default="eagle_train_work", help="data/ and run/ live here (resumable state)")
    g.add_argument("--prompts", default=None,
                   help="JSONL prompts (default: sample user turns from the target's chat template)")
    g.add_argument("--num-prompts", type=int, default=1024)
    g.add_argument("--gen-batch-size", type=int, default=256)
    g.add_argument("--prompt-max-tokens", type=int, default=96)
    g.add_argument("--max-new-tokens", type=int, default=384)
    g.add_argument("--response-temperatures", default="0,0.7", help="cycled over batches; 0 = greedy")
    g.add_argument("--import-data", default=None, help="unpack a file written by --export-data into work-dir/data")
    g.add_argument("--export-data", default=None, help="pack work-dir/data into one file after data generation")
    t = p.add_argument_group("training")
    t.add_argument("--draft-vocab", type=int, default=12288)
    t.add_argument("--intermediate-size", type=int, default=None)
    t.add_argument("--rope-theta", type=float, default=None, help="head RoPE base (default: the target's)")
    t.add_argument("--ttt-steps", type=int, default=7)
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--warmup-steps", type=int, default=100)
    t.add_argument("--max-steps", type=int, default=2000)
    t.add_argument("--decay-fraction", type=float, default=0.4)
    t.add_argument("--tokens-per-batch", type=int, default=16384)
    t.add_argument("--max-len", type=int, default=1024)
    t.add_argument("--val-fraction", type=float, default=0.03)
    t.add_argument("--eval-every", type=int, default=0)
    t.add_argument("--save-every", type=int, default=500)
    t.add_argument("--init-head", default=None,
                   help="resume from a published-format head with train_meta.json (fresh optimizer moments)")
    t.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    t.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run control")
    r.add_argument("--stage", choices=["data", "train", "all"], default="all")
    r.add_argument("--data-time-budget", type=float, default=None, help="seconds of data generation in this call")
    r.add_argument("--train-time-budget", type=float, default=None, help="seconds of training in this call")
    r.add_argument("--allow-partial-data", action="store_true",
                   help="train on the batches generated so far when --data-time-budget ends data generation early")
    r.add_argument("--stop-at-step", type=int, default=None, help="pause training at this step (resumable)")
    r.add_argument("--out", default=None, help="copy the finished head (published format) here")
    r.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    r.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="target dtype (default: bfloat16 on cuda, float32 on cpu)")
    r.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..train import (
        DataConfig,
        TrainConfig,
        export_dataset,
        generate_dataset,
        import_dataset,
        load_dataset,
        load_target,
        train_eagle3,
    )

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    work = Path(args.work_dir)
    data_dir, run_dir = work / "data", work / "run"
    progress = not args.no_progress and sys.stderr.isatty()
    target, tok = load_target(args.target, dtype=dtype, device=device)
    if args.import_data:
        n = import_dataset(args.import_data, data_dir)
        print(f"imported {n} conversations into {data_dir}")
    data_cfg = DataConfig(
        num_prompts=args.num_prompts, prompts_path=args.prompts, batch_size=args.gen_batch_size,
        prompt_max_tokens=args.prompt_max_tokens, max_new_tokens=args.max_new_tokens,
        response_temperatures=_floats(args.response_temperatures), seed=args.seed,
    )
    status = {"complete": True}
    if args.stage in ("data", "all"):
        status = generate_dataset(target, tok, data_cfg, data_dir, time_budget_s=args.data_time_budget,
                                  progress=progress)
        print(json.dumps({"data": status}))
        if args.export_data:
            n = export_dataset(data_dir, args.export_data)
            print(f"exported {n} conversations to {args.export_data}")
        if not status["complete"] and not args.allow_partial_data:
            print("data generation paused (time budget); run the same command again to continue")
            return 0
    if args.stage == "data":
        return 0
    samples = load_dataset(data_dir)
    train_cfg = TrainConfig(
        draft_vocab_size=args.draft_vocab, intermediate_size=args.intermediate_size, rope_theta=args.rope_theta,
        ttt_steps=args.ttt_steps, lr=args.lr, warmup_steps=args.warmup_steps, max_steps=args.max_steps,
        decay_fraction=args.decay_fraction, tokens_per_batch=args.tokens_per_batch, max_len=args.max_len,
        val_fraction=args.val_fraction, eval_every=args.eval_every, save_every=args.save_every,
        time_budget_s=args.train_time_budget, stop_at_step=args.stop_at_step, seed=args.seed,
        save_dtype=args.save_dtype,
    )
    head, meta = train_eagle3(target, tok, samples, train_cfg, run_dir, device=device, init_head=args.init_head,
                              progress=progress)
    last_val = meta["validation"][-1] if meta["validation"] else None
    print(json.dumps({"step": meta["step"], "complete": meta["complete"], "train_seconds": meta["train_seconds"],
                      "validation": last_val}))
    if args.out:
        dest = Path(args.out)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(run_dir / "head", dest)
        print(f"head written to {dest}")
    return 0


def main(argv=None) -> int:
    """``python -m eagle_triton.commands.train ...`` (the same flags as ``eagle-triton train``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="eagle-triton")
    register(parser.add_subparsers())
    args = parser.parse_args(["train"] + list(sys.argv[1:] if argv is None else argv))
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
