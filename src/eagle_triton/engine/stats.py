"""Per-call generation statistics (gpt-fast style: mean accepted length, acceptance by depth, tokens/s)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["GenerationStats", "PhaseTimer"]

PHASES = ("prefill", "steps")


@dataclass
class GenerationStats:
    """Statistics of one ``generate`` call.

    Attributes
    ----------
    prompt_tokens: prompt length.
    new_tokens: tokens returned (after the EOS / max_new_tokens cut).
    steps: target forwards after the prefill (speculative: verify steps; plain: decode steps).
    mean_accepted_length: tokens per step including the bonus token (``accepted / steps``, 1.0 for plain decoding).
    accept_counts: ``accept_counts[d]`` = steps that accepted at least ``d + 1`` drafted tokens (d = 0 .. depth).
    accept_length_histogram: ``histogram[a]`` = steps that accepted exactly ``a`` drafted tokens.
    speculative: whether a draft head was used.
    stop_reason: ``"eos"``, ``"max_new_tokens"`` or ``"max_length"``.
    total_s: wall-clock seconds of the call.
    prefill_s: the prefill and the first token; step_s: every decoding step after it (CUDA events on a GPU, so
        the device's time from the first step queued to the last one read; a step queued ahead and dropped at
        the stop counts too). Steady step time: ``step_s / steps``.
    tokens_per_second: ``new_tokens / total_s``.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    mean_accepted_length: float = 0.0
    accept_counts: list[int] = field(default_factory=list)
    accept_length_histogram: list[int] = field(default_factory=list)
    speculative: bool = False
    stop_reason: str = ""
    total_s: float = 0.0
    prefill_s: float = 0.0
    step_s: float = 0.0
    tokens_per_second: float = 0.0
    tree: str | None = None
    device: str = ""

    def record_step(self, accepted_drafts: int) -> None:
        self.steps += 1
        while len(self.accept_length_histogram) <= accepted_drafts:
            self.accept_length_histogram.append(0)
        self.accept_length_histogram[accepted_drafts] += 1

    def finalize(self, emitted_in_steps: int) -> None:
        """Fill the derived fields. ``emitted_in_steps`` counts tokens produced by the steps (before any cut)."""
        hist = self.accept_length_histogram
        self.accept_counts = [sum(hist[d + 1:]) for d in range(max(len(hist) - 1, 0))]
        self.mean_accepted_length = emitted_in_steps / self.steps if self.steps else 0.0
        self.tokens_per_second = self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        lines = [
            f"new tokens {self.new_tokens} in {self.total_s:.3f} s: {self.tokens_per_second:.2f} tokens/s "
            f"({'speculative, tree ' + str(self.tree) if self.speculative else 'plain decoding'})",
            f"steps {self.steps}, mean accepted length {self.mean_accepted_length:.3f} (tokens per step incl. bonus)",
            f"time: prefill {self.prefill_s * 1e3:.1f} ms, steps {self.step_s * 1e3:.1f} ms "
            f"({self.step_s * 1e3 / max(self.steps, 1):.2f} ms per step)",
        ]
        if self.speculative and self.accept_counts:
            counts = ", ".join(f"{d + 1}:{c}" for d, c in enumerate(self.accept_counts))
            lines.append("accepted at depth >= d: " + counts)
        return "\n".join(lines)


class PhaseTimer:
    """Accumulates time per phase without synchronising inside the loop.

    On CUDA each phase is bracketed by events, read once in :meth:`totals`; on the CPU ``perf_counter`` is used.
    """

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._cpu = {p: 0.0 for p in PHASES}
        self._events: list[tuple[str, object, object]] = []
        self._open: tuple[str, object] | None = None

    def start(self, phase: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._open = (phase, ev)
        else:
            self._open = (phase, time.perf_counter())

    def stop(self) -> None:
        phase, t0 = self._open
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append((phase, t0, ev))
        else:
            self._cpu[phase] += time.perf_counter() - t0
        self._open = None

    def totals(self) -> dict[str, float]:
        if self.cuda:
            if self._events:
                self._events[-1][2].synchronize()  # an event wait: no device-wide synchronisation
            out = {p: 0.0 for p in PHASES}
            for phase, a, b in self._events:
                out[phase] += a.elapsed_time(b) / 1e3
            return out
        return dict(self._cpu)
