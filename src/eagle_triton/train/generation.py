"""Who writes the self-distillation data: transformers' ``generate`` or the eagle-triton engine.

Both take token-id rows and return each row's new tokens (the caller cuts them at the first stop token):

* :class:`TransformersGenerator` runs ``model.generate`` over the left-padded rows, seeded once per call (the
  data this project's first heads were trained on).
* :class:`EngineGenerator` runs :meth:`~eagle_triton.engine.EagleEngine.generate_batch`: continuous batching over
  the engine's slots (``slots``: at most 16 with a draft head, 64 without) with CUDA graphs and (when the engine has a
  head) lossless speculation, one seed per row, so a row's data do not depend on its batch. Samples are drawn from
  the same target distribution (temperature, top-p), so the data differ only by the coins.

Speed, measured on the H100:

- Training runs (SmolLM2-135M, real weights, different settings):
  - The engine with a draft head wrote about 3.7 k generated tokens/s of two-turn data with answers up to 512
    tokens (2026-11-27). Three processes side by side wrote about 1.5 times that.
  - transformers' ``generate`` at batch 512 wrote about 8.9 k/s of single-turn data with answers up to 384 tokens
    (2026-11-22).
- Same prompts in one run (2026-11-27, ``bench/results/session19_2026-11-27/datagen_probe.json``; SmolLM2's shape
  with random weights, so only the writers' speed counts): 64 prompts of 100-700 tokens, answers of 256-512
  tokens, temperature 0.7.
  - Plain engine at 16 slots (no draft head): **12.8 k tokens/s**.
  - Engine drafting 16/3/4 with a random head, which accepts nothing: 4.9 k/s.
  - transformers' ``generate`` at batch 256: 2.5 k/s.

So the fastest writer measured is the engine without a head (``--gen-draft none``). With a trained head the
speculative engine has not yet been timed against it at these temperatures.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["EngineGenerator", "TransformersGenerator", "engine_seed"]


def engine_seed(call_seed: int, row: int) -> int:
    """Row ``row``'s seed in a call seeded ``call_seed``: above ``2**40``, so apart from every small seed
    (``bench_acceptance.py``'s held-out prompts use ``10**7 + i``)."""
    if call_seed < 0 or not 0 <= row < 1 << 20:
        raise ValueError(f"engine_seed needs call_seed >= 0 and 0 <= row < 2**20, got {call_seed}, {row}")
    return (1 << 40) + (call_seed << 20) + row


def _left_padded(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows left-padded to one width, and their attention mask."""
    width = max(len(c) for c in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, c in enumerate(seqs):
        ids[i, width - len(c):] = torch.tensor(c)
        mask[i, width - len(c):] = 1
    return ids.to(device), mask.to(device)


class TransformersGenerator:
    """``model.generate`` over left-padded rows; temperature 0 is greedy, otherwise sampling with ``top_p``
    (``top_k`` off)."""

    kind = "transformers"

    def __init__(self, model, pad_token_id: int):
        self.model = model
        self.pad_token_id = pad_token_id

    @torch.no_grad()
    def __call__(self, rows: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[list[int]]:
        ids, mask = _left_padded([list(r) for r in rows], self.pad_token_id, self.model.device)
        torch.manual_seed(seed)
        kw = (dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0
              else dict(do_sample=False))
        out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                  pad_token_id=self.pad_token_id, **kw)
        return out[:, ids.shape[1]:].tolist()


class EngineGenerator:
    """:meth:`EagleEngine.generate_batch` over ``slots`` slots, stopping at ``stop_ids``. A row that leaves no room
    in the engine's ``max_length`` gets no tokens (the caller drops it) instead of failing the whole batch."""

    kind = "engine"

    def __init__(self, engine, stop_ids, slots: int | None = None):
        from ..engine.batch import BATCH_BUCKETS, SPECULATIVE_BATCH_MAX

        slots = SPECULATIVE_BATCH_MAX if slots is None else slots
        if not 1 <= slots <= BATCH_BUCKETS[-1]:
            raise ValueError(f"slots must be in 1..{BATCH_BUCKETS[-1]} (the engine's batch buckets), got {slots}")
        if slots > SPECULATIVE_BATCH_MAX and getattr(engine, "speculative", False):
            raise ValueError(f"slots {slots}: an engine with a draft head writes at most {SPECULATIVE_BATCH_MAX} "
                             "sequences at once (speculative batches); write without one for more")
        self.engine = engine
        self.stop_ids = sorted(int(i) for i in stop_ids)
        self.slots = slots
        self.too_long = 0  # rows skipped for want of room

    def __call__(self, rows: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in rows]
        fit = [i for i, r in enumerate(rows) if len(r) < self.engine.max_length]
        self.too_long += len(rows) - len(fit)
        if fit:
            res = self.engine.generate_batch(
                input_ids=[list(rows[i]) for i in fit], max_new_tokens=max_new_tokens, temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0, top_k=0, seeds=[engine_seed(seed, i) for i in fit],
                batch_size=min(self.slots, len(fit)), eos_token_id=self.stop_ids)
            for i, (toks, _stats) in zip(fit, res, strict=True):
                out[i] = list(toks)
        return out
