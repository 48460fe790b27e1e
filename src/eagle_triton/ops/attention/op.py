"""Launchers for tree verification attention and frontier draft attention.

Validation raises ``ValueError``/``TypeError`` naming the argument. Checks that need device values (lengths against
capacities) run on the host only when no CUDA graph is being captured and ``validate=True``; inside a capture, the
kernels clamp indices so no access leaves its buffer, and out-of-range inputs give unspecified (but memory-safe)
results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._utils import cdiv, check_attention_cache, check_tensor, is_capturing, is_interpreter, next_power_of_2, num_sms
from .kernel import LOG2E, _attn_combine_kernel, _draft_attn_fwd_kernel, _tree_attn_fwd_kernel

__all__ = ["tree_attention", "draft_tree_attention", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)


@dataclass(frozen=True)
class _AttnConfig:
    block_m: int
    block_n: int
    block_d: int
    num_splits: int
    num_warps: int
    num_stages: int


def _attn_config(rows: int, lmax: int, n_bh: int, head_dim: int, device: torch.device,
                 num_splits: int | None, draft: bool = False, fp32: bool = False) -> _AttnConfig:
    """Tile sizes and split count from static shapes only (so a captured graph never changes config).

    ``rows`` = queries x group heads per KV head. Splits aim at ~2 programs per SM, each split keeping at least
    256 cache rows (fewer rows make the partial traffic comparable to the KV traffic). Warps: the sm_90 resource
    report (tests/test_compile_targets.py builds these configs) shows no spills with 4 warps for the verify kernel
    (254 registers) but spills for the draft kernel, whose RoPE prologue holds four fp32 [64, 128] tiles; 8 warps
    remove them (234 registers).
    """
    block_d = max(16, next_power_of_2(head_dim))
    if is_interpreter():
        block_m = min(32, max(16, next_power_of_2(rows)))
        block_n = 16
        warps, stages = 4, 1
        min_rows_per_split = 32
    else:
        block_m = min(64, max(16, next_power_of_2(rows)))
        block_n = 64 if block_d <= 128 else 32
        warps = 8 if draft and block_d >= 128 else 4
        stages = 3 if block_d <= 128 else 2
        if fp32:  # IEEE fp32 dots run on FMA units and hold 4-byte tiles: halve the tiles (correctness path)
            block_m, block_n, stages = min(block_m, 32), 32, 2
        min_rows_per_split = 256
    if num_splits is None:
        base = cdiv(rows, block_m) * n_bh
        want = cdiv(2 * num_sms(device), base)
        num_splits = max(1, min(want, lmax // min_rows_per_split, 64))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return _AttnConfig(block_m, block_n, block_d, int(num_splits), warps, stages)


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: true fp32 products (the GPU default would be TF32); 16-bit inputs ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def _combine(o_part, lse_part, out, Tq, Hq, head_dim, cfg):
    n_rows = lse_part.shape[0]
    block_r = 4
    _attn_combine_kernel[(cdiv(n_rows, block_r),)](
        o_part, lse_part, out, n_rows, Tq, Hq, out.stride(0), out.stride(1), out.stride(2),
        HEAD_DIM=head_dim, NUM_SPLITS=cfg.num_splits, BLOCK_S=max(2, next_power_of_2(cfg.num_splits)),
        BLOCK_D=cfg.block_d, BLOCK_R=block_r, num_warps=4,
    )




def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    *,
    num_splits: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Attention of ``Tq`` new (tree) tokens over a KV cache prefix plus their own keys under a tree mask.

    The new tokens' K/V must already sit in the cache at rows ``cache_seqlens[b] + j`` (see
    :func:`~eagle_triton.ops.kv_cache.append_kv_cache`). Query ``i`` sees the whole prefix ``[0, L_b)`` and tree
    token ``j`` iff ``tree_mask[b, i, j]``; with ``tree_mask=None`` it sees ``j <= i`` (causal: prefill, and
    ``Tq = 1`` decode). GQA, online softmax in fp32, split over the cache for parallelism.

    Parameters
    ----------
    q : Tensor ``[B, Tq, Hq, D]``, fp16/bf16/fp32.
    k_cache, v_cache : Tensor ``[B, Lmax, Hkv, D]`` (flash-attn layout), dtype of ``q``; ``Hq % Hkv == 0``.
    cache_seqlens : Tensor ``[B]`` int32 (int64 accepted): committed prefix length per sequence.
    tree_mask : Tensor ``[B, Tq, Tq]`` bool, or None for causal.
    softmax_scale : float, default ``1 / sqrt(D)``.
    num_splits : int, optional. Splits of the key axis (default: from static shapes and the SM count).
    validate : bool. Check ``cache_seqlens[b] + Tq <= Lmax`` on the host (a device sync) when not capturing.

    Returns
    -------
    out : Tensor ``[B, Tq, Hq, D]``, dtype of ``q``. A query with no visible key gets zeros.
    """
    B, Hq, Hkv, D = check_attention_cache(q, k_cache, v_cache, _FLOATS)
    dev = q.device
    Tq, Lmax = q.shape[1], k_cache.shape[1]
    check_tensor("cache_seqlens", cache_seqlens, shape=(B,), dtypes=_INTS, device=dev)
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask, shape=(B, Tq, Tq), dtypes=(torch.bool,), device=dev)
    if Tq < 1:
        raise ValueError("q must hold at least one query (Tq >= 1)")
    if Tq > Lmax:
        raise ValueError(f"{Tq} new tokens do not fit a cache of capacity {Lmax}")
    if validate and not is_capturing(dev):
        top = int(cache_seqlens.max()) if B > 0 else 0
        low = int(cache_seqlens.min()) if B > 0 else 0
        if low < 0 or top + Tq > Lmax:
            raise ValueError(
                f"cache_seqlens in [{low}, {top}] plus {Tq} tree tokens exceeds the cache capacity Lmax={Lmax}")
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    cfg = _attn_config(Tq * G, Lmax, B * Hkv, D, dev, num_splits, fp32=q.dtype == torch.float32)
    out = torch.empty_like(q)
    if B == 0:
        return out
    if cfg.num_splits > 1:
        o_part = torch.empty(B * Tq * Hq * cfg.num_splits * cfg.block_d, device=dev, dtype=torch.float32)
        lse_part = torch.empty(B * Tq * Hq, cfg.num_splits, device=dev, dtype=torch.float32)
    else:
        o_part = lse_part = out  # unused
    mask = tree_mask.view(torch.uint8) if tree_mask is not None else cache_seqlens
    ms = tree_mask.stride() if tree_mask is not None else (0, 0, 0)
    grid = (cdiv(Tq * G, cfg.block_m), B * Hkv, cfg.num_splits)
    _tree_attn_fwd_kernel[grid](
        q, k_cache, v_cache, cache_seqlens, mask, out, o_part, lse_part,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ms[0], ms[1], ms[2],
        out.stride(0), out.stride(1), out.stride(2),
        Tq, Hq, Lmax, scale * LOG2E,
        HEAD_DIM=D, GROUP=G, HAS_MASK=tree_mask is not None, NUM_SPLITS=cfg.num_splits,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_T=min(cfg.block_n, 32), BLOCK_D=cfg.block_d,
        PRECISION=_precision(q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.num_splits > 1:
        _combine(o_part, lse_part, out, Tq, Hq, D, cfg)
    return out


def draft_tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: torch.Tensor,
    anc_k: torch.Tensor,
    anc_v: torch.Tensor,
    anc_len: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    softmax_scale: float | None = None,
    *,
    num_splits: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Single-query attention of each frontier node over the prefix and its ancestors, RoPE in the kernel.

    **Experimental: no production caller.** The drafters do not use it: the fused drafter attends inside its
    persistent kernel, and the reference and multi-kernel drafters keep SafeAILab's dense draft-KV layout. It is kept,
    tested against :func:`draft_tree_attention_ref` and in the sm_90 compile gate, as the building block of a
    multi-kernel drafter with packed ancestor rows; its contract may change when one adopts it.

    **Packed ancestor layout.** Node ``n`` of sequence ``b`` owns the row ``anc_k[b, n]`` (``[A, Hkv, D]``, same for
    ``anc_v``): slots ``[0, anc_len[b, n])`` hold its ancestors' rotated keys in root-to-parent order, and the
    kernel writes the node's own rotated key (``rope(k_new[b, n])``) and ``v_new[b, n]`` into slot
    ``anc_len[b, n]``. Every slot ``< anc_len`` is visible and nothing else in the row is, so no mask tensor
    exists. To step to the next tree level, gather the parents' rows into a *new* buffer
    (``anc_k_next = anc_k[:, parent]``, ``anc_len_next = anc_len[:, parent] + 1``): a child's ancestors are its
    parent's ancestors plus the parent. Gathering in place would overwrite rows other children still read.

    This is what the reference drafter's dense masked attention computes at one draft level (see
    :class:`eagle_triton.heads.layers.Attention` with ``build_attention_mask``): the ``K`` frontier rows see the
    draft-KV prefix, their ancestors at earlier levels and themselves.

    Parameters
    ----------
    q : Tensor ``[B, N, Hq, D]`` (before RoPE), fp16/bf16/fp32; ``D`` even.
    k_cache, v_cache : Tensor ``[B, Lmax, Hkv, D]``: the prefix (rotated keys), rows ``[0, prefix_len[b])``.
    prefix_len : Tensor ``[B]`` int32/int64.
    anc_k, anc_v : Tensor ``[B, N, A, Hkv, D]``, dtype of ``q``; ``anc_len[b, n] < A`` (room for the node).
    anc_len : Tensor ``[B, N]`` int32/int64: number of ancestors (the tree level, 0 for the first draft level).
    cos, sin : Tensor ``[P, D]`` float (the head's ``cos_cached``/``sin_cached``), half-rotation layout.
    position_ids : Tensor ``[B, N]`` int32/int64, ``< P``: RoPE positions of the nodes.
    k_new, v_new : Tensor ``[B, N, Hkv, D]``: the nodes' own key (before RoPE) and value.
    softmax_scale : float, default ``1 / sqrt(D)``.
    num_splits, validate : as in :func:`tree_attention` (validation checks ``prefix_len``, ``anc_len`` and
        ``position_ids`` ranges).

    Returns
    -------
    out : Tensor ``[B, N, Hq, D]``, dtype of ``q``. Side effect: slot ``anc_len[b, n]`` of ``anc_k``/``anc_v``.
    """
    B, Hq, Hkv, D = check_attention_cache(q, k_cache, v_cache, _FLOATS)
    dev = q.device
    N, Lmax = q.shape[1], k_cache.shape[1]
    if D % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {D}")
    check_tensor("prefix_len", prefix_len, shape=(B,), dtypes=_INTS, device=dev)
    check_tensor("anc_k", anc_k, ndim=5, dtypes=(q.dtype,), device=dev, last_dim_contiguous=True)
    A = anc_k.shape[2]
    check_tensor("anc_k", anc_k, shape=(B, N, A, Hkv, D))
    check_tensor("anc_v", anc_v, shape=(B, N, A, Hkv, D), dtypes=(q.dtype,), device=dev, last_dim_contiguous=True)
    check_tensor("anc_len", anc_len, shape=(B, N), dtypes=_INTS, device=dev)
    check_tensor("cos", cos, ndim=2, dtypes=_FLOATS, device=dev, last_dim_contiguous=True)
    check_tensor("sin", sin, shape=tuple(cos.shape), dtypes=_FLOATS, device=dev, last_dim_contiguous=True)
    if cos.shape[1] != D or cos.stride() != sin.stride():
        raise ValueError(f"cos/sin must be [P, D={D}] with equal strides, got {list(cos.shape)}")
    check_tensor("position_ids", position_ids, shape=(B, N), dtypes=_INTS, device=dev)
    check_tensor("k_new", k_new, shape=(B, N, Hkv, D), dtypes=(q.dtype,), device=dev, last_dim_contiguous=True)
    check_tensor("v_new", v_new, shape=(B, N, Hkv, D), dtypes=(q.dtype,), device=dev, last_dim_contiguous=True)
    if A < 1:
        raise ValueError("anc_k needs at least one slot (for the node itself)")
    if validate and not is_capturing(dev) and B * N > 0:
        lo = torch.stack([prefix_len.min().long(), anc_len.min().long(), position_ids.min().long()])
        hi = torch.stack([prefix_len.max().long(), anc_len.max().long(), position_ids.max().long()])
        lo, hi = lo.tolist(), hi.tolist()
        if lo[0] < 0 or hi[0] > Lmax:
            raise ValueError(f"prefix_len in [{lo[0]}, {hi[0]}] exceeds the cache capacity Lmax={Lmax}")
        if lo[1] < 0 or hi[1] >= A:
            raise ValueError(f"anc_len in [{lo[1]}, {hi[1]}] leaves no slot for the node in anc_k (A={A})")
        if lo[2] < 0 or hi[2] >= cos.shape[0]:
            raise ValueError(f"position_ids in [{lo[2]}, {hi[2]}] outside the RoPE tables (P={cos.shape[0]})")
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    cfg = _attn_config(N * G, Lmax, B * Hkv, D, dev, num_splits, draft=True, fp32=q.dtype == torch.float32)
    out = torch.empty_like(q)
    if B * N == 0:
        return out
    if cfg.num_splits > 1:
        o_part = torch.empty(B * N * Hq * cfg.num_splits * cfg.block_d, device=dev, dtype=torch.float32)
        lse_part = torch.empty(B * N * Hq, cfg.num_splits, device=dev, dtype=torch.float32)
    else:
        o_part = lse_part = out
    grid = (cdiv(N * G, cfg.block_m), B * Hkv, cfg.num_splits)
    _draft_attn_fwd_kernel[grid](
        q, k_cache, v_cache, prefix_len, anc_k, anc_v, anc_len, cos, sin, position_ids, k_new, v_new,
        out, o_part, lse_part,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        anc_k.stride(0), anc_k.stride(1), anc_k.stride(2), anc_k.stride(3),
        anc_v.stride(0), anc_v.stride(1), anc_v.stride(2), anc_v.stride(3),
        anc_len.stride(0), anc_len.stride(1), position_ids.stride(0), position_ids.stride(1), cos.stride(0),
        k_new.stride(0), k_new.stride(1), k_new.stride(2),
        v_new.stride(0), v_new.stride(1), v_new.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        N, Hq, A, Lmax, cos.shape[0], scale * LOG2E,
        HEAD_DIM=D, GROUP=G, NUM_SPLITS=cfg.num_splits,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d, PRECISION=_precision(q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.num_splits > 1:
        _combine(o_part, lse_part, out, N, Hq, D, cfg)
    return out


# Integer arguments that are multiples of 16 at real shapes (the JIT specialises them so; the AOT gate must be
# told, or it compiles scalar loads that the GPU never runs).
_NOT_DIV16 = {"stride_mi", "stride_mj", "stride_ln", "stride_pn", "stride_lb", "stride_pb", "Tq", "N", "A", "P",
              "n_rows"}


def _div16(fn) -> list[str]:
    return [n for n in fn.arg_names if (n.startswith("stride_") or n in ("Hq", "Lmax")) and n not in _NOT_DIV16]


def _aot_specs():
    """Compile-only specs at the Llama-3.1-8B shapes (D=128, 32/8 heads) for tests/test_compile_targets.py.

    bf16 covers every constexpr branch; fp16 and fp32 (IEEE dots) one variant each, to bound compile time.
    """
    specs = []
    variants = [("bf16", s, m) for s in (1, 4) for m in (True, False)] + [("fp16", 4, True), ("fp32", 1, True)]
    for dt, splits, has_mask in variants:
        prec = "ieee" if dt == "fp32" else "tf32"
        sig = {n: "i32" for n in _tree_attn_fwd_kernel.arg_names}
        sig.update({"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "seqlens_ptr": "*i32",
                    "mask_ptr": "*u8", "o_ptr": f"*{dt}", "op_ptr": "*fp32", "lse_ptr": "*fp32", "qk_scale": "fp32"})
        bm, bn, st = (32, 32, 2) if dt == "fp32" else (64, 64, 3)
        const = dict(HEAD_DIM=128, GROUP=4, HAS_MASK=has_mask, NUM_SPLITS=splits, BLOCK_M=bm, BLOCK_N=bn,
                     BLOCK_T=32, BLOCK_D=128, PRECISION=prec)
        sig.update({k: "constexpr" for k in const})
        specs.append((_tree_attn_fwd_kernel, sig, const,
                      {"num_warps": 4, "num_stages": st, "div16": _div16(_tree_attn_fwd_kernel)}))
        if not has_mask:
            continue
        sig = {n: "i32" for n in _draft_attn_fwd_kernel.arg_names}
        sig.update({p: f"*{dt}" for p in ("q_ptr", "k_ptr", "v_ptr", "ak_ptr", "av_ptr", "kn_ptr", "vn_ptr", "o_ptr")})
        sig.update({"prefix_ptr": "*i32", "alen_ptr": "*i32", "pos_ptr": "*i64", "cos_ptr": "*fp32",
                    "sin_ptr": "*fp32", "op_ptr": "*fp32", "lse_ptr": "*fp32", "qk_scale": "fp32"})
        const = dict(HEAD_DIM=128, GROUP=4, NUM_SPLITS=splits, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=128, PRECISION=prec)
        sig.update({k: "constexpr" for k in const})
        specs.append((_draft_attn_fwd_kernel, sig, const,
                      {"num_warps": 8, "num_stages": st, "div16": _div16(_draft_attn_fwd_kernel)}))
    for dt in ("bf16", "fp32"):
        sig = {n: "i32" for n in _attn_combine_kernel.arg_names}
        sig.update({"op_ptr": "*fp32", "lse_ptr": "*fp32", "o_ptr": f"*{dt}"})
        const = dict(HEAD_DIM=128, NUM_SPLITS=4, BLOCK_S=4, BLOCK_D=128, BLOCK_R=4)
        sig.update({k: "constexpr" for k in const})
        specs.append((_attn_combine_kernel, sig, const, {"num_warps": 4, "div16": _div16(_attn_combine_kernel)}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
