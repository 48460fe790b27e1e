"""Weight-only FP8 (e4m3) linear layers for draft heads: the one definition of what an FP8 product computes.

A weight ``W [N, K]`` is stored as ``W8 = round_e4m3(W / s)`` (``torch.float8_e4m3fn``) with one fp32 scale per
output channel ``s [N] = max|W[n, :]| / 448`` (1 for an all-zero row). For activations ``x`` in the model dtype
``dt`` a product is

    y = ((x @ W8.to(dt).T) rounded to dt) * s  (+ bias)   rounded to dt

i.e. the matrix product of the unscaled e4m3 values (exact in bf16/fp16/fp32) accumulated and rounded like any
product of the model, then the per-channel scale (and the bias, if any) in fp32 with one more rounding.
:func:`fp8_linear` is that formula; the reference drafter (through :class:`Fp8Linear`), the multi-kernel drafter
and the fused kernel's epilogues all compute it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FP8_DTYPE", "FP8_MAX", "DRAFT_DTYPES", "Fp8Linear", "apply_draft_dtype", "fp8_linear",
           "quantize_fp8_weight", "quantize_linears_fp8"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
#: the draft-weight choices of the engine and the CLI (``--draft-dtype``): the model dtype, or FP8 linear layers
DRAFT_DTYPES = ("model", "fp8")


def apply_draft_dtype(head, draft_dtype: str | None):
    """``head`` with its linear layers in ``draft_dtype``: ``None``/``"model"`` leaves it as it is, ``"fp8"``
    quantises them in place (``Eagle3DraftHead.quantize_fp8``; EAGLE-3 heads only). Returns the head."""
    if draft_dtype in (None, "model"):
        return head
    if draft_dtype != "fp8":
        raise ValueError(f"draft dtype must be one of {DRAFT_DTYPES}, got {draft_dtype!r}")
    if not hasattr(head, "quantize_fp8"):
        raise ValueError(f"FP8 draft weights are supported for EAGLE-3 heads only, got a {head.kind} head")
    return head.quantize_fp8()


def quantize_fp8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W8, scale)`` of a ``[N, K]`` weight: e4m3 values and fp32 per-output-channel scales (round to nearest;
    every ``|W / s| <= 448``, so no value saturates and none is NaN)."""
    if weight.dim() != 2:
        raise ValueError(f"FP8 quantisation takes a [out, in] weight, got shape {list(weight.shape)}")
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    if not torch.isfinite(amax).all():
        raise ValueError("cannot quantise a weight holding inf or NaN to FP8")
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    w8 = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return w8.contiguous(), scale.contiguous()


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``rnd(rnd(x @ W8.T) * scale + bias)`` in ``x.dtype`` (module docstring)."""
    y = F.linear(x, w8.to(x.dtype)) * scale  # fp32 scale: the product is promoted to fp32 before the rounding
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


class Fp8Linear(nn.Module):
    """A bias-optional linear layer with e4m3 weights and fp32 per-output-channel scales (:func:`fp8_linear`).

    State: ``weight`` (``float8_e4m3fn [out, in]``), ``weight_scale`` (fp32 ``[out]``) and ``bias`` (model dtype or
    ``None``). Casting the module (``.to(torch.bfloat16)``, ``.half()``) moves it between devices but never changes
    the FP8 weight or the fp32 scales; the bias follows the cast like any parameter.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device), requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> Fp8Linear:
        out = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, device=lin.weight.device)
        w8, scale = quantize_fp8_weight(lin.weight)
        out.weight.copy_(w8)
        out.weight_scale.copy_(scale)
        if lin.bias is not None:
            out.bias = nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
        return out

    def _apply(self, fn, recurse=True):
        # nn.Module.to(dtype) casts every floating tensor, float8 included: apply ``fn`` to the bias only and use it
        # on an empty probe to learn the target device of the weight and its scales
        w, s = self.weight, self.weight_scale
        dev = fn(torch.empty(0, device=w.device)).device
        self._buffers["weight"], self._buffers["weight_scale"] = None, None
        super()._apply(fn, recurse)
        self._buffers["weight"], self._buffers["weight_scale"] = w.to(dev), s.to(dev)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp8"


def quantize_linears_fp8(module: nn.Module, names: list[str], structure_only: bool = False) -> None:
    """Replace the ``nn.Linear`` submodules ``names`` (dotted paths) of ``module`` by :class:`Fp8Linear`, in place.
    ``structure_only``: the layout of an FP8 checkpoint about to be loaded (weights not quantised, left zero)."""
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        lin = getattr(parent, attr)
        if isinstance(lin, Fp8Linear):
            continue
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"{name} is a {type(lin).__name__}, not a linear layer")
        if structure_only:
            new = Fp8Linear(lin.in_features, lin.out_features, bias=lin.bias is not None, device=lin.weight.device)
            if lin.bias is not None:
                new.bias = nn.Parameter(torch.zeros_like(lin.bias), requires_grad=False)
        else:
            new = Fp8Linear.from_linear(lin)
        setattr(parent, attr, new)
