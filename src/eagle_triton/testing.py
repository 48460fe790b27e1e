"""Helpers that build random draft heads and inputs (tests, demos and benchmarks; no downloads)."""

from __future__ import annotations

import torch

from .heads import DraftHeadConfig, Eagle1DraftHead, Eagle3DraftHead

__all__ = ["random_eagle3_head", "random_eagle3_head_on", "random_eagle1_head", "llama31_8b_eagle3_config",
           "SafeAILabStandIn", "StandInTokenizer", "safeailab_config", "tiny_llama_base_model"]


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


def safeailab_config(head_config: DraftHeadConfig, style: str = "transformers"):
    """The ``ea_layer.config`` object SafeAILab builds for a head config: a transformers ``LlamaConfig``
    (``style="transformers"``; under transformers >= 5 its ``rope_theta`` lives only in ``rope_parameters`` /
    ``rope_scaling``, as in SafeAILab's ``EConfig``) or a plain namespace of the config.json fields
    (``style="namespace"``, the transformers < 5 picture: ``config.rope_theta`` when the file has one)."""
    from types import SimpleNamespace

    fields = head_config.to_dict()
    if style == "namespace":
        return SimpleNamespace(**fields)
    if style != "transformers":
        raise ValueError(f"style must be 'transformers' or 'namespace', got {style!r}")
    from transformers import LlamaConfig

    return LlamaConfig(**fields)


class _EaLayer(torch.nn.Module):
    """SafeAILab's draft ``Model`` attribute layout around an eagle_triton head (weights shared, not copied)."""

    def __init__(self, head, tree_config, config_style: str = "transformers", spec=None):
        super().__init__()
        from .drafter import TreeDrafter

        self.config = safeailab_config(head.config, config_style)
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


class StandInTokenizer:
    """The two things SafeAILab's generation loops ask of a tokenizer: ``eos_token_id`` and
    ``convert_tokens_to_ids("<|eot_id|>")`` (``eot_id``)."""

    def __init__(self, eos_token_id: int | None = None, eot_id: int | None = None):
        self.eos_token_id = eos_token_id
        self.eot_id = eot_id

    def convert_tokens_to_ids(self, token: str):
        if token != "<|eot_id|>":
            raise KeyError(f"the stand-in tokenizer knows only <|eot_id|>, not {token!r}")
        return self.eot_id


def tiny_llama_base_model(vocab_size: int = 32, hidden_size: int = 64, num_layers: int = 4, seed: int = 0,
                          dtype: torch.dtype = torch.float64, rope_theta: float = 50000.0):
    """A random transformers ``LlamaForCausalLM`` (eager attention) for CPU tests of whole-generation paths.
    fp64 by default, so that two correct implementations agree on every argmax and top-k."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=96,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      rope_theta=rope_theta, tie_word_embeddings=False, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if _is_norm(name)
                    else 0.2 * torch.randn(p.shape, generator=g))
    return model.to(dtype).eval()


class SafeAILabStandIn(torch.nn.Module):
    """A stand-in for SafeAILab EAGLE's ``EaModel``, for trying the EAGLE integrations without SafeAILab's package.

    ``.ea_layer`` has SafeAILab's draft ``Model`` layout (``fc``, ``midlayer``, ``norm``, ``lm_head``, ``d2t``,
    ``embed_tokens``, ``top_k``, ``depth``, ``total_tokens`` = total_token - 1, ``stable_kv``, ``reset_kv()``,
    ``topK_genrate``) and a ``config`` built as SafeAILab builds it (``config_style``, see
    :func:`safeailab_config`: by default a transformers ``LlamaConfig``, whose RoPE base sits in
    ``rope_parameters`` under transformers >= 5).

    With a ``base_model`` (a transformers Llama-family ``*ForCausalLM``, e.g. :func:`tiny_llama_base_model`) it
    also has ``base_model``, ``tokenizer`` (:class:`StandInTokenizer`), ``use_eagle3`` and greedy ``eagenerate`` /
    ``naivegenerate`` with SafeAILab's signature, stopping rules and return values, written over transformers'
    plain forward (every step recomputes the whole sequence; the tree is verified through a 4D mask).

    ``topK_genrate`` drafts with the reference drafter, or with ``spec`` when given: an object with SafeAILab's
    ``topK_genrate(hidden_states, input_ids, sampling)`` and a ``stable_kv`` attribute (the tests pass their
    transcription of SafeAILab's code, so that patched and unpatched objects are compared against an independent
    oracle). The head's weights are shared, not copied.
    """

    def __init__(self, head=None, tree_config=None, base_model=None, tokenizer=None,
                 config_style: str = "transformers", spec=None):
        super().__init__()
        from .config import TreeConfig

        head = head if head is not None else random_eagle3_head(seed=0)
        self.ea_layer = _EaLayer(head, tree_config or TreeConfig(20, 3, 4), config_style, spec)
        self.use_eagle3 = head.kind == "eagle3"
        if base_model is not None:
            self.base_model = base_model
            self.config = base_model.config
            self.tokenizer = tokenizer if tokenizer is not None else StandInTokenizer()

    # -- SafeAILab's generation loops, over transformers' forward ------------------------------------------------
    def _forward(self, ids: torch.Tensor, tree_mask: torch.Tensor | None = None,
                 tree_positions: torch.Tensor | None = None):
        """Logits and draft features of every row of ``ids``; the last ``T + 1`` rows are a tree when
        ``tree_mask`` is given (each sees the prefix and its ancestors, at position prefix + depth)."""
        from .heads import eagle3_tap_layers

        S = ids.shape[1]
        dev, dtype = ids.device, next(self.base_model.parameters()).dtype
        see = torch.ones(S, S, dtype=torch.bool, device=dev).tril()
        positions = torch.arange(S, device=dev)
        if tree_mask is not None:
            n = tree_mask.shape[-1]
            see[S - n:, S - n:] = tree_mask[0, 0].to(dev) > 0.5
            positions[S - n:] = (S - n) + tree_positions.to(dev)
        mask = torch.zeros(S, S, dtype=dtype, device=dev).masked_fill(~see, torch.finfo(dtype).min)
        out = self.base_model(ids, attention_mask=mask[None, None], position_ids=positions[None],
                              output_hidden_states=True)
        if self.use_eagle3:
            taps = eagle3_tap_layers(self.base_model.config.num_hidden_layers)
            feats = torch.cat([out.hidden_states[i] for i in taps], dim=-1)
        else:
            feats = out.hidden_states[-1]
        return out.logits, feats

    def _stop(self, input_ids, input_len, new_token, limit, stop_token_id) -> bool:
        generated = input_ids[0, input_len:].tolist()
        if stop_token_id is not None and stop_token_id in generated:
            return True
        if self.tokenizer.eos_token_id in generated:
            return True
        return bool(new_token > self._max_new_tokens) or input_ids.shape[1] > limit

    def _begin(self, name, input_ids, temperature, max_new_tokens, max_length, is_llama3):
        """What both of SafeAILab's loops do first: ``(input_ids copy, prompt length, step limit, stop id)``."""
        if temperature > 1e-5:
            raise ValueError(f"the stand-in's {name} decodes greedily only (a test double): pass temperature=0")
        self._max_new_tokens = max_new_tokens
        self.ea_layer.reset_kv()
        stop_token_id = self.tokenizer.convert_tokens_to_ids("<|eot_id|>") if is_llama3 else None
        limit = max_length - self.ea_layer.total_tokens - 10
        return input_ids.clone(), input_ids.shape[1], limit, stop_token_id

    @torch.no_grad()
    def eagenerate(self, input_ids, temperature=0.0, top_p=0.0, top_k=0.0, max_new_tokens=512, max_length=2048,
                   log=False, is_llama3=False):
        input_ids, input_len, limit, stop_token_id = self._begin("eagenerate", input_ids, temperature,
                                                                 max_new_tokens, max_length, is_llama3)
        logits, feats = self._forward(input_ids)
        token = logits[0, -1].argmax()[None, None]
        tree = self.ea_layer.topK_genrate(feats, torch.cat([input_ids, token], 1), self.base_model.lm_head, None)
        new_token = 0
        for idx in range(limit):  # noqa: B007 - SafeAILab returns the last step index
            draft_tokens, retrieve_indices, tree_mask, tree_positions = tree
            L = input_ids.shape[1]
            logits, feats = self._forward(torch.cat([input_ids, draft_tokens], 1), tree_mask, tree_positions)
            logits, feats = logits[0, L:], feats[:, L:]
            pad = torch.full((1, 1), -1, dtype=torch.long, device=draft_tokens.device)
            candidates = torch.cat([draft_tokens, pad], 1)[0, retrieve_indices]
            path_logits = logits[retrieve_indices]
            match = (candidates[:, 1:] == path_logits[:, :-1].argmax(-1)).int()
            lengths = match.cumprod(1).sum(1)
            accept_length = lengths.max()  # a 0-d tensor, as in SafeAILab: new_token becomes one too
            best = int(lengths.argmax()) if accept_length > 0 else 0
            path = retrieve_indices[best, :accept_length + 1]
            input_ids = torch.cat([input_ids, candidates[None, best, :accept_length + 1]], 1)
            token = path_logits[best, accept_length].argmax()[None, None]
            tree = self.ea_layer.topK_genrate(feats[:, path], torch.cat([input_ids, token], 1),
                                              self.base_model.lm_head, None)
            new_token += accept_length + 1
            if self._stop(input_ids, input_len, new_token, limit, stop_token_id):
                break
        return (input_ids, new_token, idx) if log else input_ids

    @torch.no_grad()
    def naivegenerate(self, input_ids, temperature=0.0, top_p=0.0, top_k=0.0, max_new_tokens=512, max_length=2048,
                      log=False, is_llama3=False):
        input_ids, input_len, limit, stop_token_id = self._begin("naivegenerate", input_ids, temperature,
                                                                 max_new_tokens, max_length, is_llama3)
        new_token = 0
        for idx in range(limit):  # noqa: B007
            logits, _ = self._forward(input_ids)
            input_ids = torch.cat([input_ids, logits[:, -1:].argmax(-1)], 1)
            new_token += 1
            if self._stop(input_ids, input_len, new_token, limit, stop_token_id):
                break
        return (input_ids, new_token, idx) if log else input_ids
