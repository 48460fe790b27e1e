"""Triton kernels of the sampling helpers: temperature softmax, top-k / top-p renormalisation, inverse-CDF sampling
and a counter-based Philox uniform generator.

Status: tested against :mod:`.reference` under ``TRITON_INTERPRET=1`` (Triton 3.9) and compiled for sm_90; GPU runs
use Triton 3.6. One program per row, streaming the vocabulary in ``BLOCK_V`` chunks. The top-k / top-p threshold is
found exactly by a radix search on the float32 bit patterns (non-negative floats order like their bits): 8 passes,
each counting (or summing the mass of) the row against 16 candidate thresholds at once. Philox is written out here
(not ``tl.rand``) so that the stream is identical across Triton versions and to the PyTorch reference.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _philox_uniform(seed_lo, seed_hi, ctr):
    """Philox-4x32-10 on counter ``(ctr_lo, ctr_hi, 0, 0)``; returns ``(c0 >> 8) * 2**-24`` in ``[0, 1)``."""
    c0 = (ctr & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((ctr >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = c0 * 0
    c3 = c0 * 0
    k0 = seed_lo + c2
    k1 = seed_hi + c2
    for _ in tl.static_range(10):
        _c0 = c0
        _c2 = c2
        c0 = tl.math.umulhi(_c2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.math.umulhi(_c0, 0xD2511F53) ^ c3 ^ k1
        c1 = _c2 * 0xCD9E8D57
        c3 = _c0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return (c0 >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _load_seed(seed_ptr):
    s = tl.load(seed_ptr)
    lo = (s & 0xFFFFFFFF).to(tl.uint32)
    hi = ((s >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return lo, hi


@triton.jit
def _philox_kernel(out_ptr, seed_ptr, offset_ptr, n, BLOCK: tl.constexpr):
    """``out[i] = uniform(seed, offset + i)``."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lo, hi = _load_seed(seed_ptr)
    u = _philox_uniform(lo, hi, tl.load(offset_ptr) + i)
    tl.store(out_ptr + i, u, mask=i < n)


@triton.jit
def _softmax_temperature_kernel(logits_ptr, temp_ptr, out_ptr, V, BLOCK_V: tl.constexpr):
    """``out[row] = softmax(logits[row] / temperature[row])`` in float32 (online max/sum, then one write pass)."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(temp_ptr + row)
    m_i = tl.full([BLOCK_V], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        idx = start + tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + row * V + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        x = tl.math.div_rn(x, t + tl.zeros_like(x))
        m_new = tl.maximum(m_i, x)
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m_i - m_new))
        l_i = l_i * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        m_i = m_new
    m = tl.max(m_i, axis=0)
    l_sum = tl.sum(l_i * tl.where(m_i == float("-inf"), 0.0, tl.exp(m_i - m)), axis=0)
    for start in range(0, V, BLOCK_V):
        idx = start + tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + row * V + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        x = tl.math.div_rn(x, t + tl.zeros_like(x))
        e = tl.where(x == float("-inf"), 0.0, tl.exp(x - m))
        tl.store(out_ptr + row * V + idx, tl.math.div_rn(e, l_sum + tl.zeros_like(e)), mask=idx < V)


@triton.jit
def _renorm_kernel(probs_ptr, param_ptr, out_ptr, V, TOP_P: tl.constexpr, BLOCK_V: tl.constexpr):
    """Keep ``p >= tau`` and renormalise; ``tau`` = k-th largest (``TOP_P`` False) or the top-p threshold."""
    row = tl.program_id(0).to(tl.int64)
    base = probs_ptr + row * V
    if TOP_P:
        target_mass = tl.load(param_ptr + row).to(tl.float32)
    else:
        k = tl.load(param_ptr + row).to(tl.int64)
        k = tl.where(k <= 0, V + 1, k)  # k <= 0 keeps the whole row
    js = tl.arange(0, 16).to(tl.int64)
    t = tl.zeros([], dtype=tl.int64)
    for d in tl.static_range(8):
        shift = 28 - 4 * d
        cand = t + (js << shift)
        cnt = tl.zeros([16], dtype=tl.int64)
        mass = tl.zeros([16], dtype=tl.float32)
        for start in range(0, V, BLOCK_V):
            idx = start + tl.arange(0, BLOCK_V)
            m = idx < V
            p = tl.load(base + idx, mask=m, other=0.0)
            bits = p.to(tl.int32, bitcast=True).to(tl.int64)
            ge = (bits[:, None] >= cand[None, :]) & m[:, None]
            cnt += tl.sum(ge.to(tl.int64), axis=0)
            if TOP_P:
                mass += tl.sum(tl.where(ge, p[:, None], 0.0), axis=0)
        if TOP_P:
            ok = (mass >= target_mass) & (cnt >= 1)
        else:
            ok = cnt >= k
        jbest = tl.max(tl.where(ok & (js >= 1), js, 0), axis=0)
        t = t + (jbest << shift)
    if TOP_P:
        t = tl.where(target_mass >= 1.0, 0, t)  # top_p >= 1 keeps the row whatever the rounding of its sum
    kept = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        idx = start + tl.arange(0, BLOCK_V)
        p = tl.load(base + idx, mask=idx < V, other=0.0)
        bits = p.to(tl.int32, bitcast=True).to(tl.int64)
        kept += tl.where(bits >= t, p, 0.0)
    total = tl.sum(kept, axis=0)
    for start in range(0, V, BLOCK_V):
        idx = start + tl.arange(0, BLOCK_V)
        p = tl.load(base + idx, mask=idx < V, other=0.0)
        bits = p.to(tl.int32, bitcast=True).to(tl.int64)
        q = tl.math.div_rn(tl.where(bits >= t, p, 0.0), total + tl.zeros_like(p))
        tl.store(out_ptr + row * V + idx, q, mask=idx < V)


@triton.jit
def _cdf_chunk_search(idx, m, r, u, carry, last_pos, V):
    """One chunk of an inverse-CDF scan over non-negative mass ``r`` (indices ``idx``, valid where ``m``).

    Returns ``(found, last_pos, carry)``: the first index whose inclusive cumulative mass (``carry`` before the
    chunk) exceeds ``u`` among positive entries, or -1; the last positive index seen so far; the new carry. The
    callers' fallback when nothing exceeds ``u`` (rounding) is the last positive index, else ``V - 1``."""
    cdf = carry + tl.cumsum(r, axis=0)
    pos = (r > 0) & m
    first = tl.min(tl.where((cdf > u) & pos, idx, V), axis=0).to(tl.int64)
    found = tl.where(first < V, first, -1)
    last_pos = tl.maximum(last_pos, tl.max(tl.where(pos, idx, -1), axis=0).to(tl.int64))
    return found, last_pos, carry + tl.sum(r, axis=0)


@triton.jit
def _cdf_search_start(coin, total):
    """State of an inverse-CDF scan before its first chunk: ``(u, carry, found, last_pos)`` for a draw of ``coin``
    times the mass whose per-lane partial sums are ``total``."""
    u = coin * tl.sum(total, axis=0)
    return u, tl.zeros([], dtype=tl.float32), tl.full([], -1, tl.int64), tl.full([], -1, tl.int64)


@triton.jit
def _sample_kernel(probs_ptr, coin_ptr, seed_ptr, offset_ptr, out_ptr, V, USE_SEED: tl.constexpr,
                   BLOCK_V: tl.constexpr):
    """Inverse-CDF draw of row ``program_id(0)``: first ``cumsum > coin * sum`` among ``p > 0``, else the last
    positive index, else ``V - 1``."""
    row = tl.program_id(0).to(tl.int64)
    base = probs_ptr + row * V
    if USE_SEED:
        lo, hi = _load_seed(seed_ptr)
        coin = _philox_uniform(lo, hi, tl.load(offset_ptr) + row)
    else:
        coin = tl.load(coin_ptr + row)
    total = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        idx = start + tl.arange(0, BLOCK_V)
        total += tl.maximum(tl.load(base + idx, mask=idx < V, other=0.0), 0.0)
    u, carry, found, last_pos = _cdf_search_start(coin, total)
    start = 0
    while (start < V) & (found < 0):
        idx = start + tl.arange(0, BLOCK_V)
        m = idx < V
        r = tl.maximum(tl.load(base + idx, mask=m, other=0.0), 0.0)
        found, last_pos, carry = _cdf_chunk_search(idx, m, r, u, carry, last_pos, V)
        start += BLOCK_V
    tl.store(out_ptr + row, tl.where(found >= 0, found, tl.where(last_pos >= 0, last_pos, V - 1)))
