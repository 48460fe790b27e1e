"""``start_rows``: a prompt's rows but the last go into the draft KV as K/V only, and the first draft ingests the
last row; the trees and the draft KV equal those of one draft over the whole prompt (the reference drafter's)."""

import pytest
import torch

from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.fused import DrafterConfig, Weights
from eagle_triton.fused.multikernel import draft_kv_rows
from eagle_triton.heads import DraftHeadConfig
from eagle_triton.testing import random_eagle3_head, random_eagle3_head_on


def _head(**kw):
    return random_eagle3_head(seed=int(torch.randint(0, 2**31, ())), lm_head_scale=6.0, **kw)


def _prompt(head, n):
    V = head.config.vocab_size
    return torch.randn(1, n, head.feature_width, dtype=head.dtype), torch.randint(0, V, (1, n + 1))


def _slot_tree(tree, b):
    return {name: getattr(tree, name)[b:b + 1] for name in ("draft_tokens", "retrieve_indices_padded", "tree_mask",
                                                            "positions", "parents", "num_leaves", "max_depth")}


def _assert_slot_equals(tree, b, ref):
    for name, got in _slot_tree(tree, b).items():
        assert torch.equal(got, getattr(ref, name)), (name, got, getattr(ref, name))


@pytest.mark.parametrize("lengths,cfg", [((1,), (8, 2, 3)), ((6,), (12, 2, 3)), ((37,), (12, 2, 3)),
                                         ((5, 9), (10, 3, 2))],
                         ids=["one-token-prompt", "short", "long-prompt", "two-slots"])
def test_started_rows_draft_as_one_draft_of_the_whole_prompt(lengths, cfg):
    head = _head()
    tc = TreeConfig(*cfg)
    B = len(lengths)
    fused = TreeDrafter(head, tc, backend="triton")
    fused.reserve(96, tc.max_levels + 1, batch=B)
    prompts = [_prompt(head, n) for n in lengths]
    C = tc.max_levels + 1
    feats = torch.zeros(B, C, head.feature_width, dtype=head.dtype)
    ids = torch.zeros(B, C, dtype=torch.long)
    for b, (f, i) in enumerate(prompts):
        n = f.shape[1]
        fused.start_rows(b, f[0, :n - 1], i[0, 1:n])
        feats[b, 0], ids[b, 0] = f[0, n - 1], i[0, n]
    tree = fused.draft_rows(feats, ids, torch.ones(B, dtype=torch.int32))
    bufs = fused._impl.bufs
    assert bufs.kv_len.tolist() == list(lengths)
    for b, (f, i) in enumerate(prompts):
        ref = TreeDrafter(head, tc, backend="torch")
        _assert_slot_equals(tree, b, ref.draft(f, i))
        (k, v), = ref.stable_kv  # [1, nkv, n, hd]
        n = lengths[b]
        torch.testing.assert_close(bufs.k_cache[b, :n], k[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bufs.v_cache[b, :n], v[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias,fp8", [(False, False), (True, False), (True, True)], ids=["plain", "bias", "bias-fp8"])
def test_draft_kv_rows_are_the_reference_drafters_rows(bias, fp8):
    """The K/V ``draft_kv_rows`` computes are those the reference drafter keeps for the same rows: a head whose
    width differs from the target's, a non-default RoPE base, with attention bias and FP8 weights."""
    cfg = DraftHeadConfig(hidden_size=48, intermediate_size=80, num_attention_heads=3, num_key_value_heads=1,
                          vocab_size=256, draft_vocab_size=96, target_hidden_size=80, rope_theta=500000.0,
                          rms_norm_eps=1e-5, attention_bias=bias or None, architectures=["LlamaForCausalLMEagle3"])
    head = random_eagle3_head(config=cfg, seed=int(torch.randint(0, 2**31, ())))
    head = head.quantize_fp8() if fp8 else head
    tc = TreeConfig(6, 1, 2)
    f, i = _prompt(head, 11)
    ref = TreeDrafter(head, tc, backend="torch")
    ref.draft(f, i)
    (k, v), = ref.stable_kv
    dcfg = DrafterConfig.from_head(head, tc, max_len=64, max_new_rows=16)
    kr, vr = draft_kv_rows(dcfg, Weights.from_head(head, 64), f[0], i[0, 1:])
    torch.testing.assert_close(kr, k[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vr, v[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def _meta(slot, first, n):
    return torch.tensor([slot, first, n], dtype=torch.int64)


def test_start_in_chunks_equals_one_start():
    """``start_rows_chunk``: a start of 37 rows as 16-row chunks (padding rows of random junk, the last chunk
    partly padding) writes the same draft KV and length as ``start_rows`` of all 37 at once; the padding rows'
    cache rows, the rows past the start and the other slot keep their contents; a chunk of no rows sets the
    length only; padding past the cache end leaves the cache's last row as it was."""
    head = _head()
    tc = TreeConfig(8, 2, 3)
    n, C = 37, 16
    f, i = _prompt(head, n)
    feats, ids = f[0], i[0, 1:]
    one, chunked = (TreeDrafter(head, tc, backend="triton") for _ in range(2))
    for d in (one, chunked):
        d.reserve(64, tc.max_levels + 1, batch=2)
    bufs = chunked._impl.bufs
    cap = bufs.k_cache.shape[1]
    junk_k, junk_v = torch.randn_like(bufs.k_cache), torch.randn_like(bufs.v_cache)
    bufs.k_cache.copy_(junk_k)
    bufs.v_cache.copy_(junk_v)
    one.start_rows(1, feats, ids)
    f_buf, i_buf = torch.randn(C, head.feature_width, dtype=head.dtype), torch.randint(0, 9, (C,))
    for first in range(0, n, C):
        m = min(C, n - first)
        f_buf[:m], i_buf[:m] = feats[first:first + m], ids[first:first + m]
        chunked.start_rows_chunk(_meta(1, first, m), f_buf, i_buf)
    ref = one._impl.bufs
    assert bufs.kv_len.tolist() == [0, n]
    # the same products on the same rows, in products of other row counts (a library may round those differently)
    torch.testing.assert_close(bufs.k_cache[1, :n], ref.k_cache[1, :n])
    torch.testing.assert_close(bufs.v_cache[1, :n], ref.v_cache[1, :n])
    assert torch.equal(bufs.k_cache[1, n:], junk_k[1, n:]) and torch.equal(bufs.v_cache[1, n:], junk_v[1, n:])
    assert torch.equal(bufs.k_cache[0], junk_k[0]) and torch.equal(bufs.v_cache[0], junk_v[0])
    chunked.start_rows_chunk(_meta(0, 0, 0), f_buf, i_buf)  # a one-token prompt: no rows
    assert bufs.kv_len.tolist() == [0, n] and torch.equal(bufs.k_cache[0], junk_k[0])
    chunked.start_rows_chunk(_meta(0, cap - 3, 2), f_buf, i_buf)  # 14 padding rows past the cache end
    assert bufs.kv_len.tolist() == [cap - 1, n]
    assert torch.equal(bufs.k_cache[0, cap - 1], junk_k[0, cap - 1])
    assert not torch.equal(bufs.k_cache[0, cap - 3:cap - 1], junk_k[0, cap - 3:cap - 1])
    assert torch.equal(bufs.k_cache[0, :cap - 3], junk_k[0, :cap - 3])
    # the host's part of a start marks the draft KV length as the device's (chunks replayed from a graph run no
    # Python): reserving again then needs a reset, as after start_rows or draft_rows
    again = TreeDrafter(head, tc, backend="triton")
    again.reserve(64, tc.max_levels + 1, batch=2)
    again.begin_start(0, feats, ids)
    assert again.kv_len == -1
    with pytest.raises(RuntimeError, match="needs a reset"):
        again.reserve(128, tc.max_levels + 1, batch=2)
    reference = TreeDrafter(head, tc, backend="torch")
    assert not reference.starts_in_chunks and chunked.starts_in_chunks
    for call in (lambda: reference.start_rows_chunk(_meta(0, 0, 1), f_buf, i_buf),
                 lambda: reference.begin_start(0, feats, ids)):
        with pytest.raises(ValueError, match="no start_rows_chunk"):
            call()


def test_start_rows_refuses_bad_input():
    head = _head()
    tc = TreeConfig(8, 2, 3)
    fused = TreeDrafter(head, tc, backend="triton")
    W = head.feature_width
    with pytest.raises(RuntimeError, match="before reserve"):
        fused.start_rows(0, torch.randn(3, W), torch.zeros(3, dtype=torch.long))
    fused.reserve(32, 4, batch=2)
    with pytest.raises(ValueError, match=r"features must be \[N, "):
        fused.start_rows(0, torch.randn(3, W + 1), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="new_ids"):
        fused.start_rows(0, torch.randn(3, W), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="slot 2 is not one of the 2"):
        fused.start_rows(2, torch.randn(3, W), torch.zeros(3, dtype=torch.long))
    cap = fused._impl._cfg.max_len
    with pytest.raises(ValueError, match="exceed the draft KV"):
        fused.start_rows(1, torch.randn(cap, W), torch.zeros(cap, dtype=torch.long))
    assert fused._impl.bufs.kv_len.tolist() == [0, 0]  # nothing written by a refused call


def test_reference_back_end_has_no_start_rows():
    fused = TreeDrafter(_head(), TreeConfig(8, 2, 3), backend="torch")
    with pytest.raises(ValueError, match="host-known lengths only"):
        fused.start_rows(0, torch.randn(2, 4), torch.zeros(2, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n", [1, 77, 300])
def test_gpu_started_rows_at_the_smollm2_head_shape_bf16(n):
    """On the GPU at the shipped head's shape (hidden 576, 9/3 heads of 64), bf16: the K/V rows ``start_rows``
    writes are the reference drafter's for the same prompt (bf16 tolerance), and the first draft after it is a
    tree of the configured shape drafted from the last row."""
    cfg = DraftHeadConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                          vocab_size=49152, draft_vocab_size=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                          architectures=["LlamaForCausalLMEagle3"])
    head = random_eagle3_head_on("cuda", cfg, dtype=torch.bfloat16, seed=int(torch.randint(0, 2**31, ())))
    tc = TreeConfig(16, 3, 4)
    f, i = (t.cuda() for t in _prompt(head, n))
    fused = TreeDrafter(head, tc, backend="triton")
    fused.reserve(1024, tc.max_levels + 1)
    fused.start_rows(0, f[0, :n - 1], i[0, 1:n])
    C = tc.max_levels + 1
    feats = torch.zeros(1, C, head.feature_width, dtype=head.dtype, device="cuda")
    ids = torch.zeros(1, C, dtype=torch.long, device="cuda")
    feats[0, 0], ids[0, 0] = f[0, n - 1], i[0, n]
    tree = fused.draft_rows(feats, ids, torch.ones(1, dtype=torch.int32, device="cuda"))
    bufs = fused._impl.bufs
    assert bufs.kv_len.tolist() == [n] and tree.draft_tokens.shape == (1, tc.total_tokens)
    assert int(tree.draft_tokens[0, 0]) == int(i[0, n])  # the root: the token after the last row
    ref = TreeDrafter(head, tc, backend="torch")
    ref.draft(f, i)
    (k, v), = ref.stable_kv
    torch.testing.assert_close(bufs.k_cache[0, :n].float(), k[0].transpose(0, 1).float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(bufs.v_cache[0, :n].float(), v[0].transpose(0, 1).float(), atol=3e-2, rtol=2e-2)
