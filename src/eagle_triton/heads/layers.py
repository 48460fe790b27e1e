"""Building blocks of EAGLE draft heads, computing exactly what SafeAILab EAGLE computes.

The operation order (fp32 upcast inside RMSNorm, division by sqrt(head_dim), an fp32 additive mask, softmax in
fp32) is kept as in the reference so that the PyTorch drafter reproduces its outputs bit for bit in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import DraftHeadConfig

__all__ = ["RMSNorm", "RotaryEmbedding", "Attention", "MLP", "rms_norm", "rotate_half", "apply_rope", "repeat_kv"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in fp32, cast back, multiply by the weight in the input dtype.

    The one RMSNorm of the project: draft heads, the fast target and the multi-kernel drafter all call it, so they
    round identically."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """``weight * (x / rms(x))`` with the normalisation in fp32 and the weight multiply in the input dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dim (the half-rotation form of RoPE)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-rotation RoPE; ``cos``/``sin`` are already gathered at the positions, broadcastable to ``x``."""
    return (x * cos) + (rotate_half(x) * sin)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, nkv, L, hd] -> [B, nkv * n_rep, L, hd]`` (GQA expansion, as a contiguous copy)."""
    if n_rep == 1:
        return x
    b, nkv, length, hd = x.shape
    return x[:, :, None].expand(b, nkv, n_rep, length, hd).reshape(b, nkv * n_rep, length, hd)


class RotaryEmbedding(nn.Module):
    """The draft head's own RoPE tables (base ``rope_theta`` or 10000), independent of the target's.

    Tables are computed in fp32 for ``max_position_embeddings`` positions and grown on demand. (The reference
    rebuilds grown tables in the head dtype; fp32 here is more accurate and only differs past 2048 positions.)
    """

    def __init__(self, dim: int, max_position_embeddings: int = 2048, base: float = 10000.0):
        super().__init__()
        self.dim = dim
        self.base = base
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(max_position_embeddings)

    def _build(self, length: int) -> None:
        inv_freq = self.inv_freq.float()
        t = torch.arange(length, device=inv_freq.device, dtype=torch.float32)
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def _apply(self, fn, recurse=True):
        # Keep inv_freq in fp32 when the module is cast (the tables are cast per call instead).
        out = super()._apply(fn, recurse)
        self.inv_freq = self.inv_freq.float()
        self.cos_cached = self.cos_cached.float()
        self.sin_cached = self.sin_cached.float()
        return out

    def ensure_length(self, length: int) -> None:
        if length > self.cos_cached.shape[0]:
            self._build(max(length, 2 * self.cos_cached.shape[0]))

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables at ``position_ids`` (``[B, S]``) as ``[B, 1, S, dim]`` in ``dtype``."""
        cos = self.cos_cached.to(dtype)[position_ids].unsqueeze(1)
        sin = self.sin_cached.to(dtype)[position_ids].unsqueeze(1)
        return cos, sin


class Attention(nn.Module):
    """Llama attention with a cache of ``(k, v)`` tensors ``[B, nkv, L, hd]`` (post-RoPE, pre-GQA-repeat).

    ``in_features`` is 2H for the EAGLE-3 midlayer (``[norm(emb), norm(hidden)]``) and H for EAGLE-1 layers;
    ``qkv_bias`` / ``o_bias`` add biases to q/k/v / o_proj (Llama's ``attention_bias`` sets both).
    """

    def __init__(self, config: DraftHeadConfig, in_features: int, qkv_bias: bool = False, o_bias: bool = False):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(in_features, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(in_features, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(in_features, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=o_bias)
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.max_position_embeddings, config.rope_base)

    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_value: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        bsz, q_len, _ = x.shape
        q = self.q_proj(x).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        self.rotary_emb.ensure_length(int(position_ids.shape[-1]) + (0 if past_key_value is None else
                                                                     past_key_value[0].shape[2]))
        cos, sin = self.rotary_emb(position_ids, v.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        present = (k, v)
        n_rep = self.num_heads // self.num_kv_heads
        kk, vv = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = torch.matmul(q, kk.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + attention_mask  # fp32 mask: promotes the scores to fp32, as the reference does
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, vv).transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
        return self.o_proj(out), present


class MLP(nn.Module):
    def __init__(self, config: DraftHeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def build_attention_mask(
    q_len: int, past_len: int, tree_mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """The reference's additive fp32 mask ``[1, 1, q_len, past_len + q_len]``.

    Causal over the new rows with the whole past visible; where ``tree_mask`` (``[1, 1, q_len, n]``, 1 = visible)
    is given, its zeros mask the last ``n`` columns.
    """
    neg = torch.finfo(torch.float32).min
    mask = torch.zeros(q_len, past_len + q_len, dtype=torch.float32, device=device)
    if q_len > 1:
        causal = torch.full((q_len, q_len), neg, device=device)
        rows = torch.arange(q_len, device=device)
        causal.masked_fill_(rows[None, :] <= rows[:, None], 0)
        mask[:, past_len:] = causal
    mask = mask[None, None]
    if tree_mask is not None:
        # masked_fill_ on the view, not boolean-index assignment (which syncs with the host on CUDA)
        mask[:, :, -tree_mask.shape[-2]:, -tree_mask.shape[-1]:].masked_fill_(tree_mask == 0, neg)
    return mask
