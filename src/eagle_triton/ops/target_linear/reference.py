"""PyTorch references (the specification) for :mod:`eagle_triton.ops.target_linear`.

They follow the eager sequence of transformers' Llama-family layers, with the same roundings to the input dtype:
LlamaRMSNorm (normalise in fp32, cast, multiply by the weight), ``F.linear``, ``F.silu(gate) * up``, ``x + y``.
Partial sums of squares (``sumsq``) are summed in fp32 (the kernels' order of that sum is fixed per compiled
kernel but not specified: compare within the dtype's tolerance); the partials written (``sumsq_out``) are the fp32
sums of squares of the stored values over the same column tiles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._utils import cdiv
from .kernel import KEY_EMPTY

__all__ = ["target_linear_ref", "target_rms_norm_ref", "target_embedding_ref", "argmax_keys_ref"]


def _tile_sumsq(y: torch.Tensor, width: int, P: int) -> torch.Tensor:
    """fp32 ``[M, P]``: per row, the sum of squares of ``y`` over column tiles ``[p * width, (p + 1) * width)``."""
    y32 = y.to(torch.float32)
    y32 = F.pad(y32, (0, P * width - y32.shape[-1]))
    return y32.pow(2).view(y.shape[0], P, width).sum(-1)


def argmax_keys_ref(values: torch.Tensor) -> torch.Tensor:
    """The ``argmax_keys`` packing of :func:`~eagle_triton.ops.target_linear.target_linear`: each row's key of
    ``values [M, N]``, its maximum (widened to fp32, -0.0 as +0.0) made monotonic as a signed int32 in the high
    word and ``2^32 - 1 -`` the first column holding it in the low word; the largest key is the argmax."""
    v = values.float() + 0.0  # -0.0 -> +0.0
    col = v.argmax(dim=-1)
    bits = v.gather(-1, col[:, None]).squeeze(-1).view(torch.int32)
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).long()
    return (ordered << 32) | (4294967295 - col)


def target_rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                        sumsq: torch.Tensor | None = None, reset_argmax_keys: torch.Tensor | None = None,
                        **_: object) -> torch.Tensor:
    """transformers' LlamaRMSNorm over the last dim: fp32 normalisation, cast to ``x.dtype``, times ``weight``;
    with ``sumsq`` the mean of squares is the sum of the partials over the row width. ``reset_argmax_keys`` is set
    to ``KEY_EMPTY``."""
    if reset_argmax_keys is not None:
        reset_argmax_keys.fill_(KEY_EMPTY)
    x32 = x.to(torch.float32)
    if sumsq is None:
        ms = x32.pow(2).mean(-1, keepdim=True)
    else:
        ms = (sumsq.to(torch.float32).sum(-1) / x.shape[-1]).unsqueeze(-1)
    x32 = x32 * torch.rsqrt(ms + eps)
    return weight * x32.to(x.dtype)


def target_linear_ref(
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
    config=None,
    argmax_keys: torch.Tensor | None = None,
    store_output: bool = True,
    **_: object,
) -> torch.Tensor | None:
    """Reference of :func:`~eagle_triton.ops.target_linear.target_linear` (same contract). ``sumsq_out``'s tiles
    are ``config.block_n`` wide; pass the op's ``config`` (the default here is :func:`default_config` for the
    dtype of ``x``, which differs from the op's when the reference runs in another precision)."""
    if sumsq is not None and norm_weight is None and not norm_folded:
        raise ValueError("sumsq (partial sums of squares of x) is only read by the RMSNorm prologue: pass "
                         "norm_weight too")
    if norm_folded:  # weight holds W * norm_weight: the fp32 product scaled by each row's rstd, then the bias
        rstd = torch.rsqrt(sumsq.to(torch.float32).sum(-1, keepdim=True) / x.shape[-1] + eps)
        y32 = (x.to(torch.float32) @ weight.to(torch.float32).T) * rstd
        y = (y32 + bias.to(torch.float32) if bias is not None else y32).to(x.dtype)
    else:
        h = target_rms_norm_ref(x, norm_weight, eps, sumsq=sumsq) if norm_weight is not None else x
        y = F.linear(h, weight, bias)
    if silu_mul:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = residual + y
    if sumsq_out is not None:
        from .op import _FLOATS, default_config

        N, K = y.shape[-1], x.shape[-1]
        cfg = config or default_config(N, K, x.device, x.dtype if x.dtype in _FLOATS else torch.float32,
                                       silu_mul=bool(silu_mul))
        P = cdiv(N, cfg.block_n)
        if tuple(sumsq_out.shape) != (y.shape[0], P):
            raise ValueError(f"sumsq_out must have shape [M={y.shape[0]}, {P}] (fp32 partial sums of squares), "
                             f"got {list(sumsq_out.shape)}")
        sumsq_out.copy_(_tile_sumsq(y, cfg.block_n, P))
    if argmax_keys is not None:
        torch.maximum(argmax_keys, argmax_keys_ref(y).to(argmax_keys.device), out=argmax_keys)
    if not store_output:
        return None
    if out is not None:
        out.copy_(y)
        return out
    return y


def target_embedding_ref(ids: torch.Tensor, weight: torch.Tensor, *, sumsq_out: torch.Tensor | None = None,
                         **_: object) -> torch.Tensor:
    """Reference of :func:`~eagle_triton.ops.target_linear.target_embedding`: ``F.embedding``, and the partials
    over ``P = sumsq_out.shape[1]`` column chunks of ``cdiv(H, P)``."""
    y = F.embedding(ids, weight)
    if sumsq_out is not None:
        P = sumsq_out.shape[1]
        sumsq_out.copy_(_tile_sumsq(y, cdiv(weight.shape[1], P), P))
    return y
