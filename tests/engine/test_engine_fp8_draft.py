"""The engine and the CLI with an FP8 draft head (``draft_dtype="fp8"`` / ``--draft-dtype fp8``): speculative
output still equals plain greedy decoding (FP8 changes the drafts, never the output)."""

from __future__ import annotations

import argparse

import pytest
import torch

from eagle_triton import TreeConfig
from eagle_triton.engine import EagleEngine, LlamaTarget
from eagle_triton.testing import random_eagle3_head


def test_engine_fp8_draft_dtype(tiny_model, tmp_path):
    target = LlamaTarget.from_hf(tiny_model)
    head = random_eagle3_head(hidden_size=64, vocab_size=128, draft_vocab_size=48, seed=3)
    head.save_pretrained(tmp_path / "head", include_embeddings=True)
    eng = EagleEngine.from_pretrained(target, tmp_path / "head", TreeConfig(16, 3, 4), max_length=128,
                                      draft_dtype="fp8", tokenizer=False)
    assert eng.head.is_fp8 and eng.head.dtype == target.dtype
    prompt = torch.randint(0, 128, (7,), generator=torch.Generator().manual_seed(0)).tolist()
    spec, stats = eng.generate(input_ids=prompt, max_new_tokens=20)
    plain, _ = eng.generate(input_ids=prompt, max_new_tokens=20, speculative=False)
    assert spec == plain and stats.speculative
    with pytest.raises(ValueError, match="draft dtype"):
        EagleEngine.from_pretrained(target, tmp_path / "head", draft_dtype="int4", tokenizer=False)
    with pytest.raises(ValueError, match="needs a draft head"):
        EagleEngine.from_pretrained(target, None, draft_dtype="fp8", tokenizer=False)


def test_cli_takes_draft_dtype():
    from eagle_triton.commands.generate import add_model_arguments

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    assert p.parse_args([]).draft_dtype == "model"
    assert p.parse_args(["--draft-dtype", "fp8"]).draft_dtype == "fp8"
    with pytest.raises(SystemExit):
        p.parse_args(["--draft-dtype", "int4"])
