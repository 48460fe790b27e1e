"""SGLang's EAGLE Python-level helpers, backed by eagle-triton's kernels.

Same names, argument order, keyword names, dtypes and return values as SGLang's
``python/sglang/srt/speculative/{eagle_utils,spec_utils}.py`` (read for behaviour; this is an independent
implementation). The kernel-level ops (``build_tree_kernel_efficient`` with sgl-kernel's signature,
``verify_tree_greedy``, ``tree_speculative_sampling_target_only``) are re-exported from :mod:`eagle_triton.ops`, so
``from eagle_triton.compat.sglang import ...`` can replace both ``sgl_kernel`` and SGLang's helpers.

Everything here is graph-capturable (no host sync) except where noted.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from ..ops import _dispatch
from ..ops import tree_build as _tb
from ..ops import verify as _vf

# The Triton kernels on a GPU (or under the interpreter), their references for plain CPU tensors.
_build_tree_op = _dispatch.with_cpu_fallback(_tb.build_tree_kernel_efficient, _tb.build_tree_kernel_efficient_ref)
verify_tree_greedy = _dispatch.with_cpu_fallback(_vf.verify_tree_greedy, _vf.verify_tree_greedy_ref)
tree_speculative_sampling_target_only = _dispatch.with_cpu_fallback(
    _vf.tree_speculative_sampling_target_only, _vf.tree_speculative_sampling_target_only_ref)

__all__ = [
    "TreeMaskMode",
    "build_tree_kernel_efficient",
    "organize_draft_results",
    "select_top_k_tokens",
    "fast_topk",
    "verify_tree_greedy",
    "tree_speculative_sampling_target_only",
    "packed_tree_mask_dtype",
]


class TreeMaskMode(IntEnum):
    """Layout of the tree attention mask written by :func:`build_tree_kernel_efficient` (passed as an int)."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


def fast_topk(values: torch.Tensor, topk: int, dim: int):
    """``torch.max(..., keepdim=True)`` when ``topk == 1`` (same output rank as the general case), else
    ``torch.topk``. Returns ``(values, indices)``."""
    if topk == 1:
        return torch.max(values, dim=dim, keepdim=True)
    return torch.topk(values, topk, dim=dim)


def select_top_k_tokens(
    i: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor,
    scores: torch.Tensor,
    topk: int,
):
    """One EAGLE draft step's frontier selection (SGLang's ``select_top_k_tokens``).

    Parameters
    ----------
    i : int
        Draft step (0 = the first step after draft-extend).
    topk_p, topk_index : Tensor
        Per-leaf top-k draft probabilities / target-vocab ids: ``[bs, K]`` at step 0, ``[bs*K, K]`` later.
    hidden_states : Tensor
        ``[bs, H]`` at step 0, ``[bs*K, H]`` later (one row per current leaf).
    scores : Tensor or None
        ``[bs, K]`` cumulative path probabilities of the current leaves (ignored at step 0).
    topk : int

    Returns
    -------
    input_ids : ``[bs*K]`` next draft inputs; hidden_states : ``[bs*K, H]`` (parent leaf rows); scores : ``[bs, K]``;
    tree_info : ``(score_chunk, token_chunk, parent_chunk)`` with shapes ``[bs, 1, K]``, ``[bs, K]``, ``[bs, K+1]``
    at step 0 and ``[bs, K, K]``, ``[bs, K*K]``, ``[bs, K]`` later (parents are flattened-score indices).
    """
    if i == 0:
        input_ids = topk_index.flatten()
        hidden_states = hidden_states.repeat_interleave(topk, dim=0)
        scores = topk_p
        parents = torch.arange(-1, topk, dtype=torch.long, device=topk_p.device).unsqueeze(0)
        tree_info = (topk_p.unsqueeze(1), topk_index, parents.repeat(topk_p.shape[0], 1))
        return input_ids, hidden_states, scores, tree_info
    expand_scores = scores.unsqueeze(2) * topk_p.reshape(-1, topk, topk)  # [bs, K, K]
    topk_cs_p, topk_cs_index = fast_topk(expand_scores.flatten(start_dim=1), topk, dim=-1)
    topk_index = topk_index.reshape(-1, topk * topk)
    input_ids = torch.gather(topk_index, index=topk_cs_index, dim=1).flatten()
    leaf_base = torch.arange(0, hidden_states.shape[0], step=topk, device=hidden_states.device)
    rows = topk_cs_index.flatten() // topk + leaf_base.repeat_interleave(topk)
    hidden_states = hidden_states[rows, :]
    tree_info = (expand_scores, topk_index, topk_cs_index + (topk * topk * (i - 1) + topk))
    return input_ids, hidden_states, topk_cs_p, tree_info


def organize_draft_results(score_list, token_list, parents_list, num_draft_token: int):
    """Pick the ``num_draft_token - 1`` best candidates of a draft (SGLang's ``organize_draft_results``).

    Returns ``(parent_list [bs, K*(S-1)+1] int64 (or [bs, 0] when S == 1), top_scores_index [bs, D-1] int64
    sorted ascending, draft_tokens [bs, D-1])``.
    """
    scores = torch.cat(score_list, dim=1).flatten(1)
    ss_token_list = torch.cat(token_list, dim=1)
    top_scores_index = torch.topk(scores, num_draft_token - 1, dim=-1).indices
    top_scores_index = torch.sort(top_scores_index).values
    draft_tokens = torch.gather(ss_token_list, index=top_scores_index, dim=1)
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty(parents_list[0].shape[0], 0, dtype=torch.long, device=parents_list[0].device)
    return parent_list, top_scores_index, draft_tokens


def packed_tree_mask_dtype(num_verify_tokens: int) -> torch.dtype:
    """Element dtype SGLang uses for QLEN_ONLY_BITPACKING masks: uint8 / uint16 / uint32 for D <= 8 / 16 / 32."""
    if not 1 <= num_verify_tokens <= 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING supports 1..32 verify tokens, got {num_verify_tokens}")
    return torch.uint8 if num_verify_tokens <= 8 else (torch.uint16 if num_verify_tokens <= 16 else torch.uint32)


def build_tree_kernel_efficient(
    verified_id: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
    tree_mask_buf: torch.Tensor | None = None,
    position_buf: torch.Tensor | None = None,
):
    """SGLang's Python wrapper: allocate and pre-fill the outputs, then run the tree-build kernel.

    Parameters
    ----------
    verified_id : ``[bs]`` root tokens (last verified / bonus token of each request).
    parent_list, top_scores_index, draft_tokens : outputs of :func:`organize_draft_results`.
    seq_lens : ``[bs]`` int64 committed lengths (without tree tokens); ``seq_lens_sum`` = ``seq_lens.sum()`` as a
        host int (sizes the FULL_MASK buffer).
    topk, spec_steps, num_verify_tokens : ``K``, ``S``, ``D``.
    tree_mask_mode : :class:`TreeMaskMode`.
    tree_mask_buf, position_buf : optional preallocated (CUDA-graph-static) buffers; they are re-filled here
        (True for FULL_MASK / QLEN_ONLY, zero for bit-packing) and written in place.

    Returns
    -------
    ``(tree_mask, positions [bs*D] int64, retrive_index, retrive_next_token, retrive_next_sibling [bs, D] int64,
    draft_tokens [bs*D])`` where the returned ``draft_tokens`` has each request's root first.
    """
    draft_tokens = torch.cat((verified_id.unsqueeze(1).to(draft_tokens.dtype), draft_tokens), dim=1).flatten()
    bs = seq_lens.numel()
    device = seq_lens.device
    D = num_verify_tokens
    mode = TreeMaskMode(int(tree_mask_mode))
    if tree_mask_buf is not None:
        tree_mask = tree_mask_buf
        if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
            tree_mask.fill_(0)
        else:
            tree_mask.fill_(True)
    elif mode == TreeMaskMode.QLEN_ONLY:
        tree_mask = torch.full((D * bs * D,), True, dtype=torch.bool, device=device)
    elif mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        tree_mask = torch.zeros((D * bs,), dtype=packed_tree_mask_dtype(D), device=device)
    else:
        if int(seq_lens_sum) < 0:
            raise ValueError(f"seq_lens_sum must be >= 0, got {seq_lens_sum}")
        tree_mask = torch.full((int(seq_lens_sum) * D + D * D * bs,), True, dtype=torch.bool, device=device)
    if mode == TreeMaskMode.FULL_MASK and tree_mask.numel() < int(seq_lens_sum) * D + D * D * bs:
        raise ValueError(
            f"tree_mask_buf holds {tree_mask.numel()} cells, below seq_lens_sum * D + D * D * bs = "
            f"{int(seq_lens_sum) * D + D * D * bs}"
        )
    retrieve_buf = torch.full((3, bs, D), -1, device=device, dtype=torch.long)
    retrive_index, retrive_next_token, retrive_next_sibling = retrieve_buf
    if position_buf is not None:
        if position_buf.numel() != bs * D or position_buf.dtype != torch.long:
            raise ValueError(f"position_buf must hold bs * D = {bs * D} int64 values, got {position_buf.numel()} "
                             f"{position_buf.dtype}")
        positions = position_buf
    else:
        positions = torch.empty((bs * D,), device=device, dtype=torch.long)
    _build_tree_op(
        parent_list, top_scores_index, seq_lens, tree_mask, positions, retrive_index, retrive_next_token,
        retrive_next_sibling, topk, spec_steps, D, int(mode),
    )
    return tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, draft_tokens


def simulate_eagle_draft(
    bs: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    vocab_size: int = 32000,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    hidden_size: int = 8,
):
    """Run SGLang's draft post-processing on random draft distributions (for tests and benchmarks).

    Each step draws random per-leaf top-k probabilities and token ids, then goes through
    :func:`select_top_k_tokens` and :func:`organize_draft_results` exactly as an EAGLE worker would.
    Returns ``(verified_id [bs], parent_list, top_scores_index, draft_tokens)``, all int64 on ``device``.
    """
    K, S = topk, spec_steps
    g = generator
    hidden = torch.randn(bs, hidden_size, generator=g).to(device)
    score_list, token_list, parents_list = [], [], []
    scores = None
    rows = bs
    for i in range(S):
        raw = torch.rand(rows, K, generator=g) + 1e-3
        p = (raw / (raw.sum(-1, keepdim=True) * (1.0 + torch.rand(rows, 1, generator=g)))).sort(-1, True).values
        idx = torch.randint(0, vocab_size, (rows, K), generator=g)
        _, hidden, scores, info = select_top_k_tokens(i, p.to(device), idx.to(device), hidden, scores, K)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
        rows = bs * K
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        score_list, token_list, parents_list, num_verify_tokens
    )
    verified_id = torch.randint(0, vocab_size, (bs,), generator=g).to(device)
    return verified_id, parent_list, top_scores_index, draft_tokens
