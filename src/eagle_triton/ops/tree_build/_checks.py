"""Argument validation shared by :func:`build_tree_kernel_efficient` and its reference."""

from __future__ import annotations

import torch

from .._utils import check_tensor

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2
_MODES = {FULL_MASK: "FULL_MASK", QLEN_ONLY: "QLEN_ONLY", QLEN_ONLY_BITPACKING: "QLEN_ONLY_BITPACKING"}
MAX_DRAFT_TOKENS = 256


def packed_bytes_per_row(draft_token_num: int) -> int:
    """Bytes per mask row in QLEN_ONLY_BITPACKING mode (sgl-kernel's rule: 1, 2 or 4)."""
    if draft_token_num > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING supports draft_token_num <= 32, got {draft_token_num}")
    return 1 if draft_token_num <= 8 else (2 if draft_token_num <= 16 else 4)


def check_build_tree_args(
    parent_list, selected_index, verified_seq_len, tree_mask, positions,
    retrive_index, retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
) -> int:
    """Validate the op's arguments; returns ``tree_mask_mode`` as an int. Raises ``ValueError``/``TypeError``."""
    for name, v in (("topk", topk), ("depth", depth), ("draft_token_num", draft_token_num)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if depth < 1:
        raise ValueError(f"depth (spec_steps) must be >= 1, got {depth}")
    D = draft_token_num
    if not 1 <= D <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft_token_num must be in [1, {MAX_DRAFT_TOKENS}], got {D}")
    mode = int(tree_mask_mode)
    if mode not in _MODES:
        raise ValueError(f"tree_mask_mode must be 0 (FULL_MASK), 1 (QLEN_ONLY) or 2 (QLEN_ONLY_BITPACKING), got {mode}")
    check_tensor("verified_seq_len", verified_seq_len, ndim=1, dtypes=(torch.int64,))
    bs = verified_seq_len.shape[0]
    dev = verified_seq_len.device
    P = topk * (depth - 1) + 1
    check_tensor("selected_index", selected_index, shape=(bs, D - 1), dtypes=(torch.int64,), device=dev)
    check_tensor("parent_list", parent_list, ndim=2, dtypes=(torch.int64,), device=dev)
    if parent_list.shape[0] != bs or parent_list.shape[1] not in ((P, 0) if depth == 1 else (P,)):
        raise ValueError(
            f"parent_list must have shape [bs, topk * (depth - 1) + 1] = [{bs}, {P}]"
            f"{' (or [bs, 0] when depth == 1)' if depth == 1 else ''}, got {list(parent_list.shape)}"
        )
    for name, t in (("selected_index", selected_index), ("parent_list", parent_list)):
        if t.numel() and t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        check_tensor(name, t, shape=(bs, D), dtypes=(torch.int64,), device=dev)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    check_tensor("positions", positions, dtypes=(torch.int64,), device=dev)
    if positions.numel() != bs * D or not positions.is_contiguous():
        raise ValueError(f"positions must be a contiguous tensor of bs * draft_token_num = {bs * D} elements, "
                         f"got shape {list(positions.shape)}")
    check_tensor("tree_mask", tree_mask, device=dev)
    if not tree_mask.is_contiguous():
        raise ValueError("tree_mask must be contiguous")
    if mode in (FULL_MASK, QLEN_ONLY):
        if tree_mask.dtype != torch.bool:
            raise TypeError(f"tree_mask must be bool in {_MODES[mode]} mode, got {tree_mask.dtype}")
        need = bs * D * D
        if tree_mask.numel() < need:
            what = "sum(verified_seq_len) * D + bs * D * D" if mode == FULL_MASK else "bs * D * D"
            raise ValueError(f"tree_mask capacity {tree_mask.numel()} is below {need} (it must hold {what} cells)")
    else:
        nb = packed_bytes_per_row(D)
        if tree_mask.is_floating_point() or tree_mask.is_complex() or tree_mask.dtype == torch.bool:
            raise TypeError(f"tree_mask must be an integer tensor in QLEN_ONLY_BITPACKING mode, got {tree_mask.dtype}")
        have = tree_mask.numel() * tree_mask.element_size()
        if have < bs * D * nb:
            raise ValueError(f"tree_mask holds {have} bytes, below bs * D * {nb} = {bs * D * nb} bytes "
                             f"({nb} bytes per row for draft_token_num = {D})")
    return mode
