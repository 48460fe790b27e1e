"""Launcher for the fused RoPE + KV-cache write of the target forward (``B`` sequences of ``S`` rows each)."""

from __future__ import annotations

import dataclasses

import torch

from .._utils import cdiv, check_tensor, is_capturing, next_power_of_2, pdl_kwargs
from ..target_linear.op import (
    LinearConfig,
    _check_norm_inputs,
    _check_norm_mode,
    _launch_options,
    _precision,
    default_config,
    interpreter_tiles,
)
from .kernel import _qkv_rope_kernel, _rope_kv_kernel

__all__ = ["target_rope_kv", "target_qkv_rope", "qkv_rope_config", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)


def _check_rope_args(qkv_cols, dtype, dev, M, k_cache, v_cache, cache_seqlens, positions, cos, sin, num_heads,
                     num_kv_heads, cache_slots, B, D, width_of="qkv"):
    """The checks :func:`target_rope_kv` and :func:`target_qkv_rope` share (``qkv_cols``: the product's width)."""
    check_tensor("k_cache", k_cache, ndim=4, dtypes=(dtype,), device=dev, last_dim_contiguous=True)
    if k_cache.shape[2] != num_kv_heads:
        raise ValueError(f"k_cache must be [B, Lmax, Hkv={num_kv_heads}, D], got {list(k_cache.shape)}")
    check_tensor("v_cache", v_cache, shape=tuple(k_cache.shape), dtypes=(dtype,), device=dev,
                 last_dim_contiguous=True)
    if qkv_cols != (num_heads + 2 * num_kv_heads) * D:
        what = "qkv must be [M, (Hq + 2 Hkv) * D" if width_of == "qkv" else "weight must be [(Hq + 2 Hkv) * D"
        raise ValueError(f"{what} = {(num_heads + 2 * num_kv_heads) * D}, ...], got the q/k/v width {qkv_cols}")
    if D % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {D}")
    check_tensor("cache_seqlens", cache_seqlens, shape=(k_cache.shape[0],), dtypes=_INTS, device=dev)
    if cache_slots is not None:
        check_tensor("cache_slots", cache_slots, ndim=1, dtypes=(torch.int32,), device=dev)
    if B < 1 or M % B:
        src = "cache_slots" if cache_slots is not None else "k_cache"
        raise ValueError(f"{M} rows are not S rows for each of the B={B} sequences of {src}")
    check_tensor("positions", positions, shape=(M,) if positions.dim() == 1 else (B, M // B), dtypes=_INTS,
                 device=dev)
    if not positions.is_contiguous():
        raise ValueError("positions must be contiguous (row m's position is read at offset m)")
    check_tensor("cos", cos, ndim=2, dtypes=(dtype,), device=dev, last_dim_contiguous=True)
    if cos.shape[1] != D:
        raise ValueError(f"cos must be [P, D={D}], got {list(cos.shape)}")
    check_tensor("sin", sin, shape=tuple(cos.shape), dtypes=(dtype,), device=dev)
    if sin.stride() != cos.stride():
        raise ValueError("cos and sin must have the same strides")
    if cache_slots is not None and not is_capturing(dev):
        srt = cache_slots.sort().values
        lo, hi, dup = torch.stack([srt[0].long(), srt[-1].long(), (srt[1:] == srt[:-1]).any().long()]).tolist()
        if lo < 0 or hi >= k_cache.shape[0]:
            raise ValueError(f"cache_slots in [{lo}, {hi}] outside the cache's batch range [0, NB={k_cache.shape[0]})")
        if dup:  # two sequences would write the same cache rows
            raise ValueError("cache_slots must be distinct")


def target_rope_kv(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    validate: bool = True,
    cache_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Split the fused q/k/v product rows, apply the optional per-head RMSNorm (Qwen3) and RoPE, write the rotated
    k and the v of row ``j`` of sequence ``b`` into row ``cache_seqlens[c] + j`` of cache batch index ``c`` (``c = b``,
    or ``cache_slots[b]``), and return the rotated q.

    Parameters
    ----------
    qkv : Tensor ``[M, (Hq + 2 Hkv) D]`` (q heads, then k heads, then v heads), last dim contiguous; ``M = B S``
        rows grouped by sequence (row ``m`` is row ``m % S`` of sequence ``m // S``).
    k_cache, v_cache : Tensor ``[B, Lmax, Hkv, D]`` (one layer of the static cache), dtype of ``qkv``; ``[NB, Lmax,
        Hkv, D]`` (the whole cache) with ``cache_slots``.
    cache_seqlens : Tensor ``[B]`` (``[NB]`` with ``cache_slots``) int32/int64: where each cache index's new rows
        start. Rows past ``Lmax`` are dropped (the caller checks capacity on the host).
    positions : Tensor ``[B, S]`` or ``[M]`` int64/int32, contiguous: rotary positions of the rows (``seqlens + j``
        for a chunk, ``seqlens + depth`` for tree rows).
    cos, sin : Tensor ``[P, D]``, dtype of ``qkv``: the rotary tables (``rotate_half`` convention).
    num_heads, num_kv_heads : Hq, Hkv.
    q_norm, k_norm : Tensor ``[D]`` or None (both or neither): Qwen3's per-head RMSNorm, applied before RoPE.
    out : Tensor ``[M, Hq, D]`` for q, or None.
    validate : bool. Check the arguments; with ``cache_slots`` and no CUDA graph being captured, also check the
        slots on the host (a device sync).
    cache_slots : Tensor ``[B]`` int32 or None: sequence ``b`` writes cache batch index ``cache_slots[b]`` (distinct
        values in ``[0, NB)``), read on the device, so one captured graph serves every slot. None: index ``b``.
        A slot outside ``[0, NB)`` (unchecked when capturing or ``validate=False``) writes nothing.
    """
    M = qkv.shape[0]
    NB, D = k_cache.shape[0], k_cache.shape[-1]
    B = cache_slots.shape[0] if cache_slots is not None and cache_slots.dim() == 1 else NB
    S = M // B if B else 0  # rows per sequence
    if validate:
        check_tensor("qkv", qkv, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
        dev = qkv.device
        _check_rope_args(qkv.shape[1], qkv.dtype, dev, M, k_cache, v_cache, cache_seqlens, positions, cos, sin,
                         num_heads, num_kv_heads, cache_slots, B, D)
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm must be given together")
        if q_norm is not None:
            check_tensor("q_norm", q_norm, shape=(D,), dtypes=(qkv.dtype,), device=dev)
            check_tensor("k_norm", k_norm, shape=(D,), dtypes=(qkv.dtype,), device=dev)
    q = out if out is not None else torch.empty(M, num_heads, D, device=qkv.device, dtype=qkv.dtype)
    if M == 0 or S == 0:
        return q
    _rope_kv_kernel[(M,)](
        qkv, q, k_cache, v_cache, cache_seqlens, cache_slots if cache_slots is not None else cache_seqlens, positions,
        cos, sin, q_norm if q_norm is not None else cos, k_norm if k_norm is not None else cos,
        M, S, k_cache.shape[1], qkv.stride(0), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), cos.stride(0), float(eps), NB,
        HQ=num_heads, HKV=num_kv_heads, HEAD_DIM=D, BLOCK_HQ=next_power_of_2(num_heads),
        BLOCK_HKV=next_power_of_2(num_kv_heads), BLOCK_D=max(2, next_power_of_2(D)),
        HAS_NORM=q_norm is not None, HAS_SLOTS=cache_slots is not None, num_warps=4, enable_fp_fusion=False,
        **pdl_kwargs(qkv.device),
    )
    return q


def qkv_rope_config(num_heads: int, num_kv_heads: int, head_dim: int, K: int, device=None,
                    dtype: torch.dtype = torch.bfloat16) -> LinearConfig | None:
    """Tiles of :func:`target_qkv_rope` for this head shape, or None when it cannot take it (then run
    :func:`~eagle_triton.ops.target_linear.target_linear` and :func:`target_rope_kv`).

    The q/k/v product's own :func:`~eagle_triton.ops.target_linear.default_config` (a function of the weight's shape
    only), with two ``BN``-wide column sets per program: ``BN`` is halved (the same programs stream the same bytes)
    down to what divides ``head_dim / 2`` (the first-half dims of a head), and never below 16 (``tl.dot``); on the
    GPU in 16 bits, shorter chunks in more stages (``bench/probes/qkv_rope_probe.py``, H200, per layer against the two
    kernels: 8B heads ``BK = 128``: 17.6 / 19.2 us at 1 / 60 rows against 18.3 / 20.8, the halved tile at
    ``BK = 256`` in 2 stages 26.2 / 33.4; SmolLM2's ``BK = 64``: 3.9 / 4.4 against 4.2 / 4.9;
    ``bench/results/session12_2026-11-26/qkv_rope_*.json``; SmolLM2's in 5 stages without prefetch, 4.05 against
    4.31 us at M = 1 with 4 stages and one chunk prefetched, ``bench/results/session13_2026-11-26/``)."""
    half = head_dim // 2
    if head_dim % 2 or half < 16:
        return None
    N = (num_heads + 2 * num_kv_heads) * head_dim
    cfg = default_config(N, K, device, dtype, silu_mul=True)
    bn = max(16, cfg.block_n // 2)
    while bn > 16 and half % bn:
        bn //= 2
    if half % bn:
        return None
    cfg = dataclasses.replace(cfg, block_n=bn)
    if dtype != torch.float32 and not interpreter_tiles(device):
        cfg = (dataclasses.replace(cfg, block_k=64, num_stages=5, prefetch=0) if K <= 2048 else
               dataclasses.replace(cfg, block_k=128, num_stages=4))
    return cfg


def target_qkv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    sumsq: torch.Tensor | None = None,
    norm_folded: bool = False,
    out: torch.Tensor | None = None,
    config: LinearConfig | None = None,
    validate: bool = True,
    cache_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`~eagle_triton.ops.target_linear.target_linear` of the q/k/v weight followed by
    :func:`target_rope_kv`, in one kernel, without the q/k/v rows going through memory (and one launch less per
    layer). The same reduction chunks and roundings; the products of a program's two column sets may round a
    last bit apart from the plain product's (another tensor-core schedule), so a forward uses one path or the
    other throughout. A row's bits never depend on the rows launched with it (batch-invariant, as the product).

    ``x`` ``[M, K]``, ``weight`` ``[(Hq + 2 Hkv) D, K]``, ``bias``, ``norm_weight``, ``eps``, ``sumsq`` and
    ``norm_folded`` as for ``target_linear`` (the RMSNorm prologue or folded norm of the layer's input);
    ``k_cache`` ... ``cache_slots`` as for :func:`target_rope_kv` (no per-head q/k norm: Qwen3 runs the two-kernel
    path). Returns the rotated q ``[M, Hq, D]``. ``config``: default :func:`qkv_rope_config` (an explicit one
    must have ``block_n`` dividing ``D / 2``, at least 16).
    """
    M = x.shape[0]
    NB, D = k_cache.shape[0], k_cache.shape[-1]
    B = cache_slots.shape[0] if cache_slots is not None and cache_slots.dim() == 1 else NB
    S = M // B if B else 0
    _check_norm_mode(norm_folded, sumsq, norm_weight)
    cfg = config or qkv_rope_config(num_heads, num_kv_heads, D, x.shape[1] if x.dim() == 2 else 0, x.device,
                                    x.dtype)
    if validate:
        check_tensor("x", x, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
        dev, K = x.device, x.shape[1]
        check_tensor("weight", weight, ndim=2, dtypes=(x.dtype,), device=dev, last_dim_contiguous=True)
        if weight.shape[1] != K:
            raise ValueError(f"weight must be [N, K={K}], got {list(weight.shape)}")
        _check_rope_args(weight.shape[0], x.dtype, dev, M, k_cache, v_cache, cache_seqlens, positions, cos, sin,
                         num_heads, num_kv_heads, cache_slots, B, D, width_of="weight")
        if bias is not None:
            check_tensor("bias", bias, shape=(weight.shape[0],), dtypes=(x.dtype,), device=dev)
        _check_norm_inputs(norm_weight, sumsq, norm_folded, M, K, x.dtype, dev)
        if out is not None:
            check_tensor("out", out, shape=(M, num_heads, D), dtypes=(x.dtype,), device=dev,
                         last_dim_contiguous=True)
    if cfg is None or cfg.block_n < 16 or (D // 2) % cfg.block_n or D % 2:
        raise ValueError(f"target_qkv_rope cannot take head_dim={D} with config {cfg} (it needs block_n >= 16 "
                         f"dividing head_dim / 2); use target_linear and target_rope_kv")
    q = out if out is not None else torch.empty(M, num_heads, D, device=x.device, dtype=x.dtype)
    if M == 0 or S == 0:
        return q
    K = x.shape[1]
    s_in = sumsq if sumsq is not None and (norm_weight is not None or norm_folded) else x
    nss = s_in.shape[1] if s_in is sumsq else 0
    n_prog = (num_heads + num_kv_heads) * (D // 2 // cfg.block_n) + cdiv(num_kv_heads * D, 2 * cfg.block_n)
    _qkv_rope_kernel[(cdiv(M, cfg.block_m), n_prog)](
        x, weight, bias if bias is not None else weight, norm_weight if norm_weight is not None else weight, s_in,
        q, k_cache, v_cache, cache_seqlens, cache_slots if cache_slots is not None else cache_seqlens, positions,
        cos, sin, M, S, K, k_cache.shape[1], NB, x.stride(0), weight.stride(0), s_in.stride(0), q.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), cos.stride(0), float(eps),
        HQ=num_heads, HKV=num_kv_heads, HEAD_DIM=D, HAS_NORM=norm_weight is not None, NUM_SS=nss,
        NSS_P2=next_power_of_2(max(nss, 1)), NORM_FOLDED=bool(norm_folded), HAS_BIAS=bias is not None,
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, PRECISION=_precision(x.dtype), PRE=cfg.prefetch,
        HAS_SLOTS=cache_slots is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **_launch_options(x, cfg),  # fp fusion as target_linear's launch (the rotation rounds between its steps)
    )
    return q


def _aot_specs():
    """Compile-only specs: Llama-3.1-8B heads (32/8 x 128) in bf16 and fp32, Qwen3 q/k norm in bf16; the
    cache-slot variant (one-graph prefill) in bf16."""
    specs = []
    for dt, norm, slots in (("bf16", False, False), ("bf16", True, False), ("fp32", False, False),
                            ("bf16", False, True), ("bf16", True, True)):
        sig = {n: "i32" for n in _rope_kv_kernel.arg_names}
        sig.update({p: f"*{dt}" for p in ("qkv_ptr", "q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr", "qn_ptr",
                                          "kn_ptr")})
        sig.update({"seqlens_ptr": "*i32", "slots_ptr": "*i32", "pos_ptr": "*i64", "eps": "fp32"})
        const = dict(HQ=32, HKV=8, HEAD_DIM=128, BLOCK_HQ=32, BLOCK_HKV=8, BLOCK_D=128, HAS_NORM=norm,
                     HAS_SLOTS=slots, PDL=dt == "bf16")
        sig.update({k: "constexpr" for k in const})
        div = [n for n in _rope_kv_kernel.arg_names if n.startswith("stride_") or n == "Lmax"]
        specs.append((_rope_kv_kernel, sig, const, {"num_warps": 4, "enable_fp_fusion": False, "div16": div,
                                                    "launch_pdl": const["PDL"]}))
    # the q/k/v product with the RoPE/KV-write epilogue: 8B heads (128 partials, folded norm) with and without
    # cache slots, and rotated (the default config), SmolLM2's 9/3 x 64 (36 padded partials, 64-wide chunks in 5
    # stages, bias as Qwen2 has)
    for (hq, hkv, d, nss, bias, slots, cfg) in (
            (32, 8, 128, 128, False, False, LinearConfig(64, 32, 128, 4, 4)),
            (32, 8, 128, 128, False, True, LinearConfig(64, 32, 128, 4, 4)),
            (32, 8, 128, 128, False, False, LinearConfig(64, 32, 128, 4, 4, l2_prefetch=2, rotate=True)),
            (9, 3, 64, 36, True, False, LinearConfig(64, 16, 64, 4, 5))):
        sig = {n: "i32" for n in _qkv_rope_kernel.arg_names}
        sig.update({p: "*bf16" for p in ("x_ptr", "w_ptr", "b_ptr", "nw_ptr", "q_ptr", "k_ptr", "v_ptr", "cos_ptr",
                                         "snt_ptr")})
        sig.update({"sin_ptr": "*fp32", "seqlens_ptr": "*i32", "slots_ptr": "*i32", "pos_ptr": "*i64",
                    "eps": "fp32"})
        const = dict(HQ=hq, HKV=hkv, HEAD_DIM=d, HAS_NORM=False, NUM_SS=nss, NSS_P2=next_power_of_2(nss),
                     NORM_FOLDED=True, HAS_BIAS=bias, BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k,
                     PRECISION="tf32", PRE=cfg.prefetch, HAS_SLOTS=slots, PDL=True, L2_PRE=cfg.l2_prefetch,
                     ROTATE=cfg.rotate)
        sig.update({k: "constexpr" for k in const})
        div = ["K", "Lmax", "stride_xm", "stride_wn", "stride_sin_m", "stride_qm"] + [
            n for n in _qkv_rope_kernel.arg_names if n.startswith(("stride_k", "stride_v", "stride_cp"))]
        specs.append((_qkv_rope_kernel, sig, const, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                                                     "div16": div, "launch_pdl": True}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
