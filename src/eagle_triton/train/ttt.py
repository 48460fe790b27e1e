"""EAGLE-3 training-time test (TTT): the draft head unrolled over several simulated drafting steps.

Row ``j`` of a sequence ``x`` pairs the target feature ``f[j]`` with the embedding of ``x[j+1]`` at RoPE position
``j`` (step 0), exactly as at inference. Step ``s >= 1`` feeds the head its own un-normalised step ``s-1`` output
at row ``j`` together with the embedding of ``x[j+1+s]`` at position ``j+s``; its query attends causally to the
step-0 keys (rows ``<= j``, true features) and, for steps ``1..s``, only to the key of the same row ``j`` (its
simulated ancestors and itself). This is what the drafter computes along one tree path whose root row is ``j``
(tested against the inference forward in ``tests/train/test_train.py``). Step ``s`` at row ``j`` predicts the target's
distribution at position ``j+1+s`` (the token ``x[j+2+s]``).

Loss per step (EAGLE-3): soft cross-entropy between ``softmax(target_logits restricted to the draft vocab)`` and
``log_softmax(lm_head(norm(h)))`` where the position is a response position and the target's argmax lies in the
draft vocabulary; steps are weighted ``decay ** s``. Accuracy per step counts every response position: a hit is
the draft argmax (mapped to a target id) equal to the target's argmax over the full vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..heads.eagle3 import Eagle3DraftHead
from ..heads.layers import apply_rope

__all__ = ["TTTBatch", "TTTResult", "shift_left", "ttt_hidden_states", "ttt_loss"]


def shift_left(x: torch.Tensor, k: int, fill=0) -> torch.Tensor:
    """``y[:, j] = x[:, j + k]`` along dim 1, ``fill`` past the end."""
    if k == 0:
        return x
    out = torch.full_like(x, fill)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


def ttt_hidden_states(head: Eagle3DraftHead, features: torch.Tensor, tokens: torch.Tensor, steps: int) -> list:
    """The head's un-normalised outputs ``h_s [B, S, H]`` for ``s = 0 .. steps-1``.

    Parameters
    ----------
    head: the EAGLE-3 head (trained in place; ``embed_tokens`` stays frozen).
    features: ``[B, S, 3 * Ht]`` target taps of ``tokens``.
    tokens: ``[B, S]`` the sequence ``x`` (right-padded; padding never reaches earlier rows).
    steps: number of unrolled steps (>= 1).
    """
    if not isinstance(head, Eagle3DraftHead):
        raise TypeError(f"training-time test needs an Eagle3DraftHead, got {type(head).__name__}")
    if features.dim() != 3 or tokens.shape != features.shape[:2]:
        raise ValueError(f"features [B, S, W] and tokens [B, S] must agree, got {list(features.shape)} and "
                         f"{list(tokens.shape)}")
    if features.shape[-1] != head.feature_width:
        raise ValueError(f"features width {features.shape[-1]} != head feature width {head.feature_width}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    layer = head.midlayer
    attn = layer.self_attn
    B, S, _ = features.shape
    nh, nkv, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
    rep = nh // nkv
    scale = 1.0 / math.sqrt(hd)
    dev = features.device
    with torch.no_grad():
        emb_all = head.embed_tokens(tokens)
    h = head.fc(features)
    dtype = h.dtype
    emb_all = emb_all.to(dtype)
    attn.rotary_emb.ensure_length(S + steps)
    rows = torch.arange(S, device=dev)
    causal = rows[None, :] <= rows[:, None]  # [S(query), S(key)]
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    outs = []
    for s in range(steps):
        emb = shift_left(emb_all, s + 1)
        x = torch.cat((layer.input_layernorm(emb), layer.hidden_norm(h)), dim=-1)
        q = attn.q_proj(x).view(B, S, nh, hd).transpose(1, 2)
        k = attn.k_proj(x).view(B, S, nkv, hd).transpose(1, 2)
        v = attn.v_proj(x).view(B, S, nkv, hd).transpose(1, 2)
        pos = (rows + s)[None].expand(B, S)
        cos, sin = attn.rotary_emb(pos, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        qg = q.reshape(B, nkv, rep, S, hd)
        if s == 0:
            k0, v0 = k, v
        else:
            diag_k.append(k)
            diag_v.append(v)
        scores0 = torch.matmul(qg, k0[:, :, None].transpose(-1, -2)) * scale  # [B, nkv, rep, S, S]
        scores0 = scores0.float().masked_fill(~causal, float("-inf"))
        if diag_k:
            diag = torch.stack([(qg * kk[:, :, None]).sum(-1) for kk in diag_k], dim=-1) * scale  # [B,nkv,rep,S,s]
            probs = torch.softmax(torch.cat((scores0, diag.float()), dim=-1), dim=-1).to(dtype)
            p0, pd = probs[..., :S], probs[..., S:]
            out = torch.matmul(p0, v0[:, :, None])
            for i, vv in enumerate(diag_v):
                out = out + pd[..., i: i + 1] * vv[:, :, None]
        else:
            out = torch.matmul(torch.softmax(scores0, dim=-1).to(dtype), v0[:, :, None])
        out = out.reshape(B, nh, S, hd).transpose(1, 2).reshape(B, S, nh * hd)
        h = h + attn.o_proj(out)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        outs.append(h)
    return outs


@dataclass
class TTTBatch:
    """Inputs of one training batch (all ``[B, S]`` unless noted).

    tokens: the sequences; features: ``[B, S, 3 * Ht]``; target_logp: ``[B, S, Vd]`` target log-probabilities over
    the draft vocabulary (renormalised), position ``t`` predicting ``x[t+1]``; target_argmax: target argmax over the
    full vocabulary; loss_mask: 1 where ``x[t+1]`` is a response token.
    """

    tokens: torch.Tensor
    features: torch.Tensor
    target_logp: torch.Tensor
    target_argmax: torch.Tensor
    loss_mask: torch.Tensor


@dataclass
class TTTResult:
    """Loss (differentiable) and per-step statistics (python floats / ints)."""

    loss: torch.Tensor
    step_losses: list[float]
    step_correct: list[int]
    step_count: list[int]


def ttt_loss(head: Eagle3DraftHead, batch: TTTBatch, steps: int = 7, decay: float = 0.8) -> TTTResult:
    """Weighted TTT loss over ``steps`` unrolled steps and per-step top-1 hits (see the module docstring)."""
    if not head.has_vocab_map and batch.target_logp.shape[-1] != head.config.vocab_size:
        raise ValueError("target_logp must span the head's draft vocabulary")
    if batch.target_logp.shape[-1] != head.draft_vocab_size:
        raise ValueError(f"target_logp has {batch.target_logp.shape[-1]} classes but the head's draft vocabulary is "
                         f"{head.draft_vocab_size}")
    outs = ttt_hidden_states(head, batch.features, batch.tokens, steps)
    used = torch.arange(head.draft_vocab_size, device=batch.tokens.device)
    used = head.draft_to_target(used)
    if head.has_vocab_map:
        in_vocab = head.t2d[batch.target_argmax]
    else:
        in_vocab = torch.ones_like(batch.loss_mask, dtype=torch.bool)
    total = batch.features.new_zeros((), dtype=torch.float32)
    losses, correct, count = [], [], []
    for s, h in enumerate(outs):
        mask = shift_left(batch.loss_mask.bool(), s + 1, False)
        train_mask = mask & shift_left(in_vocab, s + 1, False)
        logits = head.compute_logits(h).float()
        logp = F.log_softmax(logits, dim=-1)
        tgt = shift_left(batch.target_logp, s + 1).float()
        ce = -(tgt.exp() * logp).sum(-1)  # [B, S]
        n = train_mask.sum()
        loss_s = (ce * train_mask).sum() / n.clamp(min=1)
        total = total + (decay ** s) * loss_s
        with torch.no_grad():
            pred = used[logits.argmax(-1)]
            hit = (pred == shift_left(batch.target_argmax, s + 1)) & mask
            correct.append(int(hit.sum()))
            count.append(int(mask.sum()))
        losses.append(float(loss_s.detach()))
    return TTTResult(loss=total, step_losses=losses, step_correct=correct, step_count=count)
