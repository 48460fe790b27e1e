"""EagleEngine on tiny random transformers models built in code: greedy speculative output is token-identical to
transformers' generate(do_sample=False) and to --no-speculation; exact stopping; lossless sampling; clear errors."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch
from engine_testlib import OracleDrafter, OracleRowsDrafter, hf_greedy, tiny_llama
from scipy.stats import chi2

from eagle_triton import CheckpointError, TreeConfig, TreeDrafter
from eagle_triton.engine import EagleEngine, HFTarget, LlamaTarget, ModelLoadError, load_head, load_target
from eagle_triton.engine.hf_target import cache_keyword
from eagle_triton.testing import random_eagle1_head, random_eagle3_head

V = 128


@pytest.fixture(scope="module")
def target(tiny_model):
    return LlamaTarget.from_hf(tiny_model)


def _head3(seed=1, **kw):
    return random_eagle3_head(hidden_size=64, vocab_size=V, draft_vocab_size=48, seed=seed, **kw)


def _prompt(seed, n):
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("tree,prompt_len,max_new", [
    (TreeConfig(16, 3, 4), 9, 23),
    (TreeConfig(8, 2, 3), 1, 17),
    (TreeConfig(30, 5, 6), 14, 1),
    (TreeConfig(2, 0, 1), 5, 12),
])
def test_greedy_equals_transformers_and_plain(tiny_model, target, tree, prompt_len, max_new):
    eng = EagleEngine(target, _head3(), tree, max_length=256)
    for seed in (0, 1):
        prompt = _prompt(seed + prompt_len, prompt_len)
        spec, stats = eng.generate(input_ids=prompt, max_new_tokens=max_new)
        plain, pstats = eng.generate(input_ids=prompt, max_new_tokens=max_new, speculative=False)
        ref = hf_greedy(tiny_model, prompt, max_new)
        assert spec == ref and plain == ref
        assert stats.new_tokens == max_new and stats.speculative and not pstats.speculative
        assert stats.stop_reason == "max_new_tokens" and pstats.mean_accepted_length == (1.0 if max_new > 1 else 0.0)


def test_eagle1_head_and_generic_target(tiny_model, target):
    prompt = _prompt(7, 8)
    ref = hf_greedy(tiny_model, prompt, 20)
    e1 = EagleEngine(target, random_eagle1_head(hidden_size=64, vocab_size=V, seed=2), TreeConfig(12, 3, 3),
                     max_length=128)
    assert e1.generate(input_ids=prompt, max_new_tokens=20)[0] == ref
    generic = EagleEngine(HFTarget(tiny_model), _head3(), TreeConfig(12, 3, 3), max_length=128)
    assert generic.generate(input_ids=prompt, max_new_tokens=20)[0] == ref
    # a target shared by two engines with different feature kinds is re-set-up per call
    e3 = EagleEngine(target, _head3(), TreeConfig(12, 3, 3), max_length=128)
    assert e1.generate(input_ids=prompt, max_new_tokens=20)[0] == ref
    assert e3.generate(input_ids=prompt, max_new_tokens=20)[0] == ref


def test_generic_target_other_architecture():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=64, n_layer=6, n_head=4, n_positions=256,
                                   bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    assert isinstance(load_target(m), HFTarget)
    eng = EagleEngine(load_target(m), _head3(), TreeConfig(12, 3, 3), max_length=128)
    prompt = _prompt(3, 7)
    assert eng.generate(input_ids=prompt, max_new_tokens=25, eos_token_id=None)[0] == hf_greedy(m, prompt, 25)


class _CacheNamedPastKeyValues(torch.nn.Module):
    """A causal LM whose forward takes and returns its cache as ``past_key_values`` (transformers before 5.24, and
    remote code written for it), around a model of the installed transformers."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config
        self._name = cache_keyword(model)

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids, past_key_values=None, **kwargs):
        out = self.model(input_ids=input_ids, **{self._name: past_key_values}, **kwargs)
        return SimpleNamespace(logits=out.logits, hidden_states=out.hidden_states,
                               past_key_values=getattr(out, self._name))


def test_generic_target_passes_the_cache_under_the_models_own_name(tiny_model):
    """The generic target names the cache as the model's forward does: ``cache`` on transformers >= 5.24 (where
    ``past_key_values`` is deprecated, to be removed in 5.40: no deprecation warning) and ``past_key_values`` on a
    forward that only knows that name; greedy output as transformers' either way."""
    prompt = _prompt(5, 9)
    ref = hf_greedy(tiny_model, prompt, 20)
    for model in (tiny_model, _CacheNamedPastKeyValues(tiny_model)):
        eng = EagleEngine(HFTarget(model, eos_token_ids=[]), _head3(), TreeConfig(12, 3, 3), max_length=128)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert eng.generate(input_ids=prompt, max_new_tokens=20, eos_token_id=None)[0] == ref
        assert not [w for w in caught if "past_key_values" in str(w.message)]


def _oracle_engine(tiny_model, target, prompt, tree, n_ref=60, seed=0, oracle=OracleDrafter):
    ref = hf_greedy(tiny_model, prompt, n_ref)
    drafter = oracle(prompt + ref, tree, V, seed=seed)
    return EagleEngine(target, drafter=drafter, max_length=256), ref


# OracleDrafter runs the host-paced steps, OracleRowsDrafter the device-paced ones (queued ahead of the read)
ORACLES = [OracleDrafter, OracleRowsDrafter]


@pytest.mark.parametrize("oracle", ORACLES)
@pytest.mark.parametrize("tree", [TreeConfig(12, 4, 3), TreeConfig(7, 6, 2)])
def test_long_accepted_chunks_and_awkward_caps(tiny_model, target, tree, oracle):
    prompt = _prompt(11, 6)
    eng, ref = _oracle_engine(tiny_model, target, prompt, tree, oracle=oracle)
    assert eng._runner(True).device_paced == (oracle is OracleRowsDrafter)
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=60)
    assert out == ref
    deepest = max(i for i, c in enumerate(stats.accept_length_histogram) if c)
    assert stats.mean_accepted_length > 2.5 and deepest == min(tree.max_levels, tree.num_draft_nodes)
    for cap in (1, 2, 5, 13, 59):
        out, stats = eng.generate(input_ids=prompt, max_new_tokens=cap)
        assert out == ref[:cap] and stats.new_tokens == cap and stats.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("oracle", ORACLES)
def test_eos_inside_an_accepted_chunk(tiny_model, target, oracle):
    prompt = _prompt(12, 5)
    tree = TreeConfig(12, 5, 3)
    ref = hf_greedy(tiny_model, prompt, 60)
    # an EOS whose first occurrence is well inside the continuation and, with full chains (7 tokens a step after
    # the prefill's one), not at the end of a chunk
    chunk = min(tree.max_levels, tree.num_draft_nodes) + 1
    j = next(i for i in range(6, 60) if ref[i] not in ref[:i] and i % chunk != 0)
    eos = ref[j]
    want = hf_greedy(tiny_model, prompt, 60, eos_token_id=eos)
    assert want == ref[:j + 1]
    cut_inside = False
    for seed in range(4):
        drafter = oracle(prompt + ref, tree, V, seed=seed, p_full=1.0)
        eng = EagleEngine(target, drafter=drafter, max_length=256)
        out, stats = eng.generate(input_ids=prompt, max_new_tokens=60, eos_token_id=eos)
        assert out == want and stats.stop_reason == "eos"
        emitted = round(stats.mean_accepted_length * stats.steps) + 1  # + the prefill's token
        cut_inside |= emitted > len(out)
        # an EOS beyond the cap is not reached
        out, stats = eng.generate(input_ids=prompt, max_new_tokens=j, eos_token_id=eos)
        assert out == ref[:j] and stats.stop_reason == "max_new_tokens"
    assert cut_inside, "no run had tokens after the EOS in its last accepted chunk"
    plain = EagleEngine(target, max_length=256)
    assert plain.generate(input_ids=prompt, max_new_tokens=60, eos_token_id=eos)[0] == want


def test_eos_as_first_token_and_max_length(tiny_model, target):
    prompt = _prompt(13, 10)
    ref = hf_greedy(tiny_model, prompt, 10)
    eng = EagleEngine(target, _head3(), TreeConfig(10, 3, 3), max_length=16)
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=50, eos_token_id=ref[0])
    assert out == ref[:1] and stats.stop_reason == "eos" and stats.steps == 0
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=50)
    assert out == ref[:6] and stats.stop_reason == "max_length"
    assert eng.generate(input_ids=prompt, max_new_tokens=0)[0] == []
    with pytest.raises(ValueError, match="16 tokens but max_length is 16"):
        eng.generate(input_ids=_prompt(1, 16), max_new_tokens=1)


def test_sampling_seed_reproduces(target):
    eng = EagleEngine(target, _head3(), TreeConfig(12, 3, 3), max_length=128)
    prompt = _prompt(5, 6)
    kw = dict(input_ids=prompt, max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=40)
    a, _ = eng.generate(**kw, seed=123)
    b, _ = eng.generate(**kw, seed=123)
    c, _ = eng.generate(**kw, seed=124)
    assert a == b and a != c
    p1, _ = eng.generate(**kw, seed=5, speculative=False)
    p2, _ = eng.generate(**kw, seed=5, speculative=False)
    assert p1 == p2 and len(p1) == 30


@pytest.mark.parametrize("backend", ["torch", "stub"])
def test_sampled_tokens_follow_the_target_distribution(backend):
    """Tiny vocabulary (8): the first two new tokens (the second comes from tree verification) over 1000 seeds
    follow p(t1) p(t2 | t1) of the processed target distribution (chi-square, significance 1e-3). ``torch``: the
    reference drafter, host-paced steps; ``stub``: device-paced steps (queued ahead, coins from the DeviceRNG)."""
    from eagle_triton.engine.sampling import SamplingParams, probs_from_logits

    Vs = 8
    m = tiny_llama(vocab=Vs, hidden=32, layers=4, heads=2, kv_heads=1, seed=4, std=0.3)
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=Vs, draft_vocab_size=None, seed=5, std=0.5)
    if backend == "torch":
        eng = EagleEngine(LlamaTarget.from_hf(m), head, TreeConfig(6, 2, 2), max_length=32)
    else:
        eng = EagleEngine(LlamaTarget.from_hf(m), drafter=TreeDrafter(head, TreeConfig(6, 2, 2), backend="stub"),
                          max_length=32)
    assert eng._runner(True).device_paced == (backend == "stub")
    params = SamplingParams(0.8, 0.95, 6)
    prompt = [1, 5, 2]
    n = 1000
    counts = torch.zeros(Vs, Vs)
    accepted = 0
    for s in range(n):
        out, stats = eng.generate(input_ids=prompt, max_new_tokens=2, temperature=params.temperature,
                                  top_p=params.top_p, top_k=params.top_k, seed=s)
        counts[out[0], out[1]] += 1
        accepted += stats.accept_length_histogram[0] == 0
    with torch.no_grad():
        p1 = probs_from_logits(m(torch.tensor([prompt])).logits[0, -1], params)
        seqs = torch.tensor([prompt + [t] for t in range(Vs)])
        p2 = probs_from_logits(m(seqs).logits[:, -1], params)
    probs = (p1[:, None] * p2).flatten()
    counts = counts.flatten().double()
    assert counts[probs == 0].sum() == 0
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    stat = float(((obs - exp) ** 2 / exp).sum())
    crit = float(chi2.ppf(1 - 1e-3, int(big.sum())))
    assert stat <= crit, (stat, crit)
    assert accepted > n // 10  # the draft tree's tokens were accepted often enough to matter


# -- bad input ----------------------------------------------------------------------------------------------------
def test_bad_prompts_and_arguments(target):
    eng = EagleEngine(target, _head3(), TreeConfig(10, 3, 3), max_length=64)
    with pytest.raises(ValueError, match="empty"):
        eng.generate(input_ids=[], max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        eng.generate("hello", max_new_tokens=4)
    with pytest.raises(ValueError, match="exactly one of"):
        eng.generate(max_new_tokens=4)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        eng.generate(input_ids=[1, V + 3], max_new_tokens=4)
    # an [n, N] tensor is a batch (generate_batch), which the reference drafter cannot step
    with pytest.raises(ValueError, match="drafter_backend='triton'"):
        eng.generate(input_ids=torch.zeros(2, 3, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.generate(input_ids=[1, 2], max_new_tokens=-1)
    with pytest.raises(ValueError, match="top_p"):
        eng.generate(input_ids=[1, 2], max_new_tokens=2, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="needs a draft head"):
        EagleEngine(target, max_length=64).generate(input_ids=[1, 2], max_new_tokens=2, speculative=True)


def test_heads_that_do_not_fit(target):
    with pytest.raises(ValueError, match="vocabulary 200 does not match the target vocabulary 128"):
        EagleEngine(target, random_eagle3_head(hidden_size=64, vocab_size=200, draft_vocab_size=48))
    with pytest.raises(ValueError, match="width 96 but the target gives 192"):
        EagleEngine(target, random_eagle3_head(hidden_size=64, vocab_size=V, draft_vocab_size=48,
                                               target_hidden_size=32))
    with pytest.raises(ValueError, match="EAGLE-1 draft head was given where an EAGLE-3 head is expected"):
        EagleEngine(target, random_eagle1_head(hidden_size=64, vocab_size=V), expect_kind="eagle3")
    with pytest.raises(ValueError, match="EAGLE-3 draft head was given where an EAGLE-1 head is expected"):
        EagleEngine(target, _head3(), expect_kind="eagle1")
    with pytest.raises(ValueError, match="width 32 but the target gives 64"):
        EagleEngine(target, random_eagle1_head(hidden_size=32, vocab_size=V))


def test_head_and_target_files(tmp_path, tiny_model, target):
    head = _head3()
    head.save_pretrained(tmp_path / "h3")
    loaded = load_head(tmp_path / "h3", target, kind="eagle3")
    assert loaded.kind == "eagle3"
    with pytest.raises(CheckpointError, match="EAGLE-3 head but Eagle1DraftHead"):
        load_head(tmp_path / "h3", target, kind="eagle1")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_head(tmp_path / "nope", target)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps(head.config.to_dict()))
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_head(tmp_path / "bad", target)
    small = random_eagle3_head(hidden_size=32, vocab_size=V, draft_vocab_size=48, num_attention_heads=2,
                               num_key_value_heads=1)
    small.save_pretrained(tmp_path / "small")
    with pytest.raises(CheckpointError, match="vocab or hidden mismatch"):
        load_head(tmp_path / "small", target)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_target(tmp_path / "missing")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError):
        load_target(tmp_path / "corrupt")
    tiny_model.save_pretrained(tmp_path / "tgt")
    (tmp_path / "tgt" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="cannot load target checkpoint"):
        load_target(tmp_path / "tgt")
