"""The EAGLE-3 draft vocabulary (``d2t``/``t2d``) chosen from token frequencies in the training data."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftVocab", "build_draft_vocab", "grow_draft_vocab", "token_counts"]


@dataclass
class DraftVocab:
    """A reduced draft vocabulary.

    Attributes
    ----------
    used: int64 ``[Vd]`` target ids in the draft vocabulary, ascending (draft id ``i`` is target id ``used[i]``).
    d2t: int64 ``[Vd]`` offsets, ``used[i] - i`` (the published checkpoint convention).
    t2d: bool ``[V]``, True for target ids in the draft vocabulary.
    coverage: share of counted tokens whose id is in the draft vocabulary.
    """

    used: torch.Tensor
    d2t: torch.Tensor
    t2d: torch.Tensor
    coverage: float


def token_counts(sequences, vocab_size: int, starts=None) -> torch.Tensor:
    """Histogram ``[V]`` of the tokens of ``sequences`` (each from ``starts[i]`` on when given)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for i, seq in enumerate(sequences):
        seq = seq[int(starts[i]):] if starts is not None else seq
        seq = seq.long()
        if seq.numel() and (int(seq.min()) < 0 or int(seq.max()) >= vocab_size):
            raise ValueError(f"sequence {i} has token ids outside [0, {vocab_size})")
        counts += torch.bincount(seq, minlength=vocab_size)
    return counts


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int, always_include=()) -> DraftVocab:
    """Take the ``draft_vocab_size`` most frequent ids (ties: lower id first), plus ``always_include``.

    As in EAGLE-3's ``scandata``: the chosen ids are sorted ascending, ``d2t[i] = used[i] - i`` and
    ``t2d[t] = t in used``.
    """
    if counts.dim() != 1:
        raise ValueError(f"counts must be a 1-D histogram [V], got shape {list(counts.shape)}")
    vocab_size = counts.numel()
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in [1, target vocab {vocab_size}]")
    forced = sorted({int(t) for t in always_include if t is not None})
    if any(t < 0 or t >= vocab_size for t in forced):
        raise ValueError(f"always_include ids {forced} must lie in [0, {vocab_size})")
    if len(forced) > draft_vocab_size:
        raise ValueError(f"{len(forced)} forced ids do not fit a draft vocabulary of {draft_vocab_size}")
    key = counts.to(torch.float64).clone()
    key[forced] = float("inf")
    # Stable ordering: count descending, id ascending.
    order = torch.argsort(-key, stable=True)
    used = order[:draft_vocab_size].sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    total = int(counts.sum())
    coverage = float(counts[used].sum()) / total if total else 0.0
    d2t = used - torch.arange(draft_vocab_size)
    return DraftVocab(used=used, d2t=d2t, t2d=t2d, coverage=coverage)


def grow_draft_vocab(used: torch.Tensor, counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """A head's vocabulary ``used`` grown to ``draft_vocab_size`` ids: every id of ``used`` kept, then the most
    frequent other ids of ``counts`` (ties: lower id first), sorted ascending as :func:`build_draft_vocab`'s.

    For continuing a trained head on data its vocabulary covers less well (the head's vocabulary came from older
    data); :func:`grown_positions` says where each old draft id moves.
    """
    if counts.dim() != 1:
        raise ValueError(f"counts must be a 1-D histogram [V], got shape {list(counts.shape)}")
    vocab_size = counts.numel()
    used = torch.as_tensor(used, dtype=torch.long).flatten()
    if used.numel() == 0 or int(used.min()) < 0 or int(used.max()) >= vocab_size:
        raise ValueError(f"the vocabulary to grow must be non-empty ids in [0, {vocab_size})")
    if used.unique().numel() != used.numel():
        raise ValueError("the vocabulary to grow has repeated ids")
    if not used.numel() <= draft_vocab_size <= vocab_size:
        raise ValueError(f"cannot grow a draft vocabulary of {used.numel()} ids to {draft_vocab_size}: the size must "
                         f"lie in [{used.numel()}, target vocab {vocab_size}]")
    return build_draft_vocab(counts, draft_vocab_size, always_include=used.tolist())


def grown_positions(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Draft id in ``new`` (ascending) of each id of ``old``, which ``new`` must contain."""
    pos = torch.searchsorted(new, old)
    if bool((pos >= new.numel()).any()) or not torch.equal(new[pos.clamp(max=new.numel() - 1)], old):
        raise ValueError("the grown vocabulary does not contain every id of the old one")
    return pos
