"""The cached, converted copy of a GGUF model: built once and atomically, checked by hash, rebuilt when damaged
(only folders we made), never touching anything else; and the fast readers it enables (config.json without
transformers' model code, the plain fast tokenizer) agree with transformers."""

from __future__ import annotations

import json
import os

import pytest
import torch
from engine_testlib import tiny_llama

from eagle_triton.engine import default_model
from eagle_triton.engine.fast_config import read_simple_llama_config
from eagle_triton.engine.model_cache import (
    MANIFEST,
    MARKER,
    CacheError,
    cache_root,
    check_cached_checkpoint,
    ensure_cached_checkpoint,
)
from eagle_triton.engine.target import LlamaTarget, TargetConfig, _rotary_from_config


@pytest.fixture
def gguf(tmp_path):
    p = tmp_path / "src" / "Model-1B.Q4.gguf"
    p.parent.mkdir()
    p.write_bytes(os.urandom(4096))
    return p


class FakeConvert:
    """Writes small checkpoint files (one above the full-hash limit is not needed: the edge hash is tested below)."""

    def __init__(self, fail=False):
        self.calls, self.fail = 0, fail

    def __call__(self, gguf, out):
        self.calls += 1
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "from": gguf.name}))
        (out / "model.safetensors").write_bytes(os.urandom(3000))
        if self.fail:
            raise RuntimeError("conversion failed")


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_TRITON_CACHE", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("EAGLE_TRITON_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "eagle-triton"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache_root() == tmp_path / "h" / ".cache" / "eagle-triton"


def test_built_once_then_reused(tmp_path, gguf):
    conv, logs = FakeConvert(), []
    root = tmp_path / "cache"
    d = ensure_cached_checkpoint(gguf, root, convert=conv, log=logs.append)
    assert d.parent == root and d.name.startswith("model-1b.q4-") and conv.calls == 1
    assert "first use" in logs[0]
    assert sorted(p.name for p in root.iterdir()) == [d.name]  # no temporary folder left
    manifest = json.loads((d / MANIFEST).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors"} and (d / MARKER).is_file()
    assert check_cached_checkpoint(d, manifest["source_sha256"]) is None
    assert ensure_cached_checkpoint(gguf, root, convert=conv, log=logs.append) == d and conv.calls == 1
    # another GGUF (other bytes) gets its own folder; the first one stays
    gguf.write_bytes(os.urandom(4096))
    d2 = ensure_cached_checkpoint(gguf, root, convert=conv, log=logs.append)
    assert d2 != d and d.is_dir() and conv.calls == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest", "touch_big"])
def test_damaged_copy_is_detected_and_rebuilt(tmp_path, gguf, damage, monkeypatch):
    from eagle_triton.engine import model_cache

    monkeypatch.setattr(model_cache, "_FULL_HASH_LIMIT", 1000)  # model.safetensors (3000 B) takes the edge hash
    conv, logs = FakeConvert(), []
    d = ensure_cached_checkpoint(gguf, tmp_path / "c", convert=conv, log=logs.append)
    cfg = d / "config.json"
    if damage == "truncate":
        (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100])
    elif damage == "flip":
        cfg.write_text(cfg.read_text().replace("llama", "llamb"))
    elif damage == "delete":
        cfg.unlink()
    elif damage == "manifest":
        (d / MANIFEST).write_text("{not json")
    else:  # same size, rewritten later: the mtime and edge hash tell
        data = bytearray((d / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (d / "model.safetensors").write_bytes(bytes(data))
    assert check_cached_checkpoint(d) is not None
    assert ensure_cached_checkpoint(gguf, tmp_path / "c", convert=conv, log=logs.append) == d
    assert conv.calls == 2 and "damaged" in logs[-1] and check_cached_checkpoint(d) is None
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [d.name]


def test_foreign_folder_is_never_deleted(tmp_path, gguf):
    conv = FakeConvert()
    d = ensure_cached_checkpoint(gguf, tmp_path / "c", convert=conv, log=lambda m: None)
    (d / MARKER).unlink()  # not provably ours any more
    (d / MANIFEST).unlink()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(CacheError, match="not made by eagle-triton"):
        ensure_cached_checkpoint(gguf, tmp_path / "c", convert=conv, log=lambda m: None)
    assert (d / "notes.txt").read_text() == "mine" and conv.calls == 1


def test_failed_build_leaves_nothing(tmp_path, gguf):
    root = tmp_path / "c"
    root.mkdir()
    (root / "unrelated").write_text("keep")
    with pytest.raises(RuntimeError, match="conversion failed"):
        ensure_cached_checkpoint(gguf, root, convert=FakeConvert(fail=True), log=lambda m: None)
    assert sorted(p.name for p in root.iterdir()) == ["unrelated"]


def test_stale_builds_of_ours_are_cleaned_others_kept(tmp_path, gguf):
    root = tmp_path / "c"
    ours, other = root / ".building-x-1", root / ".building-y-2"
    for p in (ours, other):
        p.mkdir(parents=True)
        os.utime(p, (0, 0))
    (ours / MARKER).write_text("")
    os.utime(ours, (0, 0))
    ensure_cached_checkpoint(gguf, root, convert=FakeConvert(), log=lambda m: None)
    assert not ours.exists() and other.is_dir()


def test_unwritable_cache_falls_back_to_the_gguf(tmp_path, gguf, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EAGLE_TRITON_CACHE", str(blocker / "sub"))  # a path under a file: cannot be created
    monkeypatch.setenv("EAGLE_TRITON_SMOLLM2", str(gguf))
    assert default_model.default_target_source(log=lambda m: None) == gguf
    assert "loading the GGUF file directly" in capsys.readouterr().err
    assert default_model.default_cache_status()["built"] is False


def test_default_target_names(tmp_path, monkeypatch):
    assert default_model.is_default_target_name(None) and default_model.is_default_target_name("SmolLM2")
    assert not default_model.is_default_target_name("some/model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()  # a local folder of that name is a path, not the default
    assert not default_model.is_default_target_name("smollm2")


@pytest.mark.parametrize("extra", [{}, {"tie_word_embeddings": True}, {"head_dim": 24}])
def test_simple_llama_config_matches_transformers(tmp_path, extra):
    from transformers import AutoConfig

    m = tiny_llama(vocab=97, hidden=48, layers=3, heads=6, kv_heads=2, seed=1, **extra)
    m.save_pretrained(tmp_path)
    simple = read_simple_llama_config(tmp_path)
    assert simple is not None
    cfg, inv_freq, scaling = simple
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert TargetConfig.from_hf(cfg) == TargetConfig.from_hf(hf)
    hf_inv, hf_scaling = _rotary_from_config(hf, "cpu")
    assert torch.equal(inv_freq, hf_inv) and scaling == hf_scaling  # the same operations in the same dtype


def test_other_rope_and_models_go_through_transformers(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    tiny_llama(layers=3, rope_parameters=rope).save_pretrained(tmp_path / "a")
    tiny_llama(layers=3, model="qwen2").save_pretrained(tmp_path / "b")
    assert read_simple_llama_config(tmp_path / "a") is None and read_simple_llama_config(tmp_path / "b") is None
    t = LlamaTarget.from_pretrained(tmp_path / "a")  # still loads, through AutoConfig
    assert torch.equal(t.inv_freq, LlamaTarget.from_hf(tiny_llama(layers=3, rope_parameters=rope)).inv_freq)


@pytest.mark.slow
def test_cached_default_model_generates_like_the_gguf(smollm2):
    """The real conversion: the cached checkpoint and tokenizer reproduce the GGUF path's prompt ids, every weight
    (the same fp32 numbers, bit for bit) and greedy tokens (the forward is compared exactly: it is the same code).
    The copy is the test session's own (conftest's ``EAGLE_TRITON_CACHE``, shared with the README examples and
    ``smollm2_cached``): converted here if no other test of the run converted it first."""
    from eagle_triton.commands.generate import prompt_token_ids
    from eagle_triton.engine import EagleEngine
    from eagle_triton.engine.loading import load_target, load_tokenizer

    model, tok = smollm2
    src = default_model.default_target_source(log=lambda m: None)
    assert src.parent == cache_root() and default_model.default_cache_status()["built"]
    fast_tok = load_tokenizer(src)
    cached = load_target(str(src), device="cpu")
    assert isinstance(cached, LlamaTarget)
    gguf_target = LlamaTarget.from_hf(model)
    assert cached.config == gguf_target.config and cached.eos_token_ids == gguf_target.eos_token_ids
    assert torch.equal(cached.inv_freq, gguf_target.inv_freq) and torch.equal(cached.embed, gguf_target.embed)
    # every weight the forward reads, bit for bit (so greedy decoding agrees on any prompt; one is decoded below)
    assert torch.equal(cached.norm, gguf_target.norm) and torch.equal(cached.lm_head_weight, gguf_target.lm_head_weight)
    assert len(cached.layers) == len(gguf_target.layers) == cached.config.num_layers
    for i, (x, y) in enumerate(zip(cached.layers, gguf_target.layers, strict=True)):
        for name in getattr(type(x), "__slots__", None) or vars(x):
            t, u = getattr(x, name), getattr(y, name)
            assert (t is None and u is None) or torch.equal(t, u), (i, name)
    for prompt in ("hi", "Write a haiku about rain."):
        ids = prompt_token_ids(fast_tok, prompt, True)
        assert ids == prompt_token_ids(tok, prompt, True)
        assert fast_tok.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
    a = EagleEngine(cached, None, max_length=256).generate(input_ids=ids, max_new_tokens=12)[0]
    b = EagleEngine(gguf_target, None, max_length=256).generate(input_ids=ids, max_new_tokens=12)[0]
    assert a == b
    assert fast_tok.decode(a, skip_special_tokens=True) == tok.decode(b, skip_special_tokens=True)


def test_plain_fast_tokenizer_loads_like_autotokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from eagle_triton.engine.loading import _plain_fast_tokenizer, load_tokenizer

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(["the quick brown fox", "jumps over the lazy dog"] * 20,
                            trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "<s>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))  # a model folder, as loading expects
    assert _plain_fast_tokenizer(str(tmp_path))
    fast, auto = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(fast) is type(auto)
    text = "the lazy fox jumps"
    assert fast(text)["input_ids"] == auto(text)["input_ids"]
    ids = auto(text)["input_ids"]
    assert fast.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True)
    assert (fast.bos_token, fast.eos_token) == (auto.bos_token, auto.eos_token)
