"""Launcher of the SGLang-compatible tree builder: validation, launch, and the sm_90 compile specs."""

from __future__ import annotations

import torch

from .._utils import next_power_of_2
from ._checks import QLEN_ONLY_BITPACKING, check_build_tree_args, packed_bytes_per_row
from .kernel import _build_tree_kernel

__all__ = ["build_tree_kernel_efficient", "AOT_SPECS"]


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build SGLang's EAGLE verification tree in place: drop-in for ``sgl_kernel.build_tree_kernel_efficient``.

    Same argument names and order as sgl-kernel (the misspelled ``retrive_*`` included), same dtypes and layouts;
    unlike the CUDA op, arguments are validated and malformed trees degrade safely (see below).

    Parameters
    ----------
    parent_list : Tensor
        Shape: ``[bs, topk * (depth - 1) + 1]`` int64 (``[bs, 0]`` allowed when ``depth == 1``): flattened
        draft-score index of the parent of each expanded frontier node (``organize_draft_results``).
    selected_index : Tensor
        Shape: ``[bs, D - 1]`` int64, the chosen flattened draft-score indices, **sorted ascending**
        (node ``i`` is ``selected_index[b, i - 1]``; node 0 is the root / verified token).
    verified_seq_len : Tensor
        Shape: ``[bs]`` int64, committed length per request (without the tree tokens).
    tree_mask : Tensor
        Output. ``FULL_MASK`` (0): bool, ``sum(verified_seq_len) * D + bs * D * D`` cells, pre-filled True (the
        prefix columns are never written). ``QLEN_ONLY`` (1): bool ``bs * D * D`` cells. ``QLEN_ONLY_BITPACKING``
        (2): any integer dtype holding ``bs * D * nb`` bytes (``nb`` = 1, 2, 4 for ``D`` <= 8, 16, 32),
        zero-filled; bit ``c`` of row ``(b, t)`` set when node ``t`` attends node ``c``.
    positions : Tensor
        Output, ``bs * D`` int64: ``verified_seq_len[b] + depth(t)`` (root at ``verified_seq_len[b]``).
    retrive_index, retrive_next_token, retrive_next_sibling : Tensor
        Outputs, ``[bs, D]`` int64, pre-filled -1: ``retrive_index[b, i] = b * D + i``; first child (smallest node
        index) and next sibling (next larger node index) links. Links that do not exist are not written.
    topk, depth, draft_token_num : int
        ``K``, ``S`` (spec steps) and ``D`` (tree size including the root, at most 256).
    tree_mask_mode : int or TreeMaskMode

    Notes
    -----
    The parent scan covers exactly the ``D - 1`` entries of the request's row (the CUDA kernel scans ``D``, one past
    the row) and the ancestor walk stops after ``depth`` nodes or at a missing parent. A node whose parent is not
    selected (ties or NaN in the draft scores) is left unlinked, as sgl-kernel does after its "invalid eagle tree"
    warning; its mask row holds the nodes walked before the missing link. Mask writes past the end of ``tree_mask``
    are dropped instead of corrupting memory (the FULL_MASK capacity depends on ``sum(verified_seq_len)``, which the
    op does not read back to the host).
    """
    mode = check_build_tree_args(
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
        retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
    )
    bs = verified_seq_len.shape[0]
    if bs == 0:
        return
    D = draft_token_num
    if mode == QLEN_ONLY_BITPACKING:
        nb = packed_bytes_per_row(D)
        mask_arg = tree_mask.view(-1).view(torch.uint8)
    else:
        nb = 1
        mask_arg = tree_mask
    block_d = max(2, next_power_of_2(D))
    P = parent_list.shape[1]
    _build_tree_kernel[(bs,)](
        parent_list if P > 0 else selected_index,  # never read when P == 0 (every node is a root child or unlinked)
        selected_index,
        verified_seq_len,
        mask_arg,
        positions,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        parent_list.stride(0) if P > 0 else 1,
        selected_index.stride(0),
        P,
        topk,
        depth,
        D,
        mask_arg.numel(),
        MODE=mode,
        NB=nb,
        BLOCK_D=block_d,
        BLOCK_BS=256,
        num_warps=4 if block_d >= 64 else 1,
    )


def _spec(mode: int, block_d: int, nb: int = 1):
    sig = {
        "parent_list_ptr": "*i64", "selected_index_ptr": "*i64", "verified_seq_len_ptr": "*i64",
        "tree_mask_ptr": "*u8" if mode == 2 else "*i1", "positions_ptr": "*i64", "retrive_index_ptr": "*i64",
        "retrive_next_token_ptr": "*i64", "retrive_next_sibling_ptr": "*i64",
        "stride_par": "i32", "stride_sel": "i32", "P": "i32", "topk": "i32", "depth": "i32", "D": "i32",
        "mask_numel": "i64",
    }
    return (_build_tree_kernel, sig, {"MODE": mode, "NB": nb, "BLOCK_D": block_d, "BLOCK_BS": 256})


#: ``(kernel, signature, constexprs)`` triples for the compile-only sm_90 gate.
AOT_SPECS = [_spec(0, 64), _spec(1, 64), _spec(2, 32, 4), _spec(2, 8, 1)]
