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

__all__ = ["DeviceRNG", "RowRNG", "RowSampling", "SamplingParams", "draw_uniform", "process_logits",
           "process_logits_rows", "probs_from_logits", "probs_from_logits_rows", "sample_from_probs"]

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


class RowSampling:
    """Per-row :class:`SamplingParams` of a batch as device tensors (written in place, so CUDA graphs see new
    values): ``temperature [B]`` (1 on greedy rows: never divided by), ``top_p_cut [B]`` (``1 - top_p``, computed
    on the host in double and stored in fp32, the value :func:`process_logits` compares against), ``use_top_p``,
    ``top_k [B]`` (0: off) and ``greedy [B]`` bool."""

    def __init__(self, rows: int, device: torch.device | str):
        dev = torch.device(device)
        self.temperature = torch.ones(rows, dtype=torch.float32, device=dev)
        self.top_p_cut = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.use_top_p = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.top_k = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.greedy = torch.ones(rows, dtype=torch.bool, device=dev)

    def set(self, row: int, params: SamplingParams) -> None:
        """Row ``row`` takes ``params`` (in-place fills: no host-to-device copy of a tensor)."""
        greedy = params.greedy
        self.greedy[row:row + 1].fill_(greedy)
        self.temperature[row:row + 1].fill_(1.0 if greedy else params.temperature)
        self.use_top_p[row:row + 1].fill_(not greedy and 1e-8 <= params.top_p < 1.0)
        self.top_p_cut[row:row + 1].fill_(1 - params.top_p)
        self.top_k[row:row + 1].fill_(0 if greedy else params.top_k)


def process_logits_rows(logits: torch.Tensor, rows: RowSampling, top_p: bool = True,
                        top_k: bool = True) -> torch.Tensor:
    """:func:`process_logits` with each row's own parameters: ``logits [B, ..., V]``, row ``b`` processed as
    ``process_logits(logits[b], params_b)`` would (the same operations in the same order, so the same values);
    greedy rows come back unprocessed. ``top_p`` / ``top_k``: ``False`` when no row uses that filter (its sort is
    skipped). No host synchronisation (graph-capturable)."""
    scores = logits.float()
    B, V = scores.shape[0], scores.shape[-1]
    shape = (B,) + (1,) * (scores.dim() - 1)
    scores = scores / rows.temperature.view(shape)  # x / 1.0 == x: rows without a temperature are unchanged
    if top_p:
        scores = _top_p_rows(scores, rows, shape)
    if top_k:
        scores = _top_k_rows(scores, rows, shape, V)
    return scores


def _top_p_rows(scores: torch.Tensor, rows: RowSampling, shape: tuple) -> torch.Tensor:
    sorted_logits, sorted_idx = torch.sort(scores, dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = (cum <= rows.top_p_cut.view(shape)) & rows.use_top_p.view(shape)
    remove_sorted[..., -1:] = False  # keep at least one token
    remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def _top_k_rows(scores: torch.Tensor, rows: RowSampling, shape: tuple, V: int) -> torch.Tensor:
    # the k-th largest value of each row (topk's last value), from one descending sort
    k = rows.top_k.clamp(max=V)
    desc = torch.sort(scores, dim=-1, descending=True).values
    idx = (k - 1).clamp(min=0).view(shape).expand(*scores.shape[:-1], 1)
    kth = desc.gather(-1, idx)
    cut = (scores < kth) & (k > 0).view(shape)
    return scores.masked_fill(cut, float("-inf"))


def probs_from_logits_rows(logits: torch.Tensor, rows: RowSampling, top_p: bool = True,
                           top_k: bool = True) -> torch.Tensor:
    """Per-row target distributions ``[B, ..., V]`` fp32: ``softmax(process_logits_rows(...))`` on sampling rows,
    the one-hot of the argmax on greedy rows (so the lossless sampling rule verifies them greedily: a draft is
    accepted iff it is the argmax, and the bonus token is the argmax)."""
    probs = torch.softmax(process_logits_rows(logits, rows, top_p, top_k), dim=-1)
    onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    shape = (logits.shape[0],) + (1,) * (logits.dim() - 1)
    return torch.where(rows.greedy.view(shape), onehot, probs)


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


class RowRNG:
    """One :class:`DeviceRNG` stream per row of a batch: ``seed [B]`` and ``offset [B]`` device tensors, row ``b``
    the stream a :class:`DeviceRNG` seeded with ``seed[b]`` gives, so a sequence draws the same coins in a batch
    as alone. :meth:`uniform` draws ``[B, ...]``: row ``b`` from stream ``b``, every row advancing."""

    def __init__(self, rows: int, device: torch.device | str):
        self.device = torch.device(device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self.offset = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self.rows = []
        for b in range(rows):  # views into seed/offset: a row's draws advance the shared offset tensor
            r = DeviceRNG.__new__(DeviceRNG)
            r.device, r.seed, r.offset = self.device, self.seed[b:b + 1], self.offset[b:b + 1]
            self.rows.append(r)

    def manual_seed(self, row: int, seed: int) -> DeviceRNG:
        """Restart row ``row``'s stream at ``seed``; returns that row's :class:`DeviceRNG`."""
        return self.rows[row].manual_seed(seed)

    def uniform(self, *shape: int) -> torch.Tensor:
        """``shape`` float32 uniforms, ``shape[0]`` the rows: row ``b`` is ``rows[b].uniform(*shape[1:])``."""
        if not shape or shape[0] != len(self.rows):
            raise ValueError(f"RowRNG.uniform draws [{len(self.rows)}, ...], got shape {list(shape)}")
        rest = shape[1:] or (1,)
        return torch.stack([r.uniform(*rest) for r in self.rows]).view(shape)


def draw_uniform(generator: torch.Generator | DeviceRNG | RowRNG | None, *shape: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """``shape`` float32 uniforms in ``[0, 1)`` from a :class:`DeviceRNG`, a :class:`RowRNG` (one stream per
    row of ``shape[0]``) or a ``torch.Generator`` on ``device``."""
    if isinstance(generator, (DeviceRNG, RowRNG)):
        return generator.uniform(*shape)
    return torch.rand(*shape, generator=generator, device=device)


def sample_from_probs(probs: torch.Tensor,
                      generator: torch.Generator | DeviceRNG | RowRNG | None = None) -> torch.Tensor:
    """One index per row of ``probs [..., V]`` (non-negative, not necessarily normalised), without a host sync.

    Returns ``[...]`` int64. Zero-probability entries are never drawn unless the whole row is zero.
    """
    if isinstance(generator, (DeviceRNG, RowRNG)):
        e = -torch.log1p(-generator.uniform(*probs.shape))  # Exp(1) by inversion; u < 1 so the log is finite
    else:
        e = torch.empty_like(probs, dtype=torch.float32).exponential_(1.0, generator=generator)
    e.clamp_(min=torch.finfo(torch.float32).tiny)  # an Exp(1) draw of 0 would turn p = 0 into 0/0 = NaN
    return torch.argmax(probs.float() / e, dim=-1)
