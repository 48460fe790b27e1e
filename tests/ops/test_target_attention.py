"""target_attention: parity with its reference, and bitwise batch invariance (CPU: Triton interpreter, tiny shapes
with splits of 32 positions; GPU: bf16 at the Llama-3.1-8B shape, CUDA-graph replay, no recompilation).

Invariance is tested as exact equality (``torch.equal``): (1) a row computed alone (``S = 1``) equals the same row
inside causal chunks; (2) a tree verify row equals the plain decode of the same token after its ancestor path was
copied into the committed rows ``L, L + 1, ...``; with GQA groups 1, 3, 4 and two sequences of different lengths.
"""

import dataclasses
import math
import secrets

import pytest
import torch
from numerics import assert_close_lowp as _close

from eagle_triton.ops.target_attention import (
    key_positions_ref,
    target_attention,
    target_attention_config,
    target_attention_ref,
    tree_ancestors,
    tree_ancestors_ref,
)

CPU_DTYPES = [torch.float32, torch.float16]



def _lowp(q, k, v, lens, mask, scale):
    """The same attention in the input dtype (scores and P.V in dtype, softmax in fp32): PyTorch's own error."""
    B, S, Hq, D = q.shape
    G = Hq // k.shape[2]
    out = torch.empty_like(q)
    for b in range(B):
        L = int(lens[b])
        kk = k[b, : L + S].repeat_interleave(G, 1).transpose(0, 1)  # [Hq, L+S, D]
        vv = v[b, : L + S].repeat_interleave(G, 1).transpose(0, 1)
        s = torch.matmul(q[b].transpose(0, 1), kk.transpose(1, 2)) * scale  # [Hq, S, L+S]
        vis = torch.ones(S, L + S, dtype=torch.bool, device=q.device)
        vis[:, L:] = mask[b] if mask is not None else torch.ones(S, S, device=q.device).tril().bool()
        p = torch.softmax(s.float().masked_fill(~vis, float("-inf")), -1).to(q.dtype)
        out[b] = torch.matmul(p, vv).transpose(0, 1)
    return out


def _random_parents(S, gen, reach=3):
    """Parent of each tree row (-1 = root): a random earlier row at most ``reach`` back, so trees have several
    branches and depths up to ``S - 1``; row 0 is the root."""
    return [-1] + [int(torch.randint(max(0, j - reach), j, (1,), generator=gen)) for j in range(1, S)]


def _ancestor_mask(parents):
    S = len(parents)
    m = torch.zeros(S, S, dtype=torch.bool)
    for i in range(S):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def _inputs(B, S, Hq, Hkv, D, Lmax, dtype, device, gen):
    q = torch.randn(B, S, Hq, D, generator=gen).to(device, dtype)
    k = torch.randn(B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    v = torch.randn(B, Lmax, Hkv, D, generator=gen).to(device, dtype)
    return q, k, v


def _lens(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


# ----------------------------------------------------------------------------------------------------------------
# parity with the reference

PARITY_CASES = [  # B, S, Hq, Hkv, D, lens, Lmax, tree
    pytest.param(2, 5, 4, 1, 32, (61, 40), 70, True, id="B2-S5-gqa4-D32-tree"),
    pytest.param(2, 7, 6, 2, 24, (0, 33), 45, True, id="B2-S7-gqa3-D24-tree-L0"),
    pytest.param(1, 1, 2, 2, 16, (37,), 40, False, id="B1-decode-mha-D16"),
    pytest.param(2, 6, 3, 1, 16, (26, 64), 71, False, id="B2-S6-gqa3-causal"),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES + [pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("B,S,Hq,Hkv,D,lens,Lmax,tree", PARITY_CASES)
def test_target_attention_matches_ref(B, S, Hq, Hkv, D, lens, Lmax, tree, dtype, device):
    gen = torch.Generator().manual_seed(4000 + B * 31 + S * 7 + D)
    q, k, v = _inputs(B, S, Hq, Hkv, D, Lmax, dtype, device, gen)
    mask = torch.stack([_ancestor_mask(_random_parents(S, gen)) for _ in range(B)]).to(device) if tree else None
    cl = _lens(lens, device)
    out = target_attention(q, k, v, cl, mask)
    assert out.shape == q.shape and out.dtype == dtype
    ref32 = target_attention_ref(q.float(), k.float(), v.float(), cl, mask)
    _close(out, ref32, _lowp(q, k, v, cl, mask, 1 / math.sqrt(D)), dtype)


def test_target_attention_scale_and_int64_lengths(device):
    gen = torch.Generator().manual_seed(9)
    q, k, v = _inputs(1, 3, 2, 1, 16, 50, torch.float32, device, gen)
    lens = torch.tensor([45], dtype=torch.int64, device=device)
    mask = _ancestor_mask([-1, 0, 0])[None].to(device)
    out = target_attention(q, k, v, lens, mask, softmax_scale=0.3)
    torch.testing.assert_close(out, target_attention_ref(q, k, v, lens, mask, softmax_scale=0.3),
                               atol=1e-5, rtol=1e-5)


def test_key_positions_ref_reproduces_the_reference(device):
    """The absolute-position view of the keys (what the kernel reduces in) is the reference's key set."""
    gen = torch.Generator().manual_seed(12)
    B, S, H, D, Lmax = 2, 6, 2, 16, 40
    q, k, v = _inputs(B, S, H, H, D, Lmax, torch.float32, device, gen)
    lens = _lens((20, 33), device)
    for mask in (torch.stack([_ancestor_mask(_random_parents(S, gen)) for _ in range(B)]).to(device), None):
        rows = key_positions_ref(lens, mask, S)  # [B, S, W]
        out = torch.empty_like(q)
        for b in range(B):
            for i in range(S):
                r = rows[b, i][rows[b, i] >= 0]
                s = torch.einsum("hd,nhd->hn", q[b, i], k[b, r]) / math.sqrt(D)
                out[b, i] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v[b, r])
        torch.testing.assert_close(out, target_attention_ref(q, k, v, lens, mask), atol=1e-5, rtol=1e-5)


def test_target_attention_reads_only_visible_rows(device):
    """Rows past ``L + S`` are never read (NaN-poisoned), and a row that sees no key gets zeros."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = _inputs(1, 3, 2, 1, 16, 30, torch.float32, device, gen)
    lens = _lens((0,), device)
    k[:, 3:] = float("nan")
    v[:, 3:] = float("nan")
    mask = torch.tensor([[[True, False, False], [False, False, False], [True, False, True]]], device=device)
    out = target_attention(q, k, v, lens, mask)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    torch.testing.assert_close(out, target_attention_ref(q, k.nan_to_num(), v.nan_to_num(), lens, mask),
                               atol=1e-5, rtol=1e-5)
    out = target_attention(q, k, v, lens, None)
    torch.testing.assert_close(out, target_attention_ref(q, k.nan_to_num(), v.nan_to_num(), lens, None),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_tree_mask_is_read_as_its_cells_above_half(mask_dtype, device):
    """A float mask read as it is (the drafters' ``tree_mask[:, 0]``, a view of ``[B, 1, S, S]``; also a
    column-major one) gives the bits of the bool mask ``mask > 0.5``: true cells hold values above 0.5, false
    cells values at or below it (0, exactly 0.5, negatives); the reference and the key positions read it alike."""
    seed = secrets.randbelow(1 << 30)  # fresh inputs each run; printed on failure
    gen = torch.Generator().manual_seed(seed)
    B, S, Hq, Hkv, D, Lmax = 2, 7, 4, 2, 16, 60
    q, k, v = _inputs(B, S, Hq, Hkv, D, Lmax, torch.float32, device, gen)
    lens = _lens((37, 5), device)
    anc = torch.stack([_ancestor_mask(_random_parents(S, gen)) for _ in range(B)])
    above, below = torch.tensor([1.0, 0.51, 0.75, 2.0]), torch.tensor([0.0, 0.5, 0.49, -1.0, 0.25])
    pick = torch.randint(0, 20, (B, S, S), generator=gen)
    values = torch.where(anc, above[pick % 4], below[pick % 5]).to(mask_dtype)
    assert torch.equal(values > 0.5, anc)
    drafter_layout = values[:, None].to(device)[:, 0]  # [B, S, S] view of [B, 1, S, S]
    column_major = values.transpose(1, 2).contiguous().transpose(1, 2).to(device)
    bool_mask = anc.to(device)
    want = target_attention(q, k, v, lens, bool_mask)
    for fmask in (drafter_layout, column_major):
        assert torch.equal(target_attention(q, k, v, lens, fmask), want), f"{mask_dtype} seed={seed}"
        assert torch.equal(target_attention_ref(q, k, v, lens, fmask), target_attention_ref(q, k, v, lens, bool_mask))
        assert torch.equal(key_positions_ref(lens, fmask, S), key_positions_ref(lens, bool_mask, S))


@pytest.mark.parametrize("B,S", [(1, 1), (2, 7), (3, 33), (1, 60)])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_tree_ancestors_match_reference(B, S, mask_dtype, device):
    """The ancestor table equals its reference exactly, for random trees (a strided float view too), and every
    row is the token's true columns then -1s."""
    seed = secrets.randbelow(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    masks = torch.stack([_ancestor_mask(_random_parents(S, gen, reach=int(torch.randint(1, 6, (1,),
                                                                                        generator=gen))))
                         for _ in range(B)])
    mask = masks.to(device) if mask_dtype == torch.bool else masks.float()[:, None].to(device)[:, 0]
    got = tree_ancestors(mask)
    want = tree_ancestors_ref(mask)
    assert got.dtype == torch.int32 and got.shape == (B, S, S)
    assert torch.equal(got.cpu(), want.cpu()), f"seed={seed}"
    for b in range(B):
        for i in range(S):
            cols = masks[b, i].nonzero().flatten().tolist()
            assert want[b, i].tolist() == cols + [-1] * (S - len(cols)), f"seed={seed}"


def test_given_ancestors_give_the_same_bits(device):
    """A table made once (a forward's layers share it) gives the bits of the table target_attention makes."""
    seed = secrets.randbelow(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    B, S, Hq, Hkv, D, Lmax = 2, 9, 4, 2, 16, 80
    q, k, v = _inputs(B, S, Hq, Hkv, D, Lmax, torch.float32, device, gen)
    lens = _lens((45, 3), device)
    mask = torch.stack([_ancestor_mask(_random_parents(S, gen)) for _ in range(B)]).to(device)
    anc = tree_ancestors(mask)
    assert torch.equal(target_attention(q, k, v, lens, mask, tree_ancestors=anc),
                       target_attention(q, k, v, lens, mask)), f"seed={seed}"


def test_corrupt_ancestor_table_reads_inside_the_cache(device):
    """Entries past S - 1 (a caller's corrupt table, unchecked on the host) are clamped to the last new row: the cache
    is a view of a larger buffer whose rows past it hold NaN, which an unclamped entry would read."""
    gen = torch.Generator().manual_seed(secrets.randbelow(1 << 30))
    S, Hq, Hkv, D, L = 6, 2, 1, 16, 40
    Lmax = L + S
    q, k_buf, v_buf = _inputs(1, S, Hq, Hkv, D, Lmax + S, torch.float32, device, gen)
    k_buf[:, Lmax:], v_buf[:, Lmax:] = float("nan"), float("nan")
    k, v = k_buf[:, :Lmax], v_buf[:, :Lmax]  # batch 1: contiguous views; the NaN rows follow them in memory
    mask = _ancestor_mask(_random_parents(S, gen))[None].to(device)
    bad = tree_ancestors(mask)
    bad[bad >= 0] += S  # rows L + S .. L + 2S - 1: past the cache, inside the NaN rows
    out = target_attention(q, k, v, _lens((L,), device), mask, tree_ancestors=bad)
    assert torch.isfinite(out).all()


def test_tree_ancestors_errors(device):
    q = torch.randn(1, 4, 2, 16, device=device)
    k = torch.randn(1, 10, 2, 16, device=device)
    lens = _lens((3,), device)
    mask = torch.ones(1, 4, 4, dtype=torch.bool, device=device).tril()
    with pytest.raises(ValueError, match="tree_mask"):
        tree_ancestors(torch.ones(1, 4, 5, dtype=torch.bool, device=device))
    with pytest.raises(TypeError, match="tree_mask"):
        tree_ancestors(torch.ones(1, 4, 4, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="pass the mask"):
        target_attention(q, k, k, lens, None, tree_ancestors=tree_ancestors(mask))
    with pytest.raises(ValueError, match="tree_ancestors"):
        target_attention(q, k, k, lens, mask, tree_ancestors=tree_ancestors(mask)[:, :3])
    with pytest.raises(TypeError, match="tree_ancestors"):
        target_attention(q, k, k, lens, mask, tree_ancestors=tree_ancestors(mask).long())
    with pytest.raises(ValueError, match="contiguous"):
        target_attention(q, k, k, lens, mask, tree_ancestors=tree_ancestors(mask).transpose(1, 2))


# ----------------------------------------------------------------------------------------------------------------
# bitwise batch invariance


def _check_causal_invariance(B, S, Hq, Hkv, D, lens, Lmax, chunks, dtype, device, seed):
    """Rows of causal chunks of sizes ``chunks`` (consecutive, from ``lens``) equal the same rows decoded alone."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _inputs(B, S, Hq, Hkv, D, Lmax, dtype, device, gen)
    base = _lens(lens, device)
    alone = [target_attention(q[:, t:t + 1].contiguous(), k, v, base + t) for t in range(S)]
    t0 = 0
    for n in chunks:
        part = target_attention(q[:, t0:t0 + n].contiguous(), k, v, base + t0)
        for t in range(n):
            assert torch.equal(part[:, t], alone[t0 + t][:, 0]), f"row {t0 + t} differs inside a chunk of {n}"
        t0 += n
    return alone


@pytest.mark.parametrize("Hq,Hkv,dtype", [(2, 2, torch.float32), (3, 1, torch.float16), (8, 2, torch.float32),
                                          (8, 2, torch.float16)], ids=["gqa1-fp32", "gqa3-fp16", "gqa4-fp32",
                                                                        "gqa4-fp16"])
def test_causal_chunk_rows_equal_single_row_decode(Hq, Hkv, dtype, device):
    # Chunks of 13 and 5 starting at 27/50: rows cross block (16) and split (32) boundaries at 32 and 64.
    _check_causal_invariance(2, 18, Hq, Hkv, 16, (27, 50), 70, (13, 5), dtype, device, seed=Hq * 10 + Hkv)


def _decode_cache(k, v, L, path, tree_base):
    """Copy of the caches with the tree rows of ``path`` (root first) committed at rows ``L, L + 1, ...``."""
    k2, v2 = k.clone(), v.clone()
    for d, j in enumerate(path):
        k2[L + d] = k[tree_base + j]
        v2[L + d] = v[tree_base + j]
    return k2, v2


def _check_tree_invariance(lens, parents, Hq, Hkv, D, Lmax, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    B, S = len(lens), len(parents[0])
    q, k, v = _inputs(B, S, Hq, Hkv, D, Lmax, dtype, device, gen)
    mask = torch.stack([_ancestor_mask(p) for p in parents]).to(device)
    cl = _lens(lens, device)
    ver = target_attention(q, k, v, cl, mask)
    for i in range(S):
        k2, v2, dec_len = torch.empty_like(k), torch.empty_like(v), []
        for b in range(B):
            path = [j for j in range(S) if mask[b, i, j]]
            k2[b], v2[b] = _decode_cache(k[b], v[b], lens[b], path, lens[b])
            dec_len.append(lens[b] + len(path) - 1)
        dec = target_attention(q[:, i:i + 1].contiguous(), k2, v2, _lens(dec_len, device))
        for b in range(B):
            assert torch.equal(ver[b, i], dec[b, 0]), f"batch {b} tree row {i} (depth {dec_len[b] - lens[b]}, " \
                                                      f"L={lens[b]}) differs from its plain decode"
    return ver


TREE_CASES = [  # lens (one per sequence), S, reach (a random tree per sequence), Hq, Hkv
    # L=59: depths up to 6 cross the block and split boundary at 64; L=45: a block boundary (48) only.
    pytest.param((59, 45), 9, 2, 8, 2, id="B2-cross-split-and-block-gqa4"),
    pytest.param((59, 45), 9, 2, 3, 1, id="B2-cross-split-and-block-gqa3"),
    # L=64: the tree starts a fresh split; L=7: committed rows only inside the first block.
    pytest.param((64, 7), 7, 3, 2, 2, id="B2-aligned-and-short-gqa1"),
    pytest.param((0,), 6, 1, 3, 1, id="B1-L0-chain-gqa3"),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("lens,S,reach,Hq,Hkv", TREE_CASES)
def test_tree_verify_rows_equal_plain_decode(lens, S, reach, Hq, Hkv, dtype, device):
    gen = torch.Generator().manual_seed(77 + S)
    parents = [_random_parents(S, gen, reach) for _ in lens]
    _check_tree_invariance(lens, parents, Hq, Hkv, 16, 80, dtype, device, seed=sum(lens) + Hq)


@pytest.mark.parametrize("L", [0, 16, 32, 45], ids=["L0", "block-boundary", "split-boundary", "inside"])
def test_tree_row_seeing_no_tree_row(L, device):
    """A mask row with no true column sees the committed rows only (zeros at L = 0), wherever L falls."""
    gen = torch.Generator().manual_seed(L)
    q, k, v = _inputs(1, 5, 4, 2, 16, 60, torch.float32, device, gen)
    mask = _ancestor_mask(_random_parents(5, gen))[None].to(device)
    mask[0, 3] = False
    cl = _lens((L,), device)
    out = target_attention(q, k, v, cl, mask)
    _close(out, target_attention_ref(q, k, v, cl, mask), out, torch.float32)
    if L == 0:
        assert torch.equal(out[0, 3], torch.zeros_like(out[0, 3]))


def test_tree_rows_do_not_depend_on_other_rows(device):
    """The same tree row verified in a larger tree (extra branches, other rows around it) gives the same bits."""
    gen = torch.Generator().manual_seed(21)
    B, Hq, Hkv, D, Lmax, L = 1, 4, 1, 16, 70, 58
    small = [-1, 0, 1, 2]  # a chain crossing the block/split boundary at 64 from L=58 ... 61
    big = [-1, 0, 0, 1, 3, 2, 4, 5, 6]  # rows 0, 1, 3, 4 form the same chain, other rows around them
    q_big, k, v = _inputs(B, len(big), Hq, Hkv, D, Lmax, torch.float32, device, gen)
    cl = _lens((L,), device)
    out_big = target_attention(q_big, k, v, cl, _ancestor_mask(big)[None].to(device))
    keep = [0, 1, 3, 4]
    k_small, v_small = k.clone(), v.clone()
    k_small[0, L:L + 4] = k[0, [L + j for j in keep]]
    v_small[0, L:L + 4] = v[0, [L + j for j in keep]]
    out_small = target_attention(q_big[:, keep].contiguous(), k_small, v_small, cl,
                                 _ancestor_mask(small)[None].to(device))
    assert torch.equal(out_small, out_big[:, keep])


def _tree_tokens_variants_equal(lens, S, Hq, Hkv, D, Lmax, dtype, device, tokens, seed):
    """A verify's rows are bit-identical for every ``tree_tokens`` (tokens per tree-kernel program)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _inputs(len(lens), S, Hq, Hkv, D, Lmax, dtype, device, gen)
    mask = torch.stack([_ancestor_mask(_random_parents(S, gen, 4)) for _ in lens]).to(device)
    cl = _lens(lens, device)
    base = target_attention_config(dtype, D, Hq // Hkv)
    outs = [target_attention(q, k, v, cl, mask, config=dataclasses.replace(base, tree_tokens=t)) for t in tokens]
    for t, o in zip(tokens[1:], outs[1:], strict=True):
        assert torch.equal(o, outs[0]), f"tree_tokens={t} differs from tree_tokens={tokens[0]} (seed={seed})"


@pytest.mark.parametrize("Hq,Hkv,tokens", [(4, 1, (1, 3, 4))], ids=["gqa4"])
def test_tree_rows_do_not_depend_on_tokens_per_program(Hq, Hkv, tokens, device):
    # L=53/20: trees of depth <= 10 cross the block (64) and split (32 positions) boundaries, and rows whose only
    # split is finished by the tree kernel sit beside rows merged by the combine
    _tree_tokens_variants_equal((53, 20), 11, Hq, Hkv, 16, 80, torch.float16, device, tokens,
                                secrets.randbelow(1 << 30))


def test_target_attention_config_errors(device):
    q, k, v = _inputs(1, 3, 4, 1, 16, 20, torch.float32, device, torch.Generator().manual_seed(0))
    base = target_attention_config(torch.float32, 16, 4)
    with pytest.raises(ValueError, match="GQA group"):
        target_attention(q, k, v, _lens((2,), device), config=dataclasses.replace(base, block_m=2))
    with pytest.raises(ValueError, match="tree_tokens"):
        target_attention(q, k, v, _lens((2,), device), config=dataclasses.replace(base, tree_tokens=base.block_m))


def test_config_does_not_depend_on_lengths():
    """The tile constants come from dtype / head shape only; the GQA group only raises the row tile to fit it."""
    cfg = target_attention_config(torch.float16, 128, 4)
    assert cfg == target_attention_config(torch.float16, 128, 4)
    assert target_attention_config(torch.float16, 64, 16).block_m >= 16
    assert cfg.split % cfg.block_n == 0


# ----------------------------------------------------------------------------------------------------------------
# cache slots: query sequence b reads cache batch index cache_slots[b] of a larger cache

SLOT_CASES = [  # NB, S, slots, tree; lengths are random per slot (some crossing the block/split boundaries)
    pytest.param(4, 6, (2,), False, id="chunk-slot2"),
    pytest.param(5, 1, (4,), False, id="decode-last-slot"),
    pytest.param(4, 5, (1,), True, id="tree-slot1"),
    pytest.param(5, 4, (3, 1), False, id="B2-chunk-slots-3-1"),
    pytest.param(5, 5, (3, 1), True, id="B2-tree-slots-3-1"),
]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("NB,S,slots,tree", SLOT_CASES)
def test_target_attention_slots_equal_view_calls(NB, S, slots, tree, dtype, device):
    """Bitwise: with ``cache_slots`` on the whole cache, each sequence's rows equal a call on the views
    ``cache[s:s+1]`` (same lengths); and the op with slots matches the reference with slots."""
    seed = secrets.randbelow(1 << 30)  # fresh inputs each run (the bitwise claim holds for any); printed on failure
    gen = torch.Generator().manual_seed(seed)
    B, Hq, Hkv, D, Lmax = len(slots), 6, 2, 24, 75
    q, _, _ = _inputs(B, S, Hq, Hkv, D, Lmax, dtype, device, gen)
    _, k, v = _inputs(NB, S, Hq, Hkv, D, Lmax, dtype, device, gen)
    cl = torch.randint(0, Lmax - S + 1, (NB,), generator=gen).to(device, torch.int32)
    mask = torch.stack([_ancestor_mask(_random_parents(S, gen)) for _ in range(B)]).to(device) if tree else None
    sl = torch.tensor(slots, dtype=torch.int32, device=device)
    out = target_attention(q, k, v, cl, mask, cache_slots=sl)
    for b, s in enumerate(slots):
        one = target_attention(q[b:b + 1], k[s:s + 1], v[s:s + 1], cl[s:s + 1], mask[b:b + 1] if tree else None)
        assert torch.equal(out[b:b + 1], one), f"sequence {b} (slot {s}, L={int(cl[s])}), seed={seed}"
    idx = sl.long()
    ref32 = target_attention_ref(q.float(), k.float(), v.float(), cl, mask, cache_slots=sl)
    _close(out, ref32, _lowp(q, k[idx], v[idx], cl[idx], mask, 1 / math.sqrt(D)), dtype)


def test_target_attention_slots_errors(device):
    NB, Lmax = 4, 10
    q = torch.randn(2, 3, 4, 16, device=device)
    k = torch.randn(NB, Lmax, 2, 16, device=device)
    lens = _lens((2, 8, 1, 9), device)  # slots 1 and 3 cannot take 3 more rows
    sl = _lens((2, 0), device)
    target_attention(q, k, k, lens, cache_slots=sl)  # only the used slots' lengths are checked
    with pytest.raises(TypeError, match="cache_slots"):
        target_attention(q, k, k, lens, cache_slots=sl.long())
    with pytest.raises(ValueError, match="cache_slots must have shape"):
        target_attention(q, k, k, lens, cache_slots=sl[:1])
    with pytest.raises(ValueError, match="cache_slots must have shape"):
        target_attention(q, k, k, lens, cache_slots=sl[None])
    with pytest.raises(ValueError, match="cache_slots is on meta"):
        target_attention(q, k, k, lens, cache_slots=torch.empty(2, dtype=torch.int32, device="meta"))
    for bad in ((2, 4), (-1, 0)):
        with pytest.raises(ValueError, match="cache_slots in .* outside"):
            target_attention(q, k, k, lens, cache_slots=_lens(bad, device))
    with pytest.raises(ValueError, match="capacity"):
        target_attention(q, k, k, lens, cache_slots=_lens((2, 1), device))
    with pytest.raises(ValueError, match="cache_seqlens must have shape"):
        target_attention(q, k, k, lens[:2], cache_slots=sl)
    with pytest.raises(ValueError, match="k_cache"):  # the slot count is free, the head dim is not
        target_attention(q, k[..., :8].contiguous(), k[..., :8].contiguous(), lens, cache_slots=sl)
    # unchecked (validate=False, as under capture): an out-of-range slot is clamped, never read out of the cache
    out = target_attention(q, k, k, lens, cache_slots=_lens((5, 0), device), validate=False)
    assert torch.equal(out, target_attention(q, k, k, lens, cache_slots=_lens((3, 0), device), validate=False))


# ----------------------------------------------------------------------------------------------------------------
# max_seqlen: a caller's bound on the lengths plans the launches, never the bits


class _Launches:
    """Counts the launches of the op module's kernels (each still runs)."""

    def __init__(self, monkeypatch):
        from eagle_triton.ops.target_attention import op

        self.count = {}
        for name in ("_shared_kernel", "_tree_kernel", "_combine_kernel"):
            kern = getattr(op, name)
            monkeypatch.setattr(op, name, self._wrap(name, kern))

    def _wrap(self, name, kern):
        counts = self.count

        class Counted:
            def __getitem__(self, grid):
                counts[name] = counts.get(name, 0) + 1
                return kern[grid]
        return Counted()


@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
def test_max_seqlen_leaves_out_launches_not_bits(tree, monkeypatch, device):
    """Within one split (32 positions under the interpreter) a bound leaves out the launch that merges splits
    (causal: the combine; tree: the shared kernel, whose only split the tree kernel runs) and the rows keep their
    bits; a larger bound limits the grid to the splits that can hold keys, with the same bits."""
    seed = secrets.randbelow(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    B, S, Hq, Hkv, D = 2, (6 if tree else 1), 6, 2, 16
    split = target_attention_config(torch.float32, D, Hq // Hkv).split  # 32 positions here, 256 on a GPU
    Lmax = max(130, 3 * split + 8)
    q, k, v = _inputs(B, S, Hq, Hkv, D, Lmax, torch.float32, device, gen)
    mask = torch.stack([_ancestor_mask(_random_parents(S, gen)) for _ in range(B)]).to(device) if tree else None
    cases = (((3, split - S), split), ((split + 7, 2 * split + 6), 2 * split + 6 + S),
             ((21, 2 * split + 5), 3 * split + 4))
    for lens, bound in cases:
        cl = _lens(lens, device)
        full = target_attention(q, k, v, cl, mask)
        launches = _Launches(monkeypatch)
        planned = target_attention(q, k, v, cl, mask, max_seqlen=bound)
        assert torch.equal(planned, full), f"lens={lens} max_seqlen={bound} (seed={seed})"
        one_split = bound <= split
        assert ("_combine_kernel" in launches.count) == (not tree and not one_split), launches.count
        assert ("_shared_kernel" in launches.count) == (not tree or not one_split), launches.count
        monkeypatch.undo()


def test_max_seqlen_errors(device):
    q, k, v = _inputs(1, 3, 4, 2, 16, 40, torch.float32, device, torch.Generator().manual_seed(1))
    lens = _lens((20,), device)
    with pytest.raises(ValueError, match="max_seqlen=22"):  # 20 committed + 3 new rows
        target_attention(q, k, v, lens, max_seqlen=22)
    with pytest.raises(ValueError, match="max_seqlen must be an int >= S=3"):
        target_attention(q, k, v, lens, max_seqlen=2)
    with pytest.raises(ValueError, match="max_seqlen must be an int"):
        target_attention(q, k, v, lens, max_seqlen=30.0)
    assert torch.equal(target_attention(q, k, v, lens, max_seqlen=23), target_attention(q, k, v, lens))


# ----------------------------------------------------------------------------------------------------------------
# errors


def test_target_attention_errors(device):
    q = torch.randn(1, 4, 4, 16, device=device)
    k = torch.randn(1, 10, 2, 16, device=device)
    lens = _lens((3,), device)
    with pytest.raises(ValueError, match="capacity"):
        target_attention(q, k, k, _lens((7,), device))
    with pytest.raises(ValueError, match="capacity"):
        target_attention(q, k, k, _lens((-1,), device))
    with pytest.raises(ValueError, match="multiple of KV heads"):
        target_attention(torch.randn(1, 4, 3, 16, device=device), k, k, lens)
    with pytest.raises(TypeError, match="k_cache"):
        target_attention(q, k.half(), k.half(), lens)
    with pytest.raises(TypeError, match="q"):
        target_attention(q.int(), k, k, lens)
    with pytest.raises(ValueError, match="v_cache"):
        target_attention(q, k, k[:, :9], lens)
    with pytest.raises(ValueError, match="k_cache"):
        target_attention(q, torch.randn(2, 10, 2, 16, device=device), torch.randn(2, 10, 2, 16, device=device), lens)
    with pytest.raises(ValueError, match="tree_mask"):
        target_attention(q, k, k, lens, torch.ones(1, 4, 5, dtype=torch.bool, device=device))
    with pytest.raises(TypeError, match="tree_mask"):
        target_attention(q, k, k, lens, torch.ones(1, 4, 4, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="cache_seqlens"):
        target_attention(q, k, k, lens.float())
    with pytest.raises(ValueError, match="cache_seqlens"):
        target_attention(q, k, k, _lens((3, 3), device))
    with pytest.raises(ValueError, match="softmax_scale"):
        target_attention(q, k, k, lens, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="capacity"):
        target_attention(torch.randn(1, 11, 4, 16, device=device), k, k, lens)
    with pytest.raises(ValueError, match="contiguous"):
        target_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), k, lens)
    if torch.cuda.is_available():  # a cache on another device than q
        with pytest.raises(ValueError, match="k_cache"):
            target_attention(q.cuda(), k.cpu(), k.cpu(), lens.cuda())


# ----------------------------------------------------------------------------------------------------------------
# GPU: the Llama-3.1-8B shape in bf16, CUDA-graph replay, no recompilation


@pytest.mark.gpu
@pytest.mark.parametrize("prefix", [100, 230, 1000, 4097])
def test_target_attention_llama8b_gpu(prefix):
    """Parity and both bitwise invariances at 32/8 heads, D 128, bf16, a 60-row tree over a prefix of 100 (every
    row in one 256-position split: finished in place), 230 (rows on both sides of the split), 1k, 4k."""
    dtype, dev, S, D = torch.bfloat16, "cuda", 60, 128
    gen = torch.Generator().manual_seed(prefix)
    parents = _random_parents(S, gen, reach=12)
    Lmax = prefix + S + 64
    q, k, v = _inputs(1, S, 32, 8, D, Lmax, dtype, dev, gen)
    mask = _ancestor_mask(parents)[None].to(dev)
    cl = _lens((prefix,), dev)
    out = target_attention(q, k, v, cl, mask)
    ref32 = target_attention_ref(q.float(), k.float(), v.float(), cl, mask)
    _close(out, ref32, _lowp(q, k, v, cl, mask, 1 / math.sqrt(D)), dtype)
    assert torch.equal(out, target_attention(q, k, v, cl, mask))  # run to run deterministic
    _check_tree_invariance([prefix], [parents], 32, 8, D, Lmax, dtype, dev, seed=prefix)
    _check_causal_invariance(1, 60, 32, 8, D, (prefix - 3,), Lmax, (13, 47), dtype, dev, seed=prefix + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("prefix", [100, 230, 1000])
def test_target_attention_tree_tokens_gpu(prefix):
    """Every tree_tokens setting gives the same bits at the 8B shape (and at SmolLM2's 9/3 heads of 64)."""
    _tree_tokens_variants_equal((prefix,), 60, 32, 8, 128, prefix + 128, torch.bfloat16, "cuda", (1, 2, 4, 16),
                                prefix)
    _tree_tokens_variants_equal((prefix, prefix // 3), 60, 9, 3, 64, prefix + 128, torch.bfloat16, "cuda",
                                (1, 2, 4, 21), prefix + 1)


@pytest.mark.gpu
def test_target_attention_cuda_graph_replay_gpu():
    gen = torch.Generator().manual_seed(3)
    S, dev = 60, "cuda"
    q, k, v = _inputs(1, S, 32, 8, 128, 2200, torch.bfloat16, dev, gen)
    mask = _ancestor_mask(_random_parents(S, gen, 8))[None].to(dev)
    lens = _lens((1000,), dev)
    target_attention(q, k, v, lens, mask)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = target_attention(q, k, v, lens, mask, validate=False)
    for new_len in (700, 2100):
        q.copy_(torch.randn_like(q))
        lens.fill_(new_len)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, target_attention(q, k, v, lens, mask))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(32, 8, 128), (9, 3, 64)], ids=["8b", "smollm2"])
def test_target_attention_max_seqlen_in_graphs_gpu(shape):
    """A verify and a decode planned for one split (the shared kernel or the combine left out of a PDL chain of
    graph-captured launches) give the bits of the unplanned launches, replayed at several lengths."""
    Hq, Hkv, D = shape
    seed = secrets.randbelow(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    S, dev, split = 60, "cuda", target_attention_config(torch.bfloat16, D, Hq // Hkv).split
    q, k, v = _inputs(1, S, Hq, Hkv, D, 1024, torch.bfloat16, dev, gen)
    mask = _ancestor_mask(_random_parents(S, gen, 8))[None].to(dev)
    lens = _lens((5,), dev)
    for m in (mask, None):
        qq = q if m is not None else q[:, :1].contiguous()
        target_attention(qq, k, v, lens, m, max_seqlen=split)  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [target_attention(qq, k, v, lens, m, validate=False, max_seqlen=split) for _ in range(3)]
        for new_len in (0, 77, split - qq.shape[1]):
            lens.fill_(new_len)
            g.replay()
            torch.cuda.synchronize()
            want = target_attention(qq, k, v, lens, m)
            assert all(torch.equal(o, want) for o in outs), f"L={new_len} tree={m is not None} (seed={seed})"


@pytest.mark.gpu
def test_target_attention_no_recompile_across_lengths_gpu():
    """After one causal call and one tree call, new prompt lengths, chunk sizes and cache lengths compile nothing."""
    import importlib

    K = importlib.import_module("eagle_triton.ops.target_attention.kernel")  # the package name is shadowed

    gen = torch.Generator().manual_seed(4)
    dev = "cuda"
    q, k, v = _inputs(1, 300, 32, 8, 128, 4096, torch.bfloat16, dev, gen)
    mask = _ancestor_mask(_random_parents(60, gen, 8))[None].to(dev)
    target_attention(q[:, :1], k, v, _lens((5,), dev))
    target_attention(q[:, :60], k, v, _lens((100,), dev), mask)

    def n_compiled():  # compiled variants: device_caches[device] = (kernel_cache, kernel_key_cache, ...)
        return sum(len(entry[0]) for fn in (K._shared_kernel, K._tree_kernel, K._combine_kernel)
                   for entry in fn.device_caches.values())

    before = n_compiled()
    for S, L in ((1, 17), (7, 200), (16, 999), (33, 3000), (300, 0), (129, 1234)):
        target_attention(q[:, :S], k, v, _lens((L,), dev))
    target_attention(q[:, :60], k, v, _lens((3001,), dev), mask)
    torch.cuda.synchronize()
    assert n_compiled() == before
