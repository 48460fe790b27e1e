"""PyTorch references (the specification) for :mod:`eagle_triton.ops.attention`.

Both compute in fp32 from upcast inputs, build the full visibility mask explicitly and return the input dtype. They
avoid host syncs (masks are built from device tensors), so an engine can swap them in for the kernels inside a
captured graph.
"""

from __future__ import annotations

import math

import torch

from ...heads.layers import rotate_half

__all__ = ["tree_attention_ref", "draft_tree_attention_ref", "rope_ref"]


def _gqa(x: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    return x if group == 1 else x.repeat_interleave(group, dim=dim)


def _masked_softmax_av(scores: torch.Tensor, vis: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``softmax(scores)`` over visible keys (rows with none give zeros), times ``values``; fp32."""
    scores = scores.masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(vis.any(-1, keepdim=True), probs, torch.zeros_like(probs))
    return torch.einsum("bhtl,bhld->bhtd", probs, values)


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    tree_mask: torch.Tensor | None,
    softmax_scale: float | None = None,
    **_: object,
) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.attention.tree_attention` (same contract; fp32 math).

    Query ``i`` of sequence ``b`` sees cache rows ``[0, L_b)`` (``L_b = cache_seqlens[b]``) and tree rows
    ``L_b + j`` for which ``tree_mask[b, i, j]`` is true (``j <= i`` when ``tree_mask`` is None).
    """
    B, Tq, Hq, D = q.shape
    Lmax, Hkv = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    dev = q.device
    lens = cache_seqlens.to(device=dev, dtype=torch.long)
    rel = torch.arange(Lmax, device=dev)[None, :] - lens[:, None]  # [B, Lmax] key row - prefix length
    in_tree = (rel >= 0) & (rel < Tq)
    t = rel.clamp(0, Tq - 1)
    if tree_mask is None:
        tm = t[:, None, :] <= torch.arange(Tq, device=dev)[None, :, None]
    else:
        tm = tree_mask.to(torch.bool).gather(2, t[:, None, :].expand(B, Tq, Lmax))
    vis = (rel < 0)[:, None, :] | (in_tree[:, None, :] & tm)  # [B, Tq, Lmax]
    k = _gqa(k_cache.float(), Hq // Hkv, 2).permute(0, 2, 3, 1)  # [B, Hq, D, Lmax]
    v = _gqa(v_cache.float(), Hq // Hkv, 2).permute(0, 2, 1, 3)  # [B, Hq, Lmax, D]
    scores = torch.matmul(q.float().permute(0, 2, 1, 3), k) * scale  # [B, Hq, Tq, Lmax]
    out = _masked_softmax_av(scores, vis[:, None], v)
    return out.permute(0, 2, 1, 3).to(q.dtype).contiguous()


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Half-rotation RoPE in fp32: ``x [B, N, H, D]`` at ``position_ids [B, N]`` with tables ``[P, D]``."""
    c = cos.float()[position_ids.long()][:, :, None, :]
    s = sin.float()[position_ids.long()][:, :, None, :]
    x32 = x.float()
    return x32 * c + rotate_half(x32) * s


def draft_tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: torch.Tensor,
    anc_k: torch.Tensor,
    anc_v: torch.Tensor,
    anc_len: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    softmax_scale: float | None = None,
    **_: object,
) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.attention.draft_tree_attention` (same contract and side effect).

    RoPE is applied to ``q`` and ``k_new`` in fp32 and rounded to the input dtype; node ``n`` attends to the prefix
    rows ``[0, prefix_len[b])``, its packed ancestors ``anc_k[b, n, :anc_len[b, n]]`` and itself. Afterwards the
    rotated ``k_new`` and ``v_new`` are written to slot ``anc_len[b, n]`` of ``anc_k`` / ``anc_v``.
    """
    B, N, Hq, D = q.shape
    Lmax, Hkv = k_cache.shape[1], k_cache.shape[2]
    A = anc_k.shape[2]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    dev = q.device
    qr = rope_ref(q, cos, sin, position_ids).to(q.dtype).float()  # [B, N, Hq, D]
    kr = rope_ref(k_new, cos, sin, position_ids).to(k_new.dtype)  # [B, N, Hkv, D]
    qh = qr.permute(0, 2, 1, 3)  # [B, Hq, N, D]

    kp = _gqa(k_cache.float(), G, 2).permute(0, 2, 1, 3)  # [B, Hq, Lmax, D]
    vp = _gqa(v_cache.float(), G, 2).permute(0, 2, 1, 3)
    s_pre = torch.matmul(qh, kp.transpose(-1, -2)) * scale  # [B, Hq, N, Lmax]
    vis_pre = (torch.arange(Lmax, device=dev)[None, :] < prefix_len.to(dev).long()[:, None])[:, None, None, :]
    vis_pre = vis_pre.expand(B, Hq, N, Lmax)

    ka = _gqa(anc_k.float(), G, 3).permute(0, 3, 1, 2, 4)  # [B, Hq, N, A, D]
    va = _gqa(anc_v.float(), G, 3).permute(0, 3, 1, 2, 4)
    s_anc = torch.einsum("bhnd,bhnad->bhna", qh, ka) * scale  # [B, Hq, N, A]
    vis_anc = (torch.arange(A, device=dev)[None, None, :] < anc_len.to(dev).long()[:, :, None])[:, None]
    vis_anc = vis_anc.expand(B, Hq, N, A)

    ks = _gqa(kr.float(), G, 2).permute(0, 2, 1, 3)  # [B, Hq, N, D]
    vs = _gqa(v_new.float(), G, 2).permute(0, 2, 1, 3)
    s_self = (qh * ks).sum(-1, keepdim=True) * scale  # [B, Hq, N, 1]

    scores = torch.cat((s_pre, s_anc, s_self), dim=-1)
    vis = torch.cat((vis_pre, vis_anc, torch.ones_like(s_self, dtype=torch.bool)), dim=-1)
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
    p_pre, p_anc, p_self = probs.split([Lmax, A, 1], dim=-1)
    out = torch.matmul(p_pre, vp) + torch.einsum("bhna,bhnad->bhnd", p_anc, va) + p_self * vs
    out = out.permute(0, 2, 1, 3).to(q.dtype).contiguous()

    bi = torch.arange(B, device=dev)[:, None].expand(B, N)
    ni = torch.arange(N, device=dev)[None, :].expand(B, N)
    slot = anc_len.to(dev).long().clamp(max=A - 1)
    anc_k[bi, ni, slot] = kr.to(anc_k.dtype)
    anc_v[bi, ni, slot] = v_new.to(anc_v.dtype)
    return out
