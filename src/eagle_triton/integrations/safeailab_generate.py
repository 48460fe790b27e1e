"""SafeAILab EAGLE's ``eagenerate`` / ``naivegenerate`` run on eagle_triton's engine, on the ``EaModel``'s own weights.

:func:`take_over_generation` installs, on an ``EaModel`` (SafeAILab's layout: ``base_model``, ``ea_layer``,
``tokenizer``), instance methods ``eagenerate`` and ``naivegenerate`` with SafeAILab's signature, defaults,
stopping rules and return values, whose every step runs on eagle_triton: the base model as a
:class:`~eagle_triton.LlamaTarget` (static KV cache, tree-masked attention, CUDA graphs on a GPU), the ``ea_layer``
as an :class:`~eagle_triton.Eagle3DraftHead` drafted by the fused drafter, verification by
:func:`~eagle_triton.engine.accept.accept_tree`: the engine's own steps (:meth:`EagleEngine.generate`'s), each
queued before the previous one is read, with SafeAILab's stop checks on the host. Deleting the instance
attributes (``restore_eagle``) brings the class's methods back.

SafeAILab's loop, as reproduced (reference/EAGLE_ALGORITHM.md section 3): ``input_ids`` grows by the step's root
and accepted drafts (the bonus token becomes the next root and is never returned); after every step it stops when
``<|eot_id|>`` (``is_llama3``) or ``tokenizer.eos_token_id`` is among the generated tokens (tokens after it in the
same step are kept), when ``new_token > max_new_tokens`` (so up to ``depth + 1`` tokens more may come), or when
``input_ids`` is longer than ``max_length - total_tokens - 10``; it runs at most that many steps. ``log=True``
returns ``(input_ids, new_token, idx)``; with greedy decoding SafeAILab's ``new_token`` is a 0-d tensor (its
accept length is one), with sampling a Python int; ``naivegenerate`` counts with an int.

Sampling draws from the same distributions as SafeAILab's code (lossless), with eagle_triton's generator: the
tokens differ from SafeAILab's for a given seed. Greedy outputs are the target's greedy decoding in both.
"""

from __future__ import annotations

import warnings

import torch

from ..engine.sampling import SamplingParams
from .safeailab import head_from_ea_layer, tree_config_from_ea_layer

__all__ = ["take_over_generation", "share_fused_projections", "SafeAILabGeneration"]

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _sampling_params(temperature, top_p, top_k) -> SamplingParams:
    """SafeAILab's ``prepare_logits_processor`` conventions: ``temperature <= 1e-5`` greedy, ``top_p`` outside
    ``[1e-8, 1)`` off, ``top_k <= 0`` off."""
    if temperature <= 1e-5:
        return SamplingParams()
    p = float(top_p) if 1e-8 <= float(top_p) < 1.0 else 1.0
    return SamplingParams(float(temperature), p, max(int(top_k), 0))


def share_fused_projections(target, base_model) -> int:
    """Make the base model's q/k/v and gate/up weights views of the target's fused copies (``w_qkv``,
    ``w_gate_up``), so the two hold one copy between them. Only tensors found bit-equal are re-pointed; the base
    model computes exactly as before. Returns the bytes freed (0 when the target's layout is not the expected
    one: then both copies stay)."""
    freed = 0
    layers = getattr(getattr(base_model, "model", None), "layers", None)
    if layers is None or len(layers) != len(getattr(target, "layers", ())):
        return 0
    for hf, ours in zip(layers, target.layers, strict=True):
        groups = ((getattr(ours, "w_qkv", None), [getattr(hf.self_attn, f"{n}_proj", None) for n in "qkv"]),
                  (getattr(ours, "w_gate_up", None), [getattr(hf.mlp, f"{n}_proj", None) for n in ("gate", "up")]))
        for fused, linears in groups:
            if not isinstance(fused, torch.Tensor) or any(m is None for m in linears):
                continue
            weights = [m.weight for m in linears]
            if (sum(w.shape[0] for w in weights) != fused.shape[0]
                    or any(w.dtype != fused.dtype or w.device != fused.device or w.dim() != 2 for w in weights)):
                continue
            parts = fused.split([w.shape[0] for w in weights])
            if not all(torch.equal(p, w) for p, w in zip(parts, weights, strict=True)):
                continue
            for m, p in zip(linears, parts, strict=True):
                if m.weight.data_ptr() != p.data_ptr():
                    freed += m.weight.numel() * m.weight.element_size()
                    m.weight.data = p
    return freed


class SafeAILabGeneration:
    """SafeAILab's ``eagenerate`` / ``naivegenerate`` on an :class:`~eagle_triton.engine.EagleEngine` built over an
    ``EaModel``'s own tensors. Build with :func:`take_over_generation`."""

    def __init__(self, model, engine, drafter_backend: str = "auto"):
        self.model = model
        self.engine = engine
        self.backend = drafter_backend

    # -- shared pieces -----------------------------------------------------------------------------------------
    def _prepare(self, input_ids, max_length) -> int:
        """Check ``input_ids``, follow the ``ea_layer``'s tree settings, make room for ``max_length``; returns
        SafeAILab's step limit ``max_length - total_tokens - 10``."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError("input_ids must be a [1, N] tensor (SafeAILab's EAGLE decodes batch size 1)")
        eng = self.engine
        tc = tree_config_from_ea_layer(self.model.ea_layer)
        if tc != eng.tree_config:  # the user changed ea_layer.top_k / depth / total_tokens
            eng.tree_config = tc
            eng.drafter = eng._make_drafter(eng.head, self.backend)
            eng._runners.clear()
        T = tc.total_tokens - 1
        limit = int(max_length) - T - 10
        # room for the prompt or SafeAILab's length limit, the steps that may be queued past it, and one tree
        need = max(input_ids.shape[1], limit) + 2 * (T + 2)
        if need > eng.max_length:
            eng.max_length = need
            eng._capacity = need + tc.total_tokens + 1
        return limit

    def _steps(self, input_ids, params, speculative: bool, limit: int):
        """The engine's steps for one generation: first the prefill's token ``(0, [token])``, then per step
        ``(accepted drafts a, the a + 1 tokens it emits)``, at most ``limit`` steps. Each step is queued before the
        previous one is read (the engine's lagged read, device-paced steps replayed from CUDA graphs), so the
        caller's stop checks run while the GPU works; a step queued past the caller's stop is dropped."""
        eng = self.engine
        seed = int(torch.randint(0, 2**62, (1,)).item())  # a CPU draw: SafeAILab's runs are unseeded
        run, pending = eng._prefill(input_ids[0].tolist(), params, speculative, seed)
        step = eng._speculative_step if speculative else eng._plain_step
        queued, first = 0, True
        while pending is not None:
            ahead = None
            if run.device_paced and queued < limit:
                ahead, queued = step(run, params), queued + 1
            a, new = pending.result()
            if not first:
                run.committed(a + 1)
            first = False
            yield a, new
            if ahead is None and queued < limit:  # host-paced steps: queued after the read
                ahead, queued = step(run, params), queued + 1
            pending = ahead

    def _stop_ids(self, is_llama3) -> set:
        tok = self.model.tokenizer
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        if is_llama3:
            eot = tok.convert_tokens_to_ids("<|eot_id|>")
            if eot is not None:
                ids.add(eot)
        return ids

    @staticmethod
    def _result(prompt, generated, new_token, idx, log, max_length, limit):
        out = torch.cat([prompt.clone(), torch.tensor([generated], dtype=prompt.dtype).to(prompt.device)], dim=1)
        if not log:
            return out
        if idx < 0:  # SafeAILab's loop never ran: it has no step index to return (an UnboundLocalError there)
            raise ValueError(f"max_length={max_length} leaves no step: SafeAILab's loop runs max_length - "
                             f"total_tokens - 10 = {limit} times")
        return out, new_token, idx

    # -- the two loops -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def eagenerate(self, input_ids, temperature=0.0, top_p=0.0, top_k=0.0, max_new_tokens=512, max_length=2048,
                   log=False, is_llama3=False):
        """SafeAILab's ``EaModel.eagenerate`` (same arguments, stopping rules and return values) on eagle_triton's
        engine: the same steps as :meth:`EagleEngine.generate`, queued ahead of SafeAILab's stop checks."""
        params = _sampling_params(temperature, top_p, top_k)
        stop = self._stop_ids(is_llama3)
        self.model.ea_layer.reset_kv()
        limit = self._prepare(input_ids, max_length)
        steps = self._steps(input_ids, params, True, limit)
        _, (root,) = next(steps)  # the prefill's token: the first root
        generated: list[int] = []
        new_token, idx, L = 0, -1, input_ids.shape[1]
        for idx, (a, new) in enumerate(steps):  # noqa: B007 - SafeAILab returns the last step index
            chunk = [root] + new[:a]  # SafeAILab's step adds its root and the accepted drafts; the bonus token
            root = new[a]  # becomes the next root
            generated.extend(chunk)
            L += a + 1
            new_token += a + 1
            if not stop.isdisjoint(chunk) or new_token > max_new_tokens or L > limit:
                break
        steps.close()
        if params.greedy and idx >= 0:  # SafeAILab's greedy accept length is a tensor, so is its sum
            new_token = torch.tensor(new_token, device=self.engine.target.device)
        return self._result(input_ids, generated, new_token, idx, log, max_length, limit)

    @torch.no_grad()
    def naivegenerate(self, input_ids, temperature=0.0, top_p=0.0, top_k=0.0, max_new_tokens=512, max_length=2048,
                      log=False, is_llama3=False):
        """SafeAILab's ``EaModel.naivegenerate`` (plain decoding; same arguments, stopping rules and return
        values) on eagle_triton's engine (plain steps, queued ahead as in :meth:`eagenerate`)."""
        params = _sampling_params(temperature, top_p, top_k)
        stop = self._stop_ids(is_llama3)
        self.model.ea_layer.reset_kv()
        limit = self._prepare(input_ids, max_length)
        # SafeAILab's step i picks token i (the first from the prefill): limit tokens, limit - 1 decode steps
        steps = self._steps(input_ids, params, False, max(limit - 1, 0))
        generated: list[int] = []
        new_token, idx, L = 0, -1, input_ids.shape[1]
        if limit > 0:
            for idx, (_, new) in enumerate(steps):  # noqa: B007
                x = new[0]
                generated.append(x)
                new_token += 1
                L += 1
                if x in stop or new_token > max_new_tokens or L > limit:
                    break
        steps.close()
        return self._result(input_ids, generated, new_token, idx, log, max_length, limit)


_SUPPORTED_ARCHITECTURES = "Llama, Mistral, Qwen2, Qwen3"


def _build_engine(model, drafter_backend: str):
    """An :class:`EagleEngine` over the ``EaModel``'s tensors, or the reason it cannot be built."""
    from ..engine import EagleEngine, LlamaTarget

    base = getattr(model, "base_model", None)
    ea_layer = model.ea_layer
    if base is None or not hasattr(model, "tokenizer"):
        return None, "the model has no base_model/tokenizer"
    devices = {p.device for p in base.parameters()}
    if len(devices) != 1:
        return None, (f"its base model is spread over {len(devices)} devices ({sorted(map(str, devices))}); "
                      "eagle_triton's target runs on one")
    try:
        # The RMSNorm as its own kernel: folded norms would change the q/k/v and gate/up weights, and the base
        # model could no longer share one copy of them with the target (share_fused_projections).
        target = LlamaTarget.from_hf(base, norm_mode="kernel")
    except (ValueError, KeyError, AttributeError) as e:
        mt = getattr(getattr(base, "config", None), "model_type", None)
        return None, (f"its base model ({type(base).__name__}, model_type {mt!r}) is not one eagle_triton's target "
                      f"runs ({_SUPPORTED_ARCHITECTURES}): {e}")
    share_fused_projections(target, base)
    try:
        head = head_from_ea_layer(ea_layer, lm_head=base.lm_head)
        engine = EagleEngine(target, head, tree_config_from_ea_layer(ea_layer), max_length=2048,
                             drafter_backend=drafter_backend)
    except (TypeError, ValueError) as e:
        return None, f"its ea_layer cannot drive eagle_triton's drafter: {e}"
    return engine, ""


def take_over_generation(model, originals: dict, drafter_backend: str = "auto") -> bool:
    """Install eagle_triton's ``eagenerate`` / ``naivegenerate`` on ``model`` (recording what they shadow in
    ``originals``). Where a part cannot be taken over it warns once, naming the part, and leaves SafeAILab's
    methods in place. Returns whether the methods were installed."""
    if not any(callable(getattr(model, n, None)) for n in ("eagenerate", "naivegenerate")):
        return False
    engine, why = _build_engine(model, drafter_backend)
    if engine is None:
        _warn_once(f"optimize_eagle_with_triton: eagenerate/naivegenerate keep SafeAILab's own path because {why} "
                   "(drafting still runs on eagle_triton's drafter)")
        return False
    gen = SafeAILabGeneration(model, engine, drafter_backend)
    for name in ("eagenerate", "naivegenerate"):
        if callable(getattr(model, name, None)):
            originals[name] = model.__dict__.get(name)
            setattr(model, name, getattr(gen, name))
    return True
