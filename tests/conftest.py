"""Test configuration: Triton's interpreter on CPU-only machines, GPU markers, fresh random seeds."""

import atexit
import os
import shutil
import tempfile

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False

# Must be set before any @triton.jit decorator runs, i.e. before eagle_triton is imported.
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests never write into the user's cache: a converted default model goes to a folder of this session's own.
_CACHE = tempfile.mkdtemp(prefix="eagle-triton-test-cache-")
os.environ["EAGLE_TRITON_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return "cuda" if _HAS_CUDA else "cpu"
