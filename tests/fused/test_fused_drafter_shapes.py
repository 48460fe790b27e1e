"""The fused drafter (and the graph drafter) for every class of published EAGLE-3 head shape, with FP8 weights and
attention biases: trees identical to the reference drafter under the interpreter (fp32, tiny shapes that keep each
class: head_dim 16 / 32 standing for 64 / 128, GQA ratios 1 / 4 / 8, target hidden != hidden, odd vocabularies);
the launch parameters of the real published shapes (meta device, no weights); and every refusal.

What the interpreter cannot show: bf16 arithmetic (it computes bf16 wrongly; fp32 compute is tested, with FP8
weights converted to fp32 in registers exactly as they are converted to bf16 on the GPU) and the NaN encodings of
e4m3 (the interpreter converts 0x7F to 480; quantize_fp8_weight never produces them). The sm_90 build of the FP8 and
bias variants is tests/test_compile_targets.py's; the GPU tests at the bottom compare trees on the device.
"""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from test_fused_drafter import accept_some, assert_same_kv, assert_same_tree, reference_margins, run_calls

from eagle_triton import Eagle3DraftHead, TreeConfig, TreeDrafter
from eagle_triton.fused import Buffers, DrafterConfig, DraftInputs, Weights, launch_drafter, launch_drafter_ref
from eagle_triton.fused.host import _SMEM_BUDGET, _SMEM_BUDGET_FP8, _TILE_KEY_ROWS, streamk_max_sharing
from eagle_triton.fused.kernel import _epi
from eagle_triton.heads import DraftHeadConfig
from eagle_triton.ops._utils import cdiv
from eagle_triton.testing import random_eagle3_head, random_eagle3_head_on


def shaped_head(hidden, heads, kv_heads, inter, vocab, draft_vocab, target_hidden=None, bias=False, fp8=False,
                seed=None, dtype=torch.float32, lm_head_scale=6.0):
    cfg = DraftHeadConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, vocab_size=vocab, draft_vocab_size=draft_vocab,
                          target_hidden_size=target_hidden, rms_norm_eps=1e-5, attention_bias=bias or None,
                          architectures=["LlamaForCausalLMEagle3"])
    head = random_eagle3_head(config=cfg, seed=seed, lm_head_scale=lm_head_scale, dtype=dtype)
    return head.quantize_fp8() if fp8 else head


# (hidden, heads, kv heads, intermediate, vocab, draft vocab, target hidden, bias, fp8): tiny stand-ins of the classes
SHAPE_CLASSES = {
    # Llama-3.2-1B-class: head_dim 64 (16 here), GQA 4
    "hd64-gqa4": (64, 4, 1, 96, 256, 96, None, False, False),
    # Llama-3.1-8B / Qwen3-8B / 70B-class: head_dim 128 (32 here), GQA 4 / 8
    "hd128-gqa4": (128, 4, 1, 160, 300, 97, None, False, False),
    "hd128-gqa8-70b": (256, 8, 1, 224, 257, 113, None, False, False),
    # no GQA (as many KV heads as heads), odd vocabularies, full vocabulary (no d2t)
    "hd64-mha-full-vocab": (48, 3, 3, 80, 211, None, None, False, False),
    # target wider than the draft (fc takes 3 x 96), attention biases
    "target-hidden-bias": (64, 2, 1, 96, 256, 96, 96, True, False),
    # FP8 weights at each head_dim class, with a bias, with GQA 8
    "fp8-hd64": (64, 4, 1, 96, 256, 96, None, False, True),
    "fp8-hd128-gqa8-bias": (256, 8, 1, 224, 257, 113, 80, True, True),
}


@pytest.mark.parametrize("shape", list(SHAPE_CLASSES), ids=list(SHAPE_CLASSES))
def test_shape_classes_match_reference(shape):
    """Prefill then decode (two calls, draft KV growing): the fused and the graph drafters give the reference's
    trees and draft KV (fp32 compute; FP8 weights converted in registers, scaled in the epilogues)."""
    hidden, nh, nkv, inter, vocab, dvocab, th, bias, fp8 = SHAPE_CLASSES[shape]
    head = shaped_head(hidden, nh, nkv, inter, vocab, dvocab, th, bias, fp8)
    assert head.config.head_dim in (16, 32)
    tc = TreeConfig(10, 2, 3)
    rng = np.random.default_rng()
    for drafters, trees in run_calls(head, tc, ["torch", "triton", "graph"], 2, 7, rng):
        assert drafters["triton"]._impl.fallback_reason == ""
        cfg = drafters["triton"]._impl._cfg
        assert cfg.fp8 == fp8 and cfg.attention_bias == bias
        for name in ("triton", "graph"):
            assert_same_tree(trees["torch"], trees[name])
            assert_same_kv(drafters["torch"].stable_kv, drafters[name].stable_kv)


def test_fp8_batched_launch_with_padded_rows_and_bias():
    """FP8 + biases through launch_drafter with 2 sequences of different KV lengths and padded new rows, both
    lm_head rankings: identical to the per-sequence reference."""
    head = shaped_head(64, 4, 2, 96, 256, 90, None, True, True)
    tc = TreeConfig(14, 2, 4)
    for lmw in (True, False):
        cfg = DrafterConfig.from_head(head, tc, max_batch=2, max_len=64, max_new_rows=8, lm_warp_rank=lmw)
        assert cfg.fp8 and cfg.attention_bias
        w = Weights.from_head(head, cfg.max_len + tc.depth + 1)
        w.check(cfg)
        bufs, bufs_ref = Buffers.allocate(cfg, "cpu"), Buffers.allocate(cfg, "cpu")
        for num_new in ([8, 3], [2, 5]):
            X = DraftInputs(torch.randn(2, 8, head.feature_width), torch.randint(0, 256, (2, 8)),
                            torch.tensor(num_new, dtype=torch.int32))
            out, ref = launch_drafter(cfg, X, w, bufs), launch_drafter_ref(cfg, X, w, bufs_ref)
            assert not out.fallback
            for a, b in zip(out, ref, strict=True):
                assert torch.equal(a, b)


@pytest.mark.parametrize(("fp8", "batch"), [(False, 17), (True, 9)], ids=["fp32-17", "fp8-9"])
def test_tail_row_tile_matches_reference(fp8, batch):
    """``tail_row_tile`` (the default) with 32-row tiles: 17 sequences of a top-4 tree (68 rows: two full tiles and a
    16-row tail; the root's 17 rows in a full tile) and 9 with FP8 weights (36 rows: one full tile and the tail,
    which takes the root's 9 rows), through launch_drafter with padded new rows: every output identical to the
    reference's and to the launch without the tail tile, and the draft KV to the latter's. (One program under the
    interpreter: the stream-K parts of several programs, a region per row tile, are the GPU test's.) Each tail is
    launched in a pass of its own and with ``tail_one_pass``: o, gate/up and down (``True``), and with FP8 o and
    down only, take the tail with the last full tile in one pass (17 sequences: the first tile alone, the second
    with the tail; 9: the root's rows in the tail alone); the same outputs and KV each time."""
    head = shaped_head(64, 4, 2, 96, 256, 90, None, True, fp8)
    tc = TreeConfig(14, 2, 4)
    base = DrafterConfig.from_head(head, tc, max_batch=batch, max_len=64, max_new_rows=4, block_m=32,
                                   tail_row_tile=True, stream_k_linear=True)
    masks = {False: 0, True: 7, "o/down": 5} if fp8 else {False: 0, True: 7}
    cfgs = [base.with_(tail_one_pass=k) for k in masks]
    for c, mask in zip(cfgs, masks.values(), strict=True):
        p = c.launch_params("cpu", batch, 4)
        assert (p["BM"], p["BMT"], p["SKL"], p["HQ"], p["TP1"]) == (32, 16, True, False, mask)
    plain = base.with_(tail_row_tile=False, tail_one_pass=False)
    assert plain.launch_params("cpu", batch, 4)["BMT"] == 0
    w = Weights.from_head(head, base.max_len + tc.depth + 1)
    bufs = [Buffers.allocate(c, "cpu") for c in cfgs]
    bufs_ref, bufs_plain = Buffers.allocate(base, "cpu"), Buffers.allocate(plain, "cpu")
    for _ in range(2):  # the second call drafts on the first's KV
        X = DraftInputs(torch.randn(batch, 4, head.feature_width), torch.randint(0, 256, (batch, 4)),
                        torch.randint(1, 5, (batch,), dtype=torch.int32))
        ref, out_plain = launch_drafter_ref(base, X, w, bufs_ref), launch_drafter(plain, X, w, bufs_plain)
        for c, b in zip(cfgs, bufs, strict=True):
            out = launch_drafter(c, X, w, b)
            assert not out.fallback
            for x, y, z in zip(out, ref, out_plain, strict=True):
                assert torch.equal(x, y) and torch.equal(x, z), c.tail_one_pass
    # the draft KV, tree steps' scratch rows included (the reference keeps only the prompt's): as without the tail
    for c, b in zip(cfgs, bufs, strict=True):
        assert torch.equal(b.k_cache, bufs_plain.k_cache) and torch.equal(b.v_cache, bufs_plain.v_cache), \
            c.tail_one_pass


def test_tail_row_tile_choice():
    """The tail tile's size: the tree rows past the full tiles rounded up to a power of two (>= 16); none where the
    rows fill whole tiles, fit one tile, or would round up to a full tile; block_m validated. On by default."""
    head = shaped_head(64, 4, 2, 96, 256, 90)
    cfg = DrafterConfig.from_head(head, TreeConfig(60, 7, 10), max_batch=16, max_len=512, max_new_rows=16, nprog=132)
    assert cfg.tail_row_tile
    dev = torch.device("cuda")  # the GPU's tiling (computed without a GPU)
    # top-10 tree: 10 rows per sequence; 128-row tiles from 65 rows on
    assert [cfg.launch_params(dev, b, 4)["BMT"] for b in (1, 8, 12, 13, 15, 16)] == [0, 0, 0, 16, 32, 32]
    assert [cfg.launch_params(dev, b, 4)["BM"] for b in (1, 8, 13, 16)] == [16, 128, 128, 128]
    assert cfg.with_(tail_row_tile=False).launch_params(dev, 16, 4)["BMT"] == 0
    # 64-row tiles: 60 rows fit one; 70 = 64 + 6 and 80 = 64 + 16 take a 16-row tail; 110 = 64 + 46 a full tile
    c64 = cfg.with_(block_m=64)
    assert [c64.launch_params(dev, b, 4)["BMT"] for b in (6, 7, 8, 11, 12)] == [0, 16, 16, 0, 0]
    assert c64.launch_params(dev, 7, 4)["BM"] == 64
    for bad in (8, 24, 256):
        with pytest.raises(ValueError, match="block_m"):
            cfg.with_(block_m=bad)
    # the one-pass tail: by default o, gate/up and down with 16-bit weights, none with FP8 (as measured); built only
    # where there is a tail tile, and needs one
    assert cfg.tail_one_pass is None
    assert [cfg.launch_params(dev, b, 4)["TP1"] for b in (8, 12, 13, 16)] == [0, 0, 7, 7]
    assert cfg.with_(weight_dtype=torch.float8_e4m3fn).launch_params(dev, 16, 4)["TP1"] == 0
    assert cfg.with_(tail_row_tile=False).launch_params(dev, 16, 4)["TP1"] == 0
    named = {True: 7, False: 0, "o": 1, "gate_up": 2, "down": 4, "o/down": 5, "down/gate_up/o": 7}
    assert {k: cfg.with_(tail_one_pass=k).launch_params(dev, 16, 4)["TP1"] for k in named} == named
    with pytest.raises(ValueError, match="tail_one_pass needs tail_row_tile"):
        cfg.with_(tail_row_tile=False, tail_one_pass=True)
    with pytest.raises(ValueError, match="tail_one_pass names an unknown product 'up'"):
        cfg.with_(tail_one_pass="o/up")
    with pytest.raises(TypeError, match="tail_one_pass must be"):
        cfg.with_(tail_one_pass=2)


def test_qkv_bias_only_head_matches_reference():
    """A head with q/k/v biases but none on o_proj (``qkv_bias``): the kernel adds zeros for o, trees identical."""
    cfg = DraftHeadConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                          vocab_size=256, draft_vocab_size=96, rms_norm_eps=1e-5, qkv_bias=True,
                          architectures=["LlamaForCausalLMEagle3"])
    head = random_eagle3_head(config=cfg, lm_head_scale=6.0)
    at = head.midlayer.self_attn
    assert at.q_proj.bias is not None and at.o_proj.bias is None
    w = Weights.from_head(head, 40)
    assert w.has_bias and not w.bias("wo").any() and torch.equal(w.bias("wk"), at.k_proj.bias)
    tc = TreeConfig(10, 2, 3)
    for _drafters, trees in run_calls(head, tc, ["torch", "triton"], 1, 5, np.random.default_rng()):
        assert_same_tree(trees["torch"], trees["triton"])


def test_fp8_tree_differs_from_the_unquantised_head():
    """The FP8 kernel path is not a no-op: with FP8 weights the logits of a draft change (so the parity above
    checks the dequantised products, not the unquantised ones)."""
    head = shaped_head(64, 4, 1, 96, 256, 96, seed=7)
    q = shaped_head(64, 4, 1, 96, 256, 96, seed=7, fp8=True)
    h = torch.randn(1, 3, 64)
    assert not torch.equal(head.compute_logits(h), q.compute_logits(h))


# ------------------------------------------------------------------------------------------------ published shapes
PUBLISHED = {
    # name: (hidden, heads, kv heads, intermediate, vocab, draft vocab)
    "llama31-8b": (4096, 32, 8, 14336, 128256, 32000),
    "qwen3-8b": (4096, 32, 8, 12288, 151936, 32000),
    "llama33-70b": (8192, 64, 8, 28672, 128256, 32000),
    "llama32-1b": (2048, 32, 8, 8192, 128256, 32000),
    "draft-vocab-64k": (4096, 32, 8, 14336, 128256, 65536),
}


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("shape", list(PUBLISHED))
def test_published_shapes_launch_parameters(shape, fp8):
    """The H100 launch (132 programs) of every published head shape, trees 60/7/10 and 60/5/10, batch 1-16: every
    tile divides what it must (RoPE pairs within a head, q/k/v chunks within one half of the 2H input), the stream-K
    buffers cover the sharing, the pipelined tiles fit the shared-memory budget, the lm_head tile keys fit their
    index (ranked by warps where the default picks it), the attention's query block holds a GQA group of the frontier,
    and its key block is 32 keys where that query block has 128 rows or more."""
    hidden, nh, nkv, inter, vocab, dvocab = PUBLISHED[shape]
    cfg_h = DraftHeadConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=nh,
                            num_key_value_heads=nkv, vocab_size=vocab, draft_vocab_size=dvocab, rms_norm_eps=1e-5)
    with torch.device("meta"):
        head = Eagle3DraftHead(cfg_h)
    hd = hidden // nh
    for tree in ((60, 7, 10), (60, 5, 10)):
        cfg = DrafterConfig.from_head(head, TreeConfig(*tree), dtype=torch.bfloat16, nprog=132,
                                      weight_dtype=torch.float8_e4m3fn if fp8 else None)
        assert cfg.fp8 == fp8
        for batch in (1, 2, 4, 8, 13, 16):
            p = cfg.launch_params(torch.device("cuda"), batch, 4)
            assert p["W8"] == fp8 and p["HD"] == hd
            # the tree rows past a full 128-row tile take a tail tile (by default): 130 = 128 + 16, 160 = 128 + 32
            assert p["BMT"] == {13: 16, 16: 32}.get(batch, 0)
            for bn in (p["BN"], p["BNQ"], p["BNQR"]):
                assert hd % bn == 0 and bn % 2 == 0
            assert p["NTH"] * p["BN"] >= hidden and p["NTHP"] >= p["NTH"]
            assert p["BM"] >= min(128, batch * 10)
            for bn, bk in ((p["BNQ"], p["BKQ"]), (p["BNQR"], p["BKQR"])):
                assert hidden % bk == 0
                assert streamk_max_sharing(cfg.qkv_tiles(bn), 2 * hidden // bk, 132) <= p["NSEG"]
            assert p["NSEG"] & (p["NSEG"] - 1) == 0 and p["NSPLIT"] & (p["NSPLIT"] - 1) == 0
            assert p["BQ"] >= p["K"] * nh // nkv
            # 32-key attention blocks where a query block has 128 rows or more (64 keys spill there), else 64
            assert p["BKV"] == (32 if p["BQ"] >= 128 else 64)
            assert cfg.with_(block_kv=64).launch_params(torch.device("cuda"), batch, 4)["BKV"] == 64
            welem = 1 if fp8 else 2
            budget = _SMEM_BUDGET_FP8 if fp8 else _SMEM_BUDGET  # FP8: 128-deep chunks at 128-row tiles too
            for rows, width, bk in ((p["BM"], p["BNV"], p["BK"]), (p["BM"], 2 * p["BNG"], p["BKG"]),
                                    (p["BM"], p["BN"], p["BKL"]), (p["BMR"], p["BN"], p["BKR"]),
                                    (p["BM"], p["BNQ"], p["BKQ"]), (p["BMR"], p["BNQR"], p["BKQR"])):
                assert p["STAGES"] * bk * (2 * rows + welem * width + 2) <= budget
            tiles_per_prog = cdiv(cdiv(dvocab, p["BNV"]), 132)
            # lm_head keys ranked by warps by default at row tiles of <= 64 rows, and at every row tile with FP8
            assert p["LMW"] == (p["BM"] <= 64 or fp8)
            if p["LMW"]:
                assert tiles_per_prog * p["BNV"] <= _TILE_KEY_ROWS


# ------------------------------------------------------------------------------------------------ refusals
def test_head_dim_not_supported_is_refused():
    """head_dim must be a power of two >= 16 (e.g. hidden 80 / 1 head, or 8): refused by the config, and the
    backend falls back to the reference with the reason (or raises without fallback) when it is built."""
    for hidden, heads in ((80, 1), (64, 8)):
        head = shaped_head(hidden, heads, 1, 96, 256, 96)
        with pytest.raises(ValueError, match=f"head_dim {hidden // heads} must be a power of two"):
            DrafterConfig.from_head(head, TreeConfig(10, 2, 3))
        with pytest.warns(RuntimeWarning, match="cannot run this head"):
            d = TreeDrafter(head, TreeConfig(10, 2, 3), backend="triton")
        assert "head_dim" in d._impl.fallback_reason
        with pytest.raises(RuntimeError, match="head_dim"):
            TreeDrafter(head, TreeConfig(10, 2, 3), backend="triton", fallback=False)


def test_vocabulary_beyond_the_key_index_is_refused():
    base = dict(hidden_size=64, num_heads=4, num_kv_heads=1, head_dim=16, intermediate_size=96, feature_width=192,
                rms_eps=1e-5, has_d2t=True)
    with pytest.raises(ValueError, match="32-bit ranking-key index"):
        DrafterConfig(draft_vocab=2**31, vocab_size=2**31, **base)
    # int32 lm_head tile keys (16-bit model dtype, ranked by warps) index a program's rows in 16 bits
    cfg = DrafterConfig(draft_vocab=70000, vocab_size=128256, dtype=torch.bfloat16, nprog=1, **base)
    p = cfg.launch_params("cpu", 1, 1)
    assert not p["LMW"]  # chosen automatically: the in-loop merge ranks int64 keys
    with pytest.raises(ValueError, match="16-bit index of its int32 tile keys"):
        cfg.with_(lm_warp_rank=True).launch_params("cpu", 1, 1)
    assert cfg.with_(nprog=2, lm_warp_rank=True).launch_params("cpu", 1, 1)["LMW"]  # 2 programs: 35000 rows each
    # fp32 ranks int64 keys everywhere: no limit
    assert DrafterConfig(draft_vocab=70000, vocab_size=128256, nprog=1, dtype=torch.float32, **base).launch_params(
        "cpu", 1, 1)["LMW"]


def test_shared_memory_budget_is_refused():
    """A tiling whose pipelined tiles exceed the shared-memory budget even at the smallest reduction chunk."""
    cfg = DrafterConfig(hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
                        draft_vocab=32000, feature_width=12288, vocab_size=128256, rms_eps=1e-5, has_d2t=True,
                        dtype=torch.bfloat16, nprog=132, max_batch=16, stages=12)
    with pytest.raises(ValueError, match="shared-memory budget"):
        cfg.launch_params(torch.device("cuda"), 16, 4)
    cfg.with_(stages=4).launch_params(torch.device("cuda"), 16, 4)


def test_weights_that_do_not_match_the_config_are_refused():
    head = shaped_head(64, 4, 1, 96, 256, 96, bias=True, fp8=True)
    tc = TreeConfig(10, 2, 3)
    cfg = DrafterConfig.from_head(head, tc, max_len=32, max_new_rows=4)
    w = Weights.from_head(head, 40)
    bufs = Buffers.allocate(cfg, "cpu")
    X = DraftInputs(torch.randn(1, 4, head.feature_width), torch.randint(0, 256, (1, 4)))
    for bad in (cfg.with_(weight_dtype=None), cfg.with_(attention_bias=False)):
        with pytest.raises(ValueError, match="do not match the drafter config"):
            launch_drafter(bad, X, w, Buffers.allocate(bad, "cpu"))
        with pytest.raises((TypeError, ValueError)):
            w.check(bad)
    w.wsc = w.wsc[:-1]
    with pytest.raises(ValueError, match="weights.wsc"):
        w.check(cfg)
    with pytest.raises(TypeError, match="weight_dtype"):
        cfg.with_(weight_dtype=torch.float8_e5m2)
    assert int(bufs.status[0]) == 0


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["llama32-1b", "llama31-8b", "qwen3-8b", "llama33-70b"])
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8-weights"])
def test_gpu_published_shapes_fp32_identical_trees(shape, fp8):
    """One program per SM at the published shapes, fp32 activations (IEEE dots, no TF32), with and without FP8
    weights, prefill then decode: the draft KV equal to the reference's, and every tree whose reference decisions
    are separated by more than 256 fp32 ulps (:func:`reference_margins`; the kernel and cuBLAS sum in different
    orders, so a near-tie may rank either way) identical to the reference's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    hidden, nh, nkv, inter, vocab, dvocab = PUBLISHED[shape]
    cfg = DraftHeadConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=nh,
                          num_key_value_heads=nkv, vocab_size=vocab, draft_vocab_size=dvocab, rms_norm_eps=1e-5,
                          architectures=["LlamaForCausalLMEagle3"])
    head = random_eagle3_head_on("cuda", cfg, peaked=True, dtype=torch.float32)
    if fp8:
        head.quantize_fp8()
    tc, rng, decided, prompt = TreeConfig(60, 7, 10), np.random.default_rng(), 0, 64
    for _ in range(3):
        drafters = {n: TreeDrafter(head, tc, backend=n) for n in ("torch", "triton")}
        ids = torch.randint(0, vocab, (1, prompt + 1), device="cuda")
        feats = torch.randn(1, prompt, head.feature_width, device="cuda")
        trees = {n: d.draft(feats, ids) for n, d in drafters.items()}
        assert drafters["triton"]._impl.fallback_reason == ""
        if reference_margins(head, tc, feats, ids) > 256:
            assert_same_tree(trees["torch"], trees["triton"])
            decided += 1
        assert_same_kv(drafters["torch"].stable_kv, drafters["triton"].stable_kv, atol=1e-3)
        acc = accept_some(trees["torch"], rng).cuda()  # the same accepted path into both: their KV must agree
        ids = torch.cat([ids, acc[None], torch.randint(0, vocab, (1, 1), device="cuda")], 1)
        feats = torch.randn(1, acc.numel() + 1, head.feature_width, device="cuda")
        for d in drafters.values():
            d.draft(feats, ids)
        assert_same_kv(drafters["torch"].stable_kv, drafters["triton"].stable_kv, atol=1e-3)
    del head, drafters
    torch.cuda.empty_cache()
    if decided == 0:
        pytest.skip("no reference tree was separated at 256 ulps: only the draft KV was compared")


# ------------------------------------------------------------------------------------------------ FP8 pieces
@triton.jit
def _fp8_pieces_kernel(w8_ptr, acc_ptr, sc_ptr, b_ptr, o_w, o_y, N: tl.constexpr, M: tl.constexpr,
                       DT: tl.constexpr):
    on = tl.arange(0, N)
    om = tl.arange(0, M)
    tl.store(o_w + on, tl.load(w8_ptr + on).to(DT).to(tl.float32))  # the kernel's weight conversion
    acc = tl.load(acc_ptr + om[:, None] * N + on[None, :])
    y = _epi(acc, sc_ptr, b_ptr, on, on < N, True, True, DT)
    tl.store(o_y + om[:, None] * N + on[None, :], y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp8_conversion_and_epilogue_in_each_dtype(dtype):
    """The two FP8 pieces of the kernel in a 16-bit and the 32-bit model dtype, under the interpreter: every finite
    e4m3 bit pattern converts to the value torch gives (exactly: e4m3 is exact in fp16/bf16/fp32), and the epilogue
    computes heads.fp8.fp8_linear's rnd(rnd(acc) * scale + bias) bit for bit. (Not bf16: the interpreter converts
    fp32 to bf16 by truncation, not rounding; bf16 is compared on the GPU.)"""
    bits = torch.arange(256, dtype=torch.uint8)
    bits = bits[(bits & 0x7F) != 0x7F]  # the NaN encodings (never produced by quantize_fp8_weight)
    n = 256
    w8 = torch.cat([bits, bits[: n - bits.numel()]]).view(torch.float8_e4m3fn)
    acc = torch.randn(4, n) * 3
    sc = torch.rand(n) * 0.01 + 1e-4
    bias = torch.randn(n).to(dtype)
    o_w, o_y = torch.empty(n), torch.empty(4, n)
    tdt = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]
    _fp8_pieces_kernel[(1,)](w8, acc, sc, bias, o_w, o_y, N=n, M=4, DT=tdt)
    assert torch.equal(o_w, w8.to(dtype).float())
    want = (acc.to(dtype) * sc + bias).to(dtype).float()
    assert torch.equal(o_y, want)
