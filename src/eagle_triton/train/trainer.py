"""EAGLE-3 head training: TTT-unrolled loss, AdamW with warm-up, resumable checkpoints, per-step validation.

The trainer runs the frozen target online on each batch (features and logits are recomputed, never stored), so a
data set is only token ids. State lives in ``out_dir``::

    trainer_state.pt   head (fp32), AdamW moments, step, epoch position, RNG, draft vocabulary, history
    head/              the head in the published EAGLE-3 format (``save_dtype``), loadable by the strict loader
    head/train_meta.json  step, epoch position, vocabulary coverage and the history (cold resume without moments)
    history.json       per-log-interval loss and per-step accuracy, validation results

Resuming: ``trainer_state.pt`` restores everything. Without it (a fresh machine), ``init_head`` plus its
``train_meta.json`` restores the weights, the step and the data position; the AdamW moments restart, with a
short re-warm-up of the learning rate (``rewarmup_steps``).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..fileio import apply_default_mode, atomic_write_json
from ..heads import DraftHeadConfig, Eagle3DraftHead
from .data import Sample, _stop_ids
from .target import target_embedding, target_final_norm, target_forward
from .ttt import TTTBatch, ttt_loss
from .vocab import build_draft_vocab, grow_draft_vocab, grown_positions, token_counts

__all__ = ["TrainConfig", "head_config_for_target", "lr_at", "make_batches", "prepare_batch", "train_eagle3",
           "validate"]


@dataclass
class TrainConfig:
    """Training settings.

    Parameters
    ----------
    draft_vocab_size: size of the reduced draft vocabulary (from response-token frequencies).
    grow_draft_vocab: with an ``init_head``, grow its draft vocabulary to this many ids (:func:`grow_draft_vocab`:
        its ids kept, the most frequent other response tokens of this data added; their ``lm_head`` rows start as
        the target's own, as a fresh head's do). ``None`` keeps the head's vocabulary.
    intermediate_size: the head's MLP width (``None``: the target's).
    rope_theta: the head's RoPE base (``None``: the target's ``rope_theta``; EAGLE-3 heads without one use 10000).
    ttt_steps, step_decay: unrolled steps and their loss weights ``step_decay ** s``.
    lr, min_lr_ratio, warmup_steps, decay_fraction, max_steps: warm-up, then constant, then a linear decay to
        ``lr * min_lr_ratio`` over the last ``decay_fraction`` of ``max_steps`` (warmup-stable-decay, so a run
        can be extended before its decay starts).
    betas, weight_decay, grad_clip: AdamW and gradient clipping.
    tokens_per_batch, max_len: batch budget (padded tokens) and truncation length.
    val_fraction: share of conversations held out for validation (every ``round(1/val_fraction)``-th one).
    log_every, eval_every, save_every: in optimizer steps (0 disables periodic eval/save).
    time_budget_s: stop (and save) once this much wall time is spent in one call.
    amp_dtype: autocast dtype on CUDA (bf16); CPU runs in fp32.
    save_dtype: dtype of the published checkpoint; max_shard_bytes: shard size limit (``None``: one
        ``model.safetensors``, the file SafeAILab EAGLE's loader reads).
    rewarmup_steps: warm-up after a cold resume (fresh AdamW moments).
    stop_at_step: pause (save and return) at this step without changing the schedule; resume later.
    """

    draft_vocab_size: int = 12288
    grow_draft_vocab: int | None = None
    intermediate_size: int | None = None
    rope_theta: float | None = None
    ttt_steps: int = 7
    step_decay: float = 0.8
    lr: float = 5e-4
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    decay_fraction: float = 0.4
    max_steps: int = 2000
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    tokens_per_batch: int = 16384
    max_len: int = 1024
    val_fraction: float = 0.03
    log_every: int = 20
    eval_every: int = 0
    save_every: int = 500
    time_budget_s: float | None = None
    seed: int = 0
    amp_dtype: str = "bfloat16"
    save_dtype: str = "bfloat16"
    max_shard_bytes: int | None = None
    rewarmup_steps: int = 30
    stop_at_step: int | None = None
    init_from_target: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1, got {self.ttt_steps}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if self.max_steps < 1 or self.tokens_per_batch < 2 or self.max_len < 2:
            raise ValueError(f"max_steps, tokens_per_batch and max_len must be positive: {self}")
        if not 0 <= self.val_fraction < 0.5:
            raise ValueError(f"val_fraction must be in [0, 0.5), got {self.val_fraction}")
        if self.grow_draft_vocab is not None and self.grow_draft_vocab < 1:
            raise ValueError(f"grow_draft_vocab must be a positive size or None, got {self.grow_draft_vocab}")
        self.betas = tuple(self.betas)


def lr_at(step: int, cfg: TrainConfig, rewarm_from: int | None = None) -> float:
    """Learning rate for optimizer step ``step`` (0-based): warm-up, constant, linear decay (WSD)."""
    decay_start = int(cfg.max_steps * (1 - cfg.decay_fraction))
    if step < cfg.warmup_steps:
        f = (step + 1) / cfg.warmup_steps
    elif step < decay_start:
        f = 1.0
    else:
        t = (step - decay_start) / max(1, cfg.max_steps - decay_start)
        f = 1.0 - (1.0 - cfg.min_lr_ratio) * min(1.0, t)
    if rewarm_from is not None and step - rewarm_from < cfg.rewarmup_steps:
        f *= (step - rewarm_from + 1) / cfg.rewarmup_steps
    return cfg.lr * f


def head_config_for_target(target_config, draft_vocab_size: int, intermediate_size: int | None = None,
                           rope_theta: float | None = None) -> DraftHeadConfig:
    """An EAGLE-3 head as wide as the target (one midlayer), for a transformers Llama-family config."""
    rp = getattr(target_config, "rope_parameters", None) or {}
    theta = rope_theta if rope_theta is not None else (rp.get("rope_theta") or getattr(target_config, "rope_theta",
                                                                                         None) or 10000.0)
    return DraftHeadConfig(
        hidden_size=target_config.hidden_size,
        intermediate_size=intermediate_size or target_config.intermediate_size,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or target_config.num_attention_heads,
        vocab_size=target_config.vocab_size,
        draft_vocab_size=draft_vocab_size,
        rms_norm_eps=float(target_config.rms_norm_eps),
        max_position_embeddings=2048,
        rope_theta=float(theta),
        bias=False,
        architectures=["LlamaForCausalLMEagle3"],
    )


def make_batches(lengths: list[int], tokens_per_batch: int, max_len: int) -> list[list[int]]:
    """Group sequence indices by length so that ``len(batch) * longest <= tokens_per_batch`` (padded tokens)."""
    order = sorted(range(len(lengths)), key=lambda i: (min(lengths[i], max_len), i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        n = min(lengths[i], max_len)
        if cur and (len(cur) + 1) * n > tokens_per_batch:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


@torch.no_grad()
def prepare_batch(target, samples: list[Sample], used: torch.Tensor, max_len: int, pad_id: int,
                  device) -> TTTBatch:
    """Pad ``samples`` on the right, run the target, and build a :class:`TTTBatch`."""
    seqs = [s.ids[:max_len] for s in samples]
    S = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), S), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), S), dtype=torch.bool)
    for i, (s, smp) in enumerate(zip(seqs, samples, strict=True)):
        tokens[i, : len(s)] = s
        # position t predicts x[t+1]: a response token when resp_start <= t+1 < len
        lo = max(0, smp.resp_start - 1)
        loss_mask[i, lo: len(s) - 1] = True
    tokens = tokens.to(device)
    out = target_forward(target, tokens)
    logits = out.logits
    argmax = logits.argmax(-1)
    logp = F.log_softmax(logits[..., used.to(device)].float(), dim=-1)
    return TTTBatch(tokens=tokens, features=out.features, target_logp=logp, target_argmax=argmax,
                    loss_mask=loss_mask.to(device))


def _amp(device, name: str):
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=getattr(torch, name))
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def validate(head, target, samples: list[Sample], cfg: TrainConfig, used, pad_id, device) -> dict:
    """Per-step top-1 accuracy and loss of the unrolled head on held-out conversations."""
    was_training = head.training
    head.eval()
    correct = [0] * cfg.ttt_steps
    count = [0] * cfg.ttt_steps
    loss_sum, n_batches = 0.0, 0
    for idx in make_batches([len(s.ids) for s in samples], cfg.tokens_per_batch, cfg.max_len):
        batch = prepare_batch(target, [samples[i] for i in idx], used, cfg.max_len, pad_id, device)
        with _amp(device, cfg.amp_dtype):
            res = ttt_loss(head, batch, cfg.ttt_steps, cfg.step_decay)
        loss_sum += float(res.loss)
        n_batches += 1
        for s in range(cfg.ttt_steps):
            correct[s] += res.step_correct[s]
            count[s] += res.step_count[s]
    head.train(was_training)
    acc = [c / max(1, n) for c, n in zip(correct, count, strict=True)]
    return {"loss": loss_sum / max(1, n_batches), "acc": acc, "positions": count[0]}


def _split(samples: list[Sample], val_fraction: float) -> tuple[list[Sample], list[Sample]]:
    if val_fraction <= 0 or len(samples) < 4:
        return samples, []
    every = max(2, round(1 / val_fraction))
    train = [s for i, s in enumerate(samples) if i % every != every // 2]
    val = [s for i, s in enumerate(samples) if i % every == every // 2]
    return train, val


def _save(head, out_dir: Path, cfg: TrainConfig, meta: dict, optimizer=None, full: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    pub = Eagle3DraftHead(head.config)
    pub.load_state_dict(head.state_dict())
    pub.config.torch_dtype = cfg.save_dtype
    pub = pub.to(getattr(torch, cfg.save_dtype))
    tmp = out_dir / "head.tmp"
    if tmp.exists():
        for f in tmp.iterdir():
            f.unlink()
    pub.save_pretrained(tmp, max_shard_bytes=cfg.max_shard_bytes)
    atomic_write_json(tmp / "train_meta.json", meta)
    apply_default_mode(tmp)  # safetensors writes its files 0600
    final, old = out_dir / "head", out_dir / "head.old"
    if old.exists():  # left by an interrupted swap
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    if final.exists():  # swap by renames: an interrupted save leaves a complete head (head/ or head.old/)
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    atomic_write_json(out_dir / "history.json", meta)
    if full and optimizer is not None:
        state = {"head": {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"},
                 "optimizer": optimizer.state_dict(), "meta": meta, "config": asdict(cfg),
                 "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}
        torch.save(state, out_dir / "trainer_state.pt.tmp")
        os.replace(out_dir / "trainer_state.pt.tmp", out_dir / "trainer_state.pt")


def _response_counts(samples: list[Sample], vocab_size: int) -> torch.Tensor:
    """Histogram ``[V]`` of the conversations' response tokens (what a draft vocabulary is chosen from)."""
    return token_counts([s.ids for s in samples], vocab_size, starts=[s.resp_start for s in samples])


def train_eagle3(target, tok, samples: list[Sample], cfg: TrainConfig, out_dir: str | os.PathLike,
                 device=None, init_head: str | os.PathLike | None = None, progress: bool = True,
                 log=print) -> tuple[Eagle3DraftHead, dict]:
    """Train (or resume training) an EAGLE-3 head for ``target`` on self-distilled ``samples``.

    Parameters
    ----------
    target, tok: the frozen transformers target and its tokenizer (see :func:`~eagle_triton.train.load_target`).
    samples: conversations from :func:`~eagle_triton.train.load_dataset`.
    cfg: :class:`TrainConfig`.
    out_dir: checkpoint directory (resumed from when it holds ``trainer_state.pt``).
    init_head: a published-format head with ``train_meta.json`` to resume from without ``trainer_state.pt``.

    Returns
    -------
    ``(head, meta)``: the head in fp32 (eval mode) and the run's metadata (step, history, validation, timings).
    """
    t_start = time.time()
    out = Path(out_dir)
    device = torch.device(device or target.device)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train_set, val_set = _split(samples, cfg.val_fraction)
    if not train_set:
        raise ValueError("no training conversations")
    state_path = out / "trainer_state.pt"
    state = torch.load(state_path, weights_only=False, map_location="cpu") if state_path.is_file() else None
    rewarm_from = None
    grown_from = None  # the init head's vocabulary, when this run grows it
    if state is not None:
        meta = state["meta"]
        used = torch.tensor(meta["vocab_used"], dtype=torch.long)
        head_cfg = DraftHeadConfig.from_dict(meta["head_config"])
        if cfg.grow_draft_vocab is not None and cfg.grow_draft_vocab != used.numel():
            raise ValueError(f"grow_draft_vocab={cfg.grow_draft_vocab}: the run in {out} has a {used.numel()}-id "
                             "vocabulary; a vocabulary grows only when training starts from init_head")
    elif init_head is not None:
        meta = json.loads((Path(init_head) / "train_meta.json").read_text())
        used = torch.tensor(meta["vocab_used"], dtype=torch.long)
        head_cfg = DraftHeadConfig.from_dict(meta["head_config"])
        rewarm_from = meta["step"]
        meta.setdefault("cold_resumes", []).append(meta["step"])
        tokens = int(sum(len(s.ids) for s in train_set))
        if (meta.get("num_train"), meta.get("train_tokens")) != (len(train_set), tokens):
            # Other data than the head's (continued training on new data): start at its first epoch; the step,
            # the vocabulary and the schedule go on.
            meta.setdefault("data_changes", []).append(
                {"step": meta["step"], "num_train": len(train_set), "num_val": len(val_set), "train_tokens": tokens})
            meta.update(epoch=0, batch_pos=0, num_train=len(train_set), num_val=len(val_set), train_tokens=tokens)
        if cfg.grow_draft_vocab is not None and cfg.grow_draft_vocab != used.numel():
            counts = _response_counts(train_set, head_cfg.vocab_size)
            vocab = grow_draft_vocab(used, counts, cfg.grow_draft_vocab)
            before = float(counts[used].sum()) / max(1, int(counts.sum()))
            grown_from, used = used, vocab.used
            head_cfg = DraftHeadConfig.from_dict({**head_cfg.to_dict(), "draft_vocab_size": used.numel()})
            meta.setdefault("vocab_changes", []).append(
                {"step": meta["step"], "from": grown_from.numel(), "to": used.numel(), "coverage_before": before,
                 "coverage_after": vocab.coverage})
            meta.update(vocab_used=used.tolist(), vocab_coverage=vocab.coverage, head_config=head_cfg.to_dict())
            log(f"draft vocab grown {grown_from.numel()} -> {used.numel()}: covers {before:.4f} -> "
                f"{vocab.coverage:.4f} of response tokens")
    else:
        counts = _response_counts(train_set, target.config.vocab_size)
        vocab = build_draft_vocab(counts, cfg.draft_vocab_size, always_include=_stop_ids(tok))
        used = vocab.used
        head_cfg = head_config_for_target(target.config, cfg.draft_vocab_size, cfg.intermediate_size, cfg.rope_theta)
        meta = {"step": 0, "epoch": 0, "batch_pos": 0, "history": [], "validation": [], "train_seconds": 0.0,
                "vocab_used": used.tolist(), "vocab_coverage": vocab.coverage, "head_config": head_cfg.to_dict(),
                "num_train": len(train_set), "num_val": len(val_set),
                "train_tokens": int(sum(len(s.ids) for s in train_set))}
        log(f"draft vocab {cfg.draft_vocab_size}: covers {vocab.coverage:.4f} of response tokens")
    torch.manual_seed(cfg.seed)
    head = Eagle3DraftHead(head_cfg)
    head._set_embeddings(target_embedding(target).float().cpu())
    with torch.no_grad():
        head.d2t.copy_(used - torch.arange(used.numel()))
        head.t2d.zero_()
        head.t2d[used] = True
    if state is not None:
        missing, unexpected = head.load_state_dict(state["head"], strict=False)
        if unexpected or set(missing) - {"embed_tokens.weight"}:
            raise RuntimeError(f"trainer_state.pt does not fit the head: missing {missing}, unexpected {unexpected}")
    elif init_head is not None:
        from ..heads import load_draft_head

        loaded = load_draft_head(init_head, embed_tokens=target_embedding(target).float().cpu())
        weights = loaded.float().state_dict()
        if grown_from is not None:
            # the head's rows move to their ids' places; the new ids' rows are the target's own output rows
            rows = target.get_output_embeddings().weight[used.to(target.device)].float().cpu()
            rows[grown_positions(grown_from, used)] = weights["lm_head.weight"]
            weights.update({"lm_head.weight": rows, "d2t": head.d2t.clone(), "t2d": head.t2d.clone()})
        head.load_state_dict(weights)
    elif cfg.init_from_target:
        # lm_head(norm(h)) starts as the target's own head over the draft vocabulary (tied or not).
        with torch.no_grad():
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[used.to(target.device)].float().cpu())
            head.norm.weight.copy_(target_final_norm(target).float().cpu())
    head = head.to(device).float().train()
    params = [p for n, p in head.named_parameters() if n != "embed_tokens.weight"]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                            fused=device.type == "cuda")
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
    batches = make_batches([len(s.ids) for s in train_set], cfg.tokens_per_batch, cfg.max_len)
    meta["batches_per_epoch"] = len(batches)
    # the head's own vocabulary size: cfg.draft_vocab_size only sizes a new head (a resumed, continued or grown one
    # keeps or grows its own), and a record saying 12288 for a 16384-id head would mislead its readers
    meta["train_config"] = {**asdict(cfg), "draft_vocab_size": int(used.numel())}
    step = meta["step"]
    base_seconds = float(meta.get("train_seconds", 0.0))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.max_steps, initial=step, desc="train eagle3", unit="step")
    window: dict = {"loss": 0.0, "n": 0, "correct": [0] * cfg.ttt_steps, "count": [0] * cfg.ttt_steps, "tok": 0}
    t_call = time.time()
    stopped_by_budget = False
    while step < cfg.max_steps:
        if cfg.time_budget_s is not None and time.time() - t_start > cfg.time_budget_s:
            stopped_by_budget = True
            break
        if cfg.stop_at_step is not None and step >= cfg.stop_at_step:
            break
        order = list(range(len(batches)))
        random.Random(cfg.seed * 7919 + meta["epoch"]).shuffle(order)
        if meta["batch_pos"] >= len(order):
            meta["epoch"] += 1
            meta["batch_pos"] = 0
            continue
        idx = batches[order[meta["batch_pos"]]]
        batch = prepare_batch(target, [train_set[i] for i in idx], used, cfg.max_len, pad_id, device)
        lr = lr_at(step, cfg, rewarm_from)
        for g in opt.param_groups:
            g["lr"] = lr
        with _amp(device, cfg.amp_dtype):
            res = ttt_loss(head, batch, cfg.ttt_steps, cfg.step_decay)
        opt.zero_grad(set_to_none=True)
        res.loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        meta["step"] = step
        meta["batch_pos"] += 1
        window["loss"] += float(res.loss.detach())
        window["n"] += 1
        window["tok"] += int(batch.tokens.numel())
        for s in range(cfg.ttt_steps):
            window["correct"][s] += res.step_correct[s]
            window["count"][s] += res.step_count[s]
        if bar is not None:
            bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            acc = [c / max(1, n) for c, n in zip(window["correct"], window["count"], strict=True)]
            rec = {"step": step, "epoch": meta["epoch"], "lr": lr, "loss": window["loss"] / window["n"],
                   "acc": [round(a, 4) for a in acc], "grad_norm": float(gnorm),
                   "tokens_per_s": window["tok"] / max(1e-9, time.time() - t_call)}
            meta["history"].append(rec)
            if bar is not None:
                bar.set_postfix(loss=f"{rec['loss']:.3f}", acc0=f"{acc[0]:.3f}", accL=f"{acc[-1]:.3f}")
            else:
                log(f"step {step} loss {rec['loss']:.4f} acc {rec['acc']} lr {lr:.2e}")
            window = {"loss": 0.0, "n": 0, "correct": [0] * cfg.ttt_steps, "count": [0] * cfg.ttt_steps, "tok": 0}
            t_call = time.time()
        if cfg.eval_every and step % cfg.eval_every == 0 and val_set:
            v = validate(head, target, val_set, cfg, used, pad_id, device)
            meta["validation"].append({"step": step, **v})
            log(f"validation @ {step}: loss {v['loss']:.4f} acc {[round(a, 3) for a in v['acc']]}")
        if cfg.save_every and step % cfg.save_every == 0:
            meta["train_seconds"] = base_seconds + (time.time() - t_start)
            _save(head, out, cfg, meta, opt)
    if bar is not None:
        bar.close()
    if val_set:
        v = validate(head, target, val_set, cfg, used, pad_id, device)
        meta["validation"].append({"step": step, **v})
        log(f"validation @ {step}: loss {v['loss']:.4f} acc {[round(a, 3) for a in v['acc']]}")
    meta["train_seconds"] = base_seconds + (time.time() - t_start)
    meta["complete"] = step >= cfg.max_steps
    meta["stopped_by_time_budget"] = stopped_by_budget
    _save(head, out, cfg, meta, opt)
    return head.eval(), meta
