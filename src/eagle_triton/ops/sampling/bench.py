"""Benchmark cases for the combined GPU benchmark: sampling helpers over the verify rows (batch x 60 tree tokens)."""

from __future__ import annotations

import torch

from .op import sampling_from_probs, softmax_with_temperature, top_k_renorm_probs, top_p_renorm_probs
from .reference import (
    sampling_from_probs_ref,
    softmax_with_temperature_ref,
    top_k_renorm_probs_ref,
    top_p_renorm_probs_ref,
)


def cases(device) -> list[dict]:
    """Rows = 60 (one tree) and 480 (8 trees); vocabularies 32000 and 128256. The sampling reference loops over
    rows on the host, so its case uses 60 rows only."""
    out = []
    g = torch.Generator().manual_seed(0)
    for M in (60, 480):
        for V in (32000, 128256):
            logits = (torch.randn(M, V, generator=g) * 3).to(device=device, dtype=torch.bfloat16)
            probs = torch.softmax(logits.float(), -1)
            shape = f"rows={M} V={V}"
            row_bytes = M * V * 4
            out += [
                {"name": "softmax_with_temperature[bf16]", "shape": shape,
                 "triton": lambda x=logits: softmax_with_temperature(x, 0.7),
                 "ref": lambda x=logits: softmax_with_temperature_ref(x, 0.7), "bytes": M * V * 6},
                {"name": "top_k_renorm_probs[k=50]", "shape": shape,
                 "triton": lambda p=probs: top_k_renorm_probs(p, 50),
                 "ref": lambda p=probs: top_k_renorm_probs_ref(p, 50), "bytes": 2 * row_bytes},
                {"name": "top_p_renorm_probs[p=0.9]", "shape": shape,
                 "triton": lambda p=probs: top_p_renorm_probs(p, 0.9),
                 "ref": lambda p=probs: top_p_renorm_probs_ref(p, 0.9), "bytes": 2 * row_bytes},
            ]
            if M == 60:
                u = torch.rand(M, generator=g).to(device)
                out.append({"name": "sampling_from_probs", "shape": shape,
                            "triton": lambda p=probs, u=u: sampling_from_probs(p, u),
                            "ref": lambda p=probs, u=u: sampling_from_probs_ref(p, u), "bytes": row_bytes})
    return out
