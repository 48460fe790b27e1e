"""Triton kernel for tree verification: sgl-kernel's greedy and target-only sampling rules, and EAGLE's rule.

Status: tested against :mod:`.reference` under ``TRITON_INTERPRET=1`` (Triton 3.9) and compiled for sm_90; GPU runs
use Triton 3.6. One program per request. The tree walk is a scalar ``while`` loop (it is inherently sequential:
each level depends on the previous acceptance) bounded by ``num_spec_step - 1`` levels and ``D`` siblings per level;
the final-token draw streams the chosen target row in ``BLOCK_V`` chunks: one pass for the residual mass, then an
early-exit inverse-CDF pass. fp32 throughout; the threshold division uses ``div_rn`` so it rounds exactly like the
reference.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..sampling.kernel import _cdf_chunk_search, _cdf_search_start


@triton.jit
def _residual_chunk(probs_ptr, draft_ptr, row_off, start, V, use_draft, tried, has_tried,
                    RULE: tl.constexpr, BLOCK_V: tl.constexpr):
    idx = start + tl.arange(0, BLOCK_V)
    m = idx < V
    r = tl.load(probs_ptr + row_off + idx, mask=m, other=0.0)
    if RULE == 1:
        # the mask is built arithmetically: combining a vector and a scalar mask with & trips the interpreter
        d = tl.load(draft_ptr + row_off + idx, mask=(m.to(tl.int32) * use_draft) > 0, other=0.0)
        r = r - d
    r = tl.maximum(r, 0.0)
    if RULE == 2:
        if has_tried > 0:
            in_chunk = tl.sum(((tried >= start) & (tried < start + BLOCK_V)).to(tl.int32), axis=0)
            if in_chunk > 0:
                member = tl.sum((idx[:, None] == tried[None, :]).to(tl.int32), axis=1) > 0
                r = tl.where(member, 0.0, r)
    return idx, m, r


@triton.jit
def _tree_verify_kernel(
    out_tok_ptr,  # sgl: predicts [>= bs*D] int32 | eagle: bonus [bs] int64
    out_idx_ptr,  # sgl: accept_index [bs, S1] int32 | eagle: accept_path [bs, S1] int64
    out_num_ptr,  # sgl: accept_token_num [bs] int32 | eagle: accept_length [bs] int64
    cand_ptr,  # [bs, D] int64
    ri_ptr,  # [bs, D] int64 (sgl only)
    nt_ptr,  # [bs, D] int64
    ns_ptr,  # [bs, D] int64
    tp_ptr,  # greedy: target_predict [bs, D] int64
    coin_ptr,  # sampling: [bs, D] f32
    coin_final_ptr,  # sampling: [bs] f32
    probs_ptr,  # sampling: [bs, D, V] f32
    draft_ptr,  # sgl sampling: [bs, D, V] f32 (mutated)
    D,
    S1,
    V,
    n_flat,
    n_pred,
    thr_single,
    thr_acc,
    RULE: tl.constexpr,  # 0 greedy, 1 sgl cumulative coin, 2 EAGLE per-sibling coin
    EAGLE_OUT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Walk request ``program_id(0)``'s tree, accept a path and draw the bonus/correction token."""
    i_b = tl.program_id(0).to(tl.int64)
    row0 = i_b * D
    if EAGLE_OUT:
        offs_c = tl.arange(0, BLOCK_C)
        tl.store(out_idx_ptr + i_b * S1 + offs_c, tl.where(offs_c == 0, 0, -1).to(tl.int64), mask=offs_c < S1)
        last = row0
    else:
        last = tl.load(ri_ptr + row0)
        tl.store(out_idx_ptr + i_b * S1, last.to(tl.int32))
    last_node = tl.zeros([], dtype=tl.int64)
    n = tl.zeros([], dtype=tl.int32)
    nxt = tl.load(nt_ptr + row0)
    cur = tl.where((nxt >= 0) & (nxt < D), nxt, -1)
    lvl = 1
    sib = 0
    tgt = tl.full([], -1, tl.int64)
    coin = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([], dtype=tl.float32)
    rem = tl.full([], 1.0, tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    tried = tl.full([BLOCK_N], -1, tl.int64)
    k = 0
    if RULE == 0:
        tgt = tl.load(tp_ptr + last, mask=(last >= 0) & (last < n_flat), other=-1)
    if RULE == 1:
        coin = tl.load(coin_ptr + row0)
    while (lvl < S1) & (cur >= 0):
        tok = tl.load(cand_ptr + row0 + cur)
        tok_ok = (tok >= 0) & (tok < V)
        p = tl.zeros([], dtype=tl.float32)
        if RULE == 0:
            accept = tok == tgt
        elif RULE == 1:
            p = tl.load(probs_ptr + (row0 + last_node) * V + tok, mask=tok_ok, other=0.0)
            acc += p
            accept = (coin <= tl.math.div_rn(acc, thr_acc)) | (p >= thr_single)
        else:
            dup = tl.sum((tried == tok).to(tl.int32), axis=0) > 0
            p = tl.load(probs_ptr + (row0 + last_node) * V + tok, mask=tok_ok & (dup == 0), other=0.0)
            u = tl.load(coin_ptr + row0 + cur)
            accept = u * rem < p
        if accept:
            if EAGLE_OUT:
                idx = row0 + cur
                tl.store(out_idx_ptr + i_b * S1 + n + 1, cur)
            else:
                idx = tl.load(ri_ptr + row0 + cur)
                tl.store(out_tok_ptr + last, tok.to(tl.int32), mask=(last >= 0) & (last < n_pred))
                tl.store(out_idx_ptr + i_b * S1 + n + 1, idx.to(tl.int32))
            n += 1
            last = idx
            last_node = cur
            lvl += 1
            sib = 0
            if RULE == 0:
                tgt = tl.load(tp_ptr + last, mask=(last >= 0) & (last < n_flat), other=-1)
            if RULE == 1:
                acc = 0.0
                coin = tl.load(coin_ptr + row0 + cur)
            if RULE == 2:
                rem = 1.0
                tried = tl.full([BLOCK_N], -1, tl.int64)
                k = 0
            nxt = tl.load(nt_ptr + row0 + cur)
        else:
            if RULE == 1:
                tl.store(draft_ptr + (row0 + last_node) * V + tok, p, mask=tok_ok)
            if RULE == 2:
                rem = rem - p
                tried = tl.where(offs_n == k, tok, tried)
                k += 1
            sib += 1
            nxt = tl.load(ns_ptr + row0 + cur)
        cur = tl.where((nxt >= 0) & (nxt < D) & (sib < D), nxt, -1)

    if EAGLE_OUT:
        tl.store(out_num_ptr + i_b, n.to(tl.int64))
    else:
        tl.store(out_num_ptr + i_b, n)

    if RULE == 0:
        result = tgt
    else:
        # Final token: inverse CDF of the residual row (rejected siblings removed), first positive crossing.
        coin_f = tl.load(coin_final_ptr + i_b)
        row_off = (row0 + last_node) * V
        use_draft = (n != S1 - 1).to(tl.int32)
        has_tried = (k > 0).to(tl.int32)
        total = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in range(0, V, BLOCK_V):
            _, _, r = _residual_chunk(probs_ptr, draft_ptr, row_off, start, V, use_draft, tried, has_tried,
                                      RULE, BLOCK_V)
            total += r
        u, carry, found, last_pos = _cdf_search_start(coin_f, total)
        start = 0
        while (start < V) & (found < 0):
            idx, m, r = _residual_chunk(probs_ptr, draft_ptr, row_off, start, V, use_draft, tried, has_tried,
                                        RULE, BLOCK_V)
            found, last_pos, carry = _cdf_chunk_search(idx, m, r, u, carry, last_pos, V)
            start += BLOCK_V
        result = tl.where(found >= 0, found, tl.where(last_pos >= 0, last_pos, V - 1))

    if EAGLE_OUT:
        tl.store(out_tok_ptr + i_b, result.to(tl.int64))
    else:
        tl.store(out_tok_ptr + last, result.to(tl.int32), mask=(last >= 0) & (last < n_pred))
