"""Explicit CUDA-graph capture of fixed-shape target steps (flash-attn ``capture_graph`` style).

A :class:`GraphedStep` wraps a function of tensors whose shapes are fixed per key (the decode step: one token;
the verify step: the ``T + 1`` tree tokens). The first call for a key warms the function up on a side stream
(so Triton kernels compile outside the capture), captures it into a graph sharing one memory pool with the
other keys, and every call copies the inputs into the graph's static buffers and replays it.

The captured function must not synchronise with the host and must read all changing state from device tensors
(the cache's ``seqlens``). Outputs are the graph's static tensors: they are overwritten by the next replay.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["GraphedStep"]


class _Entry:
    def __init__(self, graph, static_in, static_out):
        self.graph = graph
        self.static_in = static_in
        self.static_out = static_out


class GraphedStep:
    """Capture ``fn(*tensors, **consts)`` once per ``key`` and ``consts`` and replay it.

    Parameters
    ----------
    fn: the step; takes tensors (or ``None``) and returns a tensor or a tuple of tensors (or ``None`` entries).
    warmup: eager runs on a side stream before capture.
    """

    def __init__(self, fn: Callable, warmup: int = 2):
        self.fn = fn
        self.warmup = warmup
        self.pool = None
        self._entries: dict = {}

    def __contains__(self, key) -> bool:
        return key in self._entries

    def reset(self) -> None:
        """Drop every captured graph (e.g. after the weights or buffers were replaced)."""
        self._entries.clear()
        self.pool = None

    def _capture(self, key, inputs, consts):
        static_in = [None if x is None else x.clone() for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static_in, **consts)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.fn(*static_in, **consts)
        entry = _Entry(graph, static_in, static_out)
        self._entries[key] = entry
        return entry

    def __call__(self, key, *inputs, **consts):
        """Replay the graph of ``key`` (captured on its first call) on ``inputs``; ``consts``: keyword arguments
        of ``fn`` fixed in the capture (hashable; part of the key, so each value has its own graph)."""
        key = (key, tuple(sorted(consts.items()))) if consts else key
        entry = self._entries.get(key)
        if entry is None:
            entry = self._capture(key, inputs, consts)
        for dst, src in zip(entry.static_in, inputs, strict=True):
            if dst is not None:
                dst.copy_(src)
        entry.graph.replay()
        return entry.static_out
