"""Logits processing and host-sync-free sampling.

The warpers reproduce transformers' ``TemperatureLogitsWarper``, ``TopPLogitsWarper`` and ``TopKLogitsWarper``
(``min_tokens_to_keep=1``, filter value ``-inf``), applied in the order of SafeAILab EAGLE's
``prepare_logits_processor``: temperature (when != 1), top-p (when ``1e-8 <= top_p < 1``), top-k (when > 0).
Temperatures ``<= 1e-5`` mean greedy decoding, as in EAGLE.

Sampling uses the exponential race (gpt-fast's ``multinomial_sample_one_no_sync``): ``argmax(p / E)`` with
``E ~ Exp(1)`` draws index ``i`` with probability ``p_i`` and never leaves the device.

Random numbers come from a ``torch.Generator`` or from a :class:`DeviceRNG`: Philox-4x32 keyed by a seed with its
counter in a device tensor, so draws need no host state and replay correctly inside a CUDA graph (a graph bakes in
a ``torch.Generator``'s state unless it is the default one). Its stream is the same on the CPU (the reference) and
on the GPU (the Triton kernel): a seed gives the same coins everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DeviceRNG", "SamplingParams", "draw_uniform", "process_logits", "probs_from_logits", "sample_from_probs"]

GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` (<= 1e-5: greedy), ``top_p`` (1.0: off), ``top_k`` (0: off)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-p, then top-k over the last dim (fp32 result, removed entries ``-inf``).

    logits: ``[..., V]``. Returns a new ``[..., V]`` fp32 tensor.
    """
    scores = logits.float()
    if params.greedy:
        return scores
    if params.temperature != 1.0:
        scores = scores / params.temperature
    if 1e-8 <= params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - params.top_p)
        remove_sorted[..., -1:] = False  # keep at least one token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    if params.top_k > 0:
        k = min(params.top_k, scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return scores


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``softmax(process_logits(logits))`` in fp32."""
    return torch.softmax(process_logits(logits, params), dim=-1)


class DeviceRNG:
    """Counter-based uniforms: Philox-4x32-10 under key ``seed``, counter ``offset`` held in a device tensor and
    advanced on the device by every draw (graph-capturable, no host state besides the tensors).

    CUDA draws run :func:`eagle_triton.ops.philox_uniform`; CPU draws its reference, the same stream.
    """

    def __init__(self, device: torch.device | str, seed: int = 0):
        self.device = torch.device(device)
        self.seed = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.offset = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> DeviceRNG:
        """Restart the stream at ``seed`` (host values written to the device tensors in place: graphs see them)."""
        self.seed.fill_(int(seed) & (2**63 - 1))
        self.offset.zero_()
        return self

    def uniform(self, *shape: int) -> torch.Tensor:
        """``shape`` float32 uniforms in ``[0, 1)``."""
        from ..ops.sampling import philox_uniform, philox_uniform_ref

        n = 1
        for d in shape:
            n *= int(d)
        draw = philox_uniform if self.device.type == "cuda" else philox_uniform_ref
        u = draw(self.seed, self.offset, n)
        self.offset.add_(n)
        return u.view(shape)


def draw_uniform(generator: torch.Generator | DeviceRNG | None, *shape: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """``shape`` float32 uniforms in ``[0, 1)`` from a :class:`DeviceRNG` or a ``torch.Generator`` on ``device``."""
    if isinstance(generator, DeviceRNG):
        return generator.uniform(*shape)
    return torch.rand(*shape, generator=generator, device=device)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | DeviceRNG | None = None) -> torch.Tensor:
    """One index per row of ``probs [..., V]`` (non-negative, not necessarily normalised), without a host sync.

    Returns ``[...]`` int64. Zero-probability entries are never drawn unless the whole row is zero.
    """
    if isinstance(generator, DeviceRNG):
        e = -torch.log1p(-generator.uniform(*probs.shape))  # Exp(1) by inversion; u < 1 so the log is finite
    else:
        e = torch.empty_like(probs, dtype=torch.float32).exponential_(1.0, generator=generator)
    e.clamp_(min=torch.finfo(torch.float32).tiny)  # an Exp(1) draw of 0 would turn p = 0 into 0/0 = NaN
    return torch.argmax(probs.float() / e, dim=-1)
