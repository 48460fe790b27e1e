"""build_tree_kernel_efficient (Triton) vs its reference vs a loop transcription of sgl-kernel's CUDA semantics."""

import pytest
import torch

from eagle_triton.integrations.sglang import simulate_eagle_draft
from eagle_triton.ops import build_tree_kernel_efficient, build_tree_kernel_efficient_ref
from eagle_triton.ops.tree_build import tree_parents_ref
from eagle_triton.tree import build_tree_buffers

OPS = [build_tree_kernel_efficient, build_tree_kernel_efficient_ref]
SHAPES = [(1, 4, 3, 8), (3, 4, 3, 16), (2, 3, 5, 13), (2, 1, 4, 5), (2, 4, 1, 4), (1, 2, 2, 2), (2, 10, 7, 60)]


def _buffers(bs, D, L, mode, fill=-1, mask_fill=None):
    if mode == 0:
        tm = torch.full((int(L.sum()) * D + bs * D * D,), True if mask_fill is None else mask_fill)
    elif mode == 1:
        tm = torch.full((bs * D * D,), True if mask_fill is None else mask_fill)
    else:
        dt = torch.uint8 if D <= 8 else (torch.int16 if D <= 16 else torch.int32)
        tm = torch.zeros(bs * D, dtype=dt) if mask_fill is None else torch.full((bs * D,), mask_fill, dtype=dt)
    return tm, torch.full((bs * D,), -99, dtype=torch.long), torch.full((3, bs, D), fill, dtype=torch.long)


def _run(fn, par, sel, L, K, S, D, mode, **kw):
    tm, pos, rb = _buffers(sel.shape[0], D, L, mode, **kw)
    fn(par, sel, L, tm, pos, rb[0], rb[1], rb[2], K, S, D, mode)
    return tm.view(-1).view(torch.uint8), pos, rb


def _cuda_transcription(par, sel, L, K, S, D, mode):
    """sgl-kernel's build_tree_efficient, statement by statement, with the upstream bounds (scan D-1, walk <= S)."""
    bs = L.shape[0]
    tm, pos, rb = _buffers(bs, D, L, mode)
    flat = tm.view(-1).view(torch.uint8).clone()
    ri, nt, ns = rb[0], rb[1], rb[2]
    nb = 1 if D <= 8 else (2 if D <= 16 else 4)

    def find(b, value):
        for j in range(D - 1):
            if int(sel[b, j]) == value:
                return j
        return -1

    for b in range(bs):
        seq_len = int(L[b])
        for tid in range(D):
            if mode == 2:
                base = (b * D + tid) * nb
                flat[base] = 1
            else:
                if mode == 0:
                    row = D * D * b + D * int(L[:b].sum()) + (seq_len + D) * tid + seq_len + 1
                else:
                    row = D * D * b + D * tid + 1
                flat[row - 1] = 1
                for i in range(D - 1):
                    flat[row + i] = 0
            if tid == 0:
                pos[b * D] = seq_len
                for i in range(D - 1, 0, -1):
                    ri[b, i] = b * D + i
                    ptb = int(sel[b, i - 1]) // K
                    pp = 0
                    if ptb > 0:
                        j = find(b, int(par[b, ptb]))
                        if j < 0:
                            continue
                        pp = j + 1
                    if nt[b, pp] == -1:
                        nt[b, pp] = i
                    else:
                        ns[b, i] = nt[b, pp]
                        nt[b, pp] = i
                ri[b, 0] = b * D
            else:
                cur, position = tid - 1, 0
                for _ in range(S):
                    position += 1
                    if mode == 2:
                        flat[base + (cur + 1) // 8] |= 1 << ((cur + 1) % 8)
                    else:
                        flat[row + cur] = 1
                    ptb = int(sel[b, cur]) // K
                    if ptb == 0:
                        break
                    cur = find(b, int(par[b, ptb]))
                    if cur < 0:
                        break
                pos[b * D + tid] = position + seq_len
    return flat, pos, rb


def _draft(bs, K, S, D, g):
    _, par, sel, _ = simulate_eagle_draft(bs, K, S, D, vocab_size=50, generator=g)
    L = torch.randint(0, 7, (bs,), generator=g)
    return par, sel, L


@pytest.mark.parametrize("bs,K,S,D,mode", [(*shape, mode) for shape in SHAPES for mode in (0, 1, 2)
                                            if mode != 2 or shape[3] <= 32])  # bit packing: D <= 32 only
def test_matches_cuda_transcription(bs, K, S, D, mode):
    g = torch.Generator().manual_seed(1000 * D + 10 * bs + mode)
    par, sel, L = _draft(bs, K, S, D, g)
    want = _cuda_transcription(par, sel, L, K, S, D, mode)
    for fn in OPS:
        got = _run(fn, par, sel, L, K, S, D, mode)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), fn.__name__


def test_tree_semantics_against_eagle_buffers():
    """Mask rows = ancestor-or-self sets, positions = L + depth, first child smallest, siblings ascending."""
    g = torch.Generator().manual_seed(7)
    bs, K, S, D = 3, 4, 4, 20
    par, sel, L = _draft(bs, K, S, D, g)
    tm, pos, rb = _run(build_tree_kernel_efficient, par, sel, L, K, S, D, 1)
    parents = tree_parents_ref(par, sel, K)
    assert (parents[:, 1:] >= 0).all() and (parents[:, 1:] < torch.arange(1, D)).all()
    anc, depth, *_ = build_tree_buffers(parents, S, False)
    assert torch.equal(tm.view(bs, D, D).bool(), anc)
    assert torch.equal(pos.view(bs, D), L.unsqueeze(1) + depth)
    assert torch.equal(rb[0], torch.arange(bs * D).view(bs, D))
    for b in range(bs):
        for p in range(D):
            kids, c = [], int(rb[1, b, p])
            while c != -1:
                kids.append(c)
                c = int(rb[2, b, c])
            assert kids == [i for i in range(D) if int(parents[b, i]) == p]


def test_full_mask_prefix_untouched_and_layout():
    g = torch.Generator().manual_seed(3)
    bs, K, S, D = 3, 3, 3, 7
    par, sel, L = _draft(bs, K, S, D, g)
    L = torch.tensor([4, 0, 2])
    tm, _, _ = _run(build_tree_kernel_efficient, par, sel, L, K, S, D, 0)
    q, _, _ = _run(build_tree_kernel_efficient, par, sel, L, K, S, D, 1)
    q = q.view(bs, D, D)
    off = 0
    for b in range(bs):
        rows = tm[off: off + D * (int(L[b]) + D)].view(D, int(L[b]) + D)
        assert rows[:, : int(L[b])].all()  # prefix columns keep the pre-fill
        assert torch.equal(rows[:, int(L[b]):], q[b])
        off += D * (int(L[b]) + D)
    assert off == tm.numel()


@pytest.mark.parametrize("D", [5, 8, 9, 16, 17, 32])
def test_bitpacked_matches_qlen_mask(D):
    g = torch.Generator().manual_seed(D)
    bs, K, S = 2, 3, 5
    par, sel, L = _draft(bs, K, S, D, g)
    packed, _, _ = _run(build_tree_kernel_efficient, par, sel, L, K, S, D, 2)
    q, _, _ = _run(build_tree_kernel_efficient, par, sel, L, K, S, D, 1)
    nb = 1 if D <= 8 else (2 if D <= 16 else 4)
    words = packed.view(bs * D, nb).long()
    word = sum(words[:, k] << (8 * k) for k in range(nb))
    bits = (word.unsqueeze(1) >> torch.arange(D)) & 1
    assert torch.equal(bits.bool(), q.view(bs * D, D).bool())


def test_links_not_written_where_absent():
    """Only existing links are written: garbage pre-fill survives identically in op and reference."""
    g = torch.Generator().manual_seed(11)
    par, sel, L = _draft(2, 4, 3, 10, g)
    a = _run(build_tree_kernel_efficient, par, sel, L, 4, 3, 10, 2, fill=-7, mask_fill=0x55)
    b = _run(build_tree_kernel_efficient_ref, par, sel, L, 4, 3, 10, 2, fill=-7, mask_fill=0x55)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert (a[2][1] == -7).any() and (a[2][2] == -7).any()


@pytest.mark.parametrize("fn", OPS)
def test_invalid_tree_degrades_without_hang(fn):
    """Missing parent (NaN/tie in scores) -> node unlinked; a self-parent cycle is cut by the depth bound."""
    K, S, D = 2, 3, 6
    sel = torch.tensor([[0, 1, 2, 3, 6]])  # nodes 1..5
    par = torch.tensor([[-1, 0, 1, 2, 3]])  # P = K*(S-1)+1 = 5
    par_bad = par.clone()
    par_bad[0, 1] = 99  # node 3 (sel 2, ptb 1) has a parent that was not selected
    par_bad[0, 3] = 6  # node 5 (sel 6, ptb 3) is its own parent: a cycle
    L = torch.tensor([5])
    tm, pos, rb = _run(fn, par_bad, sel, L, K, S, D, 1)
    want = _cuda_transcription(par_bad, sel, L, K, S, D, 1)
    assert all(torch.equal(x, y) for x, y in zip((tm, pos, rb), want, strict=True))
    assert 3 not in rb[1, 0].tolist() and 3 not in rb[2, 0].tolist()  # node 3 unreachable
    assert int(pos[5]) == 5 + S  # the cycle walk stopped after `depth` nodes


def test_validation_errors():
    g = torch.Generator().manual_seed(0)
    par, sel, L = _draft(2, 4, 3, 8, g)
    tm, pos, rb = _buffers(2, 8, L, 1)
    args = [par, sel, L, tm, pos, rb[0], rb[1], rb[2], 4, 3, 8, 1]
    with pytest.raises(TypeError, match="selected_index"):
        build_tree_kernel_efficient(*args[:1], sel.int(), *args[2:])
    with pytest.raises(ValueError, match="selected_index"):
        build_tree_kernel_efficient(*args[:10], 9, 1)
    with pytest.raises(ValueError, match="parent_list"):
        build_tree_kernel_efficient(par[:, :-1], *args[1:])
    with pytest.raises(ValueError, match="capacity"):
        build_tree_kernel_efficient(*args[:3], tm[:-1], *args[4:])
    with pytest.raises(ValueError, match="tree_mask_mode"):
        build_tree_kernel_efficient(*args[:11], 5)
    with pytest.raises(ValueError, match="D <= 32|draft_token_num <= 32"):
        _, p2, s2, _ = simulate_eagle_draft(1, 10, 4, 40, generator=g)
        build_tree_kernel_efficient(p2, s2, L[:1], torch.zeros(40 * 4, dtype=torch.uint8),
                                    torch.empty(40, dtype=torch.long),
                                    *torch.full((3, 1, 40), -1, dtype=torch.long), 10, 4, 40, 2)
    with pytest.raises(ValueError, match="bytes"):
        build_tree_kernel_efficient(*args[:3], torch.zeros(15, dtype=torch.uint8), *args[4:11], 2)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_gpu_matches_reference(mode):
    g = torch.Generator().manual_seed(5)
    for bs, K, S, D in [(4, 4, 3, 16), (16, 10, 7, 60), (33, 8, 6, 32)]:
        if mode == 2 and D > 32:
            continue
        par, sel, L = _draft(bs, K, S, D, g)
        L = torch.randint(0, 3000, (bs,), generator=g)
        cpu = _run(build_tree_kernel_efficient_ref, par, sel, L, K, S, D, mode)
        dev = [t.cuda() for t in (par, sel, L)]
        tm, pos, rb = _buffers(bs, D, L, mode)
        tm, pos, rb = tm.cuda(), pos.cuda(), rb.cuda()
        build_tree_kernel_efficient(*dev, tm, pos, rb[0], rb[1], rb[2], K, S, D, mode)
        for a, b in zip((tm.view(-1).view(torch.uint8), pos, rb), cpu, strict=True):
            assert torch.equal(a.cpu(), b)
