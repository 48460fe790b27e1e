"""SafeAILab EAGLE integration on the stand-in: the RoPE base under transformers 5, the drafter patch's host
traffic, and optimize_eagle_with_triton running SafeAILab's eagenerate/naivegenerate on the engine."""

import types
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eagle_triton import TreeConfig, optimize_eagle_with_triton, restore_eagle
from eagle_triton.integrations.safeailab import (
    EaLayerDrafter,
    patch_ea_model_with_triton_drafter,
    rope_base_of_ea_layer,
)
from eagle_triton.testing import (
    SafeAILabStandIn,
    StandInTokenizer,
    random_eagle3_head,
    safeailab_config,
    tiny_llama_base_model,
)


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny fp64 matrices: extra threads only contend on a shared CPU.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _drive(model_a, model_b, steps=3, seed=0):
    """Call both ``topK_genrate``s on the same inputs over a few decoding steps; assert equal outputs."""
    g = torch.Generator().manual_seed(seed)
    W = model_a.ea_layer.fc.weight.shape[1]
    V = model_a.ea_layer.config.vocab_size
    ids = torch.randint(0, V, (1, 8), generator=g)
    feats = torch.randn(1, 7, W, generator=g)
    for m in (model_a, model_b):
        m.ea_layer.reset_kv()
    for _ in range(steps):
        a = model_a.ea_layer.topK_genrate(feats, ids, None, None)
        b = model_b.ea_layer.topK_genrate(feats, ids, None, None)
        for x, y in zip(a, b, strict=True):
            assert x.device == y.device and x.dtype == y.dtype
            assert torch.equal(x, y)
        row = a[1][0]
        acc = a[0][0, row[row >= 0][1:2]]
        ids = torch.cat([ids, acc[None], torch.randint(0, V, (1, 1), generator=g)], 1)
        feats = torch.randn(1, acc.numel() + 1, W, generator=g)


# -- RoPE base --------------------------------------------------------------------------------------------------
def test_transformers5_config_rope_base_reaches_the_patched_drafter():
    head = random_eagle3_head(seed=0, rope_theta=100000.0)
    orig, patched = SafeAILabStandIn(head), SafeAILabStandIn(head)
    from transformers import LlamaConfig

    for m in (orig, patched):
        m.ea_layer.config = LlamaConfig(**head.config.to_dict())
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        assert getattr(patched.ea_layer.config, "rope_theta", None) is None  # the case of the bug
    assert rope_base_of_ea_layer(patched.ea_layer) == 100000.0
    patch_ea_model_with_triton_drafter(patched, backend="torch")
    assert patched.ea_layer.topK_genrate.head.config.rope_base == 100000.0
    _drive(orig, patched)


@pytest.mark.parametrize("style", ["transformers", "namespace"])
def test_stand_in_config_styles(style):
    head = random_eagle3_head(seed=3, rope_theta=500000.0)
    m = SafeAILabStandIn(head, config_style=style)
    assert rope_base_of_ea_layer(m.ea_layer) == 500000.0
    if style == "transformers":
        assert "rope_theta" in m.ea_layer.config.rope_parameters


def test_rope_base_from_the_rotary_table_alone():
    head = random_eagle3_head(seed=0, rope_theta=100000.0)
    m = SafeAILabStandIn(head, config_style="namespace")
    cfg = vars(m.ea_layer.config).copy()
    cfg.pop("rope_theta")
    m.ea_layer.config = types.SimpleNamespace(**cfg)
    rot = m.ea_layer.midlayer.self_attn.rotary_emb
    del rot.base  # SafeAILab's transformers-5 rotary class keeps only inv_freq
    try:
        assert rope_base_of_ea_layer(m.ea_layer) == 100000.0
    finally:
        rot.base = 100000.0


def test_rope_disagreement_is_refused():
    head = random_eagle3_head(seed=0)  # the layer's tables use base 10000
    m = SafeAILabStandIn(head)
    m.ea_layer.config = safeailab_config(random_eagle3_head(seed=0, rope_theta=100000.0).config)
    with pytest.raises(ValueError, match="RoPE base is ambiguous"):
        patch_ea_model_with_triton_drafter(m, backend="torch")
    m.ea_layer.config = safeailab_config(head.config, "namespace")
    m.ea_layer.config.rope_scaling = {"rope_type": "llama3", "factor": 8.0}
    with pytest.raises(ValueError, match="plain RoPE"):
        rope_base_of_ea_layer(m.ea_layer)


# -- host traffic of the drafter patch -------------------------------------------------------------------------
class _HostReads(TorchDispatchMode):
    """Records every read of a tensor's value by the host (``item``/``int``/``tolist``/``bool``) and every copy,
    with the storage they touch."""

    def __init__(self):
        super().__init__()
        self.reads, self.copies = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(args[0].untyped_storage().data_ptr())
        if func is torch.ops.aten.copy_.default:
            self.copies.append(args[0].untyped_storage().data_ptr())
        return func(*args, **kwargs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_patched_topk_genrate_reads_the_device_once_per_call(monkeypatch, backend):
    """The host reads the tree once per call: one copy into one host buffer, from which ``R`` and ``C`` are read
    (NumPy views) and of which the CPU outputs are views. No other value is read from a tensor (no item/tolist),
    and the buffers are reused. The reference drafter's trees are packed first; the fused drafter's outputs
    (greedy or reordered for sampling) are copied straight from its buffers."""
    tolist = torch.Tensor.tolist
    listed = []

    def recording_tolist(self):
        listed.append(self.untyped_storage().data_ptr())
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", recording_tolist)
    head = random_eagle3_head(seed=1)
    m = SafeAILabStandIn(head, TreeConfig(20, 3, 4))
    patch_ea_model_with_triton_drafter(m, backend=backend)
    drafter = m.ea_layer.topK_genrate
    assert isinstance(drafter, EaLayerDrafter)
    ids = torch.randint(0, 256, (1, 8))
    feats = torch.randn(1, 7, head.feature_width)
    m.ea_layer.reset_kv()
    drafter(feats, ids, None, None)  # allocates the cached buffers
    host = drafter._outputs._plan.host
    for sampling in (None, object()):
        m.ea_layer.reset_kv()
        listed.clear()
        with _HostReads() as rec:
            out = drafter(feats, ids, None, sampling)
        plan = drafter._outputs._plan
        assert (plan.pack is None) == (backend == "triton")  # the fused drafter's outputs: no packing
        assert plan.host is host  # the buffers are reused
        host_ptr = host.untyped_storage().data_ptr()
        # no value is read from a tensor through torch; R and C are read through views of the host buffer ...
        assert not rec.reads and not listed
        for arr in (plan.leaves, plan.depth):
            assert host_ptr <= arr.ctypes.data < host_ptr + host.numel()
        assert out[1].shape == (int(plan.leaves[0]), int(plan.depth[0]) + 1)
        # ... which is filled by exactly one copy, and of which the CPU outputs are views
        assert rec.copies.count(host_ptr) == 1
        for t in out[1:3]:
            assert t.device.type == "cpu" and t.untyped_storage().data_ptr() == host_ptr
        assert out[2].dtype == torch.float32


# -- optimize_eagle_with_triton: SafeAILab's whole generation on the engine --------------------------------------
TREE = TreeConfig(12, 3, 4)


@pytest.fixture(scope="module")
def parts():
    base = tiny_llama_base_model(vocab_size=8, seed=0)
    head = random_eagle3_head(vocab_size=8, draft_vocab_size=None, seed=0, dtype=torch.float64, rope_theta=100000.0)
    prompt = torch.randint(0, 8, (1, 6), generator=torch.Generator().manual_seed(1))
    return base, head, prompt


def _optimized(model):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "no GPU", RuntimeWarning)
        return optimize_eagle_with_triton(model)


def _same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
        assert torch.equal(a, b), (a, b)
    else:
        assert type(a) is type(b) and a == b


def test_stand_in_eagenerate_is_greedy_decoding(parts):
    base, head, prompt = parts
    m = SafeAILabStandIn(head, TREE, base_model=base)
    out, new_token, steps = m.eagenerate(prompt, max_new_tokens=30, log=True)
    plain, n_plain, _ = m.naivegenerate(prompt, max_new_tokens=30, log=True)
    assert torch.equal(out[:, :plain.shape[1]], plain[:, :out.shape[1]])
    assert int(new_token) > steps + 1  # some steps accepted drafted tokens


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=30, log=True),
    dict(max_new_tokens=30),
    dict(max_new_tokens=7, log=True),  # stops past the cap, mid-chunk, as SafeAILab does
    dict(max_length=40, log=True),  # max_length - total_tokens - 10 = 19 tokens / steps
    dict(max_new_tokens=60, log=True, eos_at=9),
    dict(max_new_tokens=60, log=True, eot_at=12, is_llama3=True),
    dict(max_new_tokens=60, log=True, eot_at=12, is_llama3=False),  # <|eot_id|> ignored without is_llama3
])
def test_optimized_generation_returns_what_safeailab_returns(parts, kwargs):
    base, head, prompt = parts
    kwargs = dict(kwargs)
    plain = SafeAILabStandIn(head, TREE, base_model=base).naivegenerate(prompt, max_new_tokens=80)[0, 6:]
    tok = StandInTokenizer(eos_token_id=int(plain[kwargs.pop("eos_at")]) if "eos_at" in kwargs else None,
                           eot_id=int(plain[kwargs.pop("eot_at")]) if "eot_at" in kwargs else None)
    ref_model = SafeAILabStandIn(head, TREE, base_model=base, tokenizer=tok)
    want_ea = ref_model.eagenerate(prompt, **kwargs)
    want_naive = ref_model.naivegenerate(prompt, **kwargs)
    model, originals = _optimized(SafeAILabStandIn(head, TREE, base_model=base, tokenizer=tok))
    assert {"eagenerate", "naivegenerate", "ea_layer.topK_genrate"} <= set(originals)
    _same(want_ea, model.eagenerate(prompt, **kwargs))
    _same(want_naive, model.naivegenerate(prompt, **kwargs))
    restore_eagle(model, originals)


def test_optimized_path_shares_the_ea_models_tensors_and_restores(parts):
    base, head, prompt = parts
    m = SafeAILabStandIn(head, TREE, base_model=base)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    m, originals = _optimized(m)
    engine = m.eagenerate.__self__.engine
    t = engine.target
    assert t.embed.data_ptr() == base.model.embed_tokens.weight.data_ptr()
    assert t.lm_head_weight.data_ptr() == base.lm_head.weight.data_ptr()
    attn = base.model.layers[1].self_attn
    assert attn.q_proj.weight.data_ptr() == t.layers[1].w_qkv.data_ptr()  # one copy of q/k/v, the fused one
    assert t.norm_mode == "kernel"  # folded norms would change w_qkv/w_gate_up and end the sharing on the GPU
    assert base.model.layers[1].mlp.up_proj.weight.data_ptr() > t.layers[1].w_gate_up.data_ptr()
    assert engine.head.fc.weight is m.ea_layer.fc.weight
    assert engine.head.midlayer.mlp.down_proj.weight is m.ea_layer.midlayer.mlp.down_proj.weight
    for k, v in base.state_dict().items():
        assert torch.equal(v, before[k]), k
    restore_eagle(m, originals)
    assert m.eagenerate.__func__ is SafeAILabStandIn.eagenerate
    assert m.naivegenerate.__func__ is SafeAILabStandIn.naivegenerate
    assert "topK_genrate" not in m.ea_layer.__dict__
    _same(m.eagenerate(prompt, max_new_tokens=12, log=True),
          SafeAILabStandIn(head, TREE, base_model=base).eagenerate(prompt, max_new_tokens=12, log=True))


def test_unsupported_base_model_keeps_safeailabs_loops_and_warns_once(parts):
    _, head, prompt = parts
    base = tiny_llama_base_model(vocab_size=8, seed=0)
    base.config.model_type = "mixtral"
    m = SafeAILabStandIn(head, TREE, base_model=base)
    with pytest.warns(RuntimeWarning, match=r"base model \(LlamaForCausalLM, model_type 'mixtral'\)"):
        m, originals = optimize_eagle_with_triton(m)
    assert "eagenerate" not in originals and m.eagenerate.__func__ is SafeAILabStandIn.eagenerate
    assert "ea_layer.topK_genrate" in originals  # drafting is still taken over
    restore_eagle(m, originals)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        optimize_eagle_with_triton(m)
    assert not any("mixtral" in str(w.message) for w in seen)


def test_optimized_generation_with_an_eagle1_ea_layer(parts):
    from eagle_triton.testing import random_eagle1_head

    base, _, prompt = parts
    head = random_eagle1_head(vocab_size=8, seed=0, dtype=torch.float64)
    head.set_target_lm_head(base.lm_head)
    want = SafeAILabStandIn(head, TREE, base_model=base).eagenerate(prompt, max_new_tokens=30, log=True)
    model, originals = _optimized(SafeAILabStandIn(head, TREE, base_model=base))
    assert "eagenerate" in originals
    _same(want, model.eagenerate(prompt, max_new_tokens=30, log=True))


def test_optimized_sampling_follows_safeailabs_conventions(parts):
    base, head, prompt = parts
    model, _ = _optimized(SafeAILabStandIn(head, TREE, base_model=base))
    torch.manual_seed(0)
    ids, new_token, idx = model.eagenerate(prompt, temperature=0.8, top_p=0.9, top_k=5, max_new_tokens=20, log=True)
    assert type(new_token) is int and type(idx) is int  # SafeAILab's sampling accept length is an int
    assert torch.equal(ids[:, :6], prompt) and ids.shape[1] == 6 + new_token and 20 < new_token <= 20 + TREE.depth + 1
    assert 0 <= int(ids.min()) and int(ids.max()) < 8
    ids, new_token, idx = model.naivegenerate(prompt, temperature=0.8, max_new_tokens=20, log=True)
    assert new_token == 21 and idx == 20 and ids.shape[1] == 27


@pytest.mark.gpu
def test_patched_outputs_on_cuda_equal_the_originals():
    # The CUDA branch of the output placement (pinned host buffer, one blocking copy: the transfer and the sync).
    head = random_eagle3_head(seed=2, rope_theta=100000.0).cuda()
    orig, patched = SafeAILabStandIn(head), SafeAILabStandIn(head)
    patch_ea_model_with_triton_drafter(patched, backend="torch")  # the same drafter code as the stand-in's
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (1, 8), generator=g).cuda()
    feats = torch.randn(1, 7, head.feature_width, generator=g).cuda()
    for m in (orig, patched):
        m.ea_layer.reset_kv()
    for sampling in (None, object()):
        a = orig.ea_layer.topK_genrate(feats, ids, None, sampling)
        b = patched.ea_layer.topK_genrate(feats, ids, None, sampling)
        for x, y in zip(a, b, strict=True):
            assert x.device == y.device and x.dtype == y.dtype and torch.equal(x, y)
        assert patched.ea_layer.topK_genrate._outputs._plan.host.is_pinned()
        ids = torch.cat([ids, a[0][:, :1]], 1)
        feats = feats[:, :1]
