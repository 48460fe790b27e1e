"""Compile-only gate: every kernel listed in an ``AOT_SPECS`` builds to a cubin for sm_90, without a GPU.

The interpreter accepts things the GPU compiler rejects (``break``, block pointers, non-constexpr globals, ...), so
each ``eagle_triton.ops.<op>.op`` module (and ``eagle_triton.fused`` when present) lists
``(kernel, signature, constexprs[, options])`` tuples and this test compiles them with ``triton.compile`` for
``GPUTarget("cuda", 90, 32)``. ``options`` may hold compile options (``num_warps``, ``num_stages``) and
``div16``, the integer arguments that are multiples of 16 at real shapes: the JIT specialises such arguments (and
16-byte-aligned pointers, which the gate always assumes) and emits vector loads, so the gate compiles the code
the GPU actually runs. Compiles run in a subprocess without ``TRITON_INTERPRET`` (conftest sets it for the test
process, and the flag is read when ``@triton.jit`` decorates): one per test worker, asked one module at a time (it
imports torch and Triton once, not once per module).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import queue
import subprocess
import sys
import threading

import pytest

_COMPILE = r"""
import importlib, json, sys, time, traceback
import triton
from triton.backends.compiler import GPUTarget


def compile_specs(module):
    mod = importlib.import_module(module)
    results = []
    for i, spec in enumerate(getattr(mod, "AOT_SPECS", [])):
        fn, sig, const = spec[:3]
        opts = dict(spec[3]) if len(spec) > 3 and spec[3] else {}
        div16 = set(opts.pop("div16", ()))
        name = getattr(fn, "__name__", repr(fn))
        try:
            unknown = sorted((set(div16) | set(sig)) - set(fn.arg_names))
            if unknown:
                raise ValueError(f"names not among the kernel's arguments: {unknown}")
            attrs = {(j,): [["tt.divisibility", 16]] for j, a in enumerate(fn.arg_names)
                     if a in div16 or str(sig.get(a, "")).startswith("*")}
            t0 = time.time()
            k = triton.compile(triton.compiler.ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                               options=opts)
            assert k.asm.get("cubin"), "no cubin produced"
            results.append({"i": i, "kernel": name, "ok": True, "s": round(time.time() - t0, 2),
                            "shared": k.metadata.shared})
        except Exception as e:  # report every failing spec, not just the first
            results.append({"i": i, "kernel": name, "ok": False,
                            "error": "".join(traceback.format_exception_only(type(e), e))[-2000:]})
    return results
"""

#: one module, named by argv[1], then exit
_SCRIPT = _COMPILE + r"""
print("AOT_RESULTS=" + json.dumps(compile_specs(sys.argv[1])))
"""

#: module names on stdin, one a line, each answered by one line on stdout (its results, or the traceback of its
#: import): a worker's modules share one process, which imports torch and Triton once
_SERVER = _COMPILE + r"""
for line in sys.stdin:
    try:
        out = "AOT_RESULTS=" + json.dumps(compile_specs(line.strip()))
    except BaseException:
        out = "AOT_IMPORT_FAILED=" + json.dumps(traceback.format_exc()[-4000:])
    print(out, flush=True)
"""


def _spec_modules() -> list[str]:
    mods = []
    ops = importlib.util.find_spec("eagle_triton.ops")
    for info in pkgutil.iter_modules(ops.submodule_search_locations):
        if info.ispkg and importlib.util.find_spec(f"eagle_triton.ops.{info.name}.op") is not None:
            mods.append(f"eagle_triton.ops.{info.name}.op")
    if importlib.util.find_spec("eagle_triton.fused") is not None:
        mods.append("eagle_triton.fused")
    return sorted(mods)


def _has_nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception:
        return False
    return True


class _Compiler:
    """The compile process of a test worker (:data:`_SERVER`): started on first use, asked one module at a time,
    ended with the session. Without ``TRITON_INTERPRET``: conftest sets it for the test process, and the flag is
    read when ``@triton.jit`` decorates."""

    def __init__(self):
        self.proc = None
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []

    def ask(self, module: str, timeout: float = 900.0) -> str:
        if self.proc is None or self.proc.poll() is not None:
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            self.lines, self.err = queue.Queue(), []
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True).start()
        self.proc.stdin.write(module + "\n")
        self.proc.stdin.flush()
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            self.close()
            return ""

    @staticmethod
    def _read(stream, sink):
        for line in stream:
            (sink.put if isinstance(sink, queue.Queue) else sink.append)(line.rstrip("\n"))
        if isinstance(sink, queue.Queue):
            sink.put("")  # the process ended

    def stderr(self) -> str:
        return "\n".join(self.err)[-4000:]

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def compiler():
    c = _Compiler()
    yield c
    c.close()


@pytest.mark.skipif(not _has_nvidia_backend(), reason="Triton's NVIDIA backend (bundled ptxas) is not installed")
@pytest.mark.parametrize("module", _spec_modules())
def test_kernels_compile_for_sm90(module, compiler):
    line = compiler.ask(module)
    assert line.startswith("AOT_RESULTS="), (f"{module}: the compile process failed\n"
                                            f"{json.loads(line.split('=', 1)[1]) if '=' in line else ''}"
                                            f"{compiler.stderr()}")
    results = json.loads(line[len("AOT_RESULTS="):])
    if module.startswith("eagle_triton.ops."):
        assert results, f"{module} defines no AOT_SPECS"
    failed = [r for r in results if not r["ok"]]
    assert not failed, f"{module}: {len(failed)} of {len(results)} specs do not compile for sm_90:\n" + "\n".join(
        f"  [{r['i']}] {r['kernel']}: {r['error']}" for r in failed)
    too_big = [r for r in results if r["shared"] > 227 * 1024]
    assert not too_big, f"{module}: shared memory over the sm_90 limit (227 KiB): {too_big}"


def test_gate_catches_what_the_interpreter_accepts():
    """The gate must fail on a kernel with ``break`` (accepted by the interpreter, rejected by the compiler)."""
    src = r'''
import triton, triton.language as tl
@triton.jit
def _bad(x_ptr, n):
    for i in range(0, n):
        if i > 3:
            break
        tl.store(x_ptr + i, i)
AOT_SPECS = [(_bad, {"x_ptr": "*i32", "n": "i32"}, {})]
'''
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "gate_probe_mod.py"), "w") as f:
            f.write(src)
        env["PYTHONPATH"] = d + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run([sys.executable, "-c", _SCRIPT, "gate_probe_mod"], capture_output=True, text=True,
                              env=env, timeout=300)
    results = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("AOT_RESULTS=")][-1][12:])
    assert len(results) == 1 and not results[0]["ok"] and "Break" in results[0]["error"]
