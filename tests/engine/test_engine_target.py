"""The fast Llama-family runner against transformers, tree verification against sequential decoding, and the
PyTorch attention/KV operations against dense references."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from engine_testlib import tiny_llama
from numerics import assert_close_to_reference

from eagle_triton.engine import LlamaTarget, StaticKVCache, eagle3_tap_layers
from eagle_triton.engine.backend import (
    TorchOps,
    select_ops,
)
from eagle_triton.tree import build_tree_buffers


@pytest.mark.parametrize(
    "model,extra",
    [
        ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16}}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("qwen2", {}),
        ("qwen3", {"head_dim": 24}),
        ("mistral", {"sliding_window": None}),
    ],
    ids=["llama3-rope", "llama-bias", "qwen2-qkv-bias", "qwen3-qk-norm", "mistral"],
)
def test_prefill_decode_match_transformers(model, extra):
    """Against transformers: its fp32 forward is the baseline and its fp64 forward the reference (no fixed
    tolerance: the two libraries' fp32 kernels round differently, and differently from release to release)."""
    m = tiny_llama(vocab=97, hidden=48, layers=7, heads=6, kv_heads=2, model=model, seed=3, **extra)
    t = LlamaTarget.from_hf(m)
    t.setup(64, "eagle3")
    ids = torch.randint(0, 97, (1, 13))
    with torch.no_grad():
        ref = m(ids, output_hidden_states=True)
        ref64 = copy.deepcopy(m).double()(ids, output_hidden_states=True)
    taps, taps64 = (torch.cat([r.hidden_states[i] for i in eagle3_tap_layers(7)], dim=-1) for r in (ref, ref64))
    logits, feats = t.prefill(ids[:, :9])
    assert_close_to_reference(logits, ref.logits[:, 8], ref64.logits[:, 8], what="prefill logits")
    assert_close_to_reference(feats, taps[:, :9], taps64[:, :9], what="prefill features")
    for j in range(9, 13):
        logits, feats = t.decode(ids[:, j:j + 1])
        assert_close_to_reference(logits, ref.logits[:, j], ref64.logits[:, j], what=f"decode {j} logits")
        assert_close_to_reference(feats[:, 0], taps[:, j], taps64[:, j], what=f"decode {j} features")
    assert t.length == 13


def test_eagle1_feature_is_lm_head_input(tiny_model):
    t = LlamaTarget.from_hf(tiny_model)
    t.setup(32, "eagle1")
    ids = torch.randint(0, 128, (1, 5))
    logits, feats = t.prefill(ids)
    torch.testing.assert_close(t.lm_head(feats[:, -1]), logits, atol=1e-6, rtol=0)


def _weights(t):
    yield from (("embed", t.embed), ("norm", t.norm), ("lm_head", t.lm_head_weight))
    for i, layer in enumerate(t.layers):
        for name in layer.__slots__:
            if getattr(layer, name) is not None:
                yield f"layers.{i}.{name}", getattr(layer, name)


def test_from_pretrained_safetensors_dir(tmp_path, tiny_model):
    """Both loading paths hold the same weights, bit for bit, and compute the same function. The outputs are not
    compared exactly: tensors read from a safetensors file are not 64-byte aligned, so the CPU BLAS may take another
    code path and round differently (3.6e-7 apart with transformers 5.24)."""
    tiny_model.save_pretrained(tmp_path)
    a, b = LlamaTarget.from_hf(tiny_model), LlamaTarget.from_pretrained(tmp_path)
    ref = LlamaTarget.from_hf(tiny_model, dtype=torch.float64)
    assert a.config == b.config and torch.equal(a.inv_freq, b.inv_freq)
    wa, wb = dict(_weights(a)), dict(_weights(b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    for t in (a, b, ref):
        t.setup(32, "eagle3")
    ids = torch.randint(0, 128, (1, 6))
    (la, fa), (lb, fb), (lr, fr) = a.prefill(ids), b.prefill(ids), ref.prefill(ids)
    assert_close_to_reference(lb, la, lr, what="logits")
    assert_close_to_reference(fb, fa, fr, what="features")


def test_from_pretrained_norm_mode(tmp_path, tiny_model):
    """EagleEngine.from_pretrained passes norm_mode to the fast target it builds (the default: folded); a bad mode
    is named, and a mode for a target it does not build is refused."""
    from eagle_triton.engine import EagleEngine

    tiny_model.save_pretrained(tmp_path)
    eng = EagleEngine.from_pretrained(tmp_path, tokenizer=False, max_length=32, norm_mode="kernel")
    assert isinstance(eng.target, LlamaTarget) and eng.target.norm_mode == "kernel"
    assert EagleEngine.from_pretrained(tmp_path, tokenizer=False, max_length=32).target.norm_mode == "folded"
    with pytest.raises(ValueError, match="norm_mode must be one of"):
        EagleEngine.from_pretrained(tmp_path, tokenizer=False, max_length=32, norm_mode="fused")
    with pytest.raises(ValueError, match="norm_mode applies to the fast target"):
        EagleEngine.from_pretrained(eng.target, tokenizer=False, max_length=32, norm_mode="kernel")
    with pytest.raises(ValueError, match="norm_mode applies to the fast target"):
        EagleEngine.from_pretrained(tmp_path, tokenizer=False, target_impl="generic", norm_mode="kernel")


def _random_parents(n, levels, g):
    parents, depth = [-1], [0]
    while len(parents) < n:
        p = int(torch.randint(0, len(parents), (1,), generator=g))
        if depth[p] < levels:
            parents.append(p)
            depth.append(depth[p] + 1)
    return torch.tensor([parents])


@pytest.mark.parametrize("num_nodes,levels", [(1, 1), (6, 3), (11, 4)])
def test_verify_matches_sequential_decoding(tiny_model, num_nodes, levels):
    """The tree forward gives every node the logits and features that decoding its root-to-node path gives."""
    g = torch.Generator().manual_seed(num_nodes)
    t = LlamaTarget.from_hf(tiny_model)
    t.setup(64, "eagle3")
    prompt = torch.randint(0, 128, (1, 7), generator=g)
    parents = _random_parents(num_nodes, levels, g)
    tokens = torch.randint(0, 128, (1, num_nodes), generator=g)
    mask, depths, *_ = build_tree_buffers(parents, levels)
    t.prefill(prompt)
    logits, feats = t.verify(tokens, depths, mask)
    logits, feats = logits.clone(), feats.clone()
    # sequential decoding in fp32 is the baseline and in fp64 the reference: the tree forward multiplies other
    # shapes, which the CPU BLAS may round differently
    ref, ref64 = LlamaTarget.from_hf(tiny_model), LlamaTarget.from_hf(tiny_model, dtype=torch.float64)
    for r in (ref, ref64):
        r.setup(64, "eagle3")
    for node in range(num_nodes):
        path, n = [], node
        while n >= 0:
            path.append(n)
            n = int(parents[0, n])
        path.reverse()
        outs = []
        for r in (ref, ref64):
            r.reset()
            r.prefill(prompt)
            for p in path:
                lg, ft = r.decode(tokens[:, p:p + 1])
            outs.append((lg, ft))
        (lg, ft), (lg64, ft64) = outs
        assert_close_to_reference(logits[:, node], lg, lg64, what=f"node {node} logits")
        assert_close_to_reference(feats[:, node], ft[:, 0], ft64[:, 0], what=f"node {node} features")


def test_commit_keeps_accepted_path(tiny_model):
    """After committing a path, decoding continues exactly as if the path had been decoded token by token."""
    g = torch.Generator().manual_seed(5)
    t = LlamaTarget.from_hf(tiny_model)
    t.setup(64, None)
    prompt = torch.randint(0, 128, (1, 6), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, 3]])
    tokens = torch.randint(0, 128, (1, 7), generator=g)
    mask, depths, *_ = build_tree_buffers(parents, 3)
    t.prefill(prompt)
    t.verify(tokens, depths, mask)
    path = [0, 1, 3, 6]
    t.commit(torch.tensor([[0, 1, 3, 6]]), torch.tensor([3]), 3)
    assert t.length == 10 and int(t.cache.seqlens[0]) == 10
    nxt = torch.randint(0, 128, (1, 1), generator=g)
    got, _ = t.decode(nxt)
    full = torch.cat([prompt, tokens[:, path], nxt], dim=1)
    ref, ref64 = LlamaTarget.from_hf(tiny_model), LlamaTarget.from_hf(tiny_model, dtype=torch.float64)
    (want, _), (want64, _) = ((r.setup(64, None), r.prefill(full))[1] for r in (ref, ref64))
    assert_close_to_reference(got, want, want64, what="logits after commit")


def test_sliding_window_and_unsupported_types_are_rejected():
    m = tiny_llama(model="mistral", sliding_window=16, layers=4)
    t = LlamaTarget.from_hf(m)
    with pytest.raises(ValueError, match="sliding window"):
        t.setup(64, None)
    with pytest.raises(ValueError, match="needs a target with >= 3 layers"):
        eagle3_tap_layers(2)


# -- attention / KV operations ------------------------------------------------------------------------------------
def _dense_attention(q, k_cache, v_cache, seqlens, tree_mask):
    """Row-by-row fp64 reference."""
    B, Tq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    out = torch.zeros(B, Tq, Hq, D, dtype=torch.float64)
    for b in range(B):
        s = int(seqlens[b])
        for i in range(Tq):
            cols = list(range(s))
            for j in range(Tq):
                ok = (j <= i) if tree_mask is None else bool(tree_mask[b, i, j])
                if ok:
                    cols.append(s + j)
            for h in range(Hq):
                kv = h // (Hq // Hkv)
                kk = k_cache[b, cols, kv].double()
                vv = v_cache[b, cols, kv].double()
                w = torch.softmax(kk @ q[b, i, h].double() / math.sqrt(D), dim=0)
                out[b, i, h] = w @ vv
    return out


@pytest.mark.parametrize("B,Tq,Hq,Hkv,D,use_tree", [(1, 1, 2, 1, 8, False), (2, 5, 4, 2, 16, True),
                                                    (1, 7, 3, 3, 8, True), (2, 3, 6, 2, 4, False)])
def test_torch_ops_tree_attention_vs_dense(B, Tq, Hq, Hkv, D, use_tree):
    g = torch.Generator().manual_seed(Tq * 7 + Hq)
    Lmax = 24
    seqlens = torch.randint(0, Lmax - Tq, (B,), generator=g).to(torch.int32)
    q = torch.randn(B, Tq, Hq, D, generator=g)
    k_cache, v_cache = torch.randn(B, Lmax, Hkv, D, generator=g), torch.randn(B, Lmax, Hkv, D, generator=g)
    tree_mask = None
    if use_tree:
        parents = torch.stack([_random_parents(Tq, 3, g)[0] for _ in range(B)])
        tree_mask = build_tree_buffers(parents, 3)[0]
    ops = TorchOps()
    out = ops.tree_attention(q, k_cache, v_cache, seqlens, tree_mask)
    torch.testing.assert_close(out.double(), _dense_attention(q, k_cache, v_cache, seqlens, tree_mask),
                               atol=1e-5, rtol=1e-5)
    limited = ops.tree_attention(q, k_cache, v_cache, seqlens, tree_mask, kv_limit=int(seqlens.max()) + Tq)
    torch.testing.assert_close(limited, out, atol=1e-6, rtol=1e-6)


def test_append_and_compact_kv_cache_exact():
    g = torch.Generator().manual_seed(1)
    NL, B, Lmax, H, D = 3, 2, 20, 2, 4
    k, v = torch.randn(NL, B, Lmax, H, D, generator=g), torch.randn(NL, B, Lmax, H, D, generator=g)
    seqlens = torch.tensor([4, 7], dtype=torch.int32)
    k_new, v_new = torch.randn(B, 5, H, D, generator=g), torch.randn(B, 5, H, D, generator=g)
    before_k = k.clone()
    ops = TorchOps()
    ops.append_kv_cache(k[1], v[1], k_new, v_new, seqlens)
    assert torch.equal(k[1, 0, 4:9], k_new[0]) and torch.equal(k[1, 1, 7:12], k_new[1])
    assert torch.equal(v[1, 1, 7:12], v_new[1]) and torch.equal(k[0], before_k[0])
    assert torch.equal(k[1, 0, :4], before_k[1, 0, :4]) and torch.equal(k[1, 0, 9:], before_k[1, 0, 9:])
    accept_index = torch.tensor([[0, 2, 3, -1], [0, 1, -1, -1]])
    accept_len = torch.tensor([2, 1])
    ref_k = k.clone()
    ref_k[:, 0, 4:7] = k[:, 0, [4, 6, 7]]
    ref_k[:, 1, 7:9] = k[:, 1, [7, 8]]
    ops.compact_kv_cache(k, v, seqlens, accept_index, accept_len)  # accepted drafts, root excluded
    assert torch.equal(k, ref_k)
    assert seqlens.tolist() == [4, 7]  # the op leaves lengths alone: StaticKVCache.compact advances them


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_compaction_takes_the_rows_kept_count_as_it_is(backend):
    """``StaticKVCache.compact`` with ``rows_kept`` (``accept_len + 1`` as int32, which the step's accept writes as
    the next ``num_new``) moves and commits exactly what the accepted-drafts form does, and the back end hands that
    very tensor to the op (no ``accept_len + 1`` launch); without it, the op gets ``accept_len + 1``."""
    from eagle_triton.engine.backend import TritonOps

    ops = TorchOps() if backend == "torch" else TritonOps()  # Triton: the interpreter on a CPU machine
    seen = []
    compact = ops._compact
    ops._compact = lambda *args, **kwargs: (seen.append(args[4]), compact(*args, **kwargs))
    g = torch.Generator().manual_seed(3)
    accept_index = torch.tensor([[0, 2, 3, -1], [0, 1, -1, -1], [0, -1, -1, -1]])
    accept_len = torch.tensor([2, 1, 0])
    rows_kept = (accept_len + 1).to(torch.int32)
    caches = []
    for kept in (None, rows_kept):
        cache = StaticKVCache(2, 3, 16, 2, 4, torch.float32, "cpu")
        cache.k.copy_(torch.randn(cache.k.shape, generator=g))
        cache.v.copy_(cache.k * 2)
        cache.seqlens.copy_(torch.tensor([4, 7, 0], dtype=torch.int32))
        cache.compact(ops, accept_index, accept_len, None, kept)
        caches.append(cache)
        g.manual_seed(3)
    assert torch.equal(seen[0], accept_len + 1) and seen[1] is rows_kept
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
    assert caches[1].seqlens.tolist() == caches[0].seqlens.tolist() == [7, 9, 1]


def test_static_cache_and_backend_selection():
    cache = StaticKVCache(2, 1, 13, 2, 4, torch.float32, "cpu")
    assert cache.max_length == 16 and cache.k.shape == (2, 1, 16, 2, 4)
    cache.advance(10)
    with pytest.raises(ValueError, match="capacity exceeded"):
        cache.check_room(7)
    assert isinstance(select_ops("cpu"), TorchOps)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        select_ops("cpu", "triton")
    with pytest.raises(ValueError, match="unknown attention back end"):
        select_ops("cpu", "flash")


def test_engine_on_the_triton_ops(tiny_model):
    """The engine driven through :class:`TritonOps` (the eagle_triton.ops kernels; the Triton interpreter on a CPU
    machine) produces transformers' greedy tokens: the convention bridge to ops.compact_kv_cache holds."""
    import os

    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("needs CUDA or the Triton interpreter")
    from engine_testlib import hf_greedy

    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine
    from eagle_triton.engine.backend import TritonOps
    from eagle_triton.testing import random_eagle3_head

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = tiny_llama(layers=4, hidden=32, heads=2, kv_heads=1, seed=2)
    t = LlamaTarget.from_hf(m, device=dev, cuda_graphs=False)
    t.ops = TritonOps()
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=128, draft_vocab_size=48, seed=1)
    eng = EagleEngine(t, head, TreeConfig(8, 2, 3), max_length=64)
    prompt = list(range(3, 10))
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=6)
    assert out == hf_greedy(m, prompt, 6) and stats.steps >= 1
