"""Helpers that build random draft heads and inputs (tests, demos and benchmarks; no downloads)."""

from __future__ import annotations

import torch

from .heads import DraftHeadConfig, Eagle1DraftHead, Eagle3DraftHead

__all__ = ["random_eagle3_head", "random_eagle3_head_on", "random_eagle1_head", "llama31_8b_eagle3_config"]


def llama31_8b_eagle3_config() -> DraftHeadConfig:
    """The published Llama-3.1-8B-Instruct EAGLE-3 head's configuration (no rope_theta: base 10000)."""
    return DraftHeadConfig(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        draft_vocab_size=32000, rms_norm_eps=1e-5, max_position_embeddings=2048, pad_token_id=0,
        architectures=["LlamaForCausalLMEagle3"], bias=False,
    )


def _is_norm(name: str) -> bool:
    """Whether a parameter is an RMSNorm weight (random heads draw those near 1)."""
    return name.endswith("norm.weight") or "layernorm" in name


def _set_draft_vocab(head: Eagle3DraftHead, used: torch.Tensor) -> None:
    """``d2t``/``t2d`` for the sorted target ids ``used`` of a random draft vocabulary."""
    head.d2t.copy_(used - torch.arange(used.numel(), device=used.device))
    head.t2d.zero_()
    head.t2d[used] = True


def _randomize(module: torch.nn.Module, generator: torch.Generator, std: float) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if _is_norm(name):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(std * torch.randn(p.shape, generator=generator))


def random_eagle3_head(
    hidden_size: int = 64,
    intermediate_size: int = 96,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 256,
    draft_vocab_size: int | None = 96,
    target_hidden_size: int | None = None,
    rope_theta: float | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
    std: float = 0.1,
    config: DraftHeadConfig | None = None,
    lm_head_scale: float = 1.0,
) -> Eagle3DraftHead:
    """An EAGLE-3 head with random weights and a random sorted draft vocabulary (``d2t``/``t2d``);
    ``lm_head_scale`` multiplies ``lm_head`` (above 1: sharper next-token distributions, deeper trees)."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    cfg = config or DraftHeadConfig(
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, vocab_size=vocab_size, draft_vocab_size=draft_vocab_size,
        target_hidden_size=target_hidden_size, rope_theta=rope_theta, rms_norm_eps=1e-5,
        architectures=["LlamaForCausalLMEagle3"],
    )
    head = Eagle3DraftHead(cfg)
    _randomize(head, g, std)
    with torch.no_grad():
        head.lm_head.weight.mul_(lm_head_scale)
        head.embed_tokens.weight.copy_(torch.randn(head.embed_tokens.weight.shape, generator=g))
        if head.has_vocab_map:
            used = torch.randperm(cfg.vocab_size, generator=g)[: cfg.effective_draft_vocab]
            _set_draft_vocab(head, used.sort().values)
    return head.to(dtype).eval()


def random_eagle3_head_on(device, config: DraftHeadConfig, peaked: bool = False, dtype: torch.dtype = torch.bfloat16,
                          seed: int = 0) -> Eagle3DraftHead:
    """A large random EAGLE-3 head drawn directly on ``device`` (an 8B-shape head in seconds): weights N(0, 0.02),
    norms near 1, unit-variance embedding, a random sorted draft vocabulary; ``peaked`` scales ``lm_head`` by 12
    (sharp next-token distributions, deep trees). Benchmarks and GPU tests."""
    torch.manual_seed(seed)
    with torch.device(device):
        head = Eagle3DraftHead(config)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if _is_norm(name):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.02)
        head.embed_tokens.weight.normal_()
        if peaked:
            head.lm_head.weight.mul_(12.0)
        if head.has_vocab_map:
            used = torch.randperm(config.vocab_size, device=device)[: config.effective_draft_vocab]
            _set_draft_vocab(head, used.sort().values)
    return head.to(dtype).eval()


def random_eagle1_head(
    hidden_size: int = 64,
    intermediate_size: int = 96,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 256,
    num_hidden_layers: int = 1,
    bias: bool = True,
    rope_theta: float | None = 10000.0,
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
    std: float = 0.1,
) -> Eagle1DraftHead:
    """An EAGLE-1 head with random weights and a random target ``lm_head`` attached."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    cfg = DraftHeadConfig(
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, vocab_size=vocab_size, num_hidden_layers=num_hidden_layers,
        bias=bias, rope_theta=rope_theta, rms_norm_eps=1e-5,
    )
    lm_head = torch.nn.Linear(hidden_size, vocab_size, bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(std * 4 * torch.randn(lm_head.weight.shape, generator=g))
    head = Eagle1DraftHead(cfg, lm_head=lm_head.to(dtype))
    _randomize(head, g, std)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(torch.randn(head.embed_tokens.weight.shape, generator=g))
    return head.to(dtype).eval()


class _EaLayer(torch.nn.Module):
    """SafeAILab's draft ``Model`` attribute layout around an eagle_triton head (weights shared, not copied)."""

    def __init__(self, head, tree_config, spec=None):
        super().__init__()
        from types import SimpleNamespace

        from .drafter import TreeDrafter

        self.config = SimpleNamespace(**head.config.to_dict())
        for name in ("embed_tokens", "fc", "midlayer", "norm", "lm_head", "layers"):
            if hasattr(head, name):
                setattr(self, name, getattr(head, name))
        if head.kind == "eagle3":
            self.register_buffer("d2t", head.d2t)
            self.register_buffer("t2d", head.t2d)
        self.top_k, self.depth = tree_config.top_k, tree_config.depth
        self.total_tokens = tree_config.total_tokens - 1  # SafeAILab stores total_token - 1
        self.stable_kv = None
        self._drafter = TreeDrafter(head, tree_config) if spec is None else None
        self._spec = spec

    def reset_kv(self):
        self.stable_kv = None

    def topK_genrate(self, hidden_states, input_ids, head, logits_processor):
        if self._spec is not None:  # an independent transcription of SafeAILab's own topK_genrate
            self._spec.stable_kv = self.stable_kv
            out = self._spec.topK_genrate(hidden_states, input_ids, sampling=logits_processor is not None)
            self.stable_kv = self._spec.stable_kv
            return out
        if self.stable_kv is None:
            self._drafter.reset()
        tree = self._drafter.draft(hidden_states, input_ids, sampling=logits_processor is not None)
        self.stable_kv = self._drafter.stable_kv
        return tree.draft_tokens, tree.retrieve_indices.cpu(), tree.tree_mask.cpu(), tree.tree_position_ids


class SafeAILabStandIn(torch.nn.Module):
    """A stand-in for SafeAILab EAGLE's ``EaModel`` (``.ea_layer`` with ``fc``, ``midlayer``, ``norm``,
    ``lm_head``, ``d2t``, ``embed_tokens``, ``top_k``, ``depth``, ``total_tokens``, ``stable_kv``, ``reset_kv()``,
    ``topK_genrate``), for trying the EAGLE integrations without SafeAILab's package or a target model.

    ``topK_genrate`` drafts with the reference drafter, or with ``spec`` when given: an object with SafeAILab's
    ``topK_genrate(hidden_states, input_ids, sampling)`` and a ``stable_kv`` attribute (the tests pass their
    transcription of SafeAILab's code, so that patched and unpatched objects are compared against an independent
    oracle). The head's weights are shared, not copied."""

    def __init__(self, head=None, tree_config=None, spec=None):
        super().__init__()
        from .config import TreeConfig

        self.ea_layer = _EaLayer(head if head is not None else random_eagle3_head(seed=0),
                                 tree_config or TreeConfig(20, 3, 4), spec)
