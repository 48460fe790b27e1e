"""The lossless EAGLE engine: prefill, draft a tree, verify, accept, compact, draft again.

One loop (reference/EAGLE_ALGORITHM.md section 3) composed from plain steps:

1. ``target.prefill(prompt)`` -> logits of the last row (the first new token, the *root*) and the features of
   every prompt row.
2. ``drafter.draft(features, accepted + root)`` -> a :class:`~eagle_triton.DraftTree` of ``T + 1`` tokens.
3. ``target.verify(tree)`` -> logits and features of every tree node (tree-masked attention, depth positions).
4. ``accept_tree`` (greedy or lossless sampling) -> accepted path, accepted drafts and the bonus token.
5. ``target.commit`` compacts the KV cache to root + accepted path; the features of those rows feed step 2.

Steps are queued ahead of the host (:mod:`.step`): step ``i + 1`` is queued before the host reads step ``i``'s
tokens, its one device read, and on CUDA each step replays CUDA graphs. ``speculative=False`` runs the same target
and sampling code one token per step: the fair baseline, and the oracle of the equality tests. Batch size 1.
"""

from __future__ import annotations

import os
import time
from collections import deque

import torch

from ..config import TreeConfig
from ..drafter import TreeDrafter
from ..heads import DraftHead
from ..heads.fp8 import apply_draft_dtype
from . import loading
from .batch import (
    SPECULATIVE_BATCH_MAX,
    BatchSequence,
    BatchStepRunner,
    batch_bucket,
    not_a_speculative_bucket,
)
from .sampling import SamplingParams
from .stats import GenerationStats, PhaseTimer
from .step import StepRunner
from .target import TargetModel

__all__ = ["EagleEngine"]


class EagleEngine:
    """Speculative generation with an EAGLE draft head, exactly reproducing the target's own decoding.

    Parameters
    ----------
    target: a :class:`~eagle_triton.engine.target.TargetModel` (fast :class:`LlamaTarget` or generic
        :class:`HFTarget`); see :meth:`from_pretrained` to build one from a path.
    head: an EAGLE-3 or EAGLE-1 draft head fitting the target (vocabulary, feature width), or ``None`` for plain
        decoding only.
    tree_config: tree shape (``TreeConfig(60, 7, 10)`` by default).
    max_length: longest sequence (prompt + new tokens); the KV cache holds this plus one tree.
    tokenizer: optional, for string prompts and decoding.
    drafter: a drafter object (``reset()``, ``draft(hidden, input_ids, sampling)``, ``feature_mode``) instead of
        a :class:`~eagle_triton.TreeDrafter` over ``head`` (tests drive the engine with stub drafters).
    drafter_backend: ``"auto"`` (the fused ``"triton"`` drafter for an EAGLE-3 head on a CUDA device, else the
        reference ``"torch"`` drafter, see :meth:`_make_drafter`), ``"torch"``, ``"triton"`` (fused kernel) or
        ``"graph"`` (multi-kernel CUDA graph).
    expect_kind: ``"eagle3"`` or ``"eagle1"``: reject a head of the other kind.
    batch_trees: ``{batch bucket: TreeConfig}``: the tree :meth:`generate_batch` drafts when its slots run in that
        bucket (smaller trees verify cheaper as the batch grows); other buckets use ``tree_config``. Needs ``head``.
    drafter_options: keyword options of the drafter back end (the fused drafter's
        :class:`~eagle_triton.fused.DrafterConfig` fields such as ``nprog``, ``hidden_half_early`` or
        ``token_qkv_table``: ``False`` saves the q/k/v table's GPU memory, 786 MB at the 8B head shape, for a slower
        draft), passed to every :class:`~eagle_triton.TreeDrafter` the engine builds; the back end refuses options it
        does not take.
    """

    def __init__(self, target: TargetModel, head: DraftHead | None = None, tree_config: TreeConfig | None = None,
                 max_length: int = 2048, tokenizer=None, drafter=None, drafter_backend: str = "auto",
                 expect_kind: str | None = None, batch_trees: dict | None = None, drafter_options: dict | None = None):
        if not isinstance(target, TargetModel):
            raise TypeError(f"target must be a TargetModel (see EagleEngine.from_pretrained), got "
                            f"{type(target).__name__}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
        self.target = target
        self.tokenizer = tokenizer
        self.tree_config = tree_config or TreeConfig()
        self.max_length = max_length
        self.head = None
        if head is not None and drafter is not None:
            raise ValueError("pass a draft head or a drafter, not both")
        if drafter_options and head is None:
            raise ValueError("drafter_options configure the drafter built from a draft head: pass head")
        self._drafter_options = dict(drafter_options or {})
        if head is not None:
            self.head = self._fit_head(head, expect_kind)
            self.drafter = self._make_drafter(self.head, drafter_backend)
            feature_mode = self.head.kind
        elif drafter is not None:
            self.drafter = drafter
            feature_mode = getattr(drafter, "feature_mode", None)
            self.tree_config = getattr(drafter, "tree_config", self.tree_config)
        else:
            self.drafter = None
            feature_mode = None
        self.feature_mode = feature_mode
        self.batch_trees = self._check_batch_trees(batch_trees)
        self._drafter_backend = drafter_backend
        self._tree_drafters: dict[TreeConfig, TreeDrafter] = {}
        self._capacity = max_length + self.tree_config.total_tokens + 1
        target.setup(self._capacity, feature_mode)
        self._runners: dict[bool, StepRunner] = {}
        self._batch_runners: dict[tuple, BatchStepRunner] = {}

    def _check_batch_trees(self, batch_trees) -> dict:
        if not batch_trees:
            return {}
        if self.head is None:
            raise ValueError("batch_trees needs a draft head (the engine builds a drafter per tree)")
        if not isinstance(batch_trees, dict):
            raise TypeError(f"batch_trees must be a dict {{batch bucket: TreeConfig}}, got "
                            f"{type(batch_trees).__name__}")
        for b, tree in batch_trees.items():
            if why := not_a_speculative_bucket(b):
                raise ValueError(f"batch_trees key {b!r} {why}")
            if not isinstance(tree, TreeConfig):
                raise TypeError(f"batch_trees[{b}] must be a TreeConfig, got {type(tree).__name__}")
        return dict(batch_trees)

    def tree_for_batch(self, bucket: int) -> TreeConfig:
        """The tree :meth:`generate_batch` drafts when its slots run in ``bucket``."""
        return self.batch_trees.get(bucket, self.tree_config)

    def _drafter_for(self, tree: TreeConfig):
        """The engine's drafter for ``tree`` (built on first use from the head, on the engine's back end)."""
        if tree == self.tree_config:
            return self.drafter
        d = self._tree_drafters.get(tree)
        if d is None:
            d = self._tree_drafters[tree] = self._make_drafter(self.head, self._drafter_backend, tree)
        return d

    # -- construction ------------------------------------------------------------------------------------------
    def _fit_head(self, head: DraftHead, expect_kind: str | None) -> DraftHead:
        t = self.target
        if not isinstance(head, DraftHead):
            raise TypeError(f"head must be an EAGLE draft head, got {type(head).__name__}")
        if expect_kind is not None and head.kind != expect_kind:
            names = {"eagle3": "EAGLE-3", "eagle1": "EAGLE-1"}
            raise ValueError(f"an {names.get(head.kind, head.kind)} draft head was given where an "
                             f"{names.get(expect_kind, expect_kind)} head is expected")
        if head.config.vocab_size != t.vocab_size:
            raise ValueError(f"draft head vocabulary {head.config.vocab_size} does not match the target vocabulary "
                             f"{t.vocab_size}")
        want = t.feature_width(head.kind)
        if head.feature_width != want:
            what = ("3 x target hidden size, the EAGLE-3 taps" if head.kind == "eagle3"
                    else "the target hidden size, the EAGLE-1 feature")
            raise ValueError(
                f"{type(head).__name__} ingests features of width {head.feature_width} but the target gives "
                f"{want} ({what}; target hidden size {t.hidden_size}): the head was trained for another target"
                + (" or is an EAGLE-1 head" if head.kind == "eagle3" and head.feature_width == t.hidden_size else "")
                + (" or is an EAGLE-3 head" if head.kind == "eagle1" and head.feature_width == 3 * t.hidden_size
                   else "")
            )
        if head.kind == "eagle1":
            head.set_target_lm_head(t.lm_head)
        return head.to(device=t.device, dtype=t.dtype).eval()

    def _make_drafter(self, head: DraftHead, backend: str, tree: TreeConfig | None = None) -> TreeDrafter:
        # "auto": the fused drafter where it runs natively (EAGLE-3 head on CUDA). Its trees equal the reference's
        # in fp32 with one program per SM (tests/fused/test_fused_drafter.py, GPU), and on the H100 it drafts in ~0.7 ms
        # where the reference takes ~25 ms (bench/results/gpu_2026-11-22b). Elsewhere the reference drafter:
        # under no GPU the fused kernel would only run in Triton's interpreter.
        if backend == "auto":
            backend = "triton" if head.kind == "eagle3" and head.device.type == "cuda" else "torch"
        return TreeDrafter(head, tree or self.tree_config, backend=backend, **self._drafter_options)

    @classmethod
    def from_pretrained(cls, target, draft=None, tree_config: TreeConfig | None = None, *, device=None, dtype=None,
                        max_length: int = 2048, target_impl: str = "auto", draft_kind: str | None = None,
                        gguf_file: str | None = None, attention: str = "auto", cuda_graphs: bool | None = None,
                        drafter_backend: str = "auto", tokenizer=True, draft_dtype: str | None = None,
                        batch_trees: dict | None = None, norm_mode: str | None = None,
                        drafter_options: dict | None = None) -> EagleEngine:
        """Build an engine from paths.

        Parameters
        ----------
        target: transformers model directory, safetensors checkpoint directory, ``.gguf`` file, hub id, a
            transformers model, or a :class:`TargetModel`.
        draft: draft-head checkpoint directory (EAGLE format) or a :class:`~eagle_triton.DraftHead`; ``None``
            for plain decoding.
        device, dtype: ``"auto"``/``None`` = CUDA + bf16 when available, else CPU + fp32.
        target_impl: ``"auto"``, ``"fast"`` or ``"generic"`` (see :func:`~eagle_triton.engine.loading.load_target`).
        draft_kind: demand ``"eagle3"`` or ``"eagle1"``.
        attention: attention/KV back end of the fast path (``"auto"``, ``"torch"``, ``"triton"``).
        tokenizer: ``True`` to load the target's tokenizer (when ``target`` is a path), or a tokenizer object.
        draft_dtype: ``None``/``"model"`` (the target's dtype) or ``"fp8"``: the head's linear layers in weight-only
            FP8 (:meth:`~eagle_triton.Eagle3DraftHead.quantize_fp8`; EAGLE-3 heads). On an H200 the fused drafter
            is faster with FP8 only at batch 1 (8B head 60/7/10: 1.52 against 1.77 ms,
            bench/results/session39_2026-11-29/sweep/); from batch 2 on the converted FP8 products are slower
            than bf16 (2.40 against 2.10 ms at batch 2: bench/results/session40_2026-11-29/call2/sweep/).
        norm_mode: the fast target's RMSNorms in its fused forward (:class:`~eagle_triton.engine.LlamaTarget`):
            ``None``/``"folded"`` (fastest: folded into the weights), ``"kernel"`` (rounds as transformers does; the
            shipped SmolLM2 head, trained on transformers' features, accepts about 6% more tokens per step with it
            on the H100, while plain decoding is about 11% slower). Not for a generic target or a built
            :class:`TargetModel`.
        drafter_options: options of the drafter back end (see the class).
        """
        kwargs = {}
        if not isinstance(target, TargetModel) and target_impl != "generic":
            kwargs = {"ops": attention, "cuda_graphs": cuda_graphs}
            if norm_mode is not None:
                kwargs["norm_mode"] = norm_mode
        elif norm_mode is not None:
            raise ValueError("norm_mode applies to the fast target runner built here: not with target_impl='generic' "
                             "or a TargetModel (build LlamaTarget(norm_mode=...) yourself)")
        runner = loading.load_target(target, device=device, dtype=dtype, impl=target_impl, gguf_file=gguf_file,
                                     **kwargs)
        tok = None
        if tokenizer is True:
            if isinstance(target, (str, os.PathLike)):
                tok = loading.load_tokenizer(target, gguf_file)
        elif tokenizer not in (False, None):
            tok = tokenizer
        head = loading.load_head(draft, runner, draft_kind) if draft is not None else None
        if head is not None:
            head = apply_draft_dtype(head, draft_dtype)
        elif draft_dtype not in (None, "model"):
            raise ValueError(f"draft_dtype={draft_dtype!r} needs a draft head")
        return cls(runner, head, tree_config, max_length=max_length, tokenizer=tok, drafter_backend=drafter_backend,
                   expect_kind=draft_kind, batch_trees=batch_trees, drafter_options=drafter_options)

    # -- generation --------------------------------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        """Whether the engine has a drafter (``generate`` then speculates unless told otherwise)."""
        return self.drafter is not None

    def _prompt_ids(self, prompt, input_ids) -> list[int]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt (a string) or input_ids (token ids)")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompt must be a string, got {type(prompt).__name__}; use input_ids= for ids")
            if not prompt:
                raise ValueError("the prompt is empty")
            if self.tokenizer is None:
                raise ValueError("a string prompt needs a tokenizer: pass tokenizer= or use input_ids=")
            ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        else:
            if isinstance(input_ids, torch.Tensor):
                if input_ids.dim() == 2:
                    if input_ids.shape[0] != 1:
                        raise ValueError(f"batch size 1 only: input_ids has shape {list(input_ids.shape)}")
                    input_ids = input_ids[0]
                if input_ids.dim() != 1:
                    raise ValueError(f"input_ids must be [N] or [1, N], got shape {list(input_ids.shape)}")
                if input_ids.is_floating_point():
                    raise TypeError(f"input_ids must be integers, got {input_ids.dtype}")
                ids = [int(x) for x in input_ids.tolist()]
            else:
                ids = [int(x) for x in input_ids]
        if not ids:
            raise ValueError("the prompt is empty (no tokens)")
        bad = [x for x in ids if not 0 <= x < self.target.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token ids {bad[:5]} are outside the target vocabulary [0, {self.target.vocab_size})"
            )
        if len(ids) >= self.max_length:
            raise ValueError(f"the prompt has {len(ids)} tokens but max_length is {self.max_length}: it leaves no room "
                             "for a new token (raise max_length or shorten the prompt)")
        return ids

    @torch.no_grad()
    def warmup(self, speculative: bool | None = None) -> None:
        """Compile and capture now what generations will use, so the first ones run at full speed: a few steps
        after prompts of each prefill chunk kind (:data:`~eagle_triton.engine.target.PREFILL_CHUNKS`: one chunk,
        padded, of each size; full chunks then a rest), plain and, with a draft head, speculative (or only the
        kind ``speculative`` names). The prompts are token 0 repeated; nothing of them is kept."""
        from .target import PREFILL_CHUNKS

        kinds = [False, True] if speculative is None and self.drafter is not None else [bool(speculative)]
        lengths = sorted({*PREFILL_CHUNKS, PREFILL_CHUNKS[0] + 1})
        # CUDA: at least three steps per prompt (two eager runs, then the capture), so that the step graphs of
        # short and long contexts (the target's attention buckets) are captured too
        new = 3 * (self.tree_config.max_levels + 1) + 1 if self.target.device.type == "cuda" else 4
        for n in lengths:
            if n + new + self.tree_config.total_tokens < self.max_length:
                for spec in kinds:
                    self.generate(input_ids=[0] * n, max_new_tokens=new, speculative=spec, eos_token_id=None,
                                  seed=0)

    def generate(self, prompt: str | None = None, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, *, input_ids=None,
                 speculative: bool | None = None, eos_token_id: int | list[int] | None | str = "default",
                 on_tokens=None) -> tuple[list[int], GenerationStats]:
        """Generate up to ``max_new_tokens`` tokens after the prompt.

        Parameters
        ----------
        prompt: text (encoded with the tokenizer as is; chat templates are the caller's business) ...
        input_ids: ... or token ids (``list[int]``, ``[N]`` or ``[1, N]`` tensor).
        max_new_tokens: exact cap on new tokens.
        temperature, top_p, top_k: temperature <= 1e-5 is greedy; otherwise the target distribution is processed
            by temperature, top-p, top-k (EAGLE's order) and sampled losslessly.
        seed: seeds the engine's generator (a fixed seed reproduces the run).
        speculative: ``False`` decodes one token per step with the same target; default: speculate when the
            engine has a draft head.
        eos_token_id: stop token(s); default: the target's. Generation stops right after the first one, which is
            included in the output (as transformers does). ``None`` disables it.
        on_tokens: called with each step's new tokens (a ``list[int]``, after the EOS and ``max_new_tokens`` cuts)
            as soon as they are accepted, so the calls concatenate to the returned tokens. For streaming, and for
            keeping what was generated when the call is interrupted (an exception raised by the callback, e.g.
            ``KeyboardInterrupt``, propagates out of ``generate``).

        Returns
        -------
        ``(token_ids, stats)``: the new tokens only, and a :class:`GenerationStats`. A list of prompts (or of
        token-id lists, or an ``[n, N]`` tensor with ``n > 1``) runs :meth:`generate_batch` instead and returns its
        list.
        """
        if _is_batch(prompt, input_ids):
            if on_tokens is not None:
                raise ValueError("on_tokens streams one sequence: for a list of prompts use generate_batch's "
                                 "on_result")
            return self.generate_batch(prompt, input_ids=input_ids, max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p, top_k=top_k, seeds=seed,
                                       speculative=speculative, eos_token_id=eos_token_id)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        params = SamplingParams(float(temperature), float(top_p), int(top_k))
        ids = self._prompt_ids(prompt, input_ids)
        if speculative is None:
            speculative = self.speculative
        if speculative and self.drafter is None:
            raise ValueError("speculative decoding needs a draft head: this engine has none")
        eos = self._stop_tokens(eos_token_id)
        dev = self.target.device
        N = len(ids)
        budget = min(max_new_tokens, self.max_length - N)
        stats = GenerationStats(prompt_tokens=N, speculative=bool(speculative), device=str(dev),
                                tree=str(self.tree_config) if speculative else None)
        if max_new_tokens == 0:
            stats.stop_reason = "max_new_tokens"
            return [], stats
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())  # a CPU draw: no device read
        t0 = time.perf_counter()
        timer = PhaseTimer(dev)
        timer.start("prefill")
        run, pending = self._prefill(ids, params, speculative, int(seed))
        timer.stop()
        step = self._speculative_step if speculative else self._plain_step
        most = self.tree_config.max_levels + 1 if speculative else 1  # tokens one step can emit
        out: list[int] = []
        reason = None
        emitted = 0  # tokens the steps produced, before the stop cuts
        timer.start("steps")
        while True:
            # queue the next step before reading this one (the first read is the prefill's token), unless this one
            # may reach the budget: a queued step past a stop is dropped, its tokens never emitted
            ahead = step(run, params) if run.device_paced and len(out) + (most if out else 1) < budget else None
            a, new = pending.result()
            if out:
                stats.record_step(a if speculative else 0)
                run.committed(a + 1)
                emitted += len(new)
            reason = self._cut(new, eos, budget - len(out))
            out.extend(new)
            if on_tokens is not None and new:
                on_tokens(list(new))
            if reason is not None or len(out) >= budget:
                break
            pending = ahead if ahead is not None else step(run, params)
        timer.stop()
        if reason is None:
            reason = "max_new_tokens" if budget == max_new_tokens else "max_length"
        phases = timer.totals()
        stats.total_s = time.perf_counter() - t0
        stats.prefill_s, stats.step_s = phases["prefill"], phases["steps"]
        stats.new_tokens = len(out)
        stats.stop_reason = reason
        stats.finalize(emitted)
        return out, stats

    @torch.no_grad()
    def generate_batch(self, prompts=None, *, input_ids=None, max_new_tokens=128, temperature=0.0, top_p=1.0,
                       top_k=0, seeds=None, batch_size: int | None = None, speculative: bool | None = None,
                       eos_token_id: int | list[int] | None | str = "default",
                       on_result=None) -> list[tuple[list[int], GenerationStats]]:
        """Generate for many prompts at once: continuous batching over ``batch_size`` slots.

        Each slot prefills its own prompt; all slots step together (one draft of every sequence, one verify
        forward over their tree rows, a batched accept and commit; or one plain decode); a sequence that stops
        (EOS, its own ``max_new_tokens``, ``max_length``) frees its slot and the next waiting prompt is prefilled
        into it. Each sequence gets what :meth:`generate` gives it alone: greedy, the same tokens (the fused
        forward rounds a row alike in any batch); sampling, the same distribution, and with the same seed the same
        tokens wherever the target's logits are the same bits.

        Parameters
        ----------
        prompts: a list of strings (encoded as :meth:`generate` does) ...
        input_ids: ... or a list of token-id lists / 1-D tensors (or an ``[n, N]`` tensor).
        max_new_tokens, temperature, top_p, top_k: one value for every sequence, or a list with one per sequence.
        seeds: ``None`` (random), an int (sequence ``i`` is seeded with ``seeds + i``) or one int per sequence;
            sequence ``i`` seeded with ``s`` draws the coins ``generate(seed=s)`` draws.
        batch_size: the slots (default ``min(len(prompts), 16)``); the steps run in the smallest of
            :data:`~eagle_triton.engine.batch.BATCH_BUCKETS` that holds them (CUDA graphs per bucket), and more
            than the largest bucket (64) is an error, as is a speculative batch of more than 16. Once nobody
            waits, the running sequences move to the smallest bucket that holds them. The tree drafted is the
            engine's ``batch_trees`` entry of the starting bucket, else ``tree_config``.
        speculative, eos_token_id: as in :meth:`generate`.
        on_result: called with ``(index, tokens, stats)`` as each sequence finishes (completion order), e.g. to
            stream results to a file; an exception it raises propagates.

        Returns
        -------
        ``[(token_ids, stats), ...]`` in input order. In a batch a sequence's ``stats.total_s`` is its time from
        its prefill to its last token read, shared with the other sequences (``prefill_s`` and ``step_s`` are not
        measured per sequence: 0).
        """
        seqs, slots, speculative = self._batch_inputs(prompts, input_ids, max_new_tokens, temperature, top_p,
                                                      top_k, seeds, batch_size, speculative)
        eos = self._stop_tokens(eos_token_id)
        results: list = [None] * len(seqs)
        dev = self.target.device

        def finish(seq: BatchSequence, reason: str | None) -> None:
            st = seq.stats
            if reason is None:
                reason = "max_new_tokens" if seq.budget == seq.max_new_tokens else "max_length"
            st.total_s = time.perf_counter() - seq.t0
            st.new_tokens = len(seq.out)
            st.stop_reason = reason
            st.finalize(seq.emitted)
            results[seq.index] = (seq.out, st)
            if on_result is not None:
                on_result(seq.index, list(seq.out), st)

        bucket = batch_bucket(min(slots, max(1, sum(s.max_new_tokens > 0 for s in seqs))))
        tree = self.tree_for_batch(bucket)
        waiting = deque()
        for seq in seqs:
            seq.budget = min(seq.max_new_tokens, self.max_length - len(seq.ids))
            seq.stats = GenerationStats(prompt_tokens=len(seq.ids), speculative=bool(speculative), device=str(dev),
                                        tree=str(tree) if speculative else None)
            if seq.max_new_tokens == 0:
                seq.t0 = time.perf_counter()
                finish(seq, "max_new_tokens")
            else:
                waiting.append(seq)
        if not waiting:
            return results
        run = self._batch_runner(speculative, bucket, tree)
        occupant: list[BatchSequence | None] = [None] * run.B

        def fill(slot: int) -> None:
            seq = waiting.popleft()
            seq.t0 = time.perf_counter()
            prompt_t = self._upload(seq.ids)
            logits, feats = self.target.prefill(prompt_t, slot=slot)
            run.start(slot, prompt_t, logits, feats, seq.params, seq.seed)
            occupant[slot] = seq

        for slot in range(min(slots, len(waiting))):
            fill(slot)
        most = tree.max_levels + 1 if speculative else 1  # tokens one step can emit
        step = run.speculative_step if speculative else run.plain_step

        rows = tree.total_tokens + 1 if speculative else 1  # rows one step writes

        def queue():
            return step(tuple(occupant), self._batch_kv_bound(most, rows))

        def continues(seq: BatchSequence) -> bool:  # the pending step cannot end it (budget-wise)
            return len(seq.out) + most + (0 if seq.started else 1) < seq.budget

        def smaller_bucket() -> int | None:  # nobody waits and the running sequences fit a smaller bucket
            live = sum(s is not None for s in occupant)
            fits = batch_bucket(live) if live else run.B
            return fits if not waiting and fits < run.B else None

        pending = queue()
        while pending is not None:
            # queue the next step before reading this one, unless every sequence may stop with this one, or the
            # batch is about to move to a smaller bucket (it moves with no step in flight)
            shrink = smaller_bucket() is not None
            ahead = queue() if not shrink and any(s is not None and continues(s) for s in occupant) else None
            counts = [0] * run.B
            done = []
            for b, ((a, first, new), owner) in enumerate(zip(pending.rows(), pending.occupants, strict=True)):
                seq = occupant[b]
                if seq is None or owner is not seq:  # idle, or the slot changed hands after this step was queued
                    continue
                counts[b] = a + 1
                if not seq.started:  # its first token, picked by the prefill, comes back with its first step
                    seq.started = True
                    head = [first]
                    reason = self._cut(head, eos, seq.budget)
                    seq.out.extend(head)
                    if reason is not None or len(seq.out) >= seq.budget:
                        done.append((b, reason))
                        continue
                seq.stats.record_step(a if speculative else 0)
                seq.emitted += len(new)
                reason = self._cut(new, eos, seq.budget - len(seq.out))
                seq.out.extend(new)
                if reason is not None or len(seq.out) >= seq.budget:
                    done.append((b, reason))
            run.committed(counts)
            for b, reason in done:
                seq, occupant[b] = occupant[b], None
                run.release(b)
                finish(seq, reason)
                if waiting:
                    fill(b)
            if ahead is None and smaller_bucket() is not None:
                run, occupant = self._move_to_bucket(run, occupant, smaller_bucket(), speculative, tree)
                step = run.speculative_step if speculative else run.plain_step
            pending = ahead if ahead is not None else (queue() if any(s is not None for s in occupant) else None)
        return results

    def _batch_inputs(self, prompts, input_ids, max_new_tokens, temperature, top_p, top_k, seeds, batch_size,
                      speculative):
        """Check :meth:`generate_batch`'s arguments: ``(sequences, slots, speculative)``."""
        if (prompts is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompts (a list of strings) or input_ids (a list of token-id "
                             "lists)")
        items, name = (prompts, "prompts") if prompts is not None else (input_ids, "input_ids")
        if isinstance(items, torch.Tensor):
            if items.dim() != 2:
                raise ValueError(f"{name} as a tensor must be [n, N], got shape {list(items.shape)}")
            items = list(items)
        if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
            raise TypeError(f"{name} must be a list (one entry per sequence), got {type(items).__name__}")
        n = len(items)
        if n == 0:
            raise ValueError(f"{name} is an empty list: nothing to generate")
        ids = []
        for i, item in enumerate(items):
            try:
                ids.append(self._prompt_ids(item, None) if name == "prompts" else self._prompt_ids(None, item))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{name}[{i}]: {exc}") from None
        caps = _per_sequence("max_new_tokens", max_new_tokens, n)
        for i, m in enumerate(caps):
            if isinstance(m, bool) or not isinstance(m, int) or m < 0:
                raise ValueError(f"max_new_tokens[{i}] must be an int >= 0, got {m!r}")
        temps, tops_p, tops_k = (_per_sequence(k, v, n) for k, v in
                                 (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)))
        params = []
        for i in range(n):
            try:
                if isinstance(tops_k[i], bool) or not isinstance(tops_k[i], int):
                    raise ValueError(f"top_k must be an int >= 0, got {tops_k[i]!r}")
                params.append(SamplingParams(float(temps[i]), float(tops_p[i]), tops_k[i]))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"sequence {i}: {exc}") from None
        if seeds is None:
            seed_list = [int(x) for x in torch.randint(0, 2**62, (n,)).tolist()]  # CPU draws: no device read
        elif isinstance(seeds, int) and not isinstance(seeds, bool):
            seed_list = [seeds + i for i in range(n)]
        else:
            seed_list = _per_sequence("seeds", seeds, n)
            for i, s in enumerate(seed_list):
                if isinstance(s, bool) or not isinstance(s, int):
                    raise ValueError(f"seeds[{i}] must be an int, got {s!r}")
        if speculative is None:
            speculative = self.speculative
        if speculative and self.drafter is None:
            raise ValueError("speculative decoding needs a draft head: this engine has none")
        if batch_size is None:
            slots = min(n, SPECULATIVE_BATCH_MAX)
        else:
            batch_bucket(batch_size, speculative)  # a clear error for a bad size or one beyond the buckets
            slots = batch_size
        seqs = [BatchSequence(i, ids[i], params[i], caps[i], seed_list[i], None) for i in range(n)]
        return seqs, slots, bool(speculative)

    def _batch_runner(self, speculative: bool, B: int, tree: TreeConfig) -> BatchStepRunner:
        """The batch step runner for ``B`` slots drafting ``tree``, its target set up with ``B`` cache slots and
        every slot idle."""
        t = self.target
        drafter = self._drafter_for(tree) if speculative else None
        if not getattr(t, "device_lengths", False):
            raise ValueError(f"batched generation needs a target that keeps its lengths on the device (the fast "
                             f"LlamaTarget); {type(t).__name__} does not: use generate() per prompt")
        if speculative and not getattr(drafter, "drafts_rows", False):
            raise ValueError(f"batched speculation needs a drafter that drafts from device-counted rows (the fused "
                             f"'triton' back end); this engine's is {getattr(drafter, 'backend', '?')!r}: build "
                             "it with drafter_backend='triton', or pass speculative=False")
        most = max(self.tree_config.max_levels, tree.max_levels) + 1
        # every tree's rows, and one more step: a stopped sequence's slot may run one queued before its stop
        cap = self.max_length + max(self.tree_config.total_tokens, tree.total_tokens) + 1 + most
        if t.feature_mode != self.feature_mode or t.capacity < cap or t.batch_size != B:
            self._setup_target(cap, B)
        key = (bool(speculative), B, tree if speculative else None)
        run = self._batch_runners.get(key)
        if run is None:
            run = self._batch_runners[key] = BatchStepRunner(t, drafter, tree.max_levels + 1, B)
        run.reset()
        if speculative:  # room for every accepted row of a slot (a prompt's rows go in by start_rows)
            drafter.reserve(cap, run.C, batch=B)
        return run

    def _move_to_bucket(self, run: BatchStepRunner, occupant: list, bucket: int, speculative: bool,
                        tree: TreeConfig):
        """Move the running sequences into the first slots of a ``bucket``-slot batch (target cache, draft KV and
        step state copied on the device; no step may be in flight): ``(the new runner, its occupants)``."""
        live = [b for b, s in enumerate(occupant) if s is not None]
        self.target.keep_slots(live, bucket)
        if speculative:
            run.drafter.keep_rows(live, bucket)
        key = (bool(speculative), bucket, tree if speculative else None)
        new = self._batch_runners.get(key)
        if new is None:
            new = self._batch_runners[key] = BatchStepRunner(self.target, run.drafter, run.C, bucket)
        new.take_from(run, live)
        return new, [occupant[b] for b in live] + [None] * (bucket - len(live))

    def _batch_kv_bound(self, most: int, rows: int) -> int:
        """:meth:`_kv_bound` over every slot."""
        return max(self.target.lengths) + 2 * most + rows

    # -- generation parts --------------------------------------------------------------------------------------
    def _runner(self, speculative: bool) -> StepRunner:
        """The step runner of this kind of decoding (buffers and CUDA graphs live across calls)."""
        t = self.target
        if (t.feature_mode != self.feature_mode or t.capacity < self._capacity
                or getattr(t, "batch_size", 1) != 1):  # target shared with another engine, or batched last
            self._setup_target(self._capacity, 1)
        t.reset()
        key = bool(speculative)
        run = self._runners.get(key)
        if run is None:
            run = StepRunner(t, self.drafter if speculative else None, self.tree_config.max_levels + 1)
            self._runners[key] = run
        if speculative:
            self.drafter.reset()
            if run.device_paced:  # room for every accepted row (the prompt's go in by start_rows)
                self.drafter.reserve(self._capacity, run.C)
        return run

    def _setup_target(self, capacity: int, batch: int) -> None:
        """Set the target up for ``batch`` slots of ``capacity`` rows. The step runners of every batch size are kept
        (their graphs stay valid: a batched target runs smaller batches on the first slots of its cache) unless the
        cache was reallocated or the features changed: then their graphs point at the old buffers, so they go."""
        t = self.target
        before = (getattr(t, "cache_generation", None), t.feature_mode)
        if batch == 1:
            t.setup(capacity, self.feature_mode)
        else:
            t.setup(capacity, self.feature_mode, batch_size=batch)
        if before[0] is None or before != (t.cache_generation, t.feature_mode):
            self._runners.clear()
            self._batch_runners.clear()

    def _upload(self, ids: list[int]) -> torch.Tensor:
        """The prompt on the target's device, through pinned memory (no synchronous copy)."""
        host = torch.tensor([ids], dtype=torch.long)
        if self.target.device.type != "cuda":
            return host.to(self.target.device)
        return host.pin_memory().to(self.target.device, non_blocking=True)

    def _prefill(self, ids: list[int], params: SamplingParams, speculative: bool, seed: int):
        """Prefill the prompt and pick the first token: ``(runner, the pending first token)``."""
        run = self._runner(speculative)
        prompt_t = self._upload(ids)
        logits, feats = self.target.prefill(prompt_t)
        root = run.pick(logits, params, run.rng.manual_seed(seed))
        return run, run.begin(prompt_t, root, feats)

    def _speculative_step(self, run: StepRunner, params: SamplingParams):
        """Queue one speculative step: draft, verify, accept, commit (see :class:`StepRunner`)."""
        tc = self.tree_config
        return run.speculative_step(params, self._kv_bound(tc.max_levels + 1, tc.total_tokens + 1))

    def _plain_step(self, run: StepRunner, params: SamplingParams):
        """Queue one plain decoding step."""
        return run.plain_step(params, self._kv_bound(1, 1))

    def _kv_bound(self, most: int, rows: int) -> int:
        """An upper bound on the cache rows the next queued step reads (an exact shortcut of eager CPU attention,
        and the target's attention plan): the rows the host knows of, the two steps (of at most ``most`` rows
        each) that may be queued unread, and the ``rows`` this step writes (a tree and its root, or one token)."""
        return self.target.length + 2 * most + rows

    def _stop_tokens(self, eos_token_id) -> set[int]:
        if eos_token_id == "default":
            return set(self.target.eos_token_ids)
        if eos_token_id is None:
            return set()
        return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(x) for x in eos_token_id}

    @staticmethod
    def _cut(new: list[int], eos: set[int], room: int) -> str | None:
        """Cut ``new`` in place after its first stop token and to ``room`` tokens; the stop reason or ``None``."""
        reason = None
        for j, tok in enumerate(new):
            if tok in eos:
                del new[j + 1:]
                reason = "eos"
                break
        if len(new) > room:
            del new[room:]
            reason = None  # an EOS past the cap is cut too
        return reason

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            raise ValueError("no tokenizer: cannot decode")
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def _per_sequence(name: str, value, n: int) -> list:
    """``value`` for each of ``n`` sequences: a list or tuple must have ``n`` entries, anything else is shared."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} values for {n} prompts: pass one per prompt or a single value")
        return list(value)
    return [value] * n


def _is_batch(prompt, input_ids) -> bool:
    """Whether :meth:`EagleEngine.generate`'s arguments hold several sequences."""
    if isinstance(prompt, (list, tuple)):
        return True
    if isinstance(input_ids, torch.Tensor):
        return input_ids.dim() == 2 and input_ids.shape[0] > 1
    return isinstance(input_ids, (list, tuple)) and any(isinstance(x, (list, tuple, torch.Tensor))
                                                        for x in input_ids)
