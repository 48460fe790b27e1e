"""``eagle-triton train``: self-distil a data set from the target and train an EAGLE-3 head on it (resumable).

Example (the embedded SmolLM2-135M-Instruct; prompts sampled from the target itself)::

    eagle-triton train --work-dir work --num-prompts 4096 --max-steps 3000 --out my-head

Every stage resumes from ``--work-dir``: re-running the same command continues data generation and training
where the last call stopped (``--data-time-budget`` / ``--train-time-budget`` bound one call).

Your files are safe: ``--work-dir`` must be new, empty, or a work folder of an earlier ``train`` call, and
``--out`` new, empty, or a head written by ``train``; another non-empty folder is refused unless ``--overwrite``
(then files of the same name are replaced and every other file is kept). ``--out`` may not be the current folder,
nor the work folder, inside it or around it. Nothing is ever deleted that ``train`` did not write.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli import DefaultsHelpFormatter

WORK_DIR_KIND = "train-work-dir"
HEAD_KIND = "draft-head"


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    return values


def _prompt_openers(value: str | None) -> list[str] | None:
    """``--prompt-openers``: ``None``, ``"builtin"`` (:data:`~eagle_triton.train.INSTRUCTION_OPENERS`) or a file's
    non-blank lines (checked by :func:`check_args`)."""
    if value is None:
        return None
    if value == "builtin":
        from ..train import INSTRUCTION_OPENERS

        return list(INSTRUCTION_OPENERS)
    return [line.strip() for line in Path(value).read_text(encoding="utf-8").splitlines() if line.strip()]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train an EAGLE-3 draft head for a Llama-family target by self-distillation",
        description=(__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[-1].strip()).replace("``", ""),
        formatter_class=DefaultsHelpFormatter,
    )
    g = p.add_argument_group("target and data")
    g.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded SmolLM2-135M-Instruct), a .gguf file, or a transformers model dir/id")
    g.add_argument("--work-dir", default="eagle_train_work",
                   help="folder of the resumable state (data/ and run/); must be new, empty or an earlier "
                   "train work folder")
    g.add_argument("--prompts", default=None,
                   help="JSONL prompts (default: sample user turns from the target's chat template)")
    g.add_argument("--num-prompts", type=int, default=1024, help="conversations to generate")
    g.add_argument("--gen-batch-size", type=int, default=256, help="prompts answered per generation batch")
    g.add_argument("--prompt-max-tokens", type=int, default=96, help="longest sampled user prompt, in tokens")
    g.add_argument("--prompt-openers", default=None, metavar="FILE|builtin",
                   help="words each sampled user turn starts with, cycled over the conversations, so that the "
                        "target writes requests of those kinds: a text file with one opener per line, or 'builtin' "
                        "(eagle_triton.train.INSTRUCTION_OPENERS); default: the target samples whole turns")
    g.add_argument("--max-new-tokens", type=int, default=384, help="longest target response, in tokens")
    g.add_argument("--response-temperatures", type=_floats, default=[0.0, 0.7], metavar="T1,T2,...",
                   help="response sampling temperatures, cycled over batches; 0 = greedy")
    g.add_argument("--turns", type=int, default=1,
                   help="user turns per conversation: after each answer the target samples the next user turn and "
                        "answers it (each answer a sample; default: 1)")
    g.add_argument("--data-generator", choices=["transformers", "engine"], default="transformers",
                   help="who writes the data: transformers' generate (left-padded batches, one seed per batch) or "
                        "the eagle-triton engine (continuous batching over --gen-slots slots, CUDA graphs, "
                        "speculation, one seed per conversation); the same target distribution")
    g.add_argument("--gen-slots", type=int, default=16,
                   help="the engine generator's sequences at once: at most 16 with a draft head, 64 without one "
                        "(--gen-draft none); a conversation's data do not depend on it")
    g.add_argument("--gen-draft", default=None,
                   help="the engine generator's draft head folder, or 'none' for plain decoding (default: the "
                        "shipped head for the embedded SmolLM2, else none)")
    g.add_argument("--import-data", default=None,
                   help="unpack a file written by --export-data into work-dir/data (default: none)")
    g.add_argument("--extra-data", action="append", default=[], metavar="DIR_OR_PACK",
                   help="another data folder (the data/ of another work folder, e.g. made with another --seed in "
                        "parallel) or a pack written by --export-data, read in place: its conversations join the "
                        "training set after work-dir/data's; repeatable")
    g.add_argument("--export-data", default=None,
                   help="pack work-dir/data into one file after data generation (default: no export)")
    t = p.add_argument_group("training")
    t.add_argument("--draft-vocab", type=int, default=12288, help="draft vocabulary size (most frequent tokens)")
    t.add_argument("--grow-draft-vocab", type=int, default=None, metavar="N",
                   help="with --init-head: grow its draft vocabulary to N ids (its ids kept, the data's most frequent "
                        "other response tokens added, their output rows starting as the target's; default: the head's "
                        "vocabulary as it is)")
    t.add_argument("--intermediate-size", type=int, default=None,
                   help="MLP width of the head (default: the target's)")
    t.add_argument("--rope-theta", type=float, default=None, help="head RoPE base (default: the target's)")
    t.add_argument("--ttt-steps", type=int, default=7, help="training-time-test unroll depth")
    t.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (AdamW)")
    t.add_argument("--warmup-steps", type=int, default=100, help="linear learning-rate warm-up steps")
    t.add_argument("--max-steps", type=int, default=2000, help="optimizer steps in all")
    t.add_argument("--decay-fraction", type=float, default=0.4,
                   help="final fraction of the steps over which the learning rate decays to 0")
    t.add_argument("--tokens-per-batch", type=int, default=16384, help="tokens per training batch (padded)")
    t.add_argument("--max-len", type=int, default=1024, help="conversations are cut to this many tokens")
    t.add_argument("--val-fraction", type=float, default=0.03, help="share of conversations held out for validation")
    t.add_argument("--eval-every", type=int, default=0, help="validate every N steps (0: only at the end)")
    t.add_argument("--save-every", type=int, default=500, help="checkpoint every N steps (0: only at the end)")
    t.add_argument("--init-head", default=None,
                   help="resume from a published-format head with train_meta.json (fresh optimizer moments; "
                   "default: a new head)")
    t.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="dtype of the written head")
    t.add_argument("--seed", type=int, default=0, help="random seed (data sampling, initialisation, batch order)")
    r = p.add_argument_group("run control")
    r.add_argument("--stage", choices=["data", "train", "all"], default="all",
                   help="data: generate the data set only; train: train on existing data; all: both")
    r.add_argument("--data-time-budget", type=float, default=None,
                   help="seconds of data generation in this call (default: no limit)")
    r.add_argument("--train-time-budget", type=float, default=None,
                   help="seconds of training in this call (default: no limit)")
    r.add_argument("--allow-partial-data", action="store_true",
                   help="train on the batches generated so far when --data-time-budget ends data generation early")
    r.add_argument("--stop-at-step", type=int, default=None,
                   help="pause training at this step (resumable; default: run to --max-steps)")
    r.add_argument("--out", default=None,
                   help="also write the finished head (published format) to this folder: new, empty, or a head "
                   "written by train (default: the head stays in WORK_DIR/run/head only)")
    r.add_argument("--overwrite", action="store_true",
                   help="allow a non-empty --out / --work-dir that train did not write: files of the same name are "
                   "replaced, other files are kept (never deleted)")
    r.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    r.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="target dtype (default: bfloat16 on cuda, float32 on cpu)")
    r.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they are shown only when stderr is a terminal)")
    p.set_defaults(func=run)


def _has_work_layout(work: Path) -> bool:
    """A work folder of an earlier ``train`` (from before the ownership marker): only data/ and run/, with our
    files in them."""
    from ..fileio import MARKER

    names = {x.name for x in work.iterdir()}
    return names <= {"data", "run", MARKER} and (
        (work / "data" / "manifest.json").is_file() or (work / "run" / "trainer_state.pt").is_file())


def _exports(work: Path) -> list[str]:
    """Files this work folder's --export-data wrote (a re-run may replace them)."""
    from ..fileio import read_marker

    marker = read_marker(work) or {}
    return list(marker.get("exports", [])) if marker.get("kind") == WORK_DIR_KIND else []


def check_work_dir(work: Path, overwrite: bool) -> None:
    """``--work-dir`` must be new, empty, or a work folder of ours (unless ``overwrite``)."""
    from ..fileio import UnsafeOutputError, owner_kind

    if work.exists() and not work.is_dir():
        raise UnsafeOutputError(f"--work-dir {work} is a file, not a folder: name a new folder")
    if not work.is_dir() or owner_kind(work) == WORK_DIR_KIND or overwrite:
        return
    if any(work.iterdir()) and not _has_work_layout(work):
        raise UnsafeOutputError(f"--work-dir {work} is not empty and is not a train work folder: choose a new or "
                                "empty folder, or pass --overwrite to use it anyway (its files are kept)")


def check_out_dir(out: Path, work: Path, overwrite: bool) -> None:
    """``--out`` must not be the current folder, overlap the work folder, or hold files we did not write."""
    from ..cli import UsageError
    from ..fileio import check_output_dir, is_inside

    if is_inside(Path.cwd(), out):
        raise UsageError(f"--out {out} is the current folder or contains it: name a new folder for the head, "
                         "e.g. --out my-head")
    if is_inside(out, work) or is_inside(work, out):
        raise UsageError(f"--out {out} and --work-dir {work} overlap: the head needs a folder of its own, outside "
                         "the work folder")
    check_output_dir(out, HEAD_KIND, overwrite)


def check_args(args) -> None:
    """Everything that can be checked before the target loads."""
    from ..cli import UsageError

    positive = ("num_prompts", "gen_batch_size", "prompt_max_tokens", "max_new_tokens", "draft_vocab", "ttt_steps",
                "max_steps", "tokens_per_batch", "max_len")
    for name in positive:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup_steps", "eval_every", "save_every"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 0 <= args.val_fraction < 1:
        raise UsageError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be > 0, got {args.lr}")
    if args.grow_draft_vocab is not None and (args.grow_draft_vocab < 1 or not args.init_head):
        raise UsageError("--grow-draft-vocab needs --init-head (the head whose vocabulary grows) and a size >= 1, got "
                         f"{args.grow_draft_vocab}" + ("" if args.init_head else " without --init-head"))
    if args.prompt_openers not in (None, "builtin"):
        if not Path(args.prompt_openers).is_file():
            raise UsageError(f"--prompt-openers {args.prompt_openers} is neither a file nor 'builtin'")
        if not _prompt_openers(args.prompt_openers):
            raise UsageError(f"--prompt-openers {args.prompt_openers} holds no opener (one per line)")
    for opt, value in (("--prompts", args.prompts), ("--import-data", args.import_data)):
        if value is not None and not Path(value).is_file():
            raise UsageError(f"{opt} {value} is not a file")
    for d in args.extra_data:
        if not Path(d).is_file() and not any(Path(d).glob("shard_*.pt")):
            raise UsageError(f"--extra-data {d} is neither a data pack nor a folder of data shards (shard_*.pt): "
                             "name the data/ folder of a train work folder, or a file written by --export-data")
    if args.export_data is not None and Path(args.export_data).exists() and not args.overwrite \
            and str(Path(args.export_data).resolve()) not in _exports(Path(args.work_dir)):
        raise UsageError(f"--export-data {args.export_data} exists: choose another file name, or pass --overwrite "
                         "to replace it")
    if args.gen_draft not in (None, "none") and not Path(args.gen_draft).is_dir():
        raise UsageError(f"--gen-draft {args.gen_draft} is not a folder (a draft head, or 'none')")
    if args.gen_draft is not None and args.data_generator != "engine":
        raise UsageError("--gen-draft needs --data-generator engine")
    from ..engine.batch import BATCH_BUCKETS, SPECULATIVE_BATCH_MAX

    if not 1 <= args.gen_slots <= BATCH_BUCKETS[-1]:
        raise UsageError(f"--gen-slots must be in 1..{BATCH_BUCKETS[-1]}, got {args.gen_slots}")
    drafts = args.gen_draft not in (None, "none") or (args.gen_draft is None and args.target == "smollm2")
    if args.gen_slots > SPECULATIVE_BATCH_MAX and drafts:
        raise UsageError(f"--gen-slots {args.gen_slots}: a writer with a draft head writes at most "
                         f"{SPECULATIVE_BATCH_MAX} conversations at once; pass --gen-draft none for more")
    if args.init_head is not None and not (Path(args.init_head) / "train_meta.json").is_file():
        raise UsageError(f"--init-head {args.init_head} is not a head folder with train_meta.json")
    if args.target != "smollm2":
        from ..engine.loading import _split_source

        _split_source(args.target, None)  # a missing path: one clear error before anything loads
    work = Path(args.work_dir)
    check_work_dir(work, args.overwrite)
    if args.out:
        check_out_dir(Path(args.out), work, args.overwrite)


ENGINE_MAX_LENGTH = 2048  # the data engine's longest conversation; a longer one is dropped (and counted)


def _data_engine(args, device: str, dtype, tok):
    """The :class:`EagleEngine` that writes the data for ``--data-generator engine``."""
    from ..engine import EagleEngine
    from ..engine.default_model import default_draft_head_path
    from .generate import resolve_target

    draft = args.gen_draft
    if draft is None:
        draft = default_draft_head_path() if args.target == "smollm2" else None
    elif draft == "none":
        draft = None
    return EagleEngine.from_pretrained(resolve_target(args.target), draft, device=device, dtype=dtype,
                                       max_length=ENGINE_MAX_LENGTH, tokenizer=tok)


def run(args) -> int:
    check_args(args)
    import torch

    from ..fileio import mark_owned, publish_dir
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
    from .generate import resolve_target

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    exports = _exports(work)
    mark_owned(work, WORK_DIR_KIND, exports=exports)
    data_dir, run_dir = work / "data", work / "run"
    progress = not args.no_progress and sys.stderr.isatty()
    target, tok = load_target(resolve_target(args.target), dtype=dtype, device=device)
    if args.import_data:
        n = import_dataset(args.import_data, data_dir)
        print(f"imported {n} conversations into {data_dir}")
    data_cfg = DataConfig(
        num_prompts=args.num_prompts, prompts_path=args.prompts, batch_size=args.gen_batch_size,
        prompt_max_tokens=args.prompt_max_tokens, max_new_tokens=args.max_new_tokens,
        response_temperatures=args.response_temperatures, seed=args.seed, turns=args.turns,
        generator=args.data_generator, prompt_openers=_prompt_openers(args.prompt_openers),
        engine_slots=args.gen_slots,
    )
    status = {"complete": True}
    if args.stage in ("data", "all"):
        writer = _data_engine(args, device, dtype, tok) if args.data_generator == "engine" else target
        status = generate_dataset(writer, tok, data_cfg, data_dir, time_budget_s=args.data_time_budget,
                                  progress=progress)
        del writer
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        print(json.dumps({"data": status}))
        if args.export_data:
            path = str(Path(args.export_data).resolve())
            if path not in exports:
                mark_owned(work, WORK_DIR_KIND, exports=exports + [path])
            n = export_dataset(data_dir, args.export_data)
            print(f"exported {n} conversations to {args.export_data}")
        if not status["complete"] and not args.allow_partial_data:
            print("data generation paused (time budget); run the same command again to continue")
            return 0
    if args.stage == "data":
        return 0
    # (work-dir/data may be empty when --extra-data names every folder: a run on data made elsewhere)
    samples = load_dataset(data_dir) if any(data_dir.glob("shard_*.pt")) or not args.extra_data else []
    for d in args.extra_data:
        samples += load_dataset(d)
    train_cfg = TrainConfig(
        draft_vocab_size=args.draft_vocab, grow_draft_vocab=args.grow_draft_vocab,
        intermediate_size=args.intermediate_size, rope_theta=args.rope_theta, ttt_steps=args.ttt_steps, lr=args.lr,
        warmup_steps=args.warmup_steps, max_steps=args.max_steps,
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
        check_out_dir(dest, work, args.overwrite)  # again: the folder may have changed while training ran
        publish_dir(run_dir / "head", dest, HEAD_KIND)
        print(f"head written to {dest}")
    return 0


def main(argv=None) -> int:
    """``python -m eagle_triton.commands.train ...`` (the same flags as ``eagle-triton train``)."""
    from ..cli import main as cli_main

    return cli_main(["train"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
