"""The generic target path: any transformers causal LM through its public API.

Tree verification passes a 4D additive attention mask (prefix visible, ancestor mask over the tree block) and
explicit ``position_ids`` (sequence length + node depth); the model keeps its own ``DynamicCache``, which is
compacted to the accepted path after each step and cropped. EAGLE-3 features come from ``output_hidden_states``
(index ``i`` is the residual stream entering layer ``i``), EAGLE-1 features from the last hidden state (the input
of the LM head). Slower than :class:`~eagle_triton.engine.target.LlamaTarget` (no static cache, no CUDA graphs),
and it needs a model that honours custom 4D masks and position ids (most decoder-only transformers models do).
"""

from __future__ import annotations

import inspect

import torch

from ..heads.eagle3 import eagle3_tap_layers
from .target import TargetModel, _eos_ids

__all__ = ["HFTarget", "cache_keyword"]


def cache_keyword(model) -> str:
    """The name under which ``model``'s forward takes its cache and its output returns it: ``cache`` since
    transformers 5.24 (``past_key_values`` deprecated there, removed in 5.40), ``past_key_values`` before; asked of
    the model's own forward, so remote code written for either works."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFTarget(TargetModel):
    """Wrap a transformers ``*ForCausalLM`` (batch 1)."""

    def __init__(self, model, eos_token_ids=None):
        self.model = model.eval()
        cfg = model.config
        emb = model.get_input_embeddings().weight
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(getattr(cfg, "hidden_size", emb.shape[1]))
        self.num_layers = int(cfg.num_hidden_layers)
        self.device = emb.device
        self.dtype = emb.dtype
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else _eos_ids(model)
        self.feature_mode = None
        self.taps: tuple[int, ...] = ()
        self.capacity = 0
        self._cache = None
        self._len = 0
        self._cache_name = cache_keyword(model)

    def setup(self, max_length: int, feature_mode: str | None = None) -> None:
        if feature_mode not in (None, "eagle3", "eagle1"):
            raise ValueError(f"feature_mode must be None, 'eagle3' or 'eagle1', got {feature_mode!r}")
        self.feature_mode = feature_mode
        self.taps = eagle3_tap_layers(self.num_layers) if feature_mode == "eagle3" else ()
        self.capacity = int(max_length)
        self.reset()

    def reset(self) -> None:
        self._cache = None
        self._len = 0

    @property
    def length(self) -> int:
        return self._len

    def input_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(h)

    def _features(self, hidden_states):
        if self.feature_mode == "eagle3":
            return torch.cat([hidden_states[i] for i in self.taps], dim=-1)
        if self.feature_mode == "eagle1":
            return hidden_states[-1]
        return None

    def _call(self, ids, **kwargs):
        if self._len + ids.shape[1] > self.capacity:
            raise ValueError(f"target capacity exceeded: {self._len} + {ids.shape[1]} > {self.capacity}")
        cache = {self._cache_name: self._cache}
        out = self.model(input_ids=ids.to(self.device), use_cache=True,
                         output_hidden_states=self.feature_mode is not None, **cache, **kwargs)
        self._cache = getattr(out, self._cache_name)
        feats = self._features(out.hidden_states) if self.feature_mode is not None else None
        return out.logits, feats

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor):
        n = input_ids.shape[1]
        pos = torch.arange(self._len, self._len + n, device=self.device).view(1, n)
        logits, feats = self._call(input_ids, position_ids=pos)
        self._len += n
        return logits[:, -1], feats

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor):
        pos = torch.full((1, 1), self._len, device=self.device, dtype=torch.long)
        logits, feats = self._call(input_ids, position_ids=pos)
        self._len += 1
        return logits[:, -1], feats

    @torch.no_grad()
    def verify(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor):
        S, L = tokens.shape[1], self._len
        neg = torch.finfo(self.dtype).min
        mask = torch.zeros(1, 1, S, L + S, dtype=self.dtype, device=self.device)
        tm = tree_mask[0].to(self.device)
        tm = tm > 0.5 if tm.is_floating_point() else tm.to(torch.bool)  # a drafter's float mask: cells > 0.5
        mask[0, 0, :, L:] = torch.where(tm, 0.0, neg).to(self.dtype)
        pos = (L + depths.to(self.device).long()).view(1, S)
        return self._call(tokens, attention_mask=mask, position_ids=pos)

    def commit(self, accept_index: torch.Tensor, accept_len: torch.Tensor, accept_len_host: int) -> None:
        """Move the root + accepted rows of the verified tree to the front of its block and drop the rest."""
        L, a = self._len, int(accept_len_host)
        n = L + a + 1
        src = L + accept_index[0, : a + 1].to(self.device).long()
        cache = self._cache
        if hasattr(cache, "layers"):  # transformers >= 4.56
            for layer in cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t[:, :, L:n] = t[:, :, src]
                    setattr(layer, name, t[:, :, :n])
        else:  # older DynamicCache: key_cache / value_cache lists
            for lst in (cache.key_cache, cache.value_cache):
                for i, t in enumerate(lst):
                    t[:, :, L:n] = t[:, :, src]
                    lst[i] = t[:, :, :n]
        self._len = n
