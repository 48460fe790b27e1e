"""Launcher of the batch-invariant target attention (see :mod:`.kernel` for the reduction structure).

Validation raises ``ValueError``/``TypeError`` naming the argument. The one check that needs device values (lengths
against the cache capacity) runs on the host only when ``validate=True`` and no CUDA graph is being captured;
otherwise the kernels clamp lengths so that no access leaves its buffer (out-of-range lengths then give unspecified
but memory-safe results). Launch parameters depend on static shapes only, so a captured graph replays for any
lengths, and the query count ``S`` is not specialised on, so new prompt lengths do not compile new kernels.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .._utils import (
    cdiv,
    check_attention_cache,
    check_tensor,
    is_capturing,
    is_interpreter,
    next_power_of_2,
    num_sms,
    pdl_kwargs,
)
from .kernel import LOG2E, _ancestors_kernel, _combine_kernel, _shared_kernel, _tree_kernel

__all__ = ["target_attention", "tree_ancestors", "TargetAttentionConfig", "target_attention_config", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)
_MASKS = (torch.bool, *_FLOATS)  # a float mask's cells > 0.5 are true (the drafters' float trees, read as they are)


@dataclass(frozen=True)
class TargetAttentionConfig:
    """Tile constants. They fix the reduction order, so they depend on the device class, dtype and head shape only
    (never on lengths or row counts): a decode and a verify of the same model always use the same config.

    ``block_m`` query rows per tile (``block_m // group`` tokens of one KV head; at least ``group``), ``block_n``
    keys per block, ``split_blocks`` blocks per split (splits start at multiples of ``block_n * split_blocks``
    positions). ``num_stages`` pipelines the shared
    kernel's key blocks; ``tree_stages`` the tree kernel's, which runs one or two blocks per program: without
    pipeline buffers it needs 48 KiB of shared memory instead of 144 KiB at D = 128 (sm_90), so several of its
    programs share an SM. ``tree_tokens``: tokens per tree-kernel program (each with its own key gather, one after
    the other; capped at ``block_m // group``) when a verify with heads of 128 has more (token, KV head) pairs than
    two programs per SM can hold, else 1 (an explicit ``config=`` is used as given). Stages and ``tree_tokens``
    change no result.
    """

    block_m: int
    block_n: int
    split_blocks: int
    num_warps: int
    num_stages: int
    tree_stages: int = 1
    tree_tokens: int = 1

    @property
    def split(self) -> int:
        return self.block_n * self.split_blocks


#: GPU, 16-bit inputs: 64-row tiles (one wgmma M on sm_90), 64-key blocks, splits of 256 positions. Two tree tokens
#: per program once a verify has more than two programs per SM (H100, 60-row verify, 32 layers, in
#: bench/results/session12_2026-11-26/attn_8b_b.json: 8B shape, 480 pairs, 19.5 -> 17.3 us per layer; SmolLM2's 180
#: pairs stay at one token, 10.4 us, against 13.5 with two; more tokens per program are slower: 24.9 us with 4).
#: With the ancestor table (session21_2026-11-27/attn_table_tree_tokens.json, prefix 64): 1 / 2 / 4 tokens take
#: 15.06 / 11.75 / 16.35 us per layer.
GPU_CONFIG = TargetAttentionConfig(block_m=64, block_n=64, split_blocks=4, num_warps=4, num_stages=3, tree_tokens=2)
#: GPU, fp32 inputs (IEEE products on FMA units, 4-byte tiles): half the tiles, the same 256-position splits.
GPU_FP32_CONFIG = TargetAttentionConfig(block_m=32, block_n=32, split_blocks=8, num_warps=4, num_stages=2)
#: Triton interpreter (CPU tests): tiny tiles and splits of 32 positions, so small tests cross several splits; as
#: many tree tokens per program as the tile holds (the interpreter's cost is per program).
INTERPRETER_CONFIG = TargetAttentionConfig(block_m=16, block_n=16, split_blocks=2, num_warps=4, num_stages=1,
                                           tree_tokens=16)


def target_attention_config(dtype: torch.dtype, head_dim: int, group: int) -> TargetAttentionConfig:
    """The config every call with this dtype / head shape uses (``block_m`` raised to cover a GQA group)."""
    if is_interpreter():
        cfg = INTERPRETER_CONFIG
    elif dtype == torch.float32:
        cfg = GPU_FP32_CONFIG
    else:
        cfg = GPU_CONFIG
        if head_dim > 128:  # keep the K/V tiles of a pipelined block within shared memory; same split positions
            cfg = dataclasses.replace(cfg, block_m=64, block_n=32, split_blocks=cfg.split // 32, num_stages=2)
    bm = max(cfg.block_m, next_power_of_2(group))
    return dataclasses.replace(cfg, block_m=bm, tree_tokens=max(1, min(cfg.tree_tokens, bm // group)))


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: true fp32 products (the GPU default would be TF32); 16-bit inputs ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def tree_ancestors(tree_mask: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """The ancestor table of a verify tree, ``[B, S, S]`` int32: ``anc[b, i, d]`` is the ``d``-th true column of
    ``tree_mask[b, i]`` (token ``i``'s ancestors and itself in index order: the tree row at depth ``d`` of its
    path), -1 past its depth. :func:`target_attention` reads it instead of the mask; a forward makes it once and
    passes it to every layer (``tree_ancestors=``). One launch, no host sync.

    tree_mask : Tensor ``[B, S, S]``, bool or float (cells ``> 0.5`` true), any strides.
    """
    if validate:
        check_tensor("tree_mask", tree_mask, ndim=3, dtypes=_MASKS)
        check_tensor("tree_mask", tree_mask, shape=(None, tree_mask.shape[1], tree_mask.shape[1]))
    return _launch_ancestors(tree_mask)


def _launch_ancestors(tree_mask: torch.Tensor) -> torch.Tensor:
    """:func:`tree_ancestors` without the checks (``target_attention`` has checked the mask already)."""
    B, S = tree_mask.shape[0], tree_mask.shape[1]
    anc = torch.empty(B, S, S, device=tree_mask.device, dtype=torch.int32)
    if B * S == 0:
        return anc
    mask_float = tree_mask.is_floating_point()
    mask = tree_mask if mask_float else tree_mask.view(torch.uint8)
    _ancestors_kernel[(B * S,)](mask, anc, S, *mask.stride(), BLOCK_S=max(2, next_power_of_2(S)),
                                MASK_FLOAT=mask_float, num_warps=4, **pdl_kwargs(tree_mask.device))
    return anc


def _check(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, cache_slots, ancestors):
    slotted = cache_slots is not None
    B, Hq, Hkv, D = check_attention_cache(q, k_cache, v_cache, _FLOATS, any_cache_batch=slotted)
    dev, S = q.device, q.shape[1]
    if slotted:
        check_tensor("cache_slots", cache_slots, shape=(B,), dtypes=(torch.int32,), device=dev)
        if k_cache.shape[0] < 1:
            raise ValueError("k_cache must hold at least one slot (NB >= 1) with cache_slots")
    check_tensor("cache_seqlens", cache_seqlens, shape=(k_cache.shape[0],), dtypes=_INTS, device=dev)
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask, shape=(B, S, S), dtypes=_MASKS, device=dev)
    if ancestors is not None:
        if tree_mask is None:
            raise ValueError("tree_ancestors is the table of a tree_mask: pass the mask too")
        check_tensor("tree_ancestors", ancestors, shape=(B, S, S), dtypes=(torch.int32,), device=dev)
        if not ancestors.is_contiguous():
            raise ValueError("tree_ancestors must be contiguous (as tree_ancestors() makes it)")
    if S < 1:
        raise ValueError("q must hold at least one query row (S >= 1)")
    if S > k_cache.shape[1]:
        raise ValueError(f"{S} new rows do not fit a cache of capacity Lmax={k_cache.shape[1]}")
    if softmax_scale is not None and not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return B, S, Hq, Hkv, D


def target_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    validate: bool = True,
    cache_slots: torch.Tensor | None = None,
    config: TargetAttentionConfig | None = None,
    max_seqlen: int | None = None,
    tree_ancestors: torch.Tensor | None = None,
    tree_ancestors_early: bool = False,
) -> torch.Tensor:
    """Batch-invariant attention of ``S`` new rows over a KV cache: decode, prefill chunks and tree verification.

    Same contract as :func:`~eagle_triton.ops.attention.tree_attention`: the new rows' K/V already sit in the cache
    at rows ``cache_seqlens[b] + j``; query ``i`` sees the committed rows ``[0, L_b)`` and new row ``j`` iff
    ``tree_mask[b, i, j]`` (its ancestors and itself, tree rows in topological order), or ``j <= i`` when
    ``tree_mask`` is None (causal: decode ``S = 1``, prefill chunks).

    **Bitwise batch invariance.** A row's output is bit-identical whatever ``S`` is and whichever rows run with it,
    and whether its ancestors are tree rows (verify) or committed rows at ``L, L + 1, ...`` (the plain decode of
    the same token after its path was committed): keys are reduced by absolute position in blocks and splits at
    fixed positions with the same tiles in every case (see :mod:`eagle_triton.ops.target_attention.kernel`).

    Parameters
    ----------
    q : Tensor ``[B, S, Hq, D]``, fp16/bf16/fp32, ``D <= 256``.
    k_cache, v_cache : Tensor ``[B, Lmax, Hkv, D]``, dtype of ``q``; ``Hq % Hkv == 0``. With ``cache_slots``: the
        whole cache ``[NB, Lmax, Hkv, D]``.
    cache_seqlens : Tensor ``[B]`` (``[NB]`` with ``cache_slots``) int32/int64: committed length ``L_b`` of each
        cache index; ``L_b + S <= Lmax``.
    tree_mask : Tensor ``[B, S, S]`` bool, or None for causal. A float tensor (fp16/bf16/fp32, any strides: e.g.
        ``tree.tree_mask[:, 0]`` of a drafter's ``[B, 1, S, S]`` float ancestor mask) is read as it is, its cells
        ``> 0.5`` true: the same rows as ``tree_mask > 0.5``, without a conversion launch.
    softmax_scale : float > 0, default ``1 / sqrt(D)``.
    validate : bool. Check the lengths (and slots) on the host (a device sync) when no CUDA graph is being captured.
    cache_slots : Tensor ``[B]`` int32 or None: query sequence ``b`` reads the keys and the length of cache batch
        index ``cache_slots[b]`` (in ``[0, NB)``; read on the device, so one captured graph serves every slot; an
        unchecked out-of-range slot is clamped). None: index ``b``. ``q`` and the output stay indexed by ``b``.
    config : tile constants, default :func:`target_attention_config` (tests and probes pass others; rows are
        bit-identical only among calls with the same ``block_*``/``split_blocks``).
    max_seqlen : int or None. An upper bound, known to the caller, on every row's key count (``L_b + S``): the
        launch then covers only the splits that can hold keys, and a bound within one split (``config.split``)
        leaves out the launch that merges splits (causal: the combine; tree: the shared kernel, whose one split
        the tree kernel runs itself). The same bits as without it; a bound below the real lengths is an error when
        ``validate`` checks them, and wrong rows when it does not (lengths live on the device).
    tree_ancestors : Tensor ``[B, S, S]`` int32 or None: :func:`tree_ancestors` of ``tree_mask``, made once by a
        caller that runs several attentions over one tree (a forward's layers); the kernel reads it instead of the
        mask. None: made here (one more launch). A table of another mask gives that mask's rows; entries past
        ``S - 1`` are clamped, so even a corrupt table reads only the cache's new rows.
    tree_ancestors_early : the table was made before the kernel launched just before this call (a forward makes it
        before its first layer): with programmatic dependent launch the tree kernel then reads it while that kernel
        finishes. False (the safe default): read after waiting for it.

    Returns
    -------
    out : Tensor ``[B, S, Hq, D]``, dtype of ``q``. A row with no visible key gets zeros.
    """
    B, S, Hq, Hkv, D = _check(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, cache_slots,
                              tree_ancestors)
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)
                                   or max_seqlen < S):
        raise ValueError(f"max_seqlen must be an int >= S={S} (an upper bound on L_b + S), got {max_seqlen!r}")
    dev = q.device
    NB, Lmax = k_cache.shape[0], k_cache.shape[1]
    slotted = cache_slots is not None
    if validate and not is_capturing(dev) and B > 0:
        lens, stats = cache_seqlens, []
        if slotted:  # the lengths the queries use; clamped (as the kernels do) so the gather itself stays in range
            lens = cache_seqlens[cache_slots.clamp(0, NB - 1).long()]
            stats = [cache_slots.min().long(), cache_slots.max().long()]
        lo, hi, *slot_lh = torch.stack([lens.min().long(), lens.max().long(), *stats]).tolist()
        if slot_lh and (slot_lh[0] < 0 or slot_lh[1] >= NB):
            raise ValueError(f"cache_slots in [{slot_lh[0]}, {slot_lh[1]}] outside the cache's batch range "
                             f"[0, NB={NB})")
        if lo < 0 or hi + S > Lmax:
            raise ValueError(f"cache_seqlens in [{lo}, {hi}] plus {S} new rows exceeds the cache capacity Lmax={Lmax}")
        if max_seqlen is not None and hi + S > max_seqlen:
            raise ValueError(f"cache_seqlens up to {hi} plus {S} new rows exceeds max_seqlen={max_seqlen}")
    out = torch.empty_like(q)
    if B == 0 or Hq == 0:
        return out
    G = Hq // Hkv
    cfg = config or target_attention_config(q.dtype, D, G)
    if cfg.block_m < G or cfg.block_m // G < cfg.tree_tokens:
        raise ValueError(f"config.block_m={cfg.block_m} must hold a GQA group of {G} query heads per token, "
                         f"tree_tokens={cfg.tree_tokens} of them")
    block_d = max(16, next_power_of_2(D))
    nsplit = cdiv(Lmax, cfg.split)  # the partial buffers' layout: every split the cache can hold
    live = nsplit if max_seqlen is None else min(nsplit, cdiv(max_seqlen, cfg.split))  # splits that can hold keys
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    qk_scale = scale * LOG2E
    acc_part = torch.empty(B * S * Hq * nsplit * block_d, device=dev, dtype=torch.float32)
    ml_part = torch.empty(B * S * Hq * nsplit * 2, device=dev, dtype=torch.float32)
    causal = tree_mask is None
    pdl = pdl_kwargs(dev)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False, **pdl)
    common = dict(HEAD_DIM=D, GROUP=G, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d,
                  SPLIT_BLOCKS=cfg.split_blocks, PRECISION=_precision(q.dtype), HAS_SLOTS=slotted)

    # Which program runs which split does not change any result: spread the splits to fill the GPU.
    tiles = cdiv(S, cfg.block_m // G)
    z = max(1, min(live, cdiv(4 * num_sms(dev), tiles * B * Hkv)))
    slots = cache_slots if slotted else cache_seqlens  # an unread stand-in without slots
    # A verify within one split: the tree kernel runs that split from its start, the shared kernel has nothing to do.
    skip_shared = not causal and live == 1
    skip_combine = causal and live == 1  # every row finishes in place (single-split rows, see the kernel module)
    if not skip_shared:
        _shared_kernel[(tiles, B * Hkv, z)](
            q, k_cache, v_cache, cache_seqlens, slots, acc_part, ml_part, out,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            S, Hq, Lmax, nsplit, qk_scale, NB, CAUSAL=causal, **common, **opts,
        )
    if not causal:
        anc_early = tree_ancestors is not None and bool(tree_ancestors_early)  # our own table: the kernel before
        anc = tree_ancestors if tree_ancestors is not None else _launch_ancestors(tree_mask)
        block_s = max(2, next_power_of_2(S))
        # measured gain at heads of 128 only (see GPU_CONFIG); SmolLM2's 64-wide heads fit more programs per SM
        tt = cfg.tree_tokens if config is not None or (D >= 128 and B * S * Hkv > 2 * num_sms(dev)) else 1
        tt = min(tt, S)  # a program's token loop is unrolled: no iterations for tokens past the tree
        _tree_kernel[(cdiv(S, tt), B * Hkv)](
            q, k_cache, v_cache, cache_seqlens, slots, anc, acc_part, ml_part, out,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            S, Hq, Lmax, nsplit, qk_scale, NB, BLOCK_S=block_s, TT=tt, TTP=next_power_of_2(tt), ANC_EARLY=anc_early,
            **common,
            **dict(opts, num_stages=cfg.tree_stages),
        )
    elif not skip_combine:  # causal rows of several splits (a context longer than one split): merged here
        # heads per program: all of them in the interpreter (every program costs), 4 on the GPU
        block_h = min(16, next_power_of_2(Hq)) if is_interpreter() else min(4, next_power_of_2(Hq))
        _combine_kernel[(B * S, cdiv(Hq, block_h))](
            cache_seqlens, slots, acc_part, ml_part, out,
            out.stride(0), out.stride(1), out.stride(2),
            S, Hq, Lmax, nsplit, qk_scale, NB,
            HEAD_DIM=D, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=cfg.block_n, SPLIT_BLOCKS=cfg.split_blocks,
            HAS_SLOTS=slotted, num_warps=max(1, block_h * block_d // 128), enable_fp_fusion=False, **pdl,
        )
    return out


# Integer arguments that are multiples of 16 at real shapes (the JIT specialises them so; the AOT gate must be
# told, or it compiles scalar loads that the GPU never runs). S and NSPLIT are not.
_NOT_DIV16 = {"S", "NSPLIT"}


def _div16(fn) -> list[str]:
    return [n for n in fn.arg_names if (n.startswith("stride_") or n in ("Hq", "Lmax")) and n not in _NOT_DIV16]


def _aot_specs():
    """Compile-only specs at the Llama-3.1-8B shape (D=128, 32/8 heads) for tests/test_compile_targets.py; bf16 also
    with cache slots (the one-graph prefill)."""
    specs = []
    for dt, slots in (("bf16", False), ("fp16", False), ("fp32", False), ("bf16", True)):
        cfg = GPU_FP32_CONFIG if dt == "fp32" else GPU_CONFIG
        prec = "ieee" if dt == "fp32" else "tf32"
        pdl = dt == "bf16"  # the launch the GPU runs (programmatic dependent launch on sm_90)
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "enable_fp_fusion": False,
                "launch_pdl": pdl}
        common = dict(HEAD_DIM=128, GROUP=4, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=128,
                      SPLIT_BLOCKS=cfg.split_blocks, PRECISION=prec, HAS_SLOTS=slots, PDL=pdl)
        ptrs = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "seqlens_ptr": "*i32", "slots_ptr": "*i32",
                "acc_ptr": "*fp32", "ml_ptr": "*fp32", "o_ptr": f"*{dt}", "qk_scale": "fp32"}
        for causal in ((True, False) if dt == "bf16" else (False,)):
            sig = {n: "i32" for n in _shared_kernel.arg_names}
            const = dict(common, CAUSAL=causal)
            sig.update(ptrs)
            sig.update({k: "constexpr" for k in const})
            specs.append((_shared_kernel, sig, const, {**opts, "div16": _div16(_shared_kernel)}))
        sig = {n: "i32" for n in _tree_kernel.arg_names}
        const = dict(common, BLOCK_S=64, TT=cfg.tree_tokens, TTP=next_power_of_2(cfg.tree_tokens), ANC_EARLY=True)
        sig.update(ptrs)
        sig["anc_ptr"] = "*i32"
        sig.update({k: "constexpr" for k in const})
        specs.append((_tree_kernel, sig, const, {**opts, "num_stages": cfg.tree_stages, "div16": _div16(_tree_kernel)}))
        sig = {n: "i32" for n in _combine_kernel.arg_names}
        sig.update({"seqlens_ptr": "*i32", "slots_ptr": "*i32", "acc_ptr": "*fp32", "ml_ptr": "*fp32",
                    "o_ptr": f"*{dt}", "qk_scale": "fp32"})
        const = dict(HEAD_DIM=128, BLOCK_H=4, BLOCK_D=128, BLOCK_N=cfg.block_n, SPLIT_BLOCKS=cfg.split_blocks,
                     HAS_SLOTS=slots, PDL=pdl)
        sig.update({k: "constexpr" for k in const})
        specs.append((_combine_kernel, sig, const,
                      {"num_warps": 4, "enable_fp_fusion": False, "launch_pdl": pdl, "div16": _div16(_combine_kernel)}))
    # the ancestor table of a bool mask's bytes and of the drafters' fp32 mask read as it is (the engine's verify)
    for mask_dt in ("u8", "fp32"):
        sig = {n: "i32" for n in _ancestors_kernel.arg_names}
        const = dict(BLOCK_S=64, MASK_FLOAT=mask_dt != "u8", PDL=True)
        sig.update({"mask_ptr": f"*{mask_dt}", "anc_ptr": "*i32"})
        sig.update({k: "constexpr" for k in const})
        specs.append((_ancestors_kernel, sig, const, {"num_warps": 4, "launch_pdl": True, "div16": []}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
