"""Integration entry points on the engine: EAGLEConfig/EAGLEInference (AITER style), fused_draft_token_generation
and optimize_eagle_with_triton (SafeAILab style), all on a tiny random target built in code."""

import pytest
import torch
from engine_testlib import hf_greedy
from spec_topk_genrate import spec_standin

from eagle_triton import TreeConfig
from eagle_triton.engine import EagleEngine, LlamaTarget
from eagle_triton.integrations.aiter import EAGLEConfig, EAGLEInference
from eagle_triton.integrations.optimize import (
    GPUAssertionError,
    fused_draft_token_generation,
    optimize_eagle_with_triton,
    restore_eagle,
)
from eagle_triton.testing import random_eagle3_head

V = 128


def _head():
    return random_eagle3_head(hidden_size=64, vocab_size=V, draft_vocab_size=48, seed=3)


def test_eagle_config_maps_onto_tree_config():
    c = EAGLEConfig(topk=4, num_steps=4, num_draft_tokens=16)
    assert c.tree_config() == TreeConfig(16, 3, 4)
    assert EAGLEConfig().tree_config() == TreeConfig(60, 7, 10)
    with pytest.raises(ValueError, match="draft steps"):
        EAGLEConfig(num_steps=0)
    with pytest.raises(ValueError, match="exceed"):
        EAGLEConfig(topk=2, num_steps=1, num_draft_tokens=10)


def test_eagle_inference_generate_and_benchmark(tiny_model):
    inf = EAGLEInference(_head(), tiny_model, EAGLEConfig(topk=4, num_steps=4, num_draft_tokens=16,
                                                           max_length=128), device="cpu")
    prompt = torch.randint(0, V, (1, 7))
    out, stats = inf.generate(prompt, max_new_tokens=12)
    assert out.shape == (1, 19) and torch.equal(out[:, :7], prompt)
    assert out[0, 7:].tolist() == hf_greedy(tiny_model, prompt[0].tolist(), 12)
    assert stats["lossless"] is True and stats["speedup"] > 0 and stats["accept_length"] >= 1.0
    assert 0.0 <= stats["acceptance_rate"] <= 1.0
    bench = inf.benchmark([torch.randint(0, V, (5,)).tolist(), torch.randint(0, V, (3,)).tolist()],
                          max_new_tokens=6)
    assert len(bench["prompts"]) == 2 and all(r["identical"] for r in bench["prompts"])
    assert bench["speedup"] == pytest.approx(bench["tokens_per_second"] / bench["baseline_tokens_per_second"])


def test_fused_draft_token_generation_conventions(tiny_model):
    eng = EagleEngine(LlamaTarget.from_hf(tiny_model), _head(), TreeConfig(16, 3, 4), max_length=64)
    ids = torch.randint(0, V, (1, 6))
    out = fused_draft_token_generation(eng, ids, max_new_tokens=9)
    assert out.shape == (1, 15) and out[0, 6:].tolist() == hf_greedy(tiny_model, ids[0].tolist(), 9)
    out = fused_draft_token_generation(eng, ids, max_new_tokens=50, max_length=10)  # max_length caps the total
    assert out.shape == (1, 10)
    sampled = fused_draft_token_generation(eng, ids, temperature=0.8, top_p=0.0, top_k=0.0, max_new_tokens=5)
    assert sampled.shape == (1, 11)
    with pytest.raises(ValueError, match="max_length"):
        fused_draft_token_generation(eng, ids, max_length=6)
    if not torch.cuda.is_available():
        with pytest.raises(GPUAssertionError, match="needs a CUDA GPU"):
            fused_draft_token_generation(eng, ids, require_gpu=True)
    with pytest.raises(TypeError, match="EagleEngine"):
        fused_draft_token_generation(object(), ids)


def test_optimize_engine_and_restore(tiny_model):
    eng = EagleEngine(LlamaTarget.from_hf(tiny_model), _head(), TreeConfig(16, 3, 4), max_length=64)
    drafter, ops = eng.drafter, eng.target.ops
    model, original = optimize_eagle_with_triton(eng)
    assert model is eng
    ids = torch.randint(0, V, (1, 5))
    assert eng.generate(input_ids=ids, max_new_tokens=6)[0] == hf_greedy(tiny_model, ids[0].tolist(), 6)
    restore_eagle(eng, original)
    assert eng.drafter is drafter and eng.target.ops is ops


def test_optimize_safeailab_layout_and_restore():
    model = spec_standin(random_eagle3_head(), TreeConfig(20, 3, 4))
    calls = []

    def evaluate_posterior(logits, candidates, logits_processor):
        calls.append(logits_processor)
        return "original"

    model.evaluate_posterior = evaluate_posterior
    with pytest.warns(RuntimeWarning):
        model, original = optimize_eagle_with_triton(model)
    assert set(original) == {"ea_layer.topK_genrate", "evaluate_posterior"}
    # greedy posterior: first-max row of leading matches, bonus logits at the accepted length
    cands = torch.tensor([[5, 1, 2, -1], [5, 1, 3, 4]])
    logits = torch.full((2, 4, 8), -1.0)
    for r, toks in enumerate([[1, 2, 0, 0], [1, 3, 4, 6]]):
        for j, t in enumerate(toks):
            logits[r, j, t] = 1.0
    best, acc, bonus = model.evaluate_posterior(logits, cands, None)
    assert int(best) == 1 and int(acc) == 3 and int(bonus.argmax()) == 6
    assert model.evaluate_posterior(logits, cands, "sampling") == "original" and calls == ["sampling"]
    restore_eagle(model, original)
    assert model.evaluate_posterior is evaluate_posterior and "topK_genrate" not in model.ea_layer.__dict__
    with pytest.raises(TypeError, match="SafeAILab's layout"):
        optimize_eagle_with_triton(torch.nn.Linear(2, 2))
