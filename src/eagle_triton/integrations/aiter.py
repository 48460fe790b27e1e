"""AITER-style high-level inference: ``EAGLEConfig`` and ``EAGLEInference`` over :class:`EagleEngine`.

Vocabulary mapping (SGLang/AITER -> EAGLE): ``topk`` -> ``top_k``; ``num_steps`` (draft steps = tree levels below
the root) -> ``depth = num_steps - 1`` expansion forwards; ``num_draft_tokens`` (tree size including the root) ->
``total_tokens``. ``speedup`` is always measured: the same engine decodes the same input without speculation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..config import TreeConfig

__all__ = ["EAGLEConfig", "EAGLEInference"]


@dataclass
class EAGLEConfig:
    """Settings of :class:`EAGLEInference` (SGLang/AITER names). Defaults give EAGLE's 60/7/10 tree."""

    topk: int = 10
    num_steps: int = 8
    num_draft_tokens: int = 60
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_length: int = 2048
    seed: int | None = None
    measure_speedup: bool = True
    drafter_backend: str = "auto"
    dtype: str | None = None

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"num_steps counts draft steps (tree levels below the root) and must be >= 1, got "
                             f"{self.num_steps}")
        self.tree_config()  # validates the combination

    def tree_config(self) -> TreeConfig:
        return TreeConfig(total_tokens=self.num_draft_tokens, depth=self.num_steps - 1, top_k=self.topk)


class EAGLEInference:
    """Speculative generation with an EAGLE draft head, AITER style.

    Parameters
    ----------
    draft_model: a draft-head checkpoint directory or an eagle_triton draft head.
    target_model: a target path (transformers directory, safetensors checkpoint, ``.gguf``), a transformers causal
        LM, or an eagle_triton target runner.
    config: an :class:`EAGLEConfig`.
    device: ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available).
    """

    def __init__(self, draft_model, target_model, config: EAGLEConfig | None = None, device=None):
        from ..engine import EagleEngine

        self.config = config or EAGLEConfig()
        self.engine = EagleEngine.from_pretrained(
            target_model, draft_model, self.config.tree_config(), device=device, dtype=self.config.dtype,
            max_length=self.config.max_length, drafter_backend=self.config.drafter_backend,
        )

    def _run(self, ids, max_new_tokens, speculative):
        c = self.config
        return self.engine.generate(input_ids=ids, max_new_tokens=max_new_tokens, temperature=c.temperature,
                                    top_p=c.top_p, top_k=c.top_k, seed=c.seed, speculative=speculative)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens: int = 128) -> tuple[torch.Tensor, dict]:
        """Generate after ``input_ids`` (``[N]`` / ``[1, N]`` tensor or list). Returns ``(output_ids [1, N + n],
        stats)``; stats hold ``accept_length`` (tokens per step, bonus included), ``acceptance_rate`` (accepted
        drafts over the ``depth + 1`` a step can accept), ``speedup`` (tokens/s over the same engine without
        speculation, measured; ``None`` when ``measure_speedup`` is off) and the engine's full statistics."""
        ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor(input_ids)
        ids = ids.view(1, -1).to(torch.long)
        tokens, st = self._run(ids, max_new_tokens, speculative=True)
        stats = {
            "new_tokens": st.new_tokens,
            "steps": st.steps,
            "accept_length": st.mean_accepted_length,
            "acceptance_rate": (st.mean_accepted_length - 1.0) / (self.engine.tree_config.depth + 1),
            "tokens_per_second": st.tokens_per_second,
            "speedup": None,
            "engine": st.to_dict() if hasattr(st, "to_dict") else asdict(st),
        }
        if self.config.measure_speedup:
            base_tokens, base = self._run(ids, max_new_tokens, speculative=False)
            stats["baseline_tokens_per_second"] = base.tokens_per_second
            stats["speedup"] = st.tokens_per_second / base.tokens_per_second if base.tokens_per_second else None
            if self.config.temperature <= 1e-5:
                stats["lossless"] = base_tokens == tokens  # greedy: identical output is required
        out = torch.cat([ids.cpu(), torch.tensor([tokens], dtype=torch.long)], dim=1)
        return out, stats

    def benchmark(self, prompts, max_new_tokens: int = 128, warmup: int = 1) -> dict:
        """Run every prompt (token-id lists/tensors, or strings when the target has a tokenizer) with and without
        speculation after ``warmup`` untimed runs. Returns per-prompt stats and totals: ``accept_length``,
        ``tokens_per_second`` for both modes over all prompts, and their ratio ``speedup``."""
        encoded = [self._encode(p) for p in prompts]
        if not encoded:
            raise ValueError("benchmark needs at least one prompt")
        for p in encoded[:warmup]:
            self._run(p, min(max_new_tokens, 8), True)
            self._run(p, min(max_new_tokens, 8), False)
        rows, spec_tok, spec_s, base_tok, base_s, steps, emitted = [], 0, 0.0, 0, 0.0, 0, 0
        for p in encoded:
            tok_a, a = self._run(p, max_new_tokens, True)
            tok_b, b = self._run(p, max_new_tokens, False)
            rows.append({"prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
                         "accept_length": a.mean_accepted_length, "tokens_per_second": a.tokens_per_second,
                         "baseline_tokens_per_second": b.tokens_per_second,
                         "identical": tok_a == tok_b if self.config.temperature <= 1e-5 else None})
            spec_tok += a.new_tokens
            spec_s += a.total_s
            base_tok += b.new_tokens
            base_s += b.total_s
            steps += a.steps
            emitted += a.mean_accepted_length * a.steps
        spec_tps, base_tps = spec_tok / spec_s, base_tok / base_s
        return {
            "prompts": rows,
            "accept_length": emitted / steps if steps else 0.0,
            "tokens_per_second": spec_tps,
            "baseline_tokens_per_second": base_tps,
            "speedup": spec_tps / base_tps,
            "config": asdict(self.config),
        }

    def _encode(self, prompt):
        if isinstance(prompt, str):
            tok = self.engine.tokenizer
            if tok is None:
                raise ValueError("string prompts need a tokenizer: pass a target path, or token ids")
            return torch.tensor([tok(prompt)["input_ids"]])
        t = prompt if isinstance(prompt, torch.Tensor) else torch.tensor(prompt)
        return t.view(1, -1).to(torch.long)
