"""Launchers for the batch-invariant weight product and the standalone RMSNorm of the target forward.

**The tile configuration is a function of ``(N, K)`` and the device only** (:func:`default_config`, or an explicit
:class:`LinearConfig`), never of the row count ``M``: that is what makes a row's result independent of how many
rows are computed with it. ``M`` is passed unspecialised (``do_not_specialize``), so a new row count never compiles
a new kernel. Tune the defaults on the GPU with ``bench/bench_target.py`` (``config=`` overrides them per call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._utils import cdiv, check_tensor, is_interpreter, next_power_of_2
from .kernel import _bi_linear_kernel, _rms_norm_kernel

__all__ = ["target_linear", "target_rms_norm", "LinearConfig", "default_config", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class LinearConfig:
    """One fixed tile configuration: ``BM`` rows (a 1-row decode pads to it), ``BN`` output columns per program,
    ``BK`` reduction chunk, and the launch's warps/stages."""

    block_m: int = 64
    block_n: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4


def default_config(N: int, K: int, device: torch.device | str | None = None,
                   dtype: torch.dtype = torch.bfloat16, silu_mul: bool = False) -> LinearConfig:
    """The tile configuration for an ``[N, K]`` weight (``N`` output columns; independent of ``M`` by construction).

    GPU, 16-bit (measured on the H100 at the Llama-3.1-8B shapes, ``bench/probes/target_linear_tune.py``, results in
    ``bench/results/target_forward_2026-11-24/``): ``BM = 64`` always (one wgmma M: a 60-row verify reads the weight
    once and a 1-row decode runs the same instruction shape); then by output width ``N``:

    - ``N <= 4096`` (o, down): ``BN = 32``, ``BK = 256``, 4 stages (21.8 / 56.1 us at M = 1, cuBLAS 23.2 / 56.3);
    - ``N <= 8192`` (q/k/v): ``BN = 64``, ``BK = 256``, 3 stages (29.3 us, cuBLAS 30.3);
    - ``N < 65536`` (gate/up): ``BN = 64``, ``BK = 128``, 4 stages (94.6 us, cuBLAS 95.4);
    - larger (lm_head): ``BN = 128``, ``BK = 128``, 3 stages (355.8 us, 2.95 TB/s; cuBLAS 389.1).

    The narrow tiles of the small products keep enough programs (and bytes in flight) on 132 SMs. ``silu_mul``
    streams two weight tiles per step (gate and up): the stages are cut to what fits the shared-memory budget.
    fp32 (IEEE dots
    on FMA units) uses small tiles. Interpreter (and CPU tensors): ``64 x 64 x 64`` tiles, few programs (the
    interpreter's cost is per program).
    """
    if is_interpreter() or (device is not None and torch.device(device).type == "cpu"):
        return LinearConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        return LinearConfig(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=3)
    if N <= 4096:
        bn, bk, stages = 32, 256, 4
    elif N <= 8192:
        bn, bk, stages = 64, 256, 3
    elif N < 65536:
        bn, bk, stages = 64, 128, 4
    else:
        bn, bk, stages = 128, 128, 3
    stage_bytes = (64 + (2 if silu_mul else 1) * bn) * bk * torch.tensor([], dtype=dtype).element_size()
    stages = max(2, min(stages, _SMEM_BUDGET // stage_bytes))
    return LinearConfig(block_m=64, block_n=bn, block_k=bk, num_warps=4, num_stages=stages)


# Pipeline buffers per program: an H100 SM has 227 KiB of shared memory; leave room for the epilogue's scratch.
_SMEM_BUDGET = 200 * 1024


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: true fp32 products (the GPU default would be TF32); 16-bit inputs ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def target_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    silu_mul: bool = False,
    out: torch.Tensor | None = None,
    config: LinearConfig | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)`` with optional inline RMSNorm of ``x``, SiLU·mul and residual epilogues.

    Parameters
    ----------
    x : Tensor ``[M, K]`` (row stride free, last dim contiguous), fp16/bf16/fp32.
    weight : Tensor ``[N, K]`` (``[2N, K] = cat(gate, up)`` with ``silu_mul``), contiguous rows, dtype of ``x``.
    bias : Tensor ``[N]`` (``[2N]`` with ``silu_mul``) or None.
    norm_weight : Tensor ``[K]`` or None: normalise each x row first (LlamaRMSNorm with ``eps``).
    residual : Tensor ``[M, N]`` or None: return ``residual + y``.
    silu_mul : output column ``n`` is ``silu(gate_n) * up_n`` (the fused gate/up product of the MLP).
    out : Tensor ``[M, N]`` to write into (it may not alias ``x``), or None.
    config : tile configuration; default :func:`default_config` ``(N, K)``.
    validate : check shapes/dtypes (host-only checks, no device sync).

    Returns
    -------
    Tensor ``[M, N]`` in the dtype of ``x``. Bit-identical for a given row whatever ``M`` is.
    """
    rows_w = weight.shape[0] if weight.dim() == 2 else -1
    N = rows_w // 2 if silu_mul else rows_w
    if validate:
        check_tensor("x", x, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
        M, K = x.shape
        dev = x.device
        check_tensor("weight", weight, ndim=2, dtypes=(x.dtype,), device=dev, last_dim_contiguous=True)
        if weight.shape[1] != K:
            raise ValueError(f"weight must be [N, K={K}], got {list(weight.shape)}")
        if silu_mul and rows_w % 2:
            raise ValueError(f"silu_mul needs weight = cat(gate, up) with an even row count, got {rows_w}")
        if bias is not None:
            check_tensor("bias", bias, shape=(rows_w,), dtypes=(x.dtype,), device=dev)
        if norm_weight is not None:
            check_tensor("norm_weight", norm_weight, shape=(K,), dtypes=(x.dtype,), device=dev)
        if residual is not None:
            check_tensor("residual", residual, shape=(M, N), dtypes=(x.dtype,), device=dev,
                         last_dim_contiguous=True)
        if out is not None:
            check_tensor("out", out, shape=(M, N), dtypes=(x.dtype,), device=dev, last_dim_contiguous=True)
    M, K = x.shape
    cfg = config or default_config(N, K, x.device, x.dtype, silu_mul=bool(silu_mul))
    y = out if out is not None else torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M == 0 or N == 0:
        return y
    res = residual if residual is not None else y
    grid = (cdiv(M, cfg.block_m), cdiv(N, cfg.block_n))
    _bi_linear_kernel[grid](
        x, weight, bias if bias is not None else weight, norm_weight if norm_weight is not None else weight,
        res, y, M, N, K, x.stride(0), weight.stride(0), res.stride(0), y.stride(0), float(eps),
        HAS_NORM=norm_weight is not None, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        SILU_MUL=bool(silu_mul), BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, PRECISION=_precision(x.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


def target_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, validate: bool = True,
                    block_k: int | None = None) -> torch.Tensor:
    """LlamaRMSNorm of each row of ``x [M, K]`` (one row per program, fixed chunk order: batch-invariant)."""
    if validate:
        check_tensor("x", x, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
        check_tensor("weight", weight, shape=(x.shape[1],), dtypes=(x.dtype,), device=x.device)
    M, K = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if M == 0:
        return y
    # On the GPU the whole row in one chunk (up to 8192): the two passes are then two loads, not 2 * K / 1024
    # dependent round trips, which is what a 1-row decode waits for.
    bk = block_k or (min(64, next_power_of_2(K)) if is_interpreter() else min(8192, next_power_of_2(K)))
    _rms_norm_kernel[(M,)](x, weight, y, M, K, x.stride(0), y.stride(0), float(eps), BK=bk,
                           num_warps=8 if bk >= 2048 else 4)
    return y


def _aot_specs():
    """Compile-only specs at Llama-3.1-8B shapes: every epilogue combination in bf16 at the default tiles, the
    largest smem user (norm + SiLU·mul, two weight tiles) at ``BN`` 64 and 16, fp16/fp32 once."""
    specs = []
    div = ["N", "K", "stride_xm", "stride_wn", "stride_rm", "stride_ym"]
    flags = [(True, False, False, False), (False, True, True, False), (True, False, False, True),
             (False, False, True, False), (True, True, False, True)]
    for dt, prec, cfg in (("bf16", "tf32", LinearConfig()), ("bf16", "tf32", LinearConfig(block_n=64)),
                          ("bf16", "tf32", LinearConfig(block_n=16)), ("fp16", "tf32", LinearConfig(block_n=64)),
                          ("fp32", "ieee", LinearConfig(block_m=32, block_n=32, block_k=32, num_stages=3))):
        for norm, bias, res, silu in (flags if cfg == LinearConfig() else flags[2:3] if dt == "bf16" else flags[:1]):
            sig = {n: "i32" for n in _bi_linear_kernel.arg_names}
            sig.update({p: f"*{dt}" for p in ("x_ptr", "w_ptr", "b_ptr", "nw_ptr", "r_ptr", "y_ptr")})
            sig["eps"] = "fp32"
            const = dict(HAS_NORM=norm, HAS_BIAS=bias, HAS_RES=res, SILU_MUL=silu, BM=cfg.block_m,
                         BN=cfg.block_n, BK=cfg.block_k, PRECISION=prec)
            sig.update({k: "constexpr" for k in const})
            specs.append((_bi_linear_kernel, sig, const,
                          {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "div16": div}))
    for dt in ("bf16", "fp32"):
        sig = {n: "i32" for n in _rms_norm_kernel.arg_names}
        sig.update({"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "eps": "fp32", "BK": "constexpr"})
        specs.append((_rms_norm_kernel, sig, {"BK": 1024},
                      {"num_warps": 4, "div16": ["K", "stride_xm", "stride_ym"]}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
