"""Launcher for :func:`lm_head_topk`: streaming LM-head top-k log-probabilities (two launches, no logits)."""

from __future__ import annotations

import torch

from .._utils import cdiv, check_tensor, is_interpreter, next_power_of_2, num_sms
from .kernel import _lm_head_topk_merge_kernel, _lm_head_topk_partial_kernel

__all__ = ["lm_head_topk", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _config(M: int, V: int, H: int, kpad: int, dtype: torch.dtype, device, num_splits: int | None):
    if is_interpreter():
        block_m = 16
        block_v = max(32, kpad)
        block_h = 32
        warps, stages = 4, 1
        max_splits = 8
    else:
        # sm_90 resource report: 16 rows x 4 warps uses 168 registers; 32 rows spill (the [M, 128] int64 top-k
        # keys); 64 rows x 8 warps uses 223 registers without spills.
        block_m = 16 if M <= 16 else 64
        block_v = max(128, kpad)
        block_h = 64 if dtype == torch.float32 else 128
        warps, stages = (4 if block_m == 16 else 8), 3
        # One split per SM: enough 16-byte loads in flight to stream the weight, and few partials to merge.
        max_splits = num_sms(device)
    n_tiles = cdiv(V, block_v)
    if num_splits is None:
        num_splits = max(1, min(n_tiles, max_splits))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return block_m, block_v, block_h, int(num_splits), warps, stages


def lm_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    bias: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` log-probabilities of ``hidden @ weight.T (+ bias)`` per row, streaming the weight once.

    **Experimental: no production caller.** The fused drafter selects its top-k inside its own kernel and the
    PyTorch drafters keep the reference's ``log_softmax`` + ``topk`` (which the oracle needs bit for bit). It is
    kept, tested against :func:`lm_head_topk_ref` and in the sm_90 compile gate, for drafters that would stream a
    large draft vocabulary without materialising logits; its contract may change when one adopts it.

    No ``[M, V]`` logits tensor is created: vocabulary tiles are multiplied, folded into a running top-k and a
    running log-sum-exp per program (the vocabulary is split over programs), and a small second kernel merges
    the splits. Accumulation is fp32 (IEEE products for fp32 inputs).

    Parameters
    ----------
    hidden : Tensor ``[M, H]``, fp16/bf16/fp32.
    weight : Tensor ``[V, H]``, dtype of ``hidden``, contiguous rows (``V < 2**32``).
    k : int, ``1 <= k <= min(V, 128)``.
    bias : Tensor ``[V]`` float, optional.
    num_splits : int, optional. Vocabulary splits (default: one per SM, at most one per tile).

    Returns
    -------
    logp : Tensor ``[M, k]`` fp32, descending per row.
    ids : Tensor ``[M, k]`` int64; among equal log-probabilities the lower id comes first.
    """
    check_tensor("hidden", hidden, ndim=2, dtypes=_FLOATS, last_dim_contiguous=True)
    dev = hidden.device
    M, H = hidden.shape
    check_tensor("weight", weight, ndim=2, dtypes=(hidden.dtype,), device=dev, last_dim_contiguous=True)
    V = weight.shape[0]
    if weight.shape[1] != H:
        raise ValueError(f"weight must be [V, H={H}], got {list(weight.shape)}")
    if bias is not None:
        check_tensor("bias", bias, shape=(V,), dtypes=_FLOATS, device=dev, last_dim_contiguous=True)
    k = int(k)
    if not 1 <= k <= min(V, 128):
        raise ValueError(f"k must be in [1, min(V={V}, 128)], got {k}")
    if V >= 2**32:
        raise ValueError(f"vocabulary of {V} does not fit the 32-bit id field of the top-k keys")
    kpad = next_power_of_2(k)
    logp = torch.empty(M, k, device=dev, dtype=torch.float32)
    ids = torch.empty(M, k, device=dev, dtype=torch.int64)
    if M == 0:
        return logp, ids
    block_m, block_v, block_h, splits, warps, stages = _config(M, V, H, kpad, hidden.dtype, dev, num_splits)
    keys = torch.empty(M, splits, kpad, device=dev, dtype=torch.int64)
    m_part = torch.empty(M, splits, device=dev, dtype=torch.float32)
    l_part = torch.empty(M, splits, device=dev, dtype=torch.float32)
    _lm_head_topk_partial_kernel[(cdiv(M, block_m), splits)](
        hidden, weight, bias if bias is not None else hidden, keys, m_part, l_part,
        M, V, H, hidden.stride(0), weight.stride(0),
        HAS_BIAS=bias is not None, NUM_SPLITS=splits, KPAD=kpad,
        BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_H=block_h,
        PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages,
    )
    _lm_head_topk_merge_kernel[(M,)](
        keys, m_part, l_part, logp, ids, k,
        NUM_SPLITS=splits, KPAD=kpad, BLOCK_S=next_power_of_2(splits), num_warps=4,
    )
    return logp, ids


def _aot_specs():
    """Compile-only specs: Llama-3.1-8B head (H=4096), 10 rows, k=10 (KPAD 16), 132 splits."""
    specs = []
    for dt, bm, bh, bias in (("bf16", 16, 128, False), ("bf16", 64, 128, True), ("fp16", 16, 128, False),
                             ("fp32", 16, 64, False)):
        sig = {n: "i32" for n in _lm_head_topk_partial_kernel.arg_names}
        sig.update({"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "bias_ptr": f"*{dt}", "keys_ptr": "*i64",
                    "m_ptr": "*fp32", "l_ptr": "*fp32"})
        const = dict(HAS_BIAS=bias, NUM_SPLITS=132, KPAD=16, BLOCK_M=bm, BLOCK_V=128, BLOCK_H=bh,
                     PRECISION="ieee" if dt == "fp32" else "tf32")
        sig.update({k: "constexpr" for k in const})
        specs.append((_lm_head_topk_partial_kernel, sig, const,
                      {"num_warps": 4 if bm == 16 else 8, "num_stages": 3, "div16": ["H", "stride_xm", "stride_wv"]}))
    sig = {n: "i32" for n in _lm_head_topk_merge_kernel.arg_names}
    sig.update({"keys_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "logp_ptr": "*fp32", "ids_ptr": "*i64"})
    const = dict(NUM_SPLITS=132, KPAD=16, BLOCK_S=256)
    sig.update({k: "constexpr" for k in const})
    specs.append((_lm_head_topk_merge_kernel, sig, const, {"num_warps": 4}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
