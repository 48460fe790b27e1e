"""The fused batch-invariant Triton forward of :class:`LlamaTarget` (``ops="triton"``; Triton's interpreter on the
CPU): parity with the PyTorch forward for every family, chunked prefill, bit-identical verify/decode rows, greedy
speculative output equal to plain output, and no compilation for new prompt lengths."""

from __future__ import annotations

import collections

import pytest
import torch
from engine_testlib import OracleDrafter, tiny_llama

import eagle_triton.engine.target as target_mod
from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.drafter.tree import build_tree_buffers
from eagle_triton.engine import EagleEngine, LlamaTarget
from eagle_triton.testing import random_eagle3_head

V = 97
FAMILIES = [("llama", {"attention_bias": True, "mlp_bias": True}), ("qwen2", {}), ("qwen3", {"head_dim": 24}),
            ("mistral", {"sliding_window": None, "tie_word_embeddings": True})]
#: heads of 32: the q/k/v product runs with the RoPE + KV-write epilogue (target_qkv_rope; narrower heads keep
#: the two kernels)
WIDE_HEADS = ("qwen2", {"head_dim": 32})


@pytest.fixture
def small_chunks(monkeypatch):
    """Prefill chunks of 8 or 4 rows, so tiny prompts exercise several chunks, overlapping last chunks and
    prompts shorter than any chunk."""
    monkeypatch.setattr(target_mod, "PREFILL_CHUNKS", (8, 4))


def _model(model="llama", dtype=torch.float32, **extra):
    m = tiny_llama(vocab=V, hidden=48, layers=3, heads=6, kv_heads=2, model=model, seed=3, **extra)
    return m.to(dtype)


@pytest.mark.parametrize("model,extra", FAMILIES + [WIDE_HEADS], ids=[f[0] for f in FAMILIES] + ["qwen2-d32"])
def test_fused_forward_matches_torch_forward(model, extra, small_chunks):
    """Prefill (3 chunks of 8, the last overlapping), decode and a tree verify through the fused kernels match the
    PyTorch forward (fp32)."""
    m = _model(model, **extra)
    a, b = LlamaTarget.from_hf(m), LlamaTarget.from_hf(m, ops="triton")
    assert b.fused_forward and not a.fused_forward
    assert (b._linear_configs["qkv_rope"] is not None) == (extra.get("head_dim") == 32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (1, 19), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 3]])
    tokens = torch.randint(0, V, (1, 5), generator=g)
    mask, depths, *_ = build_tree_buffers(parents, 3)
    outs = []
    for t in (a, b):
        t.setup(64, "eagle3")
        lp, fp = t.prefill(ids)
        ld, fd = t.decode(ids[:, :1])
        lv, fv = t.verify(tokens, depths, mask)
        outs.append([x.clone() for x in (lp, fp, ld, fd, lv, fv)])
    for x, y in zip(*outs, strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(y, x, atol=5e-5, rtol=1e-5)


def test_argmax_rows_are_the_argmax_of_the_logits(small_chunks):
    """``argmax=True`` (greedy steps): the fused forward's lm_head returns each row's argmax key instead of its
    logits, decoding and verifying; the PyTorch forward has no keys and returns the logits."""
    from eagle_triton.ops.target_linear import argmax_from_keys

    m = _model()
    a, b = LlamaTarget.from_hf(m, ops="triton"), LlamaTarget.from_hf(m, ops="triton")
    assert b.fused_argmax and not LlamaTarget.from_hf(m).fused_argmax
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (1, 9), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 3, 1]])
    tokens = torch.randint(0, V, (1, 6), generator=g)
    mask, depths, *_ = build_tree_buffers(parents, 3)
    got = []
    for t, argmax in ((a, False), (b, True)):
        t.setup(32, "eagle3")
        t.prefill(ids)
        ld, _ = t.decode_rows(ids[:, :1], 32, want_features=False, argmax=argmax)
        lv, fv = t.verify_rows(tokens, depths, mask, 32, argmax=argmax)
        got.append((ld.clone(), lv.clone(), fv.clone()))
    (ld, lv, fv), (kd, kv, fk) = got
    assert kd.dtype == kv.dtype == torch.int64 and kd.shape == (1,) and kv.shape == (1, 6)
    assert torch.equal(argmax_from_keys(kd), ld.argmax(-1)) and torch.equal(argmax_from_keys(kv), lv.argmax(-1))
    assert torch.equal(fk, fv)  # the features are the same rows either way
    with pytest.raises(ValueError, match="argmax keys are made for every row"):
        b._forward_fused(ids[:, :1], torch.zeros(1, 1, dtype=torch.long), None, last_only=True, argmax=True)


def test_fused_eagle1_feature_is_lm_head_input(small_chunks):
    t = LlamaTarget.from_hf(_model(), ops="triton")
    t.setup(32, "eagle1")
    logits, feats = t.prefill(torch.randint(0, V, (1, 11)))
    assert feats.shape == (1, 11, 48)
    torch.testing.assert_close(t.lm_head(feats[:, -1]), logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", [{"norm_mode": "partials"}, {"norm_mode": "prologue"}, {"norm_mode": "kernel"},
                                {"inline_norm": False}, {"inline_norm": True}],
                         ids=["partials", "prologue", "kernel", "inline_false", "inline_true"])
def test_norm_modes_agree(kw):
    """The RMSNorm folded into the weights (default), as its own kernel, from partial sums of squares and in the
    prologue (also under the older ``inline_norm`` spelling) round alike up to the order of the row's sum of
    squares (and, folded, the roundings of the normalised row and the folded weights: fp32 here)."""
    m = _model("qwen2")
    a, b = LlamaTarget.from_hf(m, ops="triton"), LlamaTarget.from_hf(m, ops="triton", **kw)
    assert a.norm_mode == "folded"
    assert b.norm_mode == kw.get("norm_mode", {True: "prologue", False: "kernel"}.get(kw.get("inline_norm")))
    ids = torch.randint(0, V, (1, 6))
    for t in (a, b):
        t.setup(16, "eagle3")
    (la, fa), (lb, fb) = a.prefill(ids), b.prefill(ids)
    torch.testing.assert_close(lb, la, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(fb, fa, atol=2e-5, rtol=1e-5)


def test_bad_norm_mode_is_named():
    with pytest.raises(ValueError, match="norm_mode must be one of"):
        LlamaTarget.from_hf(_model(), ops="triton", norm_mode="fused")
    with pytest.raises(ValueError, match="contradicts"):
        LlamaTarget.from_hf(_model(), ops="triton", norm_mode="partials", inline_norm=True)


def test_fused_forward_needs_triton_ops():
    with pytest.raises(ValueError, match="fused_forward=True needs the Triton ops"):
        LlamaTarget.from_hf(_model(), ops="torch", fused_forward=True)


@pytest.mark.parametrize("model,extra,layers", [(*FAMILIES[0], 3), (*FAMILIES[0], 4), (*WIDE_HEADS, 7)],
                         ids=["llama-taps-0-1-2", "llama-taps-1-2-2", "qwen2-d32-qkv-rope-taps-2-3-4"])
def test_eagle3_features_are_the_tapped_layers_inputs_bitwise(model, extra, layers, small_chunks, monkeypatch):
    """The EAGLE-3 features of the fused forward (the down products that make the tapped layers' inputs write them
    straight into their slices of one buffer; the embedding and a repeated tap copied in) are, bit for bit, the
    concatenation of the inputs the tapped layers' q/k/v products (or q/k/v + RoPE products) read: prefill chunks,
    decode and verify."""
    m = tiny_llama(vocab=V, hidden=48, layers=layers, heads=6, kv_heads=2, model=model, seed=3, **extra)
    t = LlamaTarget.from_hf(m, ops="triton")
    t.setup(64, "eagle3")
    qkv_weights = {id(L.w_qkv) for L in t.layers}
    inputs, checked = [], []
    normed, rope, fused = t._normed_linear, t._qkv_rope, t._forward_fused

    def rec_normed(x, sumsq, norm_weight, weight, *args, **kwargs):
        if id(weight) in qkv_weights:
            inputs.append(x.clone())
        return normed(x, sumsq, norm_weight, weight, *args, **kwargs)

    def rec_rope(x, *args, **kwargs):
        inputs.append(x.clone())
        return rope(x, *args, **kwargs)

    def rec_forward(*args, **kwargs):
        inputs.clear()
        logits, feats = fused(*args, **kwargs)
        assert len(inputs) == layers
        want = torch.cat([inputs[i] for i in t.taps], dim=-1)
        checked.append(torch.equal(feats.reshape(want.shape), want))
        return logits, feats

    monkeypatch.setattr(t, "_normed_linear", rec_normed)
    monkeypatch.setattr(t, "_qkv_rope", rec_rope)
    monkeypatch.setattr(t, "_forward_fused", rec_forward)
    g = torch.Generator().manual_seed(layers)
    ids = torch.randint(0, V, (1, 11), generator=g)
    mask, depths, *_ = build_tree_buffers(torch.tensor([[-1, 0, 0, 1, 3]]), 3)
    t.prefill(ids)
    t.decode(ids[:, :1])
    t.verify(torch.randint(0, V, (1, 5), generator=g), depths, mask)
    assert len(checked) == 4 and all(checked), checked  # 2 prefill chunks, decode, verify


def test_float_tree_mask_gives_the_bool_masks_bits(small_chunks):
    """``verify`` and ``verify_rows`` take a drafter's float mask (cells ``> 0.5`` true; here with values on both
    sides of 0.5, as the ``[:, 0]`` view of ``[1, 1, S, S]``) with the bits of the bool mask: the fused forward reads
    it as it is, the PyTorch forward converts it."""
    m = _model()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (1, 12), generator=g)
    tokens = torch.randint(0, V, (1, 5), generator=g)
    mask, depths, *_ = build_tree_buffers(torch.tensor([[-1, 0, 1, 0, 2]]), 3)
    fmask = torch.where(mask, 0.75, 0.5)[:, None].float()[:, 0]
    for t in (LlamaTarget.from_hf(m), LlamaTarget.from_hf(m, ops="triton")):
        t.setup(64, "eagle3")
        t.prefill(ids)
        want = [x.clone() for x in t.verify(tokens, depths, mask)]
        for got in (t.verify(tokens, depths, fmask), t.verify_rows(tokens, depths, fmask),
                    t.verify(tokens, depths, fmask.half())):
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), t.fused_forward


@pytest.mark.parametrize("model,extra,norm_mode", [(*FAMILIES[0], "folded"), (*FAMILIES[2], "folded"),
                                                   (*FAMILIES[0], "kernel"), (*WIDE_HEADS, "folded")],
                         ids=["llama", "qwen3", "llama-kernel", "qwen2-d32-qkv-rope"])
def test_verify_rows_equal_decode_rows_bitwise(model, extra, norm_mode, small_chunks):
    """fp16: each verified node's logits and features equal bit for bit those of decoding its path token by token
    (a 5-row tree forward vs 1-row forwards, keys at other cache positions); also with the norms folded into the
    weights (the default, biases present) and with the norm as its own kernel."""
    m = _model(model, torch.float16, **extra)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, V, (1, 10), generator=g)
    parents = torch.tensor([[-1, 0, 1, 0, 2]])
    tokens = torch.randint(0, V, (1, 5), generator=g)
    mask, depths, *_ = build_tree_buffers(parents, 3)
    t = LlamaTarget.from_hf(m, ops="triton", norm_mode=norm_mode)
    t.setup(64, "eagle3")
    t.prefill(prompt)
    lv, fv = (x.clone() for x in t.verify(tokens, depths, mask))
    for node, path in ((2, [0, 1, 2]), (4, [0, 1, 2, 4]), (3, [0, 3])):
        t.reset()
        t.prefill(prompt)
        for p in path:
            ld, fd = t.decode(tokens[:, p:p + 1])
        assert torch.equal(ld, lv[:, node]) and torch.equal(fd[:, 0], fv[:, node]), (model, node)
    # After committing the path 0-1-2 (its K/V rows moved by the compaction), decoding node 4 (child of 2)
    # gives the verify row's bits too.
    t.reset()
    t.prefill(prompt)
    t.verify(tokens, depths, mask)
    t.commit(torch.tensor([[0, 1, 2]]), torch.tensor([2]), 2)
    ld, fd = t.decode(tokens[:, 4:5])
    assert torch.equal(ld, lv[:, 4]) and torch.equal(fd[:, 0], fv[:, 4]), (model, "after commit")


@pytest.mark.parametrize("n", [3, 13])
def test_padded_prefill_chunks_equal_row_by_row_decoding(n, small_chunks, monkeypatch):
    """fp16: a prompt prefilled in one padded chunk (3 rows in a chunk of 4) or in a full chunk plus a padded one
    (13 = 8 + 5 in 8; chunks of 8 or 4) gives, for every prompt row, the features, and for the last row the
    logits, that decoding the prompt one row at a time gives, bit for bit; the padding rows leave nothing behind
    (the next decode equals too). Also with a 32-row chunk size in a cache too short for its padding (the last
    chunk then runs the exact rows)."""
    m = _model("llama", torch.float16)
    g = torch.Generator().manual_seed(n)
    prompt = torch.randint(0, V, (1, n), generator=g)
    nxt = torch.randint(0, V, (1, 1), generator=g)
    for capacity in (64, n + 1):
        if capacity != 64:
            monkeypatch.setattr(target_mod, "PREFILL_CHUNKS", (32, 8, 4))
        t = LlamaTarget.from_hf(m, ops="triton")
        t.setup(capacity, "eagle3")
        lp, fp = (x.clone() for x in t.prefill(prompt))
        ln = t.decode(nxt)[0].clone()
        t.setup(capacity, "eagle3")
        rows = [t.decode(prompt[:, j:j + 1]) for j in range(n)]
        fd = torch.cat([f for _, f in rows], dim=1)
        assert torch.equal(fp, fd) and torch.equal(lp, rows[-1][0]), (n, capacity)
        assert torch.equal(ln, t.decode(nxt)[0]), (n, capacity)


def test_greedy_speculative_equals_plain_fp16(small_chunks):
    """fp16 under the interpreter: an oracle drafter makes long accepted chunks (deep verify rows); the output
    must equal plain greedy decoding token for token."""
    m = _model("qwen2", torch.float16)
    t = LlamaTarget.from_hf(m, ops="triton")
    prompt = torch.randint(0, V, (13,), generator=torch.Generator().manual_seed(4)).tolist()
    plain, _ = EagleEngine(t, max_length=96).generate(input_ids=prompt, max_new_tokens=16, eos_token_id=None)
    tree = TreeConfig(6, 4, 2)
    eng = EagleEngine(t, drafter=OracleDrafter(prompt + plain, tree, V, seed=1), max_length=96)
    spec, stats = eng.generate(input_ids=prompt, max_new_tokens=16, eos_token_id=None)
    assert spec == plain and stats.mean_accepted_length > 2


# -- no compilation for new prompt lengths --------------------------------------------------------------------------
def _launch_key(fn, args, kwargs):
    """What Triton's JIT specialises a launch on: constexprs and options (the keyword arguments here), the dtype
    and 16-byte alignment of each pointer, and ``== 1`` / ``% 16 == 0`` of each integer not in
    ``do_not_specialize``."""
    dns = set(fn.kwargs.get("do_not_specialize", ()) or ())
    key = [fn.__name__]
    for name, v in zip(fn.arg_names, args, strict=False):
        if isinstance(v, torch.Tensor):
            key.append((name, str(v.dtype), v.data_ptr() % 16 == 0))
        elif isinstance(v, bool) or v is None:
            key.append((name, v))
        elif isinstance(v, int):
            key.append((name, "any") if name in dns else (name, v == 1, v % 16 == 0))
        else:
            key.append((name, type(v).__name__))
    key.extend(sorted((k, repr(v)) for k, v in kwargs.items() if k not in ("grid", "warmup")))
    return tuple(key)


@pytest.fixture
def launch_keys(monkeypatch):
    from triton.runtime import interpreter

    keys = collections.defaultdict(set)
    run = interpreter.InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        keys[self.__name__].add(_launch_key(self, args, kwargs))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", recording_run)
    return keys


OWN_KERNELS = ("_bi_linear_kernel", "_rms_norm_kernel", "_embedding_kernel", "_rope_kv_kernel")


@pytest.mark.parametrize("norm_mode", ["folded"])
def test_no_new_specialisation_for_new_prompt_lengths(norm_mode, small_chunks, launch_keys):
    """After a warm-up (one prompt spanning a full and a partial chunk, a decode, a verify), prompts of other
    lengths launch every kernel with a specialisation key already seen: nothing would compile on the GPU (with the
    norms folded, the default, whose partial sums of squares' buffers must not take strides from the row count;
    the RMSNorm kernel is launched too, as the final norm)."""
    t = LlamaTarget.from_hf(_model("qwen3", head_dim=24), ops="triton", norm_mode=norm_mode)
    t.setup(64, "eagle3")
    parents = torch.tensor([[-1, 0, 0, 1]])
    mask, depths, *_ = build_tree_buffers(parents, 2)
    t.prefill(torch.randint(0, V, (1, 11)))
    t.decode(torch.randint(0, V, (1, 1)))
    t.verify(torch.randint(0, V, (1, 4)), depths, mask)
    warm = {k: set(v) for k, v in launch_keys.items()}
    assert set(OWN_KERNELS) <= set(warm)
    for n in (1, 5, 8, 16, 17, 30):
        t.reset()
        t.prefill(torch.randint(0, V, (1, n)))
        t.decode(torch.randint(0, V, (1, 1)))
    checked = list(launch_keys)
    new = {k: launch_keys[k] - warm.get(k, set()) for k in checked}
    assert not any(new.values()), f"new specialisations after warm-up: {new}"


# -- GPU (bf16, small-but-real shapes, CUDA graphs) -----------------------------------------------------------------
def _gpu_model(model="llama", **extra):
    m = tiny_llama(vocab=512, hidden=256, layers=4, heads=4, kv_heads=2, model=model, seed=5, std=0.05, **extra)
    return m.to("cuda", torch.bfloat16)


def _jit_kernels():
    """Every Triton kernel of :mod:`eagle_triton.ops` that the fused forward may launch."""
    import sys

    from triton.runtime.jit import JITFunction

    found = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("eagle_triton.ops.") and name.endswith(".kernel"):
            for attr, obj in vars(mod).items():
                if isinstance(obj, JITFunction):
                    found[f"{name}.{attr}"] = obj
    return found


def _compiled_keys(kernels) -> dict:
    """Each kernel's compiled variants: the JIT's cache keys (its argument specialisations and options)."""
    keys = {}
    for name, k in kernels.items():
        caches = getattr(k, "device_caches", None) or {}
        keys[name] = {str(key) for entry in caches.values() for key in entry[0]}
    return keys


def _new_variants(before: dict, after: dict) -> dict:
    """The variants compiled since ``before``, each beside the kernel's earlier keys (to see which argument's
    specialisation changed)."""
    return {name: {"new": sorted(after[name] - before.get(name, set())), "had": sorted(before.get(name, set()))}
            for name in after if after[name] - before.get(name, set())}


@pytest.mark.gpu
@pytest.mark.parametrize("model,extra", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_gpu_fused_forward_matches_torch_forward_bf16(model, extra):
    m = _gpu_model(model, **extra)
    a, b = LlamaTarget.from_hf(m, ops="torch", cuda_graphs=False), LlamaTarget.from_hf(m, ops="triton")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512, (1, 150), generator=g).cuda()
    outs = []
    for t in (a, b):
        t.setup(256, "eagle3")
        lp, fp = t.prefill(ids)
        ld, fd = t.decode(ids[:, :1])
        outs.append([x.float().clone() for x in (lp, fp, ld, fd)])
    for x, y in zip(*outs, strict=True):
        torch.testing.assert_close(y, x, atol=0.1, rtol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("model,extra", FAMILIES[:3], ids=[f[0] for f in FAMILIES[:3]])
def test_gpu_verify_rows_equal_decode_rows_bitwise_bf16(model, extra):
    from eagle_triton.drafter.tree import build_tree_buffers as btb

    m = _gpu_model(model, **extra)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 512, (1, 77), generator=g).cuda()
    par, depth = [-1], [0]
    while len(par) < 60:  # a random 60-node tree at most 7 levels deep (the verify of a 60/7/10 tree)
        p = int(torch.randint(0, len(par), (1,), generator=g))
        if depth[p] < 7:
            par.append(p)
            depth.append(depth[p] + 1)
    parents, levels = torch.tensor([par]), 7
    tokens = torch.randint(0, 512, (1, 60), generator=g).cuda()
    mask, depths, *_ = btb(parents, levels)
    t = LlamaTarget.from_hf(m, ops="triton")
    t.setup(256, "eagle3")
    t.prefill(prompt)
    lv, fv = (x.clone() for x in t.verify(tokens, depths.cuda(), mask.cuda()))
    for node in (1, 17, 59):
        path, n = [], node
        while n >= 0:
            path.append(n)
            n = int(parents[0, n])
        t.reset()
        t.prefill(prompt)
        for p in reversed(path):
            ld, fd = t.decode(tokens[:, p:p + 1])
        assert torch.equal(ld, lv[:, node]) and torch.equal(fd[:, 0], fv[:, node]), (model, node)
        # the same after committing the path down to the node's parent (rows moved by the compaction)
        kept = list(reversed(path))[:-1]
        t.reset()
        t.prefill(prompt)
        t.verify(tokens, depths.cuda(), mask.cuda())
        t.commit(torch.tensor([kept], device="cuda"), torch.tensor([len(kept) - 1], device="cuda"), len(kept) - 1)
        ld, fd = t.decode(tokens[:, node:node + 1])
        assert torch.equal(ld, lv[:, node]) and torch.equal(fd[:, 0], fv[:, node]), (model, node, "commit")


@pytest.mark.gpu
def test_gpu_greedy_speculative_equals_plain_bf16():
    m = _gpu_model("qwen2")
    t = LlamaTarget.from_hf(m, ops="triton")
    for seed in range(3):
        prompt = torch.randint(0, 512, (20 + 30 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain, _ = EagleEngine(t, max_length=512).generate(input_ids=prompt, max_new_tokens=64, eos_token_id=None)
        tree = TreeConfig(24, 5, 4)
        eng = EagleEngine(t, drafter=OracleDrafter(prompt + plain, tree, 512, seed=seed), max_length=512)
        spec, stats = eng.generate(input_ids=prompt, max_new_tokens=64, eos_token_id=None)
        assert spec == plain and stats.mean_accepted_length > 2


@pytest.mark.gpu
@pytest.mark.parametrize("norm_mode", ["kernel", "partials"])
def test_gpu_no_compilation_for_new_prompt_lengths(norm_mode):
    m = _gpu_model("qwen3", head_dim=64)
    t = LlamaTarget.from_hf(m, ops="triton", norm_mode=norm_mode)
    t.setup(1024, "eagle3")
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3]])
    mask, depths, *_ = build_tree_buffers(parents, 3)
    t.prefill(torch.randint(0, 512, (1, 70)).cuda())  # a full chunk and a partial one
    t.decode(torch.randint(0, 512, (1, 1)).cuda())
    t.verify(torch.randint(0, 512, (1, 6)).cuda(), depths.cuda(), mask.cuda())
    # a context past one attention split (256 positions): its decode merges splits (the combine launch), as
    # EagleEngine.warmup's 256-row prompt and steps do; short contexts never run that launch
    t.reset()
    t.prefill(torch.randint(0, 512, (1, 300)).cuda())
    t.decode(torch.randint(0, 512, (1, 1)).cuda())
    kernels = _jit_kernels()
    before = _compiled_keys(kernels)
    assert sum(len(v) for v in before.values()) > 0
    for n in (1, 3, 17, 64, 65, 128, 200, 333, 900):
        t.reset()
        t.prefill(torch.randint(0, 512, (1, n)).cuda())
        t.decode(torch.randint(0, 512, (1, 1)).cuda())
        new = _new_variants(before, _compiled_keys(kernels))
        assert not new, f"prompt of {n} tokens compiled {new}"


def test_engine_warmup_runs_every_prefill_chunk_kind_and_changes_nothing(small_chunks):
    """EagleEngine.warmup generates a few tokens after prompts of each chunk kind (here chunks of 8 and 4: prompts
    of 4, 8 and 9 rows), plain and speculative; the generations after it are the same as without it."""
    m = _model("llama")
    t = LlamaTarget.from_hf(m)  # the PyTorch forward: which prompts warmup runs does not depend on it (fast)
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, V, (11,), generator=g).tolist()
    plain, _ = EagleEngine(t, max_length=48).generate(input_ids=prompt, max_new_tokens=6, eos_token_id=None)
    head = random_eagle3_head(hidden_size=48, vocab_size=V, draft_vocab_size=48, seed=1)
    eng = EagleEngine(t, drafter=TreeDrafter(head, TreeConfig(6, 2, 2), backend="stub"), max_length=48)
    seen = []
    real = eng.generate
    eng.generate = lambda **kw: seen.append((len(kw["input_ids"]), kw["speculative"])) or real(**kw)
    eng.warmup()
    assert sorted(seen) == [(n, s) for n in (4, 8, 9) for s in (False, True)]
    eng.generate = real
    assert eng.generate(input_ids=prompt, max_new_tokens=6, eos_token_id=None)[0] == plain
    assert eng.generate(input_ids=prompt, max_new_tokens=6, eos_token_id=None, speculative=False)[0] == plain


@pytest.mark.gpu
def test_gpu_warmup_captures_every_prefill_graph():
    """On CUDA, after warmup every prefill chunk graph is captured (each size as the last chunk, the largest also
    as a full chunk before the rest): prompts of any length then capture nothing new."""
    m = _gpu_model("llama")
    t = LlamaTarget.from_hf(m, ops="triton")
    EagleEngine(t, max_length=1024).warmup()
    last, full = t._chunk_graphs[True], t._chunk_graphs[False]
    assert all(("chunk", c) in last for c in target_mod.PREFILL_CHUNKS)
    assert ("chunk", target_mod.PREFILL_CHUNKS[0]) in full
