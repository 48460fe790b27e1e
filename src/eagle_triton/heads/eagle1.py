"""EAGLE-1/2 draft head: fc over [embedding, feature], Llama decoder layer(s), logits from the target's lm_head."""

from __future__ import annotations

import torch
from torch import nn

from .base import DraftHead
from .config import DraftHeadConfig
from .layers import MLP, Attention, RMSNorm

__all__ = ["Eagle1DraftHead"]


class Eagle1DecoderLayer(nn.Module):
    """A Llama decoder layer; layer 0 has no ``input_layernorm`` (as in SafeAILab ``cnets1``)."""

    def __init__(self, config: DraftHeadConfig, index: int):
        super().__init__()
        self.index = index
        self.self_attn = Attention(config, in_features=config.hidden_size, qkv_bias=bool(config.qkv_bias))
        self.mlp = MLP(config)
        if index != 0:
            self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, position_ids, attention_mask, past_key_value):
        residual = h
        if self.index != 0:
            h = self.input_layernorm(h)
        attn, present = self.self_attn(h, position_ids, attention_mask, past_key_value)
        h = residual + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, present


class Eagle1DraftHead(DraftHead):
    """EAGLE-1/2 draft head (SafeAILab ``cnets1.Model``).

    The feature is the target's last hidden state after its final norm (width H). ``fc`` maps
    ``[embedding, feature]`` (embedding first) to H, with a bias unless the config says ``"bias": false``.
    Logits come from the *target's* ``lm_head`` applied to the draft output (no norm): pass it as ``lm_head``
    (an ``nn.Linear`` or any callable) or call :meth:`set_target_lm_head` later.
    """

    kind = "eagle1"

    def __init__(self, config: DraftHeadConfig, lm_head: nn.Module | None = None):
        super().__init__(config)
        H = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, H, config.pad_token_id)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(2 * H, H, bias=bool(config.bias))
        self.layers = nn.ModuleList([Eagle1DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.set_target_lm_head(lm_head)

    def set_target_lm_head(self, lm_head) -> None:
        """Use the target's ``lm_head`` for logits. Kept outside the state dict and ``.to()``: the target owns it."""
        self.__dict__["_target_lm_head"] = lm_head

    @property
    def target_lm_head(self):
        return self.__dict__.get("_target_lm_head")

    @property
    def feature_width(self) -> int:
        return self.config.hidden_size

    @property
    def draft_vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def has_vocab_map(self) -> bool:
        return False

    @property
    def embed_is_external(self) -> bool:
        return True

    def forward(self, hidden_states, input_ids, position_ids=None, past_key_values=None, tree_mask=None):
        """One draft forward. Returns the output ``[B, S, H]`` and the grown KV (one ``(k, v)`` per layer)."""
        position_ids, mask, emb = self._forward_inputs(hidden_states, input_ids, position_ids, past_key_values,
                                                       tree_mask, allowed_widths=(self.config.hidden_size,))
        h = self.fc(torch.cat((emb, hidden_states), dim=-1))
        presents = []
        for i, layer in enumerate(self.layers):
            past = None if past_key_values is None else past_key_values[i]
            h, present = layer(h, position_ids, mask, past)
            presents.append(present)
        return h, tuple(presents)

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        head = self.target_lm_head
        if head is None:
            raise RuntimeError(
                "Eagle1DraftHead needs the target's lm_head for logits: pass lm_head= to the constructor or "
                "from_pretrained, or call head.set_target_lm_head(...)"
            )
        return head(h)

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids
