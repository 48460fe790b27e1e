"""Engine test fixtures. One torch thread per test worker: the CPU runners are tiny and the machine is shared
(OpenMP threads spinning against another worker made each op ~100x slower here)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model():
    from engine_testlib import tiny_llama

    return tiny_llama()
