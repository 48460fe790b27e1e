"""EAGLE-3 draft head: fused low/mid/high target features, one midlayer over [emb, hidden], reduced vocabulary."""

from __future__ import annotations

import torch
from torch import nn

from .base import DraftHead
from .config import DraftHeadConfig
from .fp8 import Fp8Linear, quantize_linears_fp8
from .layers import MLP, Attention, RMSNorm

__all__ = ["Eagle3DraftHead", "eagle3_tap_layers"]


def eagle3_tap_layers(num_layers: int) -> tuple[int, int, int]:
    """Target layers whose *input* residual stream EAGLE-3 feeds its head: ``2, L // 2, L - 3``, ascending.

    These are transformers' ``output_hidden_states`` indices (0 = embeddings), concatenated ``[low, mid, high]``
    into the ``3 * Ht`` features that ``fc`` expects. SafeAILab EAGLE records the states entering decoder layers
    ``idx in {2, L // 2, L - 3}`` during its layer loop, so the order is ascending layer order
    (reference/EAGLE_ALGORITHM.md 1.1); for ``L >= 7`` the three are distinct and already ascending. Shallower
    targets (tests, toy models) make them collide or reverse: the reference's set would then give fewer than three
    states and break ``fc``, so here duplicates are kept and the tuple is sorted, which keeps the width ``3 * Ht``
    and the ascending-order rule. Training and serving both call this one function, so a head is always served with
    the taps it was trained on.
    """
    if num_layers < 3:
        raise ValueError(f"EAGLE-3 taps layers 2, L//2, L-3 and needs a target with >= 3 layers, got {num_layers}")
    low, mid, high = sorted((2, num_layers // 2, num_layers - 3))
    return low, mid, high


class Eagle3DecoderLayer(nn.Module):
    """The midlayer: attention over ``[input_layernorm(emb), hidden_norm(h)]`` (2H wide), residual on ``h``."""

    def __init__(self, config: DraftHeadConfig):
        super().__init__()
        eps = config.rms_norm_eps
        ab = bool(config.attention_bias)
        self.self_attn = Attention(config, in_features=2 * config.hidden_size, qkv_bias=ab or bool(config.qkv_bias),
                                   o_bias=ab)
        self.mlp = MLP(config)
        self.hidden_norm = RMSNorm(config.hidden_size, eps)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, emb, h, position_ids, attention_mask, past_key_value):
        residual = h
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(h)), dim=-1)
        attn, present = self.self_attn(x, position_ids, attention_mask, past_key_value)
        h = residual + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, present


class Eagle3DraftHead(DraftHead):
    """EAGLE-3 draft head (SafeAILab ``cnets.Model``).

    Inputs are either the three concatenated target taps ``[B, S, 3 * Ht]`` (projected by ``fc``) or the head's
    own un-normalised output ``[B, S, H]`` fed back during tree expansion (``fc`` skipped, decided by width as in
    the reference). Logits are ``lm_head(norm(h))`` over the draft vocabulary; :meth:`draft_to_target` maps draft
    ids to target ids through ``d2t``.

    Shapes for the Llama-3.1-8B head: H = Ht = 4096, 32 heads, 8 KV heads, I = 14336, V = 128256, Vd = 32000.
    ``config.attention_bias`` adds q/k/v and o_proj biases (``qkv_bias``: q/k/v only). :meth:`quantize_fp8` stores
    every linear layer in FP8 (:mod:`eagle_triton.heads.fp8`).
    """

    kind = "eagle3"
    #: the linear layers that :meth:`quantize_fp8` converts (the embedding and the norms stay in the model dtype)
    FP8_LAYERS = ("fc", "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
                  "midlayer.self_attn.o_proj", "midlayer.mlp.gate_proj", "midlayer.mlp.up_proj",
                  "midlayer.mlp.down_proj", "lm_head")

    def __init__(self, config: DraftHeadConfig):
        super().__init__(config)
        if config.num_hidden_layers != 1:
            raise ValueError(
                f"EAGLE-3 heads have one midlayer; config says num_hidden_layers={config.num_hidden_layers}")
        H = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, H, config.pad_token_id)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * config.feature_size, H, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.effective_draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(config.effective_draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    # -- FP8 weights --------------------------------------------------------------------------------------------
    def quantize_fp8(self, structure_only: bool = False) -> Eagle3DraftHead:
        """Convert, in place, every linear layer (fc, q/k/v, o, gate/up/down, lm_head) to weight-only FP8: e4m3
        weights with fp32 per-output-channel scales, products computed as :func:`~eagle_triton.heads.fp8.fp8_linear`
        defines. Activations, the embedding, the norms and the biases keep the model dtype. Returns ``self``;
        a head already in FP8 is left as it is. ``structure_only``: the layout of an FP8 checkpoint to be loaded."""
        quantize_linears_fp8(self, list(self.FP8_LAYERS), structure_only=structure_only)
        return self

    @property
    def is_fp8(self) -> bool:
        """Whether the linear layers hold FP8 weights (:meth:`quantize_fp8`)."""
        return isinstance(self.fc, Fp8Linear)

    # -- properties used by drafters and the engine ---------------------------------------------------------
    @property
    def feature_width(self) -> int:
        return 3 * self.config.feature_size

    @property
    def draft_vocab_size(self) -> int:
        return self.config.effective_draft_vocab

    @property
    def has_vocab_map(self) -> bool:
        return self.config.effective_draft_vocab != self.config.vocab_size

    @property
    def embed_is_external(self) -> bool:
        # The published heads take embed_tokens from the target unless the draft is narrower than the target.
        return self.config.target_hidden_size is None

    def forward(
        self,
        hidden_states: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
        """One draft forward. Returns the un-normalised output ``[B, S, H]`` and the grown KV ``((k, v),)``."""
        position_ids, mask, emb = self._forward_inputs(hidden_states, input_ids, position_ids, past_key_values,
                                                       tree_mask, (self.feature_width, self.config.hidden_size))
        h = self.fc(hidden_states) if hidden_states.shape[-1] != emb.shape[-1] else hidden_states
        past = None if past_key_values is None else past_key_values[0]
        h, present = self.midlayer(emb, h, position_ids, mask, past)
        return h, (present,)

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.has_vocab_map:
            return ids
        return ids + self.d2t[ids]
