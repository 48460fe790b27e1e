"""Batched decoding steps: every slot of a batched target stepped together, queued ahead of the host.

:class:`BatchStepRunner` is :class:`~eagle_triton.engine.step.StepRunner` over ``B`` cache slots (the target set up
with ``batch_size=B``): one draft of the ``B`` sequences in one launch, one verify forward over the ``B (T + 1)``
tree rows, a batched accept and KV compaction, or one plain decode of ``B`` rows. Each slot holds one sequence
of a continuous batch (:meth:`EagleEngine.generate_batch`): the engine frees a slot when its sequence stops and
prefills the next waiting prompt into it (:meth:`BatchStepRunner.release`, :meth:`BatchStepRunner.start`); a
slot without a sequence (*idle*) is stepped with the others, its rows ignored, and its target and draft KV lengths
zeroed at the end of every step so it never grows. When nobody waits and the running sequences fit a smaller
bucket, the engine moves them into the first slots of a runner of that size (:meth:`BatchStepRunner.take_from`,
with the target's ``keep_slots`` and the drafter's ``keep_rows``), with no step in flight.

A step's output is ``out [B, 2 + C]``: per slot the accepted drafts ``a`` (0 for plain decoding), the slot's
first token (the token its prefill picked: the host reads it with the sequence's first step, so starting a
sequence costs no read of its own), then the ``a + 1`` emitted tokens, -1 padded. The host reads it once per
step (:class:`PendingBatch`), with the next step already queued.

Per-sequence sampling: the parameters of each row live in device tensors (:class:`~.sampling.RowSampling`) and
each row draws from its own Philox stream (:class:`~.sampling.RowRNG`) exactly the coins it draws alone, so a
sequence seeded with ``s`` gets the tokens ``generate(seed=s)`` gives wherever the target's logits are the same
bits (the fused batch-invariant forward). A batch whose sequences are all greedy verifies with the greedy rule;
a batch with a sampled sequence runs every row through the sampling rule, greedy rows with one-hot
distributions (which accept exactly the argmax). On CUDA each kind of step replays CUDA graphs (per batch size:
a runner is built per bucket of :data:`BATCH_BUCKETS`), also the first draft of a new sequence: after its
prefill, the prompt's rows but the last go into the slot's draft KV as K/V only (:meth:`TreeDrafter.start_rows`),
and the last is the slot's next draft input like an accepted row.
"""

from __future__ import annotations

import torch

from .accept import accept_tree_probs, greedy_pick_rows
from .sampling import RowRNG, RowSampling, SamplingParams, probs_from_logits_rows, sample_from_probs
from .step import DeviceSteps, PendingRead, StepRunner

__all__ = ["BATCH_BUCKETS", "SPECULATIVE_BATCH_MAX", "SPECULATIVE_BUCKETS", "BatchSequence", "BatchStepRunner",
           "PendingBatch", "batch_bucket", "not_a_speculative_bucket"]

#: Batch sizes with their own buffers and CUDA graphs: a batch of ``n`` sequences runs in the smallest bucket
#: ``>= n`` (the other slots idle). Plain decoding takes every bucket; speculation at most
#: :data:`SPECULATIVE_BATCH_MAX` sequences.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: The largest speculative batch: the fused drafter's batch sizes and the batch trees are measured up to 16.
SPECULATIVE_BATCH_MAX = 16
#: The buckets a speculative batch runs in (the keys a head's batch trees may have).
SPECULATIVE_BUCKETS = tuple(b for b in BATCH_BUCKETS if b <= SPECULATIVE_BATCH_MAX)

_GREEDY = SamplingParams()


def not_a_speculative_bucket(b) -> str | None:
    """``None`` when ``b`` is a bucket a speculative batch runs in (a key a head's batch trees may have), else the
    reason, to follow ``b`` in the caller's error message."""
    if b in SPECULATIVE_BUCKETS:
        return None
    return f"is not a batch bucket of speculation ({', '.join(map(str, SPECULATIVE_BUCKETS))})"


def batch_bucket(n: int, speculative: bool = False) -> int:
    """The smallest of :data:`BATCH_BUCKETS` holding ``n`` sequences; a clear error beyond the largest, or, for a
    ``speculative`` batch, beyond :data:`SPECULATIVE_BATCH_MAX`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {n!r}")
    if n > BATCH_BUCKETS[-1]:
        raise ValueError(f"batch_size {n} is beyond the largest batch bucket {BATCH_BUCKETS[-1]} (buckets "
                         f"{', '.join(map(str, BATCH_BUCKETS))}): pass batch_size <= {BATCH_BUCKETS[-1]}")
    if speculative and n > SPECULATIVE_BATCH_MAX:
        raise ValueError(f"batch_size {n}: a speculative batch holds at most {SPECULATIVE_BATCH_MAX} sequences ({n} "
                         f"is beyond the largest batch bucket of speculation); up to {BATCH_BUCKETS[-1]} without "
                         "speculation")
    return next(b for b in BATCH_BUCKETS if n <= b)


class PendingBatch(PendingRead):
    """The output of one queued batch step and who occupied each slot when it was queued (``occupants``: one
    host token per slot, ``None`` for an idle slot), so the host drops the rows of a slot that changed hands."""

    def __init__(self, out, host, event, occupants: tuple):
        super().__init__(out, host, event)
        self.occupants = occupants

    def rows(self) -> list[tuple[int, int, list[int]]]:
        """Per slot ``(accepted drafts, the slot's first token, emitted tokens)``: waits for the step."""
        rows = []
        for v in self.values():
            a = int(v[0])
            rows.append((a, int(v[1]), v[2:a + 3]))
        return rows


class BatchStepRunner(DeviceSteps):
    """Buffers, steps and CUDA graphs of one engine for ``batch`` slots and one kind of decoding.

    Parameters
    ----------
    target: a target with device lengths set up with ``batch_size=batch`` (:class:`LlamaTarget`).
    drafter: a drafter that drafts rows (:attr:`TreeDrafter.drafts_rows`) for speculation, else ``None``.
    max_path: the longest accepted path in nodes (tree depth + 2).
    batch: the slots.
    """

    def __init__(self, target, drafter, max_path: int, batch: int):
        self.B, self.C = int(batch), int(max_path)
        B, C = self.B, self.C
        super().__init__(target, drafter, torch.full((B, 2 + C), -1, dtype=torch.long, device=target.device))
        if not self.device_paced:
            what = ("the target keeps its lengths on the host" if not getattr(target, "device_lengths", False)
                    else "the drafter drafts from host-known lengths only")
            raise ValueError(f"batched generation needs device-paced steps, but {what}: use the fast LlamaTarget "
                             "and, to speculate, the fused drafter (drafter_backend='triton')")
        dev = self.device
        W = target.feature_width(getattr(drafter, "feature_mode", None) or target.feature_mode) if drafter else 0
        self.feats = torch.zeros(B, C, max(W, 1), dtype=target.dtype, device=dev)
        self.ids = torch.zeros(B, C, dtype=torch.long, device=dev)
        self.num_new = torch.ones(B, dtype=torch.int32, device=dev)
        self._root_paths = torch.zeros(B, 1, 1, dtype=torch.long, device=dev)  # a tree with no drafts (plain picks)
        self.first_token = torch.zeros(B, dtype=torch.long, device=dev)
        self.active = torch.zeros(B, dtype=torch.int32, device=dev)
        self.rng = RowRNG(B, dev)
        self.sampling = RowSampling(B, dev)
        # keep[b]: every slot but b (forgetting one slot's draft KV in stream order)
        self._keep = [torch.ones(B, dtype=torch.int32, device=dev).index_fill_(0, torch.tensor([b], device=dev), 0)
                      for b in range(B)]
        self._params: list[SamplingParams] = [_GREEDY] * B  # host copy of the rows' parameters: the kind of step

    # -- slots ----------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a batch: every slot idle, every length zero."""
        self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()
        self.active.zero_()
        self.out.fill_(-1)
        self._params = [_GREEDY] * self.B

    def release(self, slot: int) -> None:
        """Free ``slot`` (its sequence stopped, or it is about to take a new one): its target and draft KV lengths
        become zero and it idles. Device work only, queued after every step already queued."""
        self.target.reset(slot)
        if self.drafter is not None:
            self.drafter.forget_rows(self._keep[slot])
        self.active[slot:slot + 1].zero_()
        self._params[slot] = _GREEDY

    def start(self, slot: int, prompt_ids: torch.Tensor, logits: torch.Tensor, feats, params: SamplingParams,
              seed: int) -> None:
        """Begin a sequence in ``slot`` after its prefill into that slot (``prompt_ids [1, N]``, the prefill's
        last logits ``[1, V]`` and features ``[1, N, W]``): pick its first token from the slot's RNG stream seeded
        with ``seed`` (as ``generate`` does), set the slot's sampling parameters, and put its prompt rows but the
        last into the slot's draft KV (the last is its next draft's input, as after any step). No host read: the
        first token comes back with the slot's next step."""
        root = StepRunner.pick(logits, params, self.rng.manual_seed(slot, seed))
        self.first_token[slot:slot + 1].copy_(root)
        self.ids[slot, :1].copy_(root)  # plain decoding reads the pending token here
        self.sampling.set(slot, params)
        self._params[slot] = params
        if self.speculative:  # row j pairs with token j + 1
            self._start_draft(slot, None if feats is None else feats[0], torch.cat([prompt_ids[0, 1:], root.view(1)]))
        self.active[slot:slot + 1].fill_(1)

    def take_from(self, other: BatchStepRunner, slots: list[int]) -> None:
        """Continue ``other``'s sequences of ``slots`` in this runner's first slots (a smaller bucket; the target
        and drafter have kept the same slots in that order): their step inputs, first tokens, RNG streams and
        sampling parameters move along (device copies), every other slot idles."""
        n = len(slots)
        idx = torch.tensor(slots, device=self.device)
        for mine, theirs in ((self.feats, other.feats), (self.ids, other.ids), (self.num_new, other.num_new),
                             (self.first_token, other.first_token), (self.active, other.active),
                             (self.rng.seed, other.rng.seed), (self.rng.offset, other.rng.offset),
                             *((getattr(self.sampling, k), getattr(other.sampling, k))
                               for k in ("temperature", "top_p_cut", "use_top_p", "top_k", "greedy"))):
            mine[:n].copy_(theirs.index_select(0, idx))
        self.active[n:].zero_()
        self.out.fill_(-1)
        self._params = [other._params[s] for s in slots] + [_GREEDY] * (self.B - n)
        for j in range(n, self.B):
            self.sampling.set(j, _GREEDY)

    # -- steps ----------------------------------------------------------------------------------------------------
    def _mode(self) -> tuple | None:
        """``None`` when every row is greedy, else which filters some sampled row uses ``(top_p, top_k)``: a kind
        of step (and graph) each, so a batch never sorts its logits for a filter no row asks for."""
        sampled = [p for p in self._params if not p.greedy]
        if not sampled:
            return None
        return any(p.top_p < 1.0 for p in sampled), any(p.top_k > 0 for p in sampled)

    def speculative_step(self, occupants: tuple, kv_bound: int | None) -> PendingBatch:
        """Queue one speculative step of every slot (``occupants``: the host's token per slot, handed back with
        the output; ``kv_bound``: an upper bound on the cache rows any slot reads, for eager CPU attention)."""
        mode = self._mode()
        bound = self._step_bound(kv_bound)
        self._run(("step", mode, bound), lambda: self._verify_accept(mode, self._draft(), bound))
        return self._pending(PendingBatch, occupants=occupants)

    def _verify_accept(self, mode: tuple | None, tree, kv_bound) -> None:
        """Verify every slot's tree, accept, commit, zero the idle slots' lengths, and leave the next draft's
        inputs and this step's tokens in the static buffers."""
        t = self.target
        if mode is not None:  # sampling verification walks the paths in lexicographic order
            tree = tree.in_sampling_order()
        keys = mode is None and t.fused_argmax  # greedy: the lm_head's argmax keys, no logits
        logits, tfeats = t.verify_rows(tree.draft_tokens, tree.positions, tree.tree_mask[:, 0], kv_bound, argmax=keys)
        res = None if mode is None else accept_tree_probs(tree, probs_from_logits_rows(logits, self.sampling, *mode),
                                                          self.rng)
        self._commit_accepted(tree, logits, tfeats, res, self.out[:, 0], self.out[:, 2:], keys)
        self._forget_idle()
        self.out[:, 1].copy_(self.first_token)

    def plain_step(self, occupants: tuple, kv_bound: int | None) -> PendingBatch:
        """Queue one plain decoding step of every slot: each slot's next token after its pending one."""
        mode = self._mode()
        bound = self._step_bound(kv_bound)
        self._run(("plain", mode, bound), lambda: self._plain_body(mode, bound))
        return self._pending(PendingBatch, occupants=occupants)

    def _plain_body(self, mode: tuple | None, kv_bound) -> None:
        keys = mode is None and self.target.fused_argmax
        logits, _ = self.target.decode_rows(self.ids[:, :1], kv_bound, want_features=False, argmax=keys)
        if mode is None:  # the argmax kernels write the token into the output and the next input
            greedy_pick_rows(logits, self._root_paths, self.out[:, 0], self.out[:, 2:3], self.ids[:, :1],
                             self.num_new, keys=keys)
        else:
            tok = sample_from_probs(probs_from_logits_rows(logits, self.sampling, *mode), self.rng)
            self.ids[:, 0].copy_(tok)
            self.out[:, 0].zero_()
            self.out[:, 2].copy_(tok)
        self._forget_idle()
        self.out[:, 1].copy_(self.first_token)

    def _forget_idle(self) -> None:
        """Idle slots keep no rows: their target and draft KV lengths go back to zero every step."""
        self.target.cache.seqlens.mul_(self.active)
        if self.drafter is not None:
            self.drafter.forget_rows(self.active)

    def committed(self, counts: list[int]) -> None:
        """The host has read that slot ``b`` committed ``counts[b]`` more rows."""
        self.target.note_committed(counts)


class BatchSequence:
    """The host's record of one sequence of a batch: its prompt, parameters, budget, tokens so far and stats."""

    def __init__(self, index: int, ids: list[int], params: SamplingParams, max_new_tokens: int, seed: int,
                 stats):
        self.index, self.ids, self.params, self.seed, self.stats = index, ids, params, seed, stats
        self.max_new_tokens = max_new_tokens
        self.budget = 0  # set with the engine's max_length
        self.out: list[int] = []
        self.started = False  # its first token has been read
        self.emitted = 0  # tokens its steps produced, before the stop cuts
        self.t0 = 0.0
