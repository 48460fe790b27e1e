"""eagle_triton.integrations.sglang: SGLang's Python helpers and the drop-in op names."""

import pytest
import torch

from eagle_triton.integrations import sglang as sg


def test_fast_topk_keepdim():
    x = torch.randn(3, 7)
    v, i = sg.fast_topk(x, 1, -1)
    assert v.shape == (3, 1) and torch.equal(i[:, 0], x.argmax(-1))
    v, i = sg.fast_topk(x, 3, -1)
    assert torch.equal(v, x.topk(3, -1).values)


def test_select_top_k_tokens_and_organize():
    g = torch.Generator().manual_seed(0)
    bs, K, D, H = 2, 3, 8, 4
    hidden = torch.randn(bs, H, generator=g)
    p0 = torch.rand(bs, K, generator=g).sort(-1, True).values
    i0 = torch.randint(0, 100, (bs, K), generator=g)
    ids, hs, scores, info = sg.select_top_k_tokens(0, p0, i0, hidden, None, K)
    assert torch.equal(ids, i0.flatten()) and torch.equal(hs, hidden.repeat_interleave(K, 0))
    assert info[0].shape == (bs, 1, K) and info[2].tolist() == [[-1, 0, 1, 2]] * bs
    p1 = torch.rand(bs * K, K, generator=g)
    i1 = torch.randint(0, 100, (bs * K, K), generator=g)
    ids1, hs1, scores1, info1 = sg.select_top_k_tokens(1, p1, i1, hs, scores, K)
    expand = scores.unsqueeze(2) * p1.view(bs, K, K)
    top = expand.flatten(1).topk(K, -1)
    assert torch.equal(scores1, top.values) and torch.equal(info1[2], top.indices + K)
    assert torch.equal(ids1, i1.view(bs, K * K).gather(1, top.indices).flatten())
    assert torch.equal(hs1, hs[(top.indices // K + torch.arange(bs).unsqueeze(1) * K).flatten()])
    par, sel, dt = sg.organize_draft_results([info[0], info1[0]], [info[1], info1[1]], [info[2], info1[2]], D)
    assert par.shape == (bs, K + 1) and par.dtype == torch.long
    assert torch.equal(sel, sel.sort(-1).values) and sel.shape == (bs, D - 1)
    par1, _, _ = sg.organize_draft_results([info[0]], [info[1]], [info[2]], 3)
    assert par1.shape == (bs, 0) and par1.dtype == torch.long  # S == 1: empty long parent list


@pytest.mark.parametrize("mode", list(sg.TreeMaskMode))
def test_build_tree_wrapper(mode):
    g = torch.Generator().manual_seed(int(mode))
    bs, K, S, D = 3, 4, 3, 12
    vid, par, sel, dt = sg.simulate_eagle_draft(bs, K, S, D, generator=g)
    L = torch.tensor([3, 0, 5])
    tm, pos, ri, nt, ns, toks = sg.build_tree_kernel_efficient(vid, par, sel, dt, L, int(L.sum()), K, S, D, mode)
    assert torch.equal(toks.view(bs, D)[:, 0], vid) and torch.equal(toks.view(bs, D)[:, 1:], dt)
    assert pos.shape == (bs * D,) and ri.shape == nt.shape == ns.shape == (bs, D)
    if mode == sg.TreeMaskMode.FULL_MASK:
        assert tm.numel() == int(L.sum()) * D + bs * D * D and tm.dtype == torch.bool
    elif mode == sg.TreeMaskMode.QLEN_ONLY:
        assert tm.numel() == bs * D * D
    else:
        assert tm.dtype == torch.uint16 and tm.numel() == bs * D
    # Preallocated buffers are re-filled and reused (CUDA-graph-static path).
    buf, pbuf = torch.empty_like(tm).fill_(0 if mode != 2 else 0xFF), torch.empty_like(pos)
    out = sg.build_tree_kernel_efficient(vid, par, sel, dt, L, int(L.sum()), K, S, D, mode, buf, pbuf)
    assert out[0] is buf and out[1] is pbuf
    assert torch.equal(buf.view(-1).view(torch.uint8), tm.view(-1).view(torch.uint8)) and torch.equal(pbuf, pos)


def test_wrapper_errors_and_dtype_table():
    assert sg.packed_tree_mask_dtype(8) == torch.uint8 and sg.packed_tree_mask_dtype(9) == torch.uint16
    assert sg.packed_tree_mask_dtype(17) == torch.uint32
    with pytest.raises(ValueError):
        sg.packed_tree_mask_dtype(33)
    g = torch.Generator().manual_seed(1)
    vid, par, sel, dt = sg.simulate_eagle_draft(1, 2, 2, 4, generator=g)
    with pytest.raises(ValueError, match="tree_mask_buf"):
        sg.build_tree_kernel_efficient(vid, par, sel, dt, torch.tensor([5]), 5, 2, 2, 4, 0,
                                       torch.ones(10, dtype=torch.bool))


def test_drop_in_names_and_keywords():
    """sgl-kernel call sites pass the misspelled retrive_* keywords."""
    import inspect

    for fn in (sg.verify_tree_greedy, sg.tree_speculative_sampling_target_only):
        params = inspect.signature(fn).parameters
        assert {"retrive_index", "retrive_next_token", "retrive_next_sibling"} <= set(params)
    from eagle_triton.ops import build_tree_kernel_efficient

    assert list(inspect.signature(build_tree_kernel_efficient).parameters) == [
        "parent_list", "selected_index", "verified_seq_len", "tree_mask", "positions", "retrive_index",
        "retrive_next_token", "retrive_next_sibling", "topk", "depth", "draft_token_num", "tree_mask_mode"]
    g = torch.Generator().manual_seed(2)
    vid, par, sel, dt = sg.simulate_eagle_draft(2, 3, 3, 8, generator=g)
    _, _, ri, nt, ns, toks = sg.build_tree_kernel_efficient(vid, par, sel, dt, torch.tensor([1, 2]), 3, 3, 3, 8, 1)
    pred = torch.empty(2 * 8 + 1, dtype=torch.int32)
    ai = torch.full((2, 4), -1, dtype=torch.int32)
    an = torch.empty(2, dtype=torch.int32)
    sg.verify_tree_greedy(predicts=pred, accept_index=ai, accept_token_num=an, candidates=toks.view(2, 8),
                          retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
                          target_predict=torch.zeros(2, 8, dtype=torch.long))
    assert (ai[:, 0] == torch.tensor([0, 8], dtype=torch.int32)).all()
