"""SmolLM2-135M-Instruct (the embedded default target): greedy speculative decoding is token-identical to
transformers' generate(do_sample=False) and to plain decoding; the ``eagle-triton generate`` command end to end."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from engine_testlib import OracleDrafter
from numerics import assert_close_to_reference

from eagle_triton import TreeConfig
from eagle_triton.cli import main
from eagle_triton.commands.generate import prompt_token_ids
from eagle_triton.engine import EagleEngine, LlamaTarget, default_model
from eagle_triton.engine import loading as loading_mod
from eagle_triton.testing import random_eagle3_head

EOS = 2  # <|im_end|>


def _hf(model, ids, n, eos=EOS):
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(ids):].tolist()


def _head(seed=0):
    return random_eagle3_head(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=49152, draft_vocab_size=2048, target_hidden_size=576, seed=seed)


@pytest.fixture(scope="module")
def target(smollm2_cached):
    return LlamaTarget.from_hf(smollm2_cached[0])


def test_target_taps_and_eos(smollm2_cached, target):
    model, tok = smollm2_cached
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (30, 576, 49152)
    assert target.eos_token_ids == [EOS]
    ids = prompt_token_ids(tok, "Hello!", True)
    target.setup(64, "eagle3")
    logits, feats = target.prefill(torch.tensor([ids]))
    with torch.no_grad():
        ref = model(torch.tensor([ids]), output_hidden_states=True)
        ref64 = copy.deepcopy(model).double()(torch.tensor([ids]), output_hidden_states=True)
    # transformers in fp32 is the baseline and in fp64 the reference: a fixed 1e-4 failed on 1 of 55,296 features
    # (1.58e-4) with transformers 5.24, whose fp32 kernels round differently from ours.
    assert_close_to_reference(logits, ref.logits[:, -1], ref64.logits[:, -1], what="logits")
    taps = (2, 15, 27)
    assert_close_to_reference(feats, torch.cat([ref.hidden_states[i] for i in taps], -1),
                              torch.cat([ref64.hidden_states[i] for i in taps], -1), what="features")


@pytest.mark.parametrize("prompt,tree,n", [("Write a haiku about rain.", TreeConfig(16, 3, 4), 12),
                                           ("What is the capital of France?", TreeConfig(10, 5, 2), 8)])
def test_greedy_random_head_equals_transformers(smollm2_cached, target, prompt, tree, n):
    model, tok = smollm2_cached
    ids = prompt_token_ids(tok, prompt, True)
    eng = EagleEngine(target, _head(), tree, max_length=512)
    spec, stats = eng.generate(input_ids=ids, max_new_tokens=n)
    plain, _ = eng.generate(input_ids=ids, max_new_tokens=n, speculative=False)
    assert spec == plain == _hf(model, ids, n)
    assert stats.speculative and stats.steps >= 1


def test_oracle_drafter_eos_inside_chunk(smollm2_cached, target):
    model, tok = smollm2_cached
    ids = prompt_token_ids(tok, "Name three colors.", True)
    ref = _hf(model, ids, 40)
    assert ref[-1] == EOS and len(ref) < 40
    tree = TreeConfig(8, 3, 2)  # chains of 4 drafts: 5 tokens a step; the EOS is not at a chunk end
    full = ids + ref + [EOS] * 8
    eng = EagleEngine(target, drafter=OracleDrafter(full, tree, 49152, seed=0, p_full=1.0), max_length=512)
    out, stats = eng.generate(input_ids=ids, max_new_tokens=40)
    assert out == ref and stats.stop_reason == "eos"
    assert round(stats.mean_accepted_length * stats.steps) + 1 > len(out)  # tokens after the EOS were cut
    assert eng.generate(input_ids=ids, max_new_tokens=7)[0] == ref[:7]


@pytest.fixture
def cli_models(smollm2_cached, monkeypatch):
    """Make the CLI reuse the session's SmolLM2 instead of loading the GGUF again (the loader itself is covered by
    the README command and bench)."""
    model, tok = smollm2_cached
    seen = {}

    def fake_target(source, **kwargs):
        seen["target"] = source
        return LlamaTarget.from_hf(model)

    monkeypatch.setattr(loading_mod, "load_target", fake_target)
    # the default's cached conversion is covered by test_model_cache.py; here the CLI only has to ask for it
    monkeypatch.setattr(default_model, "default_target_source", lambda log=None: "cached-default-smollm2")
    monkeypatch.setattr(loading_mod, "load_tokenizer", lambda source, gguf_file=None: tok)
    return model, tok, seen


def test_cli_generate_default_json(cli_models, capsys):
    model, tok, seen = cli_models
    rc = main(["generate", "--json", "--max-new-tokens", "9", "--prompt", "Tell me a joke."])
    out, err = capsys.readouterr()
    assert rc == 0
    assert seen["target"] == "cached-default-smollm2"
    res = json.loads(out)
    ids = prompt_token_ids(tok, "Tell me a joke.", True)
    assert res["prompt_token_ids"] == ids
    assert res["token_ids"] == _hf(model, ids, 9)
    assert res["text"] == tok.decode(res["token_ids"], skip_special_tokens=True)
    for key in ("new_tokens", "steps", "mean_accepted_length", "tokens_per_second"):
        assert key in res["stats"]
    from eagle_triton.engine.default_model import default_draft_head_path

    if default_draft_head_path() is None:
        assert "no draft head has been shipped" in err and res["speculative"] is False


def test_cli_generate_with_draft_head(cli_models, tmp_path, capsys):
    model, tok, _ = cli_models
    _head(seed=3).save_pretrained(tmp_path / "head")
    common = ["generate", "--json", "--max-new-tokens", "11", "--prompt", "Tell me a joke.", "--no-chat-template",
              "--total-tokens", "12", "--depth", "3", "--draft-top-k", "3"]
    assert main(common + ["--draft", str(tmp_path / "head"), "--target", "unused"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main(common + ["--draft", str(tmp_path / "head"), "--target", "unused", "--no-speculation"]) == 0
    plain = json.loads(capsys.readouterr().out)
    ids = list(tok("Tell me a joke.")["input_ids"])
    assert spec["prompt_token_ids"] == ids and spec["speculative"] and not plain["speculative"]
    assert spec["token_ids"] == plain["token_ids"] == _hf(model, ids, 11)
    assert spec["stats"]["tree"] == "12/3/3"
    # a head of the wrong kind, and a prompt that does not fit, are clear errors
    assert main(common + ["--draft", str(tmp_path / "head"), "--target", "unused", "--draft-kind", "eagle1"]) == 2
    assert "EAGLE-3 head but Eagle1DraftHead" in capsys.readouterr().err
    assert main(common[:-6] + ["--target", "unused", "--max-length", "4"]) == 2
    assert "--max-length is 4" in capsys.readouterr().err
    assert main(common[:-6] + ["--target", "unused", "--prompt", ""]) == 2
    assert "empty" in capsys.readouterr().err


def test_cli_errors_without_models(tmp_path, capsys):
    assert main(["generate", "--target", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--total-tokens", "1"]) == 2
    assert "total_tokens" in capsys.readouterr().err
    assert main([]) == 2
    with pytest.raises(SystemExit):
        main(["generate", "--max-new-tokens", "many"])
