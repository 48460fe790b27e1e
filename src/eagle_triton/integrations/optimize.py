"""Entry points for SafeAILab EAGLE users, mapped onto the engine and drafters (no second algorithm).

- :func:`optimize_eagle_with_triton`: switch an engine, or an object in SafeAILab's layout, to the Triton
  drafter and kernels; returns the original methods so everything can be restored.
- :func:`fused_draft_token_generation`: generate with the fused drafter, EAGLE's ``eagenerate`` way
  (sampling arguments with EAGLE's "0 disables" convention, output = prompt + new ids).
"""

from __future__ import annotations

import torch

__all__ = ["GPUAssertionError", "optimize_eagle_with_triton", "restore_eagle", "fused_draft_token_generation"]


class GPUAssertionError(AssertionError):
    """A GPU-only path (the fused Triton drafter, Triton kernels) was requested where no CUDA GPU is available."""


def _require_gpu(what: str) -> None:
    if not torch.cuda.is_available():
        raise GPUAssertionError(f"{what} needs a CUDA GPU, and torch.cuda.is_available() is False")


def _engine_of(model):
    from ..engine import EagleEngine

    if isinstance(model, EagleEngine):
        return model
    engine = getattr(model, "engine", None)
    return engine if isinstance(engine, EagleEngine) else None


# Methods SafeAILab's EaModel path uses, replaced when an object exposes them as attributes.
_EAGLE_METHODS = ("tree_decoding", "evaluate_posterior", "update_inference_inputs")


def optimize_eagle_with_triton(model):
    """Run an EAGLE model's generation on eagle_triton's engine and Triton kernels.

    ``model`` is an :class:`~eagle_triton.engine.EagleEngine` (or an object with ``.engine``): its drafter and
    target attention switch to the Triton implementations. Or ``model`` is an EAGLE model in SafeAILab's layout
    (``EaModel``: ``base_model``, ``ea_layer``, ``tokenizer``, ``eagenerate``, ``naivegenerate``):

    - ``ea_layer.topK_genrate`` drafts with eagle_triton's drafter (the fused Triton kernel on a GPU), on the
      ``ea_layer``'s own tensors (see :func:`~eagle_triton.patch_ea_model_with_triton_drafter`);
    - ``eagenerate`` and ``naivegenerate`` run SafeAILab's loop (same signature, defaults, stopping rules and
      return values, ``log=True`` included; see :mod:`eagle_triton.integrations.safeailab_generate`) entirely on
      eagle_triton's engine: the base model as a :class:`~eagle_triton.LlamaTarget` whose tensors are the base
      model's own, the ``ea_layer`` as the draft head. The target fuses q/k/v and gate/up into one matrix each;
      those fused copies are made once, then the base model's ``q/k/v_proj`` and ``gate/up_proj`` weights are
      re-pointed at slices of them (bit-equal, checked), so after the call one copy of every weight exists. The
      conversion briefly holds both (for an 8B Llama about 9 GB more at the peak). The target's KV cache is
      eagle_triton's own (SafeAILab's is never allocated by the new methods).
    - where a part cannot be taken over (a base model other than Llama/Mistral/Qwen2/Qwen3, a model spread over
      several devices, an ea_layer the drafter cannot read) it warns once naming the part and keeps SafeAILab's
      methods for it. An ``evaluate_posterior`` attribute is replaced by a greedy, sync-free version (sampling
      calls the original).

    Without a GPU the PyTorch reference paths are used (drafting warns). Returns ``(model, original_methods)``;
    pass both to :func:`restore_eagle` to undo. ``original_methods`` lists only what was actually replaced.
    """
    original: dict = {}
    engine = _engine_of(model)
    if engine is not None:
        from ..drafter import TreeDrafter, available_draft_backends
        from ..engine.backend import select_ops

        on_gpu = engine.target.device.type == "cuda"
        if engine.head is not None and on_gpu and "triton" in available_draft_backends():
            original["drafter"] = engine.drafter
            engine.drafter = TreeDrafter(engine.head, engine.tree_config, backend="triton")
        target_ops = getattr(engine.target, "ops", None)
        if target_ops is not None and on_gpu:
            original["target_ops"] = target_ops
            engine.target.ops = select_ops(engine.target.device, "triton")
        return model, original

    from .safeailab import EaLayerDrafter, _default_backend
    from .safeailab_generate import take_over_generation

    ea_layer = getattr(model, "ea_layer", None)
    if ea_layer is None or not hasattr(ea_layer, "topK_genrate"):
        raise TypeError("optimize_eagle_with_triton needs an EagleEngine or an EAGLE model in SafeAILab's layout "
                        "(an ea_layer with topK_genrate)")
    original["ea_layer.topK_genrate"] = ea_layer.__dict__.get("topK_genrate")
    ea_layer.topK_genrate = EaLayerDrafter(ea_layer, _default_backend())
    take_over_generation(model, original)
    for name in _EAGLE_METHODS:
        if callable(getattr(model, name, None)):
            if name in _REPLACEMENTS:
                original[name] = model.__dict__.get(name)
                setattr(model, name, _REPLACEMENTS[name](getattr(model, name)))
    return model, original


def restore_eagle(model, original_methods: dict):
    """Undo :func:`optimize_eagle_with_triton`."""
    engine = _engine_of(model)
    if engine is not None:
        if "drafter" in original_methods:
            engine.drafter = original_methods["drafter"]
        if "target_ops" in original_methods:
            engine.target.ops = original_methods["target_ops"]
        return model
    for key, value in original_methods.items():
        obj, name = (model.ea_layer, key.split(".", 1)[1]) if key.startswith("ea_layer.") else (model, key)
        if value is None:
            obj.__dict__.pop(name, None)
        else:
            setattr(obj, name, value)
    return model


def _greedy_posterior(logits, candidates):
    """SafeAILab ``evaluate_posterior`` for greedy decoding on device tensors, with no host sync:
    ``(best_candidate, accept_length, logits[best, accept_length])``."""
    match = (candidates[:, 1:] == logits[:, :-1].argmax(-1)).int()
    lengths = torch.cumprod(match, dim=1).sum(dim=1)
    best = torch.argmax(lengths)
    accept = lengths[best]
    return best, accept, logits[best, accept]


def _wrap_evaluate_posterior(original):
    def evaluate_posterior(logits, candidates, logits_processor):
        # Sampling keeps the original (it draws with Python's ``random``): only the greedy path is replaced.
        if logits_processor is not None:
            return original(logits, candidates, logits_processor)
        return _greedy_posterior(logits, candidates)

    return evaluate_posterior


_REPLACEMENTS = {"evaluate_posterior": _wrap_evaluate_posterior}


def fused_draft_token_generation(model, input_ids, temperature: float = 0.0, top_p: float = 0.0,
                                 top_k: float = 0.0, max_new_tokens: int = 20, max_length: int = 2048,
                                 require_gpu: bool = False) -> torch.Tensor:
    """Generate with the fused drafter, EAGLE's ``eagenerate`` conventions: ``temperature <= 1e-5`` is greedy;
    ``top_p`` outside ``[1e-8, 1)`` and ``top_k <= 0`` are disabled. Returns ``[1, N + n]`` ids (prompt + new).

    ``model`` is an :class:`EagleEngine` (or has ``.engine``). ``max_length`` caps prompt + new tokens (at most the
    engine's own ``max_length``). ``require_gpu=True`` demands the fused GPU path and raises
    :class:`GPUAssertionError` without a GPU; otherwise the engine's drafter runs (the reference on the CPU).
    """
    engine = _engine_of(model)
    if engine is None:
        raise TypeError("fused_draft_token_generation needs an EagleEngine (or an object with .engine)")
    if require_gpu:
        _require_gpu("fused_draft_token_generation(require_gpu=True)")
        if getattr(engine.drafter, "backend", None) != "triton":
            optimize_eagle_with_triton(engine)
    ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor(input_ids)
    ids = ids.view(1, -1).to(torch.long)
    n = ids.shape[1]
    cap = min(int(max_length), engine.max_length)
    if n >= cap:
        raise ValueError(f"the prompt has {n} tokens but max_length is {cap}")
    p = float(top_p) if 1e-8 <= float(top_p) < 1.0 else 1.0
    tokens, _ = engine.generate(input_ids=ids, max_new_tokens=min(int(max_new_tokens), cap - n),
                                temperature=float(temperature), top_p=p, top_k=max(int(top_k), 0))
    return torch.cat([ids.cpu(), torch.tensor([tokens], dtype=torch.long)], dim=1)
