"""bench/probes/batch_probe.py's device timeline: each kind of part's device time, and the idle time before each
part charged to it (fake CUDA events on a clock the test advances, so that it runs without a GPU)."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "probes")]

import batch_probe  # noqa: E402


class _Clock:
    now = 0.0


class _Event:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = _Clock.now

    def elapsed_time(self, other):
        return other.t - self.t


class _Parts:
    def step(self, ms):
        _Clock.now += ms

    def prefill(self, ms):
        _Clock.now += ms


def test_timeline_charges_idle_time_to_the_part_that_follows(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    tl = batch_probe._GpuTimeline()
    orig = (tl.wrap(_Parts, "step", "step"), tl.wrap(_Parts, "prefill", "prefill"))
    try:
        parts = _Parts()
        parts.step(1.0)
        _Clock.now += 0.5  # the device waits for the host before the prefill
        parts.prefill(2.0)
        parts.step(1.0)
        _Clock.now += 0.25
        parts.step(1.0)
    finally:
        _Parts.step, _Parts.prefill = orig
    s = tl.summary()
    assert s["total_ms"] == 5.75
    assert s["parts"]["step"] == {"calls": 3, "device_ms": 3.0, "idle_before_ms": 0.25}
    assert s["parts"]["prefill"] == {"calls": 1, "device_ms": 2.0, "idle_before_ms": 0.5}
