"""PyTorch references of the sampling helpers (the specification).

* :func:`softmax_with_temperature_ref`: ``softmax(logits / temperature)`` in float32.
* :func:`top_k_renorm_probs_ref`: keep every probability ``>= `` the ``k``-th largest of its row (ties at the
  threshold are all kept), zero the rest, renormalise. ``k <= 0`` or ``k >= V`` keeps the whole row.
* :func:`top_p_renorm_probs_ref`: keep every probability ``>= tau`` where ``tau`` is the largest value whose
  "mass at or above" reaches ``top_p`` (the smallest high-probability set covering ``top_p``, ties at the threshold
  kept), zero the rest, renormalise.
* :func:`sampling_from_probs_ref`: inverse-CDF draw: ``u = coin * sum(p)``; the first index whose inclusive
  cumulative sum exceeds ``u`` among ``p > 0``; else the last positive index; ``V - 1`` for an all-zero row.
* :func:`philox_uniform_ref`: counter-based uniforms in ``[0, 1)``: Philox-4x32-10 with key ``seed`` (low, high
  32 bits) and counter ``(offset + i) (low, high), 0, 0``; the uniform is ``(c0 >> 8) * 2**-24`` (never 1.0).
"""

from __future__ import annotations

import torch

from ._checks import check_probs, per_row

__all__ = [
    "softmax_with_temperature_ref",
    "top_k_renorm_probs_ref",
    "top_p_renorm_probs_ref",
    "sampling_from_probs_ref",
    "philox_uniform_ref",
]

_M32 = 0xFFFFFFFF


def softmax_with_temperature_ref(logits: torch.Tensor, temperature) -> torch.Tensor:
    """Reference of :func:`eagle_triton.ops.softmax_with_temperature`."""
    check_probs("logits", logits, float_only=False)
    t = per_row(temperature, logits.shape[0], torch.float32, logits.device, "temperature")
    return torch.softmax(logits.float() / t.unsqueeze(1), dim=-1)


def top_k_renorm_probs_ref(probs: torch.Tensor, top_k) -> torch.Tensor:
    """Reference of :func:`eagle_triton.ops.top_k_renorm_probs`."""
    check_probs("probs", probs)
    M, V = probs.shape
    k = per_row(top_k, M, torch.int64, probs.device, "top_k")
    sorted_p = probs.sort(dim=-1, descending=True).values
    kk = k.clamp(1, V)
    tau = sorted_p.gather(1, (kk - 1).unsqueeze(1))
    tau = torch.where(((k <= 0) | (k >= V)).unsqueeze(1), torch.zeros_like(tau), tau)
    kept = torch.where(probs >= tau, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_probs_ref(probs: torch.Tensor, top_p) -> torch.Tensor:
    """Reference of :func:`eagle_triton.ops.top_p_renorm_probs`."""
    check_probs("probs", probs)
    M, V = probs.shape
    p = per_row(top_p, M, torch.float32, probs.device, "top_p")
    sorted_p = probs.sort(dim=-1, descending=True).values
    csum = sorted_p.cumsum(-1)
    # Smallest n with csum[n-1] >= top_p (n = V when none): tau = sorted_p[n-1].
    reach = csum >= p.unsqueeze(1)
    n = torch.where(reach.any(-1), reach.to(torch.int8).argmax(-1), torch.full_like(p, V - 1, dtype=torch.int64))
    tau = sorted_p.gather(1, n.unsqueeze(1))
    tau = torch.where(reach.any(-1, keepdim=True) & (p < 1).unsqueeze(1), tau, torch.zeros_like(tau))
    kept = torch.where(probs >= tau, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def sampling_from_probs_ref(probs: torch.Tensor, uniform_samples=None, seed=None, offset=None) -> torch.Tensor:
    """Reference of :func:`eagle_triton.ops.sampling_from_probs`."""
    check_probs("probs", probs)
    M, V = probs.shape
    if uniform_samples is None:
        if seed is None or offset is None:
            raise ValueError("pass uniform_samples [M], or seed and offset tensors")
        uniform_samples = philox_uniform_ref(seed, offset, M)
    u_in = uniform_samples.float().to(probs.device)
    r = probs.clamp(min=0)
    out = torch.empty(M, dtype=torch.int64, device=probs.device)
    for i in range(M):  # loop-clear: float32 sum and sequential float32 cumulative sum, as the kernel's order
        row = r[i].cpu()
        total = row.sum()
        u = u_in[i].cpu() * total
        cdf = torch.from_numpy(row.numpy().cumsum(dtype="float32"))
        hit = torch.nonzero((cdf > u) & (row > 0)).flatten()
        if hit.numel():
            out[i] = hit[0]
        else:
            pos = torch.nonzero(row > 0).flatten()
            out[i] = pos[-1] if pos.numel() else V - 1
    return out


def _umulhi32(a: torch.Tensor, b: int) -> torch.Tensor:
    ah, al = a >> 16, a & 0xFFFF
    bh, bl = b >> 16, b & 0xFFFF
    mid = ah * bl + al * bh
    return (ah * bh + ((mid << 16) + al * bl >> 32)) & _M32


def philox_uniform_ref(seed: torch.Tensor, offset: torch.Tensor, n: int) -> torch.Tensor:
    """Reference of :func:`eagle_triton.ops.philox_uniform`: ``[n]`` float32 uniforms for counters
    ``offset + arange(n)`` under key ``seed`` (both int64 tensors with one element)."""
    dev = seed.device
    s = int(seed.reshape(-1)[0].item()) & 0xFFFFFFFFFFFFFFFF
    ctr = offset.reshape(-1)[:1].long().cpu() + torch.arange(n, dtype=torch.int64)
    c0 = ctr & _M32
    c1 = (ctr >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = s & _M32, s >> 32
    A, B = 0xD2511F53, 0xCD9E8D57
    for _ in range(10):
        _c0, _c2 = c0, c2
        c0 = _umulhi32(_c2, B) ^ c1 ^ k0
        c2 = _umulhi32(_c0, A) ^ c3 ^ k1
        c1 = (_c2 * B) & _M32
        c3 = (_c0 * A) & _M32
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return ((c0 >> 8).float() * (1.0 / 16777216.0)).to(dev)
