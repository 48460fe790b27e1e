"""Benchmark cases for the combined GPU benchmark: tree verification (Triton vs the loop-clear PyTorch references,
which walk the tree on the host and therefore include device-host copies)."""

from __future__ import annotations

import torch

from ...drafter.tree import build_tree_buffers
from ...integrations.sglang import TreeMaskMode, build_tree_kernel_efficient, simulate_eagle_draft
from ..tree_convert import linked_lists_to_parents
from .op import tree_speculative_sampling_target_only, verify_tree, verify_tree_greedy
from .reference import tree_speculative_sampling_target_only_ref, verify_tree_greedy_ref, verify_tree_ref


def _tree(bs, V, device, g, K=10, S=7, D=60):
    vid, par, sel, dt = simulate_eagle_draft(bs, K, S, D, vocab_size=V, generator=g, device=device)
    L = torch.full((bs,), 500, dtype=torch.long, device=device)
    _, _, ri, nt, ns, toks = build_tree_kernel_efficient(vid, par, sel, dt, L, 500 * bs, K, S, D,
                                                         TreeMaskMode.QLEN_ONLY)
    return toks.view(bs, D), ri, nt, ns


def _peaked_probs(cand, nt, V, g, device):
    bs, D = cand.shape
    p = torch.rand(bs, D, V, generator=g).to(device)
    kid = cand.gather(1, nt.clamp(min=0))
    p.scatter_add_(2, kid.unsqueeze(-1), torch.full((bs, D, 1), 0.5 * V, device=device))
    return p / p.sum(-1, keepdim=True)


def cases(device) -> list[dict]:
    """60-token trees (top-k 10, 7 steps), vocabularies 32000 and 128256, batch 1 and 8."""
    out = []
    g = torch.Generator().manual_seed(0)
    for bs in (1, 8):
        for V in (32000, 128256):
            cand, ri, nt, ns = _tree(bs, V, device, g)
            D, S1 = cand.shape[1], 8
            probs = _peaked_probs(cand, nt, V, g, device)
            coins = torch.rand(bs, D, generator=g).to(device)
            cf = torch.rand(bs, generator=g).to(device)
            tp = probs.argmax(-1)
            pred = torch.full((bs * D,), -1, dtype=torch.int32, device=device)
            ai = torch.full((bs, S1), -1, dtype=torch.int32, device=device)
            an = torch.zeros(bs, dtype=torch.int32, device=device)
            draft = torch.zeros_like(probs)
            g_args = (pred, ai, an, cand, ri, nt, ns, tp)
            s_args = (pred, ai, an, cand, ri, nt, ns, coins, cf, probs, draft)
            shape = f"bs={bs} D={D} V={V}"
            if V == 32000:
                out.append({"name": "verify_tree_greedy", "shape": shape,
                            "triton": lambda a=g_args: verify_tree_greedy(*a),
                            "ref": lambda a=g_args: verify_tree_greedy_ref(*a), "bytes": 8 * 5 * bs * D})
            out.append({"name": "tree_speculative_sampling_target_only", "shape": shape,
                        "triton": lambda a=s_args: tree_speculative_sampling_target_only(*a),
                        "ref": lambda a=s_args: tree_speculative_sampling_target_only_ref(*a),
                        "bytes": 2 * 4 * bs * V + 8 * 5 * bs * D})
            parents = linked_lists_to_parents(nt, ns)
            retrieve = build_tree_buffers(parents, 7, True)[2]
            e_kw = dict(target_probs=probs, uniform_samples=coins, uniform_samples_for_final_sampling=cf)
            out.append({"name": "verify_tree[sampling]", "shape": shape,
                        "triton": lambda c=cand, r=retrieve, k=e_kw: verify_tree(c, r, **k),
                        "ref": lambda c=cand, r=retrieve, k=e_kw: verify_tree_ref(c, r, **k),
                        "bytes": 4 * bs * V + 8 * bs * D * 10})
    return out
