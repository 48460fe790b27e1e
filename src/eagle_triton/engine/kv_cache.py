"""The target's static, preallocated KV cache (gpt-fast ``KVCache`` / EAGLE ``kv_cache.py`` behaviour)."""

from __future__ import annotations

import torch

from ..ops._utils import move_slots_to_front

__all__ = ["StaticKVCache", "find_multiple"]


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of ``k`` that is ``>= n``."""
    return n if n % k == 0 else n + k - (n % k)


class StaticKVCache:
    """K and V buffers ``[NL, B, Lmax, Hkv, D]`` (flash-attn layout per layer) plus ``seqlens [B]`` int32.

    ``seqlens`` lives on the device (graph-capturable); ``host_len`` mirrors it on the host for batch 1, updated
    only from values the engine already read (no extra synchronisation).

    Parameters
    ----------
    num_layers, batch_size, max_length, num_kv_heads, head_dim: buffer sizes; ``max_length`` is rounded up to a
        multiple of 8.
    dtype, device: storage of the buffers.
    """

    def __init__(self, num_layers: int, batch_size: int, max_length: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = find_multiple(int(max_length), 8)
        shape = (num_layers, batch_size, self.max_length, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.host_len = 0

    def first_slots(self, n: int) -> StaticKVCache:
        """A cache of the first ``n`` slots that shares this one's storage (views ``k[:, :n]``, ``seqlens[:n]``): a
        batch bucket of ``n`` sequences whose rows stay where they are, so CUDA graphs captured on it stay valid
        while other buckets of the same storage are used."""
        if not 1 <= n <= self.k.shape[1]:
            raise ValueError(f"first_slots: {n} slots outside 1..{self.k.shape[1]}")
        view = object.__new__(StaticKVCache)
        view.max_length = self.max_length
        view.k, view.v, view.seqlens = self.k[:, :n], self.v[:, :n], self.seqlens[:n]
        view.host_len = 0
        return view

    def move_slots(self, slots: list[int]) -> None:
        """Move the rows and lengths of ``slots`` (distinct slot indices, in order) to slots ``0..len(slots)-1``, in
        place (device copies of the slots that move only)."""
        move_slots_to_front(slots, (self.k, 1), (self.v, 1), (self.seqlens, 0))

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of layer ``i``, each ``[B, Lmax, Hkv, D]`` (views)."""
        return self.k[i], self.v[i]

    def reset(self) -> None:
        self.seqlens.zero_()
        self.host_len = 0

    def advance(self, n: int) -> None:
        """Commit ``n`` rows written after the current length (prefill, plain decoding)."""
        self.seqlens.add_(n)
        self.host_len += n

    def check_room(self, n: int) -> None:
        if self.host_len + n > self.max_length:
            raise ValueError(
                f"KV cache capacity exceeded: {self.host_len} rows held + {n} new > {self.max_length} allocated"
            )

    def compact(self, ops, accept_index: torch.Tensor, accept_len: torch.Tensor,
                accept_len_host: int | None, rows_kept: torch.Tensor | None = None) -> None:
        """Keep root + accepted path of the verified tree (``accept_len`` drafts) and commit them: ``seqlens``
        advances by ``accept_len + 1`` after the move (the back ends' ops leave it alone). ``rows_kept``: that
        count as int32 ``[B]`` when the caller has it (the step's next ``num_new``: the greedy accept kernel writes
        it), read as it is by the compaction and the advance (no add launch)."""
        if rows_kept is not None:
            ops.compact_kv_cache(self.k, self.v, self.seqlens, accept_index, accept_len, rows_kept=rows_kept)
        else:
            ops.compact_kv_cache(self.k, self.v, self.seqlens, accept_index, accept_len)
        self.seqlens.add_(rows_kept if rows_kept is not None else accept_len.to(torch.int32) + 1)
        if accept_len_host is not None:  # None: the caller advances host_len once it has read the length
            self.host_len += int(accept_len_host) + 1
