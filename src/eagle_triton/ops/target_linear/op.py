"""Launchers for the batch-invariant weight product, the standalone RMSNorm and the embedding gather of the target
forward.

**The tile configuration is a function of ``(N, K)`` and the device only** (:func:`default_config`, or an explicit
:class:`LinearConfig`), never of the row count ``M``: that is what makes a row's result independent of how many
rows are computed with it. ``M`` is passed unspecialised (``do_not_specialize``), so a new row count never compiles
a new kernel. Tune the defaults on the GPU with ``bench/bench_target.py`` (``config=`` overrides them per call).

**Partial sums of squares** (``sumsq`` / ``sumsq_out``, fp32 ``[M, P]``): a kernel that produces a row of the
residual stream (the residual products, :func:`target_embedding`) can also write ``P`` partial sums of the squares
of its stored values (one per output tile of ``BN`` columns, :func:`sumsq_width`), and the RMSNorm that follows
(:func:`target_linear` with ``norm_weight``, :func:`target_rms_norm`) loads its row tile's partials as one
``[rows, P]`` block and sums each row's ``P`` (``tl.sum``), instead of reading the whole row again. The tile
boundaries are fixed by the producer's configuration and the reduction order by the reader's (never by ``M``), so
a row's partials, and hence its norm, never depend on ``M``. The buffers must have unit column stride (row-major
``[M, P]``, any row stride): a reader's block is then contiguous and vector-loaded, and its row stride ``P`` does
not change with the row count (nothing recompiles for a new prompt length).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._utils import cdiv, check_tensor, is_interpreter, next_power_of_2, pdl_kwargs
from .kernel import KEY_EMPTY, _bi_linear_kernel, _embedding_kernel, _rms_norm_kernel

__all__ = ["target_linear", "argmax_from_keys", "KEY_EMPTY", "fold_norm_weight",
           "target_rms_norm", "target_embedding", "sumsq_width", "LinearConfig",
           "default_config", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class LinearConfig:
    """One fixed tile configuration: ``BM`` rows (a 1-row decode pads to it), ``BN`` output columns per program,
    ``BK`` reduction chunk, the launch's warps/stages, and ``prefetch`` (0-2): weight chunks a program loads before
    waiting for the previous kernel (see the kernel; it changes timing, never the result). ``l2_prefetch`` (0, 1,
    2, 4, 8): weight chunks a program asks L2 for before that wait (a hint: no registers, no stage, no bit
    changed; only with programmatic dependent launch). ``rotate``: program ``n`` reduces its chunks starting
    at chunk ``n % cdiv(K, block_k)``, wrapping around, so that the programs running at one time read different
    columns; it changes the summation order, hence the bits, but per output tile only (rows stay batch-invariant),
    so it belongs to the tile configuration."""

    block_m: int = 64
    block_n: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    prefetch: int = 0
    l2_prefetch: int = 0
    rotate: bool = False

    def __post_init__(self):
        if self.prefetch not in (0, 1, 2):
            raise ValueError(f"LinearConfig.prefetch must be 0, 1 or 2, got {self.prefetch}")
        if self.l2_prefetch not in (0, 1, 2, 4, 8):
            raise ValueError(f"LinearConfig.l2_prefetch must be 0, 1, 2, 4 or 8, got {self.l2_prefetch}")


def default_config(N: int, K: int, device: torch.device | str | None = None,
                   dtype: torch.dtype = torch.bfloat16, silu_mul: bool = False) -> LinearConfig:
    """The tile configuration for an ``[N, K]`` weight (``N`` output columns; independent of ``M`` by construction).

    GPU, 16-bit (measured on the H100 at the Llama-3.1-8B shapes, ``bench/probes/target_linear_tune.py``, results in
    ``bench/results/target_forward_2026-11-24/``): ``BM = 64`` always (one wgmma M: a 60-row verify reads the weight
    once and a 1-row decode runs the same instruction shape); then by output width ``N``:

    - ``N <= 4096`` (o, down): ``BN = 32``, ``BK = 256``, 4 stages (21.8 / 56.1 us at M = 1, cuBLAS 23.2 / 56.3);
    - ``N <= 8192`` (q/k/v): ``BN = 64``, ``BK = 256``, 3 stages (29.3 us, cuBLAS 30.3);
    - ``N < 65536`` (gate/up): ``BN = 64``, ``BK = 128``, 4 stages (94.6 us, cuBLAS 95.4);
    - larger (lm_head): ``BN = 128``, ``BK = 128``, 3 stages (355.8 us, 2.95 TB/s; cuBLAS 389.1);
    - each asks L2 for its first two weight chunks before the PDL wait (``l2_prefetch=2``: the 8B step probe,
      ``bench/results/session20_2026-11-27/step_l2_8b*.json``, H100: decode 5.637 -> 5.556-5.575 ms, 60-row
      verify 6.113 -> 6.061-6.065, speculative 60/7/10 step 8.636 -> 8.550-8.577; one chunk gains half of
      that, four no more, eight lose it);
    - ``silu_mul`` (gate/up, and the q/k/v product with RoPE, whose :func:`~eagle_triton.ops.rope_kv.qkv_rope_config`
      starts from these tiles) reduces in rotated chunk order (``rotate``): H100, 8B shape, the 60/7/10 speculative
      step 8.458-8.463 -> 8.422-8.426 ms and plain decode 5.573-5.576 -> 5.540-5.541 ms per token (one lease,
      alternated twice; ``bench/results/session26_2026-11-28/``). Per product (one run each): gate/up -35 us per
      step, q/k/v -11, o +3, lm_head -5 and down +58 (the last three stay unrotated).

    Small models (``K <= 2048``; SmolLM2-135M, products chained in one CUDA graph with programmatic dependent
    launch, ``bench/probes/wide_tiles.py``, ``bench/results/session13_2026-11-26/wide_smollm2_b.json``): ``BN = 16``;
    a reduction length that is not a multiple of 128 (SmolLM2's 576) in ``BK = 64`` chunks, 6 stages (no chunk half
    masked: o 2.52 and gate/up 3.66 us at M = 1, against 2.78 / 4.77 with ``BK = 256``, 3 stages, one chunk
    prefetched, the earlier tiles, bit-identical rows), else ``BK = 256``, 3 stages, the first weight chunk loaded
    before waiting on the previous kernel (down 4.4 us; ``bench/results/pdl_2026-11-25/``); their lm_head
    ``BN = 64``, in ``BK = 64`` chunks, 4 stages where ``K % 128`` (SmolLM2, H200: 17.2 / 19.0 us at 1 / 60 rows
    against 19.3 / 22.7 with ``BK = 128``, ``wide_smollm2_c.json``), else ``BK = 128``, 2 stages, two chunks
    prefetched (22.4 us against 26.9 with the 8B tiles, H100).

    The narrow tiles of the small products keep enough programs (and bytes in flight) on 132 SMs. ``silu_mul``
    streams two weight tiles per step (gate and up): the stages are cut to what fits the shared-memory budget.
    fp32 (IEEE dots
    on FMA units) uses small tiles. Interpreter (and CPU tensors): ``64 x 64 x 64`` tiles, few programs (the
    interpreter's cost is per program).
    """
    if interpreter_tiles(device):
        return LinearConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        return LinearConfig(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=3)
    if K <= 2048 and N * K <= _SMALL_PRODUCT:  # small models (SmolLM2): latency-bound, many narrow programs
        if K % 128:
            return LinearConfig(block_m=64, block_n=16, block_k=64, num_warps=4, num_stages=6)
        return LinearConfig(block_m=64, block_n=16, block_k=256, num_warps=4, num_stages=3, prefetch=1)
    if K <= 2048:  # a small model's lm_head
        if K % 128:
            return LinearConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4)
        return LinearConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=2, prefetch=2)
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
    return LinearConfig(block_m=64, block_n=bn, block_k=bk, num_warps=4, num_stages=stages, l2_prefetch=2,
                        rotate=bool(silu_mul))


def interpreter_tiles(device: torch.device | str | None) -> bool:
    """Whether products for ``device`` take the interpreter's tiles (Triton's interpreter, or CPU tensors)."""
    return is_interpreter() or (device is not None and torch.device(device).type == "cpu")


# Pipeline buffers per program: an H100 SM has 227 KiB of shared memory; leave room for the epilogue's scratch.
_SMEM_BUDGET = 200 * 1024
#: Weights up to this many elements with ``K <= 2048`` count as small products (SmolLM2's largest is 1536 x 576).
_SMALL_PRODUCT = 4 * 1024 * 1024


def sumsq_width(N: int, config: LinearConfig) -> int:
    """Columns ``P`` of the partial sums of squares a product with ``N`` outputs writes: one per ``BN`` tile."""
    return cdiv(N, config.block_n)


def _check_sumsq(name: str, t: torch.Tensor, M: int, P: int | None, dev) -> None:
    check_tensor(name, t, ndim=2, dtypes=(torch.float32,), device=dev)
    if t.shape[0] != M or (P is not None and t.shape[1] != P) or t.shape[1] < 1:
        want = f"[M={M}, {P if P is not None else 'P >= 1'}]"
        raise ValueError(f"{name} must have shape {want} (fp32 partial sums of squares), got {list(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must be row-major [M, P] with unit column stride (the kernels load a row tile's "
                         f"partials as one contiguous block), got strides {list(t.stride())}")


def _check_norm_mode(norm_folded: bool, sumsq, norm_weight) -> None:
    """The RMSNorm arguments' combination (a host check on ``None``-ness only, so it runs without ``validate``: a
    mode slip would silently normalise twice or never)."""
    if norm_folded and (sumsq is None or norm_weight is not None):
        raise ValueError("norm_folded needs sumsq (the rows' partial sums of squares) and no norm_weight (it is "
                         "folded into weight)")


def _check_norm_inputs(norm_weight, sumsq, norm_folded: bool, M: int, K: int, dtype, dev) -> None:
    """``norm_weight`` ``[K]`` and the partial sums of squares ``sumsq`` ``[M, P]`` of a normed product's rows."""
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, shape=(K,), dtypes=(dtype,), device=dev)
    if sumsq is not None:
        if norm_weight is None and not norm_folded:
            raise ValueError("sumsq (partial sums of squares of x) is only read by the RMSNorm prologue: pass "
                             "norm_weight too (or norm_folded=True with the norm weight folded into weight)")
        _check_sumsq("sumsq", sumsq, M, None, dev)


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
    sumsq: torch.Tensor | None = None,
    sumsq_out: torch.Tensor | None = None,
    norm_folded: bool = False,
    out: torch.Tensor | None = None,
    config: LinearConfig | None = None,
    validate: bool = True,
    argmax_keys: torch.Tensor | None = None,
    store_output: bool = True,
) -> torch.Tensor | None:
    """``y = x @ W.T (+ bias)`` with optional inline RMSNorm of ``x``, SiLU·mul and residual epilogues.

    Parameters
    ----------
    x : Tensor ``[M, K]`` (row stride free, last dim contiguous), fp16/bf16/fp32.
    weight : Tensor ``[N, K]`` (``[2N, K] = cat(gate, up)`` with ``silu_mul``), contiguous rows, dtype of ``x``.
    bias : Tensor ``[N]`` (``[2N]`` with ``silu_mul``) or None.
    norm_weight : Tensor ``[K]`` or None: normalise each x row first (LlamaRMSNorm with ``eps``).
    residual : Tensor ``[M, N]`` or None: return ``residual + y``.
    silu_mul : output column ``n`` is ``silu(gate_n) * up_n`` (the fused gate/up product of the MLP).
    sumsq : fp32 ``[M, P]`` (unit column stride) or None (needs ``norm_weight``): partial sums of squares of each
        x row (their sum is the row's sum of squares), written by the kernel that produced ``x``; without
        it the prologue sums the squares over the row tile itself (every program re-reads its rows: slower).
    sumsq_out : fp32 ``[M, sumsq_width(N, config)]`` (unit column stride) or None: also write, per row and per
        ``BN``-wide output tile, the sum of squares of the returned values (as rounded to the output dtype).
    norm_folded : with ``sumsq`` and without ``norm_weight``: ``weight`` already holds ``W * norm_weight`` (an
        RMSNorm weight folded in, :func:`fold_norm_weight`), and each output row is ``rstd * (x @ W.T)`` in fp32
        (``rstd = rsqrt(sum(sumsq) / K + eps)``) before the bias. The same norm as ``norm_weight`` up to the
        rounding of the normalised row and of the folded weight to the dtype; x is streamed unnormalised, so the
        product costs what a plain one does.
    out : Tensor ``[M, N]`` to write into (it may not alias ``x``), or None.
    config : tile configuration; default :func:`default_config` ``(N, K)``.
    validate : check shapes/dtypes (host-only checks, no device sync).
    argmax_keys : int64 ``[M]`` or None: each row's maximum output (as rounded to the dtype) and its first column,
        packed (:func:`argmax_from_keys` reads the column), merged into the tensor by ``atomic_max``. It must hold
        ``KEY_EMPTY`` beforehand (:func:`target_rms_norm`'s ``reset_argmax_keys`` sets it in the kernel that makes
        a forward's last hidden rows).
    store_output : False (with ``argmax_keys``): the outputs are not written (greedy decoding reads the keys only).

    Returns
    -------
    Tensor ``[M, N]`` in the dtype of ``x`` (None when ``store_output`` is False). Bit-identical for a given row
    whatever ``M`` is.
    """
    rows_w = weight.shape[0] if weight.dim() == 2 else -1
    N = rows_w // 2 if silu_mul else rows_w
    _check_norm_mode(norm_folded, sumsq, norm_weight)
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
        _check_norm_inputs(norm_weight, sumsq, norm_folded, M, K, x.dtype, dev)
        if residual is not None:
            check_tensor("residual", residual, shape=(M, N), dtypes=(x.dtype,), device=dev,
                         last_dim_contiguous=True)
        if out is not None:
            check_tensor("out", out, shape=(M, N), dtypes=(x.dtype,), device=dev, last_dim_contiguous=True)
        if argmax_keys is not None:
            check_tensor("argmax_keys", argmax_keys, shape=(M,), dtypes=(torch.int64,), device=dev)
            if argmax_keys.stride(0) != 1:
                raise ValueError("argmax_keys must be contiguous")
    if not store_output and argmax_keys is None:
        raise ValueError("store_output=False needs argmax_keys (nothing would be computed)")
    M, K = x.shape
    cfg = config or default_config(N, K, x.device, x.dtype, silu_mul=bool(silu_mul))
    if validate and sumsq_out is not None:
        _check_sumsq("sumsq_out", sumsq_out, M, sumsq_width(N, cfg), x.device)
    if store_output:
        y = out if out is not None else torch.empty(M, N, device=x.device, dtype=x.dtype)
    else:  # an unwritten stand-in (the kernel reads the dtype of its pointer)
        y = x
    if M == 0 or N == 0:
        return y if store_output else None
    res = residual if residual is not None else y
    s_in = sumsq if sumsq is not None and (norm_weight is not None or norm_folded) else y
    s_out = sumsq_out if sumsq_out is not None else y
    nss = s_in.shape[1] if s_in is sumsq else 0
    grid = (cdiv(M, cfg.block_m), cdiv(N, cfg.block_n))
    keys = argmax_keys if argmax_keys is not None else s_in  # an unread stand-in without keys
    _bi_linear_kernel[grid](
        x, weight, bias if bias is not None else weight, norm_weight if norm_weight is not None else weight,
        res, y, s_in, s_out, keys, M, N, K, x.stride(0), weight.stride(0), res.stride(0), y.stride(0),
        s_in.stride(0), s_out.stride(0), float(eps),
        HAS_NORM=norm_weight is not None, NUM_SS=nss, NSS_P2=next_power_of_2(max(nss, 1)), HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, SILU_MUL=bool(silu_mul), WRITE_SS=sumsq_out is not None,
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, PRECISION=_precision(x.dtype), PRE=cfg.prefetch,
        NORM_FOLDED=bool(norm_folded), ARGMAX=argmax_keys is not None, STORE_Y=bool(store_output),
        **_launch_options(x, cfg), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y if store_output else None


def argmax_from_keys(keys: torch.Tensor) -> torch.Tensor:
    """The column of each key of :func:`target_linear`'s ``argmax_keys`` (int64, as ``torch.argmax`` returns)."""
    return 4294967295 - (keys & 4294967295)


def _launch_options(x: torch.Tensor, cfg: LinearConfig) -> dict:
    """The launch keywords a config adds: programmatic dependent launch and, with it, the L2 prefetch
    (``L2_PRE``); the rotated chunk order (``ROTATE``)."""
    kw = pdl_kwargs(x.device)
    if kw and cfg.l2_prefetch:
        kw["L2_PRE"] = cfg.l2_prefetch
    if cfg.rotate:
        kw["ROTATE"] = True
    return kw


def fold_norm_weight(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """``weight * norm_weight`` (each column ``k`` scaled by the RMSNorm weight ``k``), computed in fp32 and
    rounded once to the weight's dtype: the weight of a ``norm_folded`` :func:`target_linear`."""
    if norm_weight.shape != (weight.shape[1],):
        raise ValueError(f"norm_weight must be [K={weight.shape[1]}], got {list(norm_weight.shape)}")
    return (weight.to(torch.float32) * norm_weight.to(torch.float32)[None, :]).to(weight.dtype)


def target_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                    sumsq: torch.Tensor | None = None, validate: bool = True,
                    block_k: int | None = None, reset_argmax_keys: torch.Tensor | None = None) -> torch.Tensor:
    """LlamaRMSNorm of each row of ``x [M, K]`` (one row per program, fixed chunk order: batch-invariant).

    ``sumsq``: fp32 ``[M, P]`` partial sums of squares of the rows, unit column stride (see the module doc): the
    row's sum of squares is their sum, and the kernel reads the row once instead of twice.
    ``reset_argmax_keys``: int64 ``[M]``, set to ``KEY_EMPTY`` by the same launch, for a :func:`target_linear`
    that reads these rows with ``argmax_keys`` (a forward's lm_head: no fill launch of its own).
    """
    if validate:
        check_tensor("x", x, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
        check_tensor("weight", weight, shape=(x.shape[1],), dtypes=(x.dtype,), device=x.device)
        if sumsq is not None:
            _check_sumsq("sumsq", sumsq, x.shape[0], None, x.device)
        if reset_argmax_keys is not None:
            check_tensor("reset_argmax_keys", reset_argmax_keys, shape=(x.shape[0],), dtypes=(torch.int64,),
                         device=x.device)
            if reset_argmax_keys.stride(0) != 1:
                raise ValueError("reset_argmax_keys must be contiguous")
    M, K = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if M == 0:
        return y
    # On the GPU the whole row in one chunk (up to 8192): the two passes are then two loads, not 2 * K / 1024
    # dependent round trips, which is what a 1-row decode waits for.
    bk = block_k or (min(64, next_power_of_2(K)) if is_interpreter() else min(8192, next_power_of_2(K)))
    s = sumsq if sumsq is not None else y
    nss = sumsq.shape[1] if sumsq is not None else 0
    keys = reset_argmax_keys if reset_argmax_keys is not None else s  # an unwritten stand-in without keys
    _rms_norm_kernel[(M,)](x, weight, y, s, keys, M, K, x.stride(0), y.stride(0), s.stride(0), float(eps),
                           BK=bk, NUM_SS=nss, NSS_P2=next_power_of_2(max(nss, 1)),
                           RESET_KEY=reset_argmax_keys is not None,
                           num_warps=8 if bk >= 2048 else 4, **pdl_kwargs(x.device))
    return y


def target_embedding(ids: torch.Tensor, weight: torch.Tensor, *, sumsq_out: torch.Tensor | None = None,
                     validate: bool = True) -> torch.Tensor:
    """``weight[ids]`` (the embedding rows ``[M, H]``) and, into ``sumsq_out`` (fp32 ``[M, P]``, unit column
    stride), each row's ``P``
    partial sums of squares over consecutive column chunks of ``cdiv(H, P)`` (the first RMSNorm's input).

    ``ids``: ``[M]`` integer token ids in ``[0, V)`` (checked on the host for CPU tensors; on the GPU, in kernels
    built with Triton's debug mode); ``weight``: ``[V, H]``, contiguous rows. One launch replaces
    ``F.embedding`` and a pass over the rows.
    """
    if validate:
        check_tensor("ids", ids, ndim=1, dtypes=(torch.int32, torch.int64))
        check_tensor("weight", weight, ndim=2, dtypes=_FLOATS, device=ids.device, last_dim_contiguous=True)
        if sumsq_out is not None:
            _check_sumsq("sumsq_out", sumsq_out, ids.shape[0], None, ids.device)
        if ids.device.type == "cpu" and ids.numel() and not bool(((ids >= 0) & (ids < weight.shape[0])).all()):
            bad = ids[(ids < 0) | (ids >= weight.shape[0])][0].item()
            raise IndexError(f"token id {bad} is out of the embedding's range [0, {weight.shape[0]})")
    M, (V, H) = ids.shape[0], weight.shape
    y = torch.empty(M, H, device=weight.device, dtype=weight.dtype)
    if M == 0:
        return y
    P = sumsq_out.shape[1] if sumsq_out is not None else 1
    W = cdiv(H, P)
    bw = next_power_of_2(W)
    bp = max(1, min(next_power_of_2(P), (256 if is_interpreter() else 8192) // bw))
    s = sumsq_out if sumsq_out is not None else y
    _embedding_kernel[(M,)](ids, weight, y, s, V, H, W, P, ids.stride(0), weight.stride(0), y.stride(0),
                            s.stride(0), WRITE_SS=sumsq_out is not None, BP=bp, BW=bw,
                            num_warps=8 if bp * bw >= 4096 else 4, **pdl_kwargs(weight.device))
    return y


def _aot_specs():
    """Compile-only specs at Llama-3.1-8B shapes: every epilogue combination in bf16 at the default tiles (the
    normed products reading 128 partial sums of squares, the residual products writing them, and the older
    row-sum prologue), the largest smem user (norm + SiLU·mul, two weight tiles) at ``BN`` 64 and 16, fp16/fp32
    once, a partial count that is not a power of two (SmolLM2's 18: a masked ``[BM, 32]`` tile); the standalone
    RMSNorm with and without partials; the embedding gather; the folded-norm products (``HAS_NORM`` None)."""
    specs = []
    div = ["N", "K", "stride_xm", "stride_wn", "stride_rm", "stride_ym", "stride_sout_m"]
    # (HAS_NORM (None: NORM_FOLDED), NUM_SS, HAS_BIAS, HAS_RES, SILU_MUL, WRITE_SS)
    flags = [(True, 128, False, False, False, False), (False, 0, True, True, False, True),
             (True, 128, False, False, True, False), (False, 0, False, True, False, True),
             (True, 128, True, False, True, False), (True, 0, False, False, False, False),
             (True, 0, True, False, True, False), (False, 0, False, False, False, False)]
    for dt, prec, cfg, cases in (
            ("bf16", "tf32", LinearConfig(), flags), ("bf16", "tf32", LinearConfig(block_n=64), flags[2:3]),
            ("bf16", "tf32", LinearConfig(block_n=16), flags[2:3]),
            # small models (default_config): a reduction length that is a multiple of 128 (SmolLM2's down; weights
            # prefetched), a small lm_head over such a length and over SmolLM2's 576 (64-wide chunks)
            ("bf16", "tf32", LinearConfig(64, 16, 256, 4, 3, prefetch=1), flags[:5]),
            ("bf16", "tf32", LinearConfig(64, 64, 128, 4, 2, prefetch=2), flags[7:]),
            ("bf16", "tf32", LinearConfig(64, 64, 64, 4, 4), flags[7:]),
            ("fp16", "tf32", LinearConfig(block_n=64), flags[:2]),
            ("fp32", "ieee", LinearConfig(block_m=32, block_n=32, block_k=32, num_stages=3), flags[:2]),
            ("bf16", "tf32", LinearConfig(block_n=64), [(True, 18, True, False, True, False)]),
            # norm_folded (norm=None): the 8B q/k/v and gate/up with 128 partials, SmolLM2's with 36 (padded rows,
            # 64-wide chunks of its 576)
            ("bf16", "tf32", LinearConfig(block_n=64, block_k=256, num_stages=3),
             [(None, 128, False, False, False, False)]),
            ("bf16", "tf32", LinearConfig(block_n=64, block_k=128), [(None, 128, True, False, True, False)]),
            ("bf16", "tf32", LinearConfig(64, 16, 64, 4, 6),
             [(None, 36, False, False, False, False), (None, 36, False, False, True, False)]),
            # weight chunks asked of L2 before the PDL wait: the 8B folded q/k/v, gate/up (two tiles, rotated chunk
            # order, as default_config gives it) and down
            ("bf16", "tf32", LinearConfig(block_n=64, block_k=256, num_stages=3, l2_prefetch=2),
             [(None, 128, False, False, False, False)]),
            ("bf16", "tf32", LinearConfig(block_n=64, block_k=128, l2_prefetch=2, rotate=True),
             [(None, 128, False, False, True, False)]),
            ("bf16", "tf32", LinearConfig(block_n=32, block_k=256, l2_prefetch=1), flags[3:4])):
        for norm, nss, bias, res, silu, wss in cases:
            folded, norm = norm is None, bool(norm)
            sig = {n: "i32" for n in _bi_linear_kernel.arg_names}
            sig.update({p: f"*{dt}" for p in ("x_ptr", "w_ptr", "b_ptr", "nw_ptr", "r_ptr", "y_ptr")})
            sig.update({"sin_ptr": "*fp32", "sout_ptr": "*fp32", "key_ptr": "*i64", "eps": "fp32"})
            const = dict(HAS_NORM=norm, NUM_SS=nss, NSS_P2=next_power_of_2(max(nss, 1)), HAS_BIAS=bias,
                         HAS_RES=res, SILU_MUL=silu, WRITE_SS=wss, BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k,
                         PRECISION=prec, PRE=cfg.prefetch, PDL=dt == "bf16", NORM_FOLDED=folded,
                         L2_PRE=cfg.l2_prefetch, ROTATE=cfg.rotate)
            sig.update({k: "constexpr" for k in const})
            # the partials' row stride: their count (a multiple of 16 at 8B, not at SmolLM2's 18), or padded to 16
            row_div = ["stride_sin_m"] if nss % 16 == 0 or folded else []
            specs.append((_bi_linear_kernel, sig, const,
                          {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "div16": div + row_div,
                           "launch_pdl": dt == "bf16"}))
    # the 8B lm_head of a greedy step: argmax keys only (no logits stored), its default tiles
    lm = default_config(128256, 4096, "cuda")
    sig = {n: "i32" for n in _bi_linear_kernel.arg_names}
    sig.update({p: "*bf16" for p in ("x_ptr", "w_ptr", "b_ptr", "nw_ptr", "r_ptr", "y_ptr")})
    sig.update({"sin_ptr": "*fp32", "sout_ptr": "*fp32", "key_ptr": "*i64", "eps": "fp32"})
    const = dict(HAS_NORM=False, NUM_SS=0, NSS_P2=1, HAS_BIAS=False, HAS_RES=False, SILU_MUL=False, WRITE_SS=False,
                 BM=lm.block_m, BN=lm.block_n, BK=lm.block_k, PRECISION="tf32", PRE=lm.prefetch, PDL=True,
                 NORM_FOLDED=False, L2_PRE=lm.l2_prefetch, ROTATE=lm.rotate, ARGMAX=True, STORE_Y=False)
    sig.update({k: "constexpr" for k in const})
    specs.append((_bi_linear_kernel, sig, const, {"num_warps": lm.num_warps, "num_stages": lm.num_stages,
                                                  "div16": div, "launch_pdl": True}))
    for dt, nss, reset in (("bf16", 0, False), ("bf16", 128, True), ("fp32", 0, False), ("fp32", 18, True)):
        sig = {n: "i32" for n in _rms_norm_kernel.arg_names}
        sig.update({"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "s_ptr": "*fp32", "key_ptr": "*i64",
                    "eps": "fp32", "BK": "constexpr", "NUM_SS": "constexpr", "NSS_P2": "constexpr",
                    "PDL": "constexpr", "RESET_KEY": "constexpr"})
        row_div = ["stride_s_m"] if nss % 16 == 0 else []
        pdl = dt == "bf16"
        specs.append((_rms_norm_kernel, sig, {"BK": 4096, "NUM_SS": nss, "NSS_P2": next_power_of_2(max(nss, 1)),
                                              "PDL": pdl, "RESET_KEY": reset},
                      {"num_warps": 8, "div16": ["K", "stride_xm", "stride_ym"] + row_div, "launch_pdl": pdl}))
    for dt, wss in (("bf16", True), ("fp32", False)):
        sig = {n: "i32" for n in _embedding_kernel.arg_names}
        sig.update({"ids_ptr": "*i64", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "s_ptr": "*fp32",
                    "WRITE_SS": "constexpr", "BP": "constexpr", "BW": "constexpr", "PDL": "constexpr"})
        specs.append((_embedding_kernel, sig, {"WRITE_SS": wss, "BP": 128, "BW": 32, "PDL": wss},
                      {"num_warps": 8, "div16": ["H", "W", "stride_wv", "stride_ym", "stride_s_m"],
                       "launch_pdl": wss}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
