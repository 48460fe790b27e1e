"""How much of what the target writes a draft vocabulary can draft at all (a recipe choice of issue 22).

A token outside the head's draft vocabulary can never be drafted, so every such token in the target's output ends
the accepted chain of its step. This measures, for the shipped head's vocabulary and for vocabularies of other sizes
chosen from a data set's response-token counts (as ``eagle-triton train`` chooses them, or grown from the head's as
``--grow-draft-vocab`` grows it):

* the share of response tokens of training data packs (``--data``) inside each vocabulary;
* the share of the target's own greedy answers to evaluation prompts (MT-bench first turns, HumanEval) inside each
  (the target's answers are generated here with transformers, greedy, ``--max-new-tokens``; an fp32 CPU run is
  enough: the figure counts tokens, not time).

    python bench/vocab_coverage.py --data runs/s13.pt.gz,runs/s14.pt.gz --sizes 12288,16384,24576 \
        --datasets mtbench,humaneval --limit 80 --out bench/results/<set>

Writes ``vocab_coverage.json`` (device, versions, date, command, per source and vocabulary: tokens, covered share).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_acceptance import chat_ids, default_target, load_prompts  # noqa: E402
from results_guard import refuse_foreign  # noqa: E402

from eagle_triton.train import build_draft_vocab, grow_draft_vocab, load_dataset, token_counts  # noqa: E402

HEAD = ROOT / "src" / "eagle_triton" / "assets" / "smollm2-eagle3"


def head_vocab(head_dir: Path) -> torch.Tensor:
    """The target ids of a head's draft vocabulary (from its ``train_meta.json``), ascending."""
    meta = json.loads((head_dir / "train_meta.json").read_text())
    return torch.tensor(sorted(meta["vocab_used"]), dtype=torch.long)


def response_counts(paths: list[str], vocab_size: int) -> torch.Tensor:
    """Response-token histogram ``[V]`` of the conversations of data packs or folders."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for p in paths:
        samples = load_dataset(p)
        counts += token_counts([s.ids for s in samples], vocab_size, starts=[s.resp_start for s in samples])
    return counts


@functools.lru_cache(maxsize=1)
def _cpu_target(target: str):
    """The target and its tokenizer, fp32 on the CPU, loaded once for every prompt set."""
    from eagle_triton.train import load_target

    return load_target(target, dtype=torch.float32, device="cpu")


def greedy_answers(target: str, prompts: list[str], max_new: int, batch: int) -> tuple[list[list[int]], dict]:
    """The target's greedy answers (token ids, cut after the first stop token) with transformers, fp32 CPU."""
    model, tok = _cpu_target(target)
    stop = {tok.eos_token_id, *([tok.convert_tokens_to_ids("<|im_end|>")] if "<|im_end|>" in tok.get_vocab() else [])}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = []
    for i in range(0, len(prompts), batch):
        rows = [chat_ids(tok, p) for p in prompts[i:i + batch]]
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=pad)
        for row in gen[:, width:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in stop), len(row))
            out.append(row[:cut])
    return out, {"vocab_size": model.config.vocab_size, "stop_ids": sorted(t for t in stop if t is not None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", default=str(HEAD), help="head folder whose vocabulary is measured (train_meta.json)")
    ap.add_argument("--data", default="", help="comma-separated data packs or folders (response tokens counted)")
    ap.add_argument("--sizes", default="12288,16384,24576", help="vocabulary sizes chosen from --data's counts")
    ap.add_argument("--datasets", default="mtbench,humaneval", help="evaluation prompt sets ('' for none)")
    ap.add_argument("--limit", type=int, default=80, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--target", default=None)
    ap.add_argument("--out", default=None, help="folder for vocab_coverage.json")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else None
    if out is not None:
        refuse_foreign("vocab_coverage", out / "vocab_coverage.json")

    used_head = head_vocab(Path(args.head))
    datasets = [d for d in args.datasets.split(",") if d]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    t0 = time.time()
    answers = {}
    vocab_size, stop_ids = None, []
    if datasets:
        prompts = {d: load_prompts(d)[:args.limit] for d in datasets}
        for d, ps in prompts.items():
            answers[d], info = greedy_answers(args.target or default_target(), ps, args.max_new_tokens, args.batch)
            vocab_size, stop_ids = info["vocab_size"], info["stop_ids"]
            print(f"{d}: {len(ps)} greedy answers, {sum(map(len, answers[d]))} tokens ({time.time() - t0:.0f} s)")
    vocab_size = vocab_size or int(json.loads((Path(args.head) / "config.json").read_text())["vocab_size"])

    vocabs = {f"head ({used_head.numel()})": used_head}
    paths = [p for p in args.data.split(",") if p]
    # every source as a token histogram [V]
    sources = {d: token_counts([torch.tensor(a, dtype=torch.long) for a in answers[d]], vocab_size) for d in answers}
    if paths:
        counts = response_counts(paths, vocab_size)
        sources["data responses"] = counts
        for n in sizes:
            vocabs[f"from data ({n})"] = build_draft_vocab(counts, n, always_include=stop_ids).used
            if n > used_head.numel():
                vocabs[f"head grown ({n})"] = grow_draft_vocab(used_head, counts, n).used
    table = {}
    for src, hist in sources.items():
        total = int(hist.sum())
        covered = {name: round(float(hist[used].sum()) / total, 5) if total else float("nan")
                   for name, used in vocabs.items()}
        table[src] = {"tokens": total, "covered": covered}
        print(src, table[src])
    doc = {"benchmark": "vocab_coverage", "device": "cpu", "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "torch": torch.__version__, "python": platform.python_version(),
        "command": "python " + " ".join(sys.argv), "head": args.head, "data": paths, "limit": args.limit,
        "max_new_tokens": args.max_new_tokens, "answers": "transformers generate, greedy, fp32 CPU",
        "coverage": table, "seconds": round(time.time() - t0, 1)}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "vocab_coverage.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out / 'vocab_coverage.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
