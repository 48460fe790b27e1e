"""Training recipe choices measured one at a time: short runs of ``train_eagle3`` that differ in one setting each,
validated on the same held-out conversations with the same validation settings.

    python bench/train_ablation.py --data runs/pack.pt.gz --init-head src/eagle_triton/assets/smollm2-eagle3 \
        --steps 300 --variants "base;lr=5e-4;ttt_steps=5;max_len=1024" --out $OUT
    # a trained head's vocabulary grown (its ids kept, the data's most frequent others added):
    python bench/train_ablation.py --data runs/pack.pt.gz --init-head src/eagle_triton/assets/smollm2-eagle3 \
        --steps 300 --variants "lr=5e-4;lr=5e-4,grow_draft_vocab=16384;lr=5e-4,grow_draft_vocab=24576" --out $OUT
    # the draft vocabulary needs heads trained from scratch (a head's vocabulary is part of it):
    python bench/train_ablation.py --data runs/pack.pt.gz --steps 600 \
        --variants "draft_vocab_size=12288;draft_vocab_size=8192;draft_vocab_size=16384" --out $OUT

Every variant starts from the same point (``--init-head``, or a fresh head with the same seed), trains ``--steps``
optimizer steps on the same conversations (``--data``: a pack from ``export_dataset`` or a data folder) with a short
warmup-stable-decay schedule (the last 30% of its steps decay), and is then validated on the data's held-out
conversations (every 33rd, as ``eagle-triton train`` holds out) with one validation setting for all: unrolled
``--val-ttt-steps`` steps, conversations cut at ``--val-max-len``. So a variant that trains on shorter sequences or
fewer unrolled steps is judged on the same positions as the others. ``base`` is the defaults of ``eagle-triton
train`` as ``scripts/train_smollm2.sh`` sets them (lr 1e-3, 7 TTT steps, max_len 1536, 16384 tokens per batch).

Writes ``train_ablation[_TAG].json`` (per variant: the overrides, steps, seconds, tokens/s, validation loss and
top-1 accuracy per unrolled step; rewritten after every variant, with ``"complete": false`` until the last one, so a
run stopped by a time limit keeps what it finished) and a PNG of the accuracies. Training runs go to a temporary
folder, removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from results_guard import refuse_foreign  # noqa: E402

from eagle_triton.fileio import atomic_write_json  # noqa: E402
from eagle_triton.train import TrainConfig  # noqa: E402

#: The recipe's settings (scripts/train_smollm2.sh's); a variant overrides some of them.
BASE = dict(lr=1e-3, ttt_steps=7, max_len=1536, tokens_per_batch=16384, draft_vocab_size=12288, warmup_steps=100)
#: The settings a variant may change.
KNOBS = ("lr", "ttt_steps", "max_len", "tokens_per_batch", "draft_vocab_size", "grow_draft_vocab", "warmup_steps",
         "step_decay", "intermediate_size", "grad_clip")


def parse_variants(text: str, init_head: bool) -> list[tuple[str, dict]]:
    """``"base;lr=5e-4;ttt_steps=5,max_len=1024"`` -> ``[(name, overrides), ...]`` (``base``: no override)."""
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    out, seen = [], set()
    for chunk in (c.strip() for c in text.split(";")):
        if not chunk:
            continue
        over = {}
        if chunk != "base":
            for item in chunk.split(","):
                key, sep, value = (s.strip() for s in item.partition("="))
                if not sep or key not in KNOBS:
                    raise SystemExit(f"variant {chunk!r}: expected key=value with key in {', '.join(KNOBS)}")
                kind = str(types[key])
                try:
                    over[key] = float(value) if "float" in kind else int(value)
                except ValueError:
                    raise SystemExit(f"variant {chunk!r}: {key}={value!r} is not a number") from None
        if init_head and "draft_vocab_size" in over:
            raise SystemExit(f"variant {chunk!r}: the draft vocabulary is part of --init-head's head; measure it "
                             "from scratch (no --init-head)")
        if not init_head and "grow_draft_vocab" in over:
            raise SystemExit(f"variant {chunk!r}: grow_draft_vocab grows --init-head's vocabulary; pass --init-head")
        if chunk in seen:
            raise SystemExit(f"variant {chunk!r} is given twice")
        seen.add(chunk)
        out.append((chunk, over))
    if not out:
        raise SystemExit("--variants names no variant")
    return out


def load_samples(data: str):
    """The conversations of comma-separated data packs or folders, in the order given (read in place)."""
    from eagle_triton.train import load_dataset

    paths = [d for d in data.split(",") if d]
    for d in paths:
        if not Path(d).exists():
            raise SystemExit(f"--data {d}: no such file or folder")
    return [s for d in paths for s in load_dataset(d)]


def run_variant(name, over, target, tok, samples, args, work: Path, start_step: int) -> dict:
    """Train one variant from the common start and validate it with the common validation settings."""
    from eagle_triton.train import train_eagle3, validate
    from eagle_triton.train.trainer import _split

    settings = {**BASE, **over}
    total = start_step + args.steps
    # a short run's warm-up is at most a tenth of it; its last 30% decays (decay_fraction is of the absolute steps)
    run = {**settings, "warmup_steps": min(settings["warmup_steps"], max(1, args.steps // 10))}
    cfg = TrainConfig(**run, max_steps=total, decay_fraction=0.3 * args.steps / total,
                        val_fraction=args.val_fraction, save_every=0, seed=args.seed,
                        log_every=max(1, args.steps // 10))
    t0 = time.perf_counter()
    head, meta = train_eagle3(target, tok, samples, cfg, work / "runs" / name.replace("/", "_"), device=args.device,
                              init_head=args.init_head, progress=False, log=lambda *_: None)
    seconds = time.perf_counter() - t0
    _, val = _split(samples, args.val_fraction)
    if not val:
        raise SystemExit("no held-out conversations: more data, or a larger --val-fraction")
    vcfg = TrainConfig(**{**BASE, "ttt_steps": args.val_ttt_steps, "max_len": args.val_max_len},
                         val_fraction=args.val_fraction)
    used = head.draft_to_target(torch.arange(head.draft_vocab_size, device=head.d2t.device)).to(args.device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    v = validate(head, target, val, vcfg, used, pad, torch.device(args.device))
    trained = [h for h in meta["history"] if h["step"] > start_step]
    return {"name": name, "overrides": over, "settings": settings, "steps": meta["step"] - start_step,
            "seconds": round(seconds, 2),
            "tokens_per_s": round(sum(h["tokens_per_s"] for h in trained) / len(trained), 1) if trained else None,
            "val_loss": v["loss"], "val_acc": v["acc"], "val_positions": v["positions"]}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results["variants"]:
        ax.plot(range(len(r["val_acc"])), r["val_acc"], marker="o", label=r["name"])
    ax.set_xlabel("unrolled step")
    ax.set_ylabel("held-out top-1 accuracy")
    ax.set_title(f"{results['steps']} steps per variant, {results['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2", help="'smollm2' (the embedded GGUF), a .gguf file or a model dir")
    p.add_argument("--data", required=True,
                   help="data packs (export_dataset's .pt or .pt.gz) or data folders, comma-separated")
    p.add_argument("--init-head", default=None, help="every variant starts from this head (default: from scratch)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per variant")
    p.add_argument("--variants", default="base;lr=5e-4;ttt_steps=5;max_len=1024",
                   help="';'-separated variants, each 'base' or key=value[,key=value] (keys: " + ", ".join(KNOBS) + ")")
    p.add_argument("--val-fraction", type=float, default=0.03)
    p.add_argument("--val-ttt-steps", type=int, default=7, help="unrolled steps every variant is validated over")
    p.add_argument("--val-max-len", type=int, default=1536, help="validation conversations are cut here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results"))
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    variants = parse_variants(args.variants, args.init_head is not None)
    if args.init_head is not None and not (Path(args.init_head) / "train_meta.json").is_file():
        raise SystemExit(f"--init-head {args.init_head} is not a head folder with train_meta.json")
    out = Path(args.out)
    stem = "train_ablation" + (f"_{args.tag}" if args.tag else "")
    refuse_foreign("train_ablation", out / f"{stem}.json", out / f"{stem}.png")

    from eagle_triton.commands.generate import resolve_target
    from eagle_triton.train import load_target

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target, tok = load_target(resolve_target(args.target), dtype=dtype, device=args.device)
    start = json.loads((Path(args.init_head) / "train_meta.json").read_text())["step"] if args.init_head else 0
    every = round(1 / args.val_fraction) if args.val_fraction > 0 else None
    given = sys.argv[1:] if argv is None else list(argv)
    results = {
        "benchmark": "train_ablation", "command": "python3 bench/train_ablation.py " + " ".join(given),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "git_commit": os.environ.get("EAGLE_TRITON_GIT_COMMIT"),
        "data": args.data, "init_head": args.init_head, "start_step": start, "steps": args.steps, "base": BASE,
        "validation": {"ttt_steps": args.val_ttt_steps, "max_len": args.val_max_len, "every": every},
        "variants": [],
    }
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train_ablation_") as tmp:
        work = Path(tmp)
        samples = load_samples(args.data)
        results["conversations"] = len(samples)
        for name, over in variants:
            r = run_variant(name, over, target, tok, samples, args, work, start)
            results["variants"].append(r)
            print(f"[ablation] {name:32s} acc {[round(a, 3) for a in r['val_acc']]}  loss {r['val_loss']:.4f}  "
                  f"{r['seconds']:.0f} s", flush=True)
            # after every variant: a run cut short (a time limit) keeps the variants it finished
            results["complete"] = len(results["variants"]) == len(variants)
            atomic_write_json(out / f"{stem}.json", results, indent=1)
    plot(results, out / f"{stem}.png")
    print(f"wrote {out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
