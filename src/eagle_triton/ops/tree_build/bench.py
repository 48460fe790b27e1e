"""Benchmark cases for the combined GPU benchmark: tree build (Triton vs the vectorised PyTorch reference)."""

from __future__ import annotations

import torch

from ...integrations.sglang import simulate_eagle_draft
from .op import build_tree_kernel_efficient
from .reference import build_tree_kernel_efficient_ref


def cases(device) -> list[dict]:
    """EAGLE-3 default tree (60 tokens, top-k 10, 7 steps) for FULL_MASK / QLEN_ONLY, and a 32-token bit-packed
    tree, at batch 1, 8 and 64."""
    out = []
    g = torch.Generator().manual_seed(0)
    for bs in (1, 8, 64):
        for mode, (K, S, D) in ((0, (10, 7, 60)), (1, (10, 7, 60)), (2, (8, 6, 32))):
            _, par, sel, _ = simulate_eagle_draft(bs, K, S, D, generator=g, device=device)
            L = torch.randint(100, 4000, (bs,), generator=g).to(device)
            if mode == 0:
                tm = torch.ones(int(L.sum()) * D + bs * D * D, dtype=torch.bool, device=device)
            elif mode == 1:
                tm = torch.ones(bs * D * D, dtype=torch.bool, device=device)
            else:
                tm = torch.zeros(bs * D, dtype=torch.int32, device=device)
            pos = torch.empty(bs * D, dtype=torch.long, device=device)
            rb = torch.full((3, bs, D), -1, dtype=torch.long, device=device)
            args = (par, sel, L, tm, pos, rb[0], rb[1], rb[2], K, S, D, mode)
            mask_bytes = bs * D * (D if mode else D) * (1 if mode != 2 else 0) + (bs * D * 4 if mode == 2 else 0)
            nbytes = 8 * (par.numel() + sel.numel() + bs + bs * D * 4) + mask_bytes
            out.append({
                "name": f"build_tree_kernel_efficient[{['FULL_MASK', 'QLEN_ONLY', 'BITPACK'][mode]}]",
                "shape": f"bs={bs} D={D} K={K} S={S}",
                "triton": lambda a=args: build_tree_kernel_efficient(*a),
                "ref": lambda a=args: build_tree_kernel_efficient_ref(*a),
                "bytes": nbytes,
            })
    return out
