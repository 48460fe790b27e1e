"""Tree drafters: :class:`TreeDrafter` over the back ends of :mod:`.backends` (the PyTorch reference
``"torch"``, the fused kernel ``"triton"``, the multi-kernel ``"graph"``, the model-free ``"stub"``)."""

from __future__ import annotations

import torch

from ..config import TreeConfig
from ..heads.base import DraftHead
from ..tree import DraftTree, build_tree_buffers, rank_topk, select_tree_nodes, selected_parents
from .backends import (
    BUILTIN_DRAFT_BACKENDS,
    DraftBackend,
    available_draft_backends,
    register_draft_backend,
    resolve_draft_backend,
)
from .reference import check_draft_inputs

__all__ = [
    "BUILTIN_DRAFT_BACKENDS",
    "DraftBackend",
    "DraftTree",
    "TreeDrafter",
    "register_draft_backend",
    "resolve_draft_backend",
    "available_draft_backends",
    "build_tree_buffers",
    "check_draft_inputs",
    "rank_topk",
    "select_tree_nodes",
    "selected_parents",
]


class TreeDrafter:
    """Drafts EAGLE-2 dynamic trees with a draft head, keeping the draft KV across calls like SafeAILab EAGLE.

    Parameters
    ----------
    head: an :class:`~eagle_triton.Eagle3DraftHead` or :class:`~eagle_triton.Eagle1DraftHead`.
    tree_config: the tree shape (``TreeConfig(60, 7, 10)`` by default).
    backend: a name from :mod:`eagle_triton.drafter.backends`: ``"torch"`` (the reference, the oracle),
        ``"triton"`` (the fused kernel), ``"graph"`` (multi-kernel, CUDA graph) or ``"stub"`` (no model).

    Examples
    --------
    >>> drafter = TreeDrafter(head, TreeConfig(60, 7, 10))          # doctest: +SKIP
    >>> tree = drafter.draft(features, torch.cat([prompt, root], 1))  # doctest: +SKIP
    >>> tree.draft_tokens.shape, tree.retrieve_indices.shape          # doctest: +SKIP
    (torch.Size([1, 60]), torch.Size([R, C]))
    """

    def __init__(self, head: DraftHead, tree_config: TreeConfig | None = None, backend: str = "torch", **options):
        if not isinstance(head, DraftHead):
            raise TypeError(f"head must be an EAGLE draft head, got {type(head).__name__}")
        self.head = head
        self.tree_config = tree_config or TreeConfig()
        factory = resolve_draft_backend(backend)
        self.backend = backend
        self._impl: DraftBackend = factory(head, self.tree_config, **options)

    def reset(self) -> None:
        """Forget the draft KV (call at the start of every generation)."""
        self._impl.reset()

    @property
    def kv_len(self) -> int:
        """Rows (accepted positions) currently held in the draft KV."""
        return self._impl.kv_len

    @property
    def stable_kv(self):
        return self._impl.stable_kv

    def draft(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, sampling: bool = False) -> DraftTree:
        """Draft one tree.

        Parameters
        ----------
        hidden_states: ``[1, S, W]`` target features of the ``S`` accepted rows not yet in the draft KV
            (``W = 3 * Ht`` for EAGLE-3, ``Ht`` for EAGLE-1).
        input_ids: ``[1, L + 1]`` all accepted tokens plus the just-sampled root token, ``S = L - kv_len``.
        sampling: order ``retrieve_indices`` rows lexicographically (for sampling verification) instead of by
            leaf index (greedy).
        """
        return self._impl.draft(hidden_states, input_ids, sampling=sampling)

    @property
    def drafts_rows(self) -> bool:
        """Whether the back end drafts from device-counted rows (:meth:`draft_rows`), with no host reads."""
        return hasattr(self._impl, "draft_rows") and not getattr(self._impl, "fallback_reason", "")

    def reserve(self, max_len: int, max_new_rows: int, batch: int = 1) -> None:
        """Preallocate for :meth:`draft_rows` (``max_len`` accepted rows, ``max_new_rows`` new rows per draft,
        ``batch`` sequences)."""
        if hasattr(self._impl, "reserve"):
            if batch == 1:
                self._impl.reserve(max_len, max_new_rows)
            else:
                self._impl.reserve(max_len, max_new_rows, batch=batch)

    def forget_rows(self, keep: torch.Tensor) -> None:
        """Forget the draft KV of the sequences whose ``keep [B]`` (int32, on the device) is 0, keeping the others:
        a batch slot that is freed or takes a new sequence (device work only: capturable). A back end without
        draft KV (``"stub"``) has nothing to forget."""
        if hasattr(self._impl, "forget_rows"):
            self._impl.forget_rows(keep)

    def start_rows(self, slot: int, features: torch.Tensor | None, new_ids: torch.Tensor) -> None:
        """Start sequence ``slot``'s draft KV with rows ``features [N, W]`` (``new_ids [N]``: the token after each
        row), its length becoming ``N``: the prompt's rows before its last, which a draft keeps only as K/V (device
        work only; after :meth:`reserve`). The sequence's first :meth:`draft_rows` then ingests the last row like
        any later draft. A back end without draft KV (``"stub"``) has nothing to keep."""
        if hasattr(self._impl, "start_rows"):
            self._impl.start_rows(slot, features, new_ids)
        elif not self.drafts_rows:
            raise ValueError(f"the {self.backend!r} drafter back end drafts from host-known lengths only: start_rows "
                             "needs a back end with drafts_rows (the fused 'triton' one, 'stub')")

    @property
    def starts_in_chunks(self) -> bool:
        """Whether the back end has :meth:`start_rows_chunk` (the fused ``"triton"`` one): the engine then starts
        sequences with fixed-size chunks replayed from a CUDA graph instead of :meth:`start_rows`."""
        return hasattr(self._impl, "start_rows_chunk")

    def begin_start(self, slot: int, features: torch.Tensor, new_ids: torch.Tensor) -> None:
        """The host's part of :meth:`start_rows` (checks of the back end, buffers, shapes and room for the rows plus
        a draft; the draft KV's length becomes the device's only), for a caller that then runs the start's
        :meth:`start_rows_chunk` calls, perhaps replayed from a graph. Back ends with :attr:`starts_in_chunks`
        only."""
        self._chunked_starts().begin_start(slot, features, new_ids)

    def start_rows_chunk(self, meta: torch.Tensor, features: torch.Tensor, new_ids: torch.Tensor) -> None:
        """One fixed-size chunk of :meth:`start_rows` with every length on the device (capturable): ``meta [3]``
        int64 ``(slot, first row, valid rows)``, ``features [C, W]``, ``new_ids [C]`` (rows past the valid ones are
        padding). Back ends with :attr:`starts_in_chunks` only."""
        self._chunked_starts().start_rows_chunk(meta, features, new_ids)

    def _chunked_starts(self):
        """The back end, which must have :attr:`starts_in_chunks`."""
        if not self.starts_in_chunks:
            raise ValueError(f"the {self.backend!r} drafter back end has no start_rows_chunk: use start_rows")
        return self._impl

    def keep_rows(self, rows: list[int], batch: int) -> None:
        """Keep only the draft KV of sequences ``rows`` (in that order) in room for ``batch`` sequences (a batch
        moving its last sequences to a smaller batch). A back end without draft KV (``"stub"``) keeps nothing."""
        if hasattr(self._impl, "keep_rows"):
            self._impl.keep_rows(rows, batch)

    def draft_rows(self, features: torch.Tensor, new_ids: torch.Tensor, num_new: torch.Tensor | None = None,
                   sampling: bool = False) -> DraftTree:
        """Draft one tree from ``features [1, S, W]`` of rows not yet in the draft KV, ``num_new [1]`` int32 of
        them valid (``None``: all), ``new_ids [1, S]`` the token after each row (the last valid one is the root).
        Lengths stay on the device: no host synchronisation (the engine's step graphs). Back ends with
        :attr:`drafts_rows` only.

        The tree's tensors are views of the back end's own output buffers, the same ones at every call until its
        buffers are reallocated (:meth:`reserve`, a batch moving buckets): the engine's CUDA graph of the rest of a
        step reads the tree at the addresses it was captured with, also after a draft that ran eagerly (the
        first two of each kind, before the capture). The engine checks this contract on every step."""
        if not self.drafts_rows:
            raise ValueError(f"the {self.backend!r} drafter back end drafts from host-known lengths only: use "
                             "draft(), or a back end with drafts_rows (the fused 'triton' one, 'stub')")
        return self._impl.draft_rows(features, new_ids, num_new, sampling=sampling)
