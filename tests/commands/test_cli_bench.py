"""`eagle-triton bench` on SmolLM2 with a random head sized for it (lossless, so outputs must be identical)."""

import json

import pytest

from eagle_triton.cli import main
from eagle_triton.testing import random_eagle3_head


def test_bench_with_and_without_speculation(tmp_path, capsys):
    pytest.importorskip("gguf")
    from eagle_triton.engine.default_model import smollm2_gguf_path

    target = str(smollm2_gguf_path())
    head = random_eagle3_head(hidden_size=576, intermediate_size=256, num_attention_heads=9, num_key_value_heads=3,
                              vocab_size=49152, draft_vocab_size=512, rope_theta=100000.0, seed=0)
    head.save_pretrained(tmp_path / "head")
    rc = main(["bench", "--target", target, "--draft", str(tmp_path / "head"), "--prompt", "Name three colours.",
               "--max-new-tokens", "6", "--num-runs", "1", "--total-tokens", "8", "--depth", "2",
               "--draft-top-k", "3", "--device", "cpu", "--threads", "1", "--out", str(tmp_path), "--json"])
    assert rc == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert set(result["modes"]) == {"plain", "speculative"}
    assert result["identical_greedy_output"] is True
    assert result["speedup"] > 0 and (tmp_path / "bench.png").stat().st_size > 1000
    assert set(result["modes"]["speculative"]["phases_ms_per_token"]) == {"prefill_ms", "step_ms"}
    assert main(["bench", "--num-runs", "0"]) == 2
