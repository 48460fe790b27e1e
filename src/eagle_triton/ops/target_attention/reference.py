"""PyTorch reference (the specification) of :func:`~eagle_triton.ops.target_attention.target_attention`.

The attention itself is the one :func:`~eagle_triton.ops.attention.tree_attention` computes (the kernels differ only
in their reduction order, which the reference does not model: fp32 math, compared within the dtype's tolerance).
Besides it, :func:`key_positions_ref` spells out the absolute-position view the kernel reduces in, for tests.
"""

from __future__ import annotations

import torch

from ..attention.reference import tree_attention_ref

__all__ = ["target_attention_ref", "key_positions_ref", "tree_ancestors_ref"]


def _as_bool_mask(tree_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The bool mask a tree mask stands for: a float mask's cells ``> 0.5`` are true (the op reads it as it is)."""
    if tree_mask is not None and tree_mask.is_floating_point():
        return tree_mask > 0.5
    return tree_mask


def target_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    validate: bool = True,
    cache_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.target_attention.target_attention` (same contract; fp32 math).

    Query ``i`` of sequence ``b`` sees cache rows ``[0, L_b)`` and new rows ``L_b + j`` with ``tree_mask[b, i, j]``
    (``j <= i`` when ``tree_mask`` is None; a float mask's cells ``> 0.5`` are true); a row that sees nothing gets
    zeros. With ``cache_slots`` ``[B]``,
    sequence ``b`` reads the rows and the length of cache batch index ``cache_slots[b]`` of the whole cache. No host
    sync (``validate`` is accepted for signature parity and ignored).
    """
    del validate
    tree_mask = _as_bool_mask(tree_mask)
    if cache_slots is not None:  # gather the slots' views: the plain contract on them
        idx = cache_slots.to(k_cache.device).long()
        k_cache, v_cache, cache_seqlens = k_cache[idx], v_cache[idx], cache_seqlens.to(idx.device)[idx]
    return tree_attention_ref(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale)


def tree_ancestors_ref(tree_mask: torch.Tensor) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.target_attention.tree_ancestors`: ``[B, S, S]`` int32, entry
    ``[b, i, d]`` the ``d``-th true column of ``tree_mask[b, i]`` (a float mask's cells ``> 0.5``), -1 past them."""
    m = _as_bool_mask(tree_mask)
    S = m.shape[-1]
    cols = torch.arange(S, device=m.device)
    first = torch.where(m, cols, S + cols).sort(-1).values  # true columns first, in index order
    return torch.where(first < S, first, -1).to(torch.int32)


def key_positions_ref(cache_seqlens: torch.Tensor, tree_mask: torch.Tensor | None, S: int) -> torch.Tensor:
    """Cache row of each key position, ``[B, S, Lmax_needed]`` int64 (-1 where the row sees no key there).

    Row ``i`` sees positions ``0..P_i``: position ``p < L`` is cache row ``p``; position ``L + d`` is new row
    ``L + anc[i, d]``, where ``anc[i, d]`` is the ``d``-th true column of ``tree_mask[b, i]`` (``d``-th column
    ``<= i`` in causal mode, i.e. ``i`` itself at ``d = i``). The kernels reduce keys in exactly this order.
    """
    tree_mask = _as_bool_mask(tree_mask)
    lens = cache_seqlens.long()
    B = lens.shape[0]
    dev = lens.device
    if tree_mask is None:
        tree_mask = torch.ones(S, S, dtype=torch.bool, device=dev).tril().expand(B, S, S)
    anc = tree_ancestors_ref(tree_mask).long()  # -1 past each row's depth (masked below by cnt)
    cnt = tree_mask.sum(-1)  # [B, S]
    width = int(lens.max()) + S if B else 0
    p = torch.arange(width, device=dev)[None, None, :]
    L = lens[:, None, None]
    d = (p - L).clamp(0, S - 1).expand(B, S, width)
    tree_row = L + anc.gather(2, d)
    rows = torch.where(p < L, p, tree_row)
    return torch.where(p < L + cnt[:, :, None], rows, torch.full_like(rows, -1))
