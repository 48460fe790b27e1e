"""The engine's decoding steps over device-resident state, queued ahead of the host (the lagged read).

A step is *launched*, not waited for: :meth:`StepRunner.speculative_step` / :meth:`StepRunner.plain_step` queue the
work and return a :class:`PendingTokens`, whose :meth:`~PendingTokens.result` reads that step's tokens (one
asynchronous copy into pinned memory, then waiting on its event). Every input of a step (the rows the drafter has
not ingested yet, the token after each, their count, the target's cache length, the RNG counter) is written by the
previous step on the device, so the engine queues step ``i + 1`` before it reads step ``i``: the GPU never waits
for Python.

*Device-paced* steps (a target with lengths on the device, :attr:`TargetModel.device_lengths`, and for speculation
a drafter that drafts from device-counted rows, :attr:`TreeDrafter.drafts_rows`) contain no host
synchronisation, and on CUDA each step is replayed from one CUDA graph: a speculative step (draft -> verify
forward -> accept -> KV compaction -> the next draft's inputs, the verify reading the tree from the drafter's
buffers; a generation's first draft is one like the others, the prompt's rows but the last being put into the
draft KV after the prefill, in fixed-size chunks replayed from one more graph), a plain step (forward ->
pick -> commit). The first two runs of each graph's work are eager (the second with exactly the captured
shapes, so every Triton kernel is compiled before the capture; a capture executes nothing, so no state needs
saving). Other combinations (the
generic transformers target, the reference drafter) run *host-paced*: the step reads its accepted length inside,
and nothing is queued ahead.
"""

from __future__ import annotations

import torch

from ..fused.host import fill_start_meta
from .accept import accept_greedy_rows, accept_tree, greedy_pick_rows
from .sampling import DeviceRNG, SamplingParams, probs_from_logits, sample_from_probs

__all__ = ["DeviceSteps", "PendingRead", "PendingTokens", "StepRunner"]


class PendingRead:
    """The output buffer of one queued step, copied out when the step is queued (``out`` is reused by the next
    step): one asynchronous copy into pinned memory and an event; :meth:`values` waits on the event."""

    def __init__(self, out: torch.Tensor, host: torch.Tensor, event):
        host.copy_(out, non_blocking=event is not None)
        if event is not None:
            event.record()
        self._host, self._event = host, event

    def values(self) -> list:
        """The step's output as a list: waits for the step (the engine's one device read per step)."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


class PendingTokens(PendingRead):
    """The tokens of one queued step: ``out = [a, t_0, ..., t_a, -1 ...]`` (``a`` accepted drafts, then the emitted
    tokens)."""

    def result(self) -> tuple[int, list[int]]:
        """``(accepted drafts, emitted tokens)``: waits for the step."""
        values = self.values()
        a = int(values[0])
        return a, values[1:a + 2]


class DeviceSteps:
    """What every step runner shares: whether its steps are device-paced, their CUDA graphs (:meth:`_run`), and
    the double-buffered pinned copies of each step's output (:meth:`_pending`).

    Parameters
    ----------
    target, drafter: the engine's target and drafter (``None`` for plain decoding).
    out: the device buffer every step writes its output into (copied out per step).
    """

    def __init__(self, target, drafter, out: torch.Tensor):
        self.target, self.drafter = target, drafter
        dev = target.device
        self.device = dev
        self.speculative = drafter is not None
        self.device_paced = bool(getattr(target, "device_lengths", False)) and (
            drafter is None or bool(getattr(drafter, "drafts_rows", False)))
        self.use_graphs = (self.device_paced and dev.type == "cuda"
                           and bool(getattr(target, "use_cuda_graphs", False)))
        self.out = out
        cuda = dev.type == "cuda"
        self._host = [torch.empty(out.shape, dtype=out.dtype, pin_memory=cuda) for _ in range(2)]
        self._events = [torch.cuda.Event() for _ in range(2)] if cuda else [None, None]
        self._slot = 0
        self._graphs: dict = {}
        self._eager_runs: dict = {}
        self._tree_ptrs: tuple | None = None  # (buffer owners, the tree's tensor addresses) of the first tree
        self._start_bufs: dict = {}  # static inputs of the sequence-start chunks (_start_in_chunks)

    def _check_tree(self, tree):
        """Under CUDA graphs the rest of a step replays reading the tree at the addresses it was captured with, so a
        drafter must return its trees in its own buffers (:meth:`TreeDrafter.draft_rows`'s contract): checked
        here by comparing addresses on the host, for each set of buffers; a breach is an error, never a replay
        reading stale memory. Returns ``tree``."""
        if self.use_graphs:
            owners = self._buffers()
            ptrs = tuple(t.data_ptr() for t in vars(tree).values() if isinstance(t, torch.Tensor))
            seen = self._tree_ptrs
            if seen is None or any(a is not b for a, b in zip(seen[0], owners, strict=True)):
                self._tree_ptrs = (owners, ptrs)
            elif seen[1] != ptrs:
                raise RuntimeError(f"the drafter ({type(self.drafter).__name__}) returned a tree outside the buffers "
                                   "of its previous trees: draft_rows must return views of its own output buffers "
                                   "(the step's CUDA graph reads them at fixed addresses)")
        return tree

    def _buffers(self) -> tuple:
        """Every buffer object a captured graph points into: the target's cache and the drafter's buffers (a
        reallocation invalidates the graphs). Kept referenced with the graphs, so identity cannot be reused."""
        impl = getattr(self.drafter, "_impl", None)
        return getattr(self.target, "cache", None), getattr(impl, "bufs", None), self.target.feature_mode

    def _run(self, kind, fn, eager_runs: int = 2):
        """Run ``fn`` (device-paced work) eagerly for its first ``eager_runs`` calls of this ``kind`` (two: every
        Triton kernel compiled, the second with the captured shapes), then from a graph; returns ``fn``'s result
        (the captured one when replaying: its tensors are the graph's static outputs)."""
        if not self.use_graphs:
            return fn()
        owners = self._buffers()
        entry = self._graphs.get(kind)
        if entry is not None and any(a is not b for a, b in zip(entry[2], owners, strict=True)):
            entry = None  # buffers reallocated since the capture: capture again
            self._eager_runs.pop(kind, None)
        if entry is None:
            runs = self._eager_runs.get(kind, 0)
            if runs < eager_runs:
                self._eager_runs[kind] = runs + 1
                return fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn()
            entry = self._graphs[kind] = (graph, out, owners)
        entry[0].replay()
        return entry[1]

    def _start_draft(self, slot: int, feats: torch.Tensor | None, ids: torch.Tensor) -> None:
        """Set up ``slot``'s first draft after its prefill: ``feats [N, W]`` (``None``: a drafter that reads no
        features) are the prompt rows' features and ``ids [N]`` the token after each (the last: the first token).
        The rows before the last go into the draft KV as K/V only (:meth:`TreeDrafter.start_rows`); the last one is
        the slot's next draft input, so its first draft is a step graph's like every later one (device work only)."""
        n = ids.shape[0]
        start = getattr(self.drafter, "start_rows", None)
        if start is None:
            raise TypeError(f"{type(self.drafter).__name__} drafts from device-counted rows but has no "
                            "start_rows(slot, features, new_ids), which device-paced speculation uses to put a "
                            "prompt's rows into the draft KV")
        if feats is not None and getattr(self.drafter, "starts_in_chunks", False):
            self._start_in_chunks(slot, feats[:n - 1], ids[:n - 1])
        else:
            start(slot, None if feats is None else feats[:n - 1], ids[:n - 1])
        if feats is not None:
            self.feats[slot, :1].copy_(feats[n - 1:n])
        self.ids[slot, :1].copy_(ids[n - 1:n])
        self.num_new[slot:slot + 1].fill_(1)

    START_CHUNK = 128  # rows per sequence-start chunk (the target's common prefill chunk)

    def _start_in_chunks(self, slot: int, feats: torch.Tensor, ids: torch.Tensor) -> None:
        """``start_rows(slot, feats [R, W], ids [R])`` as :data:`START_CHUNK`-row chunks of the drafter's
        ``start_rows_chunk``, each replayed from one CUDA graph (:meth:`_run`) after its rows, the slot and the
        offsets are copied into static buffers (a few launches per chunk instead of the products' few dozen
        launched from Python; a batch slot's refill holds the other slots' steps meanwhile). The host's part
        (checks, and the drafter's host mirror of the length) runs first, every time (``begin_start``)."""
        rows, C = ids.shape[0], self.START_CHUNK
        self.drafter.begin_start(slot, feats, ids)
        key = ("start", feats.dtype, feats.shape[1])
        bufs = self._start_bufs.get(key)
        if bufs is None:
            bufs = self._start_bufs[key] = (torch.zeros(C, feats.shape[1], dtype=feats.dtype, device=self.device),
                                            torch.zeros(C, dtype=torch.int64, device=self.device),
                                            torch.zeros(3, dtype=torch.int64, device=self.device))
        f_buf, i_buf, meta = bufs
        for first in range(0, max(rows, 1), C):  # (no rows: one empty chunk sets the length to 0)
            m = min(C, rows - first)
            f_buf[:m].copy_(feats[first:first + m])
            i_buf[:m].copy_(ids[first:first + m])
            fill_start_meta(meta, slot, first, m)
            # one eager run (PyTorch operations only, no Triton kernel to compile): a generation's one start is
            # captured by the second generation, so warmed-up generations run it from the graph
            self._run(key, lambda: self.drafter.start_rows_chunk(meta, f_buf, i_buf), eager_runs=1)

    def _step_bound(self, kv_bound: int | None) -> int | None:
        """The bound on the cache rows a step reads that it is run with: eager, the engine's own (exact CPU
        attention, planned launches); under CUDA graphs, the target's bucket of it (a graph per bucket, see
        ``attention_bucket``), which is part of the step's graph key."""
        if not self.use_graphs:
            return kv_bound
        bucket = getattr(self.target, "attention_bucket", None)
        return bucket(kv_bound) if bucket is not None else None

    def _commit_accepted(self, tree, logits, tfeats, res, out_len, out_tokens, keys: bool = False) -> None:
        """Commit the accepted paths and leave this step's output (``out_len``, ``out_tokens``: views of ``out``)
        and the next draft's inputs in the subclass's static buffers (``feats``, ``ids``, ``num_new``): the features
        of root + accepted drafts, each paired with the token after it. ``res`` None (greedy): the accept kernel
        writes all of it in place (``keys``: ``logits`` holds the target's argmax keys); else the sampling rule's
        :class:`~eagle_triton.engine.accept.AcceptResult`."""
        t = self.target
        if res is None:
            feats_out = self.feats if tfeats is not None else None
            accept_index, accept_len, _, _ = accept_greedy_rows(
                tree, logits, tfeats, out=(None, out_len, out_tokens, feats_out), next_inputs=(self.ids, self.num_new),
                keys=keys)
            t.commit_rows(accept_index, accept_len, self.num_new)
            return
        torch.add(res.accept_len, 1, out=self.num_new)  # rows kept (int32): the compaction and the commit read it
        t.commit_rows(res.accept_index, res.accept_len, self.num_new)
        if tfeats is not None:
            rows = res.accept_index.clamp(min=0)
            self.feats.copy_(tfeats.gather(1, rows.unsqueeze(-1).expand(-1, -1, tfeats.shape[-1])))
        self.ids.copy_(res.tokens.clamp(min=0))
        out_len.copy_(res.accept_len)
        out_tokens.copy_(res.tokens)

    def _draft(self):
        """Draft from the rows in the static buffers: the tree, in the drafter's own buffers (checked)."""
        return self._check_tree(self.drafter.draft_rows(self.feats, self.ids, self.num_new))

    def _pending(self, cls=PendingTokens, **extra):
        """Copy this step's ``out`` into the next pinned buffer: a ``cls`` (``extra``: its further arguments)."""
        slot = self._slot
        self._slot ^= 1
        return cls(self.out, self._host[slot], self._events[slot], **extra)


class StepRunner(DeviceSteps):
    """Buffers, steps and CUDA graphs of one engine for one kind of decoding (kept across ``generate`` calls).

    Parameters
    ----------
    target: the engine's :class:`~eagle_triton.engine.target.TargetModel`.
    drafter: a :class:`~eagle_triton.TreeDrafter` (or compatible) for speculation, else ``None``.
    max_path: the longest accepted path in nodes (tree depth + 2: root, drafts and bonus).
    """

    def __init__(self, target, drafter, max_path: int):
        self.C = int(max_path)
        super().__init__(target, drafter, torch.full((1 + self.C,), -1, dtype=torch.long, device=target.device))
        dev = self.device
        W = target.feature_width(getattr(drafter, "feature_mode", None) or target.feature_mode) if drafter else 0
        self.feats = torch.zeros(1, self.C, max(W, 1), dtype=target.dtype, device=dev)
        self.ids = torch.zeros(1, self.C, dtype=torch.long, device=dev)
        self.num_new = torch.ones(1, dtype=torch.int32, device=dev)
        self._root_paths = torch.zeros(1, 1, 1, dtype=torch.long, device=dev)  # a tree with no drafts (plain picks)
        self.rng = DeviceRNG(dev)
        self.host_len = 0  # rows the host knows are committed (host-paced steps)
        self.seq = None  # host-paced speculation: every accepted token, on the device

    # -- one generation ------------------------------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, root: torch.Tensor, feats) -> PendingTokens:
        """Set up a generation after the prefill: ``prompt_ids [1, N]``, the first token ``root [1]`` (on the
        device), the prompt's features ``[1, N, W]`` (speculation). Returns the pending root token."""
        N = prompt_ids.shape[1]
        self.host_len = N
        self._first = None
        self.ids[0, 0] = root[0]  # plain decoding reads the pending token here
        if self.speculative:
            ids = torch.cat([prompt_ids[:, 1:], root.view(1, 1)], dim=1)  # row j pairs with token j + 1
            if self.device_paced:
                self._start_draft(0, None if feats is None else feats[0], ids[0])
            else:
                self._first = (feats, ids)
                self.seq = torch.cat([prompt_ids, root.view(1, 1)], dim=1)
                self._host_feats = feats
        self.out.fill_(-1)
        self.out[:1].zero_()  # in-place fills: a Python scalar assigned by index would be a host-to-device copy
        self.out[1] = root[0]
        return self._pending()

    def speculative_step(self, params: SamplingParams, kv_bound: int | None) -> PendingTokens:
        """Queue one speculative step (``kv_bound``: an upper bound on the cache rows it reads, for eager CPU
        attention). Host-paced runners finish the step before returning.

        One graph makes a step: the draft, the verify forward, accept, KV compaction and the next draft's inputs
        (the verify reads the tree from the drafter's own buffers). A generation's first step is one like the
        others: :meth:`begin` put the prompt's rows but the last into the draft KV."""
        if not self.device_paced:
            return self._host_paced_step(params)
        bound = self._step_bound(kv_bound)
        self._run(("step", params, bound), lambda: self._verify_accept(params, self._draft(), bound))
        return self._pending()

    def _verify_accept(self, params, tree, kv_bound) -> None:
        """Verify ``tree`` (leaf-ordered, as drafted), accept, commit, and leave the next draft's inputs and this
        step's tokens in the static buffers."""
        t = self.target
        if not params.greedy:  # sampling verification walks the paths in lexicographic order
            tree = tree.in_sampling_order()
        keys = params.greedy and t.fused_argmax  # greedy: the lm_head's argmax keys, no logits
        logits, tfeats = t.verify_rows(tree.draft_tokens, tree.positions, tree.tree_mask[:, 0], kv_bound, argmax=keys)
        res = None if params.greedy else accept_tree(tree, logits, params, self.rng)
        self._commit_accepted(tree, logits, tfeats, res, self.out[:1], self.out[1:].view(1, -1), keys)

    def plain_step(self, params: SamplingParams, kv_bound: int | None) -> PendingTokens:
        """Queue one plain decoding step: the target's next token after the pending one."""
        if not self.device_paced:
            return self._host_paced_plain(params)
        bound = self._step_bound(kv_bound)
        self._run(("plain", params, bound), lambda: self._plain_body(params, bound))
        return self._pending()

    def _plain_body(self, params, kv_bound) -> None:
        keys = params.greedy and self.target.fused_argmax
        logits, _ = self.target.decode_rows(self.ids[:, :1], kv_bound, want_features=False, argmax=keys)
        if params.greedy:  # the argmax kernels write the token into the output and the next input
            greedy_pick_rows(logits, self._root_paths, self.out[:1], self.out[1:2].view(1, 1), self.ids[:, :1],
                             self.num_new, keys=keys)
            return
        tok = self.pick(logits, params, self.rng)
        self.ids[0, 0] = tok[0]
        self.out[:1].zero_()
        self.out[1] = tok[0]

    @staticmethod
    def pick(logits: torch.Tensor, params: SamplingParams, rng) -> torch.Tensor:
        """Next token from ``[1, V]`` logits: argmax (greedy) or a sample of the processed distribution."""
        if params.greedy:
            return logits.argmax(dim=-1)
        return sample_from_probs(probs_from_logits(logits, params), rng)

    def committed(self, n: int) -> None:
        """The host has read that ``n`` more rows are committed (device-paced targets mirror it)."""
        if self.device_paced:
            self.target.note_committed(n)

    # -- host-paced steps (generic target or reference drafter) ----------------------------------------------------
    def _host_paced_step(self, params: SamplingParams) -> PendingTokens:
        t, L = self.target, self.host_len
        first, self._first = self._first, None
        hidden = first[0] if first is not None else self._host_feats
        tree = self.drafter.draft(hidden, self.seq[:, :L + 1], sampling=not params.greedy)
        logits, tfeats = t.verify(tree.draft_tokens, tree.positions, tree.tree_mask[:, 0])
        res = accept_tree(tree, logits, params, self.rng)
        a = int(res.accept_len[0])  # host-paced: the step reads its length here
        t.commit(res.accept_index, res.accept_len, a)
        if tfeats is not None:
            self._host_feats = tfeats[:, res.accept_index[0, :a + 1]]
        self.seq = torch.cat([self.seq, res.tokens[:, :a + 1]], dim=1)
        self.host_len = L + a + 1
        self.out[0] = res.accept_len[0]
        self.out[1:].copy_(res.tokens[0])
        return self._pending()

    def _host_paced_plain(self, params: SamplingParams) -> PendingTokens:
        logits, _ = self.target.decode(self.ids[:, :1])
        tok = self.pick(logits, params, self.rng)
        self.ids[0, 0] = tok[0]
        self.out[:1].zero_()
        self.out[1] = tok[0]
        return self._pending()
