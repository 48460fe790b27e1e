"""Random inputs shared by the RoPE + KV-write tests (tests/ops/test_rope_kv.py, tests/ops/test_qkv_rope.py)."""

from __future__ import annotations

import torch


def rope_cache_case(g: torch.Generator, B: int, Lmax: int, Hkv: int, D: int, starts, dtype, device, S: int):
    """Rotary tables (``rotate_half`` convention, random frequencies), random K/V caches ``[B, Lmax, Hkv, D]``,
    the committed lengths ``starts`` and tree-like positions ``[B, S]`` (each row at its start plus a depth of
    0-3). Returns ``cos, sin, k_cache, v_cache, seqlens, positions``."""
    P = Lmax + 8
    ang = torch.arange(P)[:, None] * torch.rand(D // 2, generator=g)[None, :]
    ang = torch.cat((ang, ang), 1)
    cos, sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
    kc = torch.randn(B, Lmax, Hkv, D, generator=g).to(device, dtype)
    vc = torch.randn(B, Lmax, Hkv, D, generator=g).to(device, dtype)
    seqlens = torch.tensor(starts, dtype=torch.int32, device=device)
    pos = (seqlens.long().cpu()[:, None] + torch.randint(0, 4, (B, S), generator=g)).to(device)
    return cos, sin, kc, vc, seqlens, pos
