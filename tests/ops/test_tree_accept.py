"""tree_accept_greedy against its reference (exact: integer outputs and copied rows) on random trees with planted
accepted paths and argmax ties, the features gather into caller buffers, and bad input."""

import secrets

import pytest
import torch

from eagle_triton.ops.tree_accept import tree_accept_greedy, tree_accept_greedy_ref
from eagle_triton.tree import build_tree_buffers

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


def _random_tree(gen, T, reach=3):
    """Parents of a random tree of ``T`` drafts (node 0 the root), each parent at most ``reach`` nodes back."""
    return [-1] + [int(torch.randint(max(0, j - reach), j, (1,), generator=gen)) for j in range(1, T + 1)]


def _case(B, T, V, W, dtype, device, gen, plant=True):
    parents = torch.tensor([_random_tree(gen, T) for _ in range(B)], dtype=torch.int64)
    depth = int(build_tree_buffers(parents, T)[1].max())
    retrieve = build_tree_buffers(parents, depth + 1)[2]
    N = T + 1
    tokens = torch.randint(0, V, (B, N), generator=gen)
    logits = torch.randn(B, N, V, generator=gen)
    if plant:  # along a random leaf's path, make each node's argmax its child's token (a few mismatches remain)
        for b in range(B):
            row = retrieve[b, int(torch.randint(0, int((retrieve[b, :, 0] >= 0).sum()), (1,), generator=gen))]
            path = [int(x) for x in row if x >= 0]
            stop = int(torch.randint(1, len(path) + 1, (1,), generator=gen))
            for par, child in zip(path[:stop - 1], path[1:stop], strict=True):
                logits[b, par, tokens[b, child]] = 10.0
    feats = torch.randn(B, N, W, generator=gen) if W else None
    to = dict(device=device)
    return (tokens.to(**to), retrieve.to(**to), logits.to(device, dtype),
            None if feats is None else feats.to(device, dtype))


def _assert_equal(got, want):
    for name, g, w in zip(("accept_index", "accept_len", "tokens", "features"), got, want, strict=True):
        if w is None:
            assert g is None, name
        else:
            assert g.dtype == w.dtype and torch.equal(g, w), f"{name}: {g} vs {w}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,V,W", [(1, 6, 300, 40), (3, 16, 257, 0), (2, 60, 129, 17), (2, 1, 1, 3),
                                     (1, 9, 1000, 1)])
def test_tree_accept_greedy_matches_ref(B, T, V, W, dtype, device):
    seed = secrets.randbelow(1 << 30)
    tok, ri, logits, feats = _case(B, T, V, W, dtype, device, torch.Generator().manual_seed(seed))
    got = tree_accept_greedy(tok, ri, logits, feats)
    want = tree_accept_greedy_ref(tok, ri, logits, feats)
    _assert_equal(got, want)
    assert ((got[0] >= 0).sum(1) == got[1] + 1).all(), f"seed={seed}"


def test_tree_accept_greedy_accepts_planted_paths_and_breaks_ties_first(device):
    """A fully planted path is accepted whole; equal maxima in different argmax slices (128 under the interpreter)
    pick the first index, as torch.argmax."""
    gen = torch.Generator().manual_seed(secrets.randbelow(1 << 30))
    V = 700
    parents = torch.tensor([[-1, 0, 1, 2, 0, 4]])
    retrieve = build_tree_buffers(parents, 4)[2]
    tok = torch.tensor([[5, 11, 12, 13, 21, 22]])
    logits = torch.randn(1, 6, V, generator=gen).clamp(-3, 3)
    for par, child in ((0, 1), (1, 2), (2, 3)):
        logits[0, par, tok[0, child]] = 10.0
    logits[0, 3, [650, 129, 401]] = 10.0  # the bonus token: three equal maxima in three slices -> 129
    logits[0, 3, [5, 6]] = -torch.inf
    idx, n, out_tok, _ = tree_accept_greedy(tok.to(device), retrieve.to(device), logits.to(device))
    assert n.tolist() == [3]
    assert idx.tolist() == [[0, 1, 2, 3, -1]] and out_tok.tolist() == [[11, 12, 13, 129, -1]]
    _assert_equal((idx, n, out_tok, None), tree_accept_greedy_ref(tok, retrieve, logits))
    root_only = tree_accept_greedy(tok[:, :1].to(device), torch.zeros(1, 1, 1, dtype=torch.long, device=device),
                                   torch.full((1, 1, V), -torch.inf, device=device))
    assert root_only[1].tolist() == [0] and root_only[2].tolist() == [[0]]  # all -inf: index 0, as torch


def test_tree_accept_greedy_writes_caller_buffers(device):
    """``out``: the results land in the caller's tensors (a strided view for the features), which are returned."""
    gen = torch.Generator().manual_seed(secrets.randbelow(1 << 30))
    tok, ri, logits, feats = _case(2, 12, 90, 24, torch.float32, device, gen)
    C = ri.shape[2]
    big = torch.zeros(2, C + 3, 24, device=device)
    bufs = (torch.empty(2, C, dtype=torch.long, device=device), torch.empty(2, dtype=torch.long, device=device),
            None, big[:, 1:C + 1])
    nxt = (torch.full((2, C), 7, dtype=torch.long, device=device), torch.zeros(2, dtype=torch.int32, device=device))
    got = tree_accept_greedy(tok, ri, logits, feats, out=bufs, next_inputs=nxt)
    assert got[0] is bufs[0] and got[1] is bufs[1] and got[3] is bufs[3]
    want = tree_accept_greedy_ref(tok, ri, logits, feats)
    _assert_equal(got, want)
    assert torch.equal(nxt[0], want[2].clamp(min=0)) and torch.equal(nxt[1], (want[1] + 1).int())
    ref_nxt = (torch.empty_like(nxt[0]), torch.empty_like(nxt[1]))
    tree_accept_greedy_ref(tok, ri, logits, feats, next_inputs=ref_nxt)
    assert torch.equal(ref_nxt[0], nxt[0]) and torch.equal(ref_nxt[1], nxt[1])
    strided = torch.zeros(2, C + 2, dtype=torch.long, device=device)  # accept_len and tokens as columns of one buffer
    tree_accept_greedy(tok, ri, logits, out=(None, strided[:, 0], strided[:, 2:], None))
    assert torch.equal(strided[:, 0], want[1]) and torch.equal(strided[:, 2:], want[2]) and not strided[:, 1].any()
    assert torch.equal(big[:, 0], torch.zeros_like(big[:, 0])) and torch.equal(big[:, C + 1:],
                                                                                torch.zeros_like(big[:, C + 1:]))


def test_tree_accept_greedy_errors(device):
    gen = torch.Generator().manual_seed(1)
    tok, ri, logits, feats = _case(1, 5, 30, 4, torch.float32, device, gen)
    with pytest.raises(TypeError, match="draft_tokens"):
        tree_accept_greedy(tok.int(), ri, logits)
    with pytest.raises(ValueError, match="logits must be"):
        tree_accept_greedy(tok, ri, logits[:, :3])
    with pytest.raises(ValueError, match="retrieve_indices holds"):
        tree_accept_greedy(tok, ri.expand(2, -1, -1).contiguous(), logits)
    with pytest.raises(ValueError, match="outside"):
        tree_accept_greedy(tok, ri.clamp(max=9) + 3, logits)
    with pytest.raises(ValueError, match="features must be"):
        tree_accept_greedy(tok, ri, logits, feats[:, :2])
    with pytest.raises(ValueError, match="out features given"):
        tree_accept_greedy(tok, ri, logits, None, out=(None, None, None, feats))
    with pytest.raises(TypeError, match="num_new"):
        tree_accept_greedy(tok, ri, logits, next_inputs=(torch.empty(1, ri.shape[2], dtype=torch.long),
                                                         torch.empty(1, dtype=torch.long)))
    with pytest.raises(ValueError, match="out tokens"):
        tree_accept_greedy(tok, ri, logits, out=(None, None, torch.empty(1, 2, dtype=torch.long), None))


@pytest.mark.parametrize("B,T,V,W", [(1, 6, 300, 40), (2, 60, 129, 17), (2, 1, 1, 3)])
def test_tree_accept_greedy_from_argmax_keys(B, T, V, W, device):
    """The lm_head's packed argmax keys (``argmax_keys``, one per node, in place of the logits) give what the
    logits give, in the kernel and in the reference; exactly one of the two is taken."""
    from eagle_triton.ops.target_linear import argmax_keys_ref

    seed = secrets.randbelow(1 << 30)
    tok, ri, logits, feats = _case(B, T, V, W, torch.float32, device, torch.Generator().manual_seed(seed))
    logits[..., :2] = logits.amax(-1, keepdim=True)  # ties: the first index wins
    keys = argmax_keys_ref(logits.reshape(-1, V)).view(B, T + 1)
    want = tree_accept_greedy_ref(tok, ri, logits, feats)
    _assert_equal(tree_accept_greedy(tok, ri, None, feats, argmax_keys=keys), want)
    _assert_equal(tree_accept_greedy_ref(tok, ri, None, feats, argmax_keys=keys), want)
    with pytest.raises(ValueError, match="exactly one of logits and argmax_keys"):
        tree_accept_greedy(tok, ri, logits, argmax_keys=keys)
    with pytest.raises(ValueError, match="exactly one of logits and argmax_keys"):
        tree_accept_greedy(tok, ri, None)
    with pytest.raises(TypeError, match="argmax_keys must have dtype"):
        tree_accept_greedy(tok, ri, None, argmax_keys=keys.int())
