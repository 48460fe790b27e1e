"""GPU checks of the engine (marker ``gpu``): CUDA-graph replay equals eager execution, speculative equals plain
decoding with the Triton kernels, in fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import OracleDrafter, hf_greedy, tiny_llama

from eagle_triton import TreeConfig
from eagle_triton.engine import EagleEngine, LlamaTarget
from eagle_triton.testing import random_eagle3_head

pytestmark = pytest.mark.gpu


def _engine(model, dtype, graphs, ops="auto", tree=None, head_seed=1):
    tree = tree or TreeConfig(16, 3, 4)
    t = LlamaTarget.from_hf(model, device="cuda", dtype=dtype, ops=ops, cuda_graphs=graphs)
    head = random_eagle3_head(hidden_size=64, vocab_size=128, draft_vocab_size=48, seed=head_seed)
    return EagleEngine(t, head, tree, max_length=256)


@pytest.mark.parametrize("ops", ["auto", "torch"])
def test_cuda_graphs_equal_eager_fp32(ops):
    m = tiny_llama(seed=5)
    prompt = list(range(5, 17))
    ref = hf_greedy(m, prompt, 40)
    eager = _engine(m, torch.float32, graphs=False, ops=ops)
    graphed = _engine(m, torch.float32, graphs=True, ops=ops)
    for eng in (eager, graphed):
        spec, stats = eng.generate(input_ids=prompt, max_new_tokens=40)
        plain, _ = eng.generate(input_ids=prompt, max_new_tokens=40, speculative=False)
        assert spec == plain == ref
    # replaying captured graphs again (second call) keeps giving the same tokens
    assert graphed.generate(input_ids=prompt, max_new_tokens=40)[0] == ref


def test_oracle_long_chunks_with_graphs_fp32():
    m = tiny_llama(seed=6)
    prompt = list(range(20, 27))
    ref = hf_greedy(m, prompt, 50)
    tree = TreeConfig(12, 4, 3)
    t = LlamaTarget.from_hf(m, device="cuda", cuda_graphs=True)
    eng = EagleEngine(t, drafter=OracleDrafter(prompt + ref, tree, 128, seed=1), max_length=256)
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=50)
    assert out == ref and stats.mean_accepted_length > 2.5


def test_bf16_speculative_equals_plain():
    """bf16 with the Triton kernels and graphs: tokens equal plain decoding of the same engine (the verify and
    decode forwards differ only in GEMM shapes; a rare near-tie could differ, none on this seed)."""
    m = tiny_llama(seed=7)
    eng = _engine(m, torch.bfloat16, graphs=True)
    prompt = list(range(30, 41))
    spec, stats = eng.generate(input_ids=prompt, max_new_tokens=48)
    plain, _ = eng.generate(input_ids=prompt, max_new_tokens=48, speculative=False)
    assert spec == plain and stats.step_s > 0


def _step_engine(dtype, tree=None):
    m = tiny_llama(seed=8, hidden=128, heads=4, kv_heads=2)
    t = LlamaTarget.from_hf(m, device="cuda", dtype=dtype)
    head = random_eagle3_head(hidden_size=128, vocab_size=128, draft_vocab_size=64, num_attention_heads=4,
                              num_key_value_heads=2, seed=9)
    return m, EagleEngine(t, head, tree or TreeConfig(16, 3, 4), max_length=256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_graphs_queue_ahead_and_equal_plain(dtype):
    """Device-paced steps (fused drafter, fused target forward) replayed from graphs: speculative == plain, for
    caps that end inside an accepted chunk, and again on a second call (the graphs replayed)."""
    m, eng = _step_engine(dtype)
    run = eng._runner(True)
    assert run.device_paced and run.use_graphs
    prompt = list(range(3, 24))
    plain, _ = eng.generate(input_ids=prompt, max_new_tokens=60, speculative=False)
    if dtype == torch.float32:
        assert plain == hf_greedy(m, prompt, 60)
    for cap in (60, 1, 2, 13):
        spec, stats = eng.generate(input_ids=prompt, max_new_tokens=cap)
        assert spec == plain[:cap] and stats.new_tokens == cap
    kinds = {kind[0] for kind in run._graphs}
    assert "step" in kinds and kinds <= {"step", "start"}, f"a speculative step is one graph, got {kinds}"


def test_no_device_sync_inside_steps():
    """Whole generations (speculative greedy and sampled, plain) under sync-debug "error": the only host waits are
    the lagged reads (CUDA events), so no synchronising call happens once the graphs exist."""
    _, eng = _step_engine(torch.bfloat16)
    prompt = list(range(40, 57))
    kinds = [dict(), dict(temperature=0.8, top_p=0.9, top_k=20, seed=3), dict(speculative=False),
             dict(speculative=False, temperature=0.7, seed=4)]
    first = [eng.generate(input_ids=prompt, max_new_tokens=40, **kw)[0] for kw in kinds]  # warm-up and capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = [eng.generate(input_ids=prompt, max_new_tokens=40, **kw)[0] for kw in kinds]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert again == first  # seeded sampling reproduces, greedy is deterministic
