"""Host side of the fused drafter: configuration, weights, preallocated buffers, the launch and the reference.

``launch_drafter(cfg, X, weights, bufs)`` drafts one EAGLE-2 tree per sequence in a single kernel launch, with
no host synchronisation (CUDA-graph capturable once the buffers exist). ``launch_drafter_ref`` is the same
operation computed by the PyTorch reference drafter, sequence by sequence (the oracle, and the fallback where
no GPU or Triton is available).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field, fields, replace

import torch

from ..config import TreeConfig
from ..drafter.reference import TorchDraftBackend, check_draft_inputs
from ..heads.base import DraftHead
from ..ops._utils import cdiv, move_slots_to_front
from ..ops._utils import is_interpreter as _interpreting
from ..ops._utils import next_power_of_2 as _pow2
from ..tree import DraftTree

__all__ = [
    "DrafterConfig",
    "FusedDrafterWeights",
    "FusedDrafterBuffers",
    "Weights",
    "Buffers",
    "DraftInputs",
    "DraftOutput",
    "launch_drafter",
    "launch_drafter_ref",
    "FusedDraftBackend",
    "triton_available",
    "profile_phases",
    "token_qkv_table",
]

PROFILE_SLOTS = 128  # = kernel.PROF_SLOTS: arrival-time slots per program
_SMEM_BUDGET = 180 * 1024  # bytes of pipeline buffers per program (an H100 SM has 227 KB)
# FP8 weights: 128-deep chunks also for lm_head and gate/up at 128-row tiles (193 KB of buffers; the sm_90 builds
# of the four benchmark shapes take 181-214 KB in all): 8B 60/7/10 batch 16 9.27 -> 8.98 ms on an H200
# (bench/results/session32_2026-11-28/), where 180 KB left them 64 deep
_SMEM_BUDGET_FP8 = 200 * 1024
_FP8 = torch.float8_e4m3fn
_MAX_VOCAB = 2**31 - 1  # the int64 ranking keys hold a 32-bit vocabulary index
#: DrafterConfig.tail_one_pass's product names and the kernel's TP1 mask bits
_ONE_PASS_PRODUCTS = {"o": 1, "gate_up": 2, "down": 4}
_TILE_KEY_ROWS = 65536  # the int32 keys of a program's lm_head tiles hold a 16-bit index within its tiles


def triton_available(device: torch.device | str) -> tuple[bool, str]:
    """Whether the fused kernel can run for tensors on ``device``, and why not."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - triton is a dependency
        return False, f"Triton is not importable ({exc})"
    dev = torch.device(device)
    if dev.type == "cuda":
        return True, ""
    if dev.type == "cpu" and _interpreting():
        return True, ""
    return False, f"no CUDA device for tensors on {dev} and TRITON_INTERPRET is not set"


# ------------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class DrafterConfig:
    """Shapes, capacities and tiling of one fused drafter.

    Model shape: ``hidden_size`` H, ``num_heads``/``num_kv_heads``/``head_dim``, ``intermediate_size``,
    ``draft_vocab`` (rows of ``lm_head``), ``feature_width`` (3 x target hidden for EAGLE-3). Tree: ``top_k`` K,
    ``depth`` D, ``total_tokens`` (T + 1). Capacities: ``max_batch`` sequences, ``max_len`` draft-KV rows per
    sequence (accepted rows plus the ``D * K`` scratch tree rows), ``max_new_rows`` rows per root step.
    Launch: ``nprog`` resident programs (``None``: one per SM on the GPU, 1 under the interpreter),
    ``nsplit`` KV splits of the attention, the tile sizes, and ``lm_warp_rank``: rank the lm_head tiles' keys
    after the product loop with warp-level reductions instead of merging each tile inside the loop (``None``: when a
    row tile holds at most 64 rows, and at every row tile with FP8 weights, where it measured faster on an H200,
    60/7/10. FP8: 8B batch 16 7.984 / 7.983 -> 7.907 / 7.900 ms, batch 13 7.922 / 7.919 -> 7.873 / 7.877, batch 8
    level, batch 4 3.238 / 3.224 -> 3.183 / 3.165 (64-row tiles); batch 16 Qwen3-8B 7.651 / 7.618 -> 7.561 / 7.531,
    70B 21.229 / 21.352 -> 21.109 / 21.316, 1B-class 4.716 / 4.715 -> 4.539 / 4.541. bf16 at 64-row tiles: 8B batch
    4 2.899 / 2.899 -> 2.843 / 2.843, batch 5 3.051 -> 2.989; at 128-row tiles slower, 8B batch 16 7.097 / 7.085 ->
    7.230 / 7.222, and keeps the in-loop merge there).
    Weights: ``weight_dtype`` ``None`` (the model dtype) or ``torch.float8_e4m3fn`` (weight-only FP8 linear layers,
    converted in registers, per-output-channel scales in the epilogues: :mod:`eagle_triton.heads.fp8`);
    ``attention_bias``: q/k/v and o_proj biases.
    ``hidden_half_early``: where a tree step's rows fit one row tile and programs are left over, those programs
    compute the hidden half of the next step's q/k/v product during RM and SEL, and the next q/k/v streams only the
    embedding half (docs/fused_drafter.md, "The hidden half early"). The same arithmetic in another summation
    order. ``None`` (the default): where it measured faster, for heads of hidden size >= 1024: one sequence whose
    weights are not FP8 (H100, bf16 8B 60/7/10 2.50 -> 2.46 ms; fp32, the test dtype, follows bf16), and with the
    q/k/v table (which leaves the next q/k/v nothing to stream then) one or two sequences, FP8 too (H200, 8B
    60/7/10 with the table: bf16 batch 1 1.863 -> 1.753 ms, batch 2 2.259 -> 2.103; FP8 batch 1 1.652 -> 1.569,
    batch 2 2.578 -> 2.506; batch 4 slower: 2.940 -> 3.023, FP8 3.551 -> 3.643); ``True``: wherever a row tile
    leaves half the programs idle; ``False``: never.
    ``stream_k_linear``: fc, o, gate/up and down cut into equal contiguous (tile, reduction chunk) ranges, one per
    program, as q/k/v always is (a tile's parts summed by its owner in a fixed order; with several row tiles each
    row tile's parts in a region of their own). ``None`` (the default): for heads of hidden size >= 1024, where it
    measured faster on an H200 at every such shape and batch tried (FP8 8B 60/7/10 1.884 -> 1.747 ms; bf16 batch
    2-8 4-6%, batch 1 0.2-0.4%; two row tiles, batch 13-16: bf16 8B 8.48 -> 7.93 ms, FP8 10.38 -> 9.28; prefill
    level); small heads such as SmolLM2's, with their own narrow tiles, measured slower with it (60/7/10 0.443 ->
    0.474 ms, batch 16 1.424 -> 1.634) and keep whole tiles. ``True``: at every shape; ``False``: never (whole
    tiles, each over the full reduction).
    ``l2_prefetch``: chunks of its next weight phase each program asks L2 for while it waits at a grid barrier
    (sm_90 ``prefetch.global.L2``; the values are the same). ``None`` (the default): 2 at 128-row tiles (batch >= 7
    at top-k 10) of 4096-wide heads, where it measured faster on an H200 (60/7/10 batch 16: 8B bf16 7.98 -> 7.85 ms,
    FP8 9.06 -> 8.85, Qwen3-8B bf16 7.66 -> 7.54, FP8 8.65 -> 8.48; 8B batch 8 bf16 4.33 -> 4.24, FP8 5.06 -> 4.95);
    it measured slower at the 70B (bf16 25.28 -> 25.59, FP8 24.24 -> 24.87) and 1B-class shapes (bf16 4.82 -> 5.10,
    FP8 5.23 -> 5.31) and at batch 1 (8B bf16 1.940 -> 1.956, FP8 1.73 -> 1.92) and is off there; ``0``: never.
    ``token_qkv_table``: a tree step's input rows are draft tokens, so the embedding half of their q/k/v product,
    ``W_qkv[:, :H] @ RMSNorm(embedding)``, depends on the token alone: with the table it is computed once per
    draft-vocabulary token (:func:`token_qkv_table`, fp32 ``[draft_vocab, q + k + v features]``, built on the
    first launch and kept with the weights: like ``embed_rstd``, derived once, so a head changed in place later needs
    new weights), and the tree steps gather their rows instead of streaming that half
    of the weights (the root step still streams both halves). The same products in another summation order (each
    row's sum exact in fp64, rounded once to fp32). ``None`` (the default): wherever the table is no larger than
    the head's own weights (:attr:`head_weight_bytes`; 8B-class heads: a 786 MB table beside 1.9 GB of weights; the
    Llama-3.1-8B, Qwen3-8B, Llama-3.3-70B, 1B-class and SmolLM2 shapes all take it), measured faster at every
    shape, batch and weight type tried on an H200 (bench/results/session33_2026-11-28/; 60/7/10, 8B: bf16 batch 1
    1.942 -> 1.753 ms, batch 16 7.84 -> 7.18; FP8 batch 1 1.73 -> 1.57 with the hidden half early, batch 16 8.83 ->
    8.11; 70B batch 16 25.0 -> 21.4); ``True``: always; ``False``: never.
    ``block_m``: rows of a row tile (a power of two in 16..128; ``None``: the step's tree rows rounded up to a
    power of two, at most 128, and 16 under the interpreter).
    ``tail_row_tile``: where a step's tree rows need more than one row tile, the rows past the full tiles take a
    tile of their own power-of-two size instead of a full one (batch 16 of a top-10 tree: 128 + 32 rows instead of
    128 + 128; a padded row costs the products' arithmetic as a real one). On by default: 8B shape, 60/7/10, bf16
    on an H200, batch 16 7.110 / 7.085 -> 6.038 / 6.019 ms, batch 13 7.065 / 7.033 -> 5.768 / 5.757
    (bench/results/session38_2026-11-29/; FP8 batch 16 7.887 -> 6.446, batch 13 7.850 -> 5.857). The tail runs a
    smaller MMA tile (``mma.sync`` where the 128-row tile runs ``wgmma`` on sm_90): the same products, not always
    the same bits. Against the launch without it, bf16 weights gave identical outputs in four launches; FP8 weights
    changed some K/V rows (a root row among them) and trees then parted; fp32 differed by rounding (1e-4). The GPU
    tests compare trees with the reference as for any schedule: identical wherever the reference's decisions are
    separated (tests/fused/test_fused_drafter.py, ``two_row_tiles``).
    ``tail_one_pass``: the products that take the tail tile in one pass with the last full tile: each weight chunk,
    loaded once, feeds both products (two accumulators each), so those weights stream once per step instead of
    once per row tile (lm_head still takes the tail in a pass of its own: pairing it too measured flat, 8B bf16
    batch 16 5.661 -> 5.649 / 5.671 ms, its 128-row tiles bound by the in-loop top-k merge). ``True``: o_proj,
    gate/up and down; ``False``: none; a string names them, ``/``-separated (``"o/down"``; names: ``o``,
    ``gate_up``, ``down``); ``None``: the measured choice, o, gate/up and down with 16-bit weights (60/7/10, H200,
    batch 16: 8B 6.03 -> 5.65 ms, batch 13 5.77 -> 5.29; Qwen3-8B 5.77 -> 5.43; 70B 17.12 -> 15.59; 1B-class 3.54
    -> 3.46; bench/results/session39_2026-11-29/), none with FP8 weights (flat with every pairing tried: all three
    6.41 -> 6.42 at batch 16, 5.87 -> 5.82 at 13; o and down only; all three at 64-wide gate/up tiles). Bits: the
    same as the tail's own pass, bf16 and FP8 (GPU test). Needs ``tail_row_tile`` where it names a product.

    Shapes the kernel cannot run are refused here or in :meth:`launch_params`, before any launch, with the reason:
    head_dim not a power of two >= 16 (RoPE pairs features within one power-of-two tile), hidden size not a multiple
    of 16, a draft vocabulary beyond the 32-bit key index, ``lm_warp_rank=True`` where a program's lm_head tiles
    exceed the 16-bit index of its int32 keys, pipelined tiles beyond the shared-memory budget, a KV capacity that
    cannot hold the tree. (A grid that cannot be resident is refused after compilation, before the launch.)
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab: int
    feature_width: int
    vocab_size: int
    rms_eps: float
    has_d2t: bool
    top_k: int = 10
    depth: int = 7
    total_tokens: int = 60
    max_batch: int = 1
    max_len: int = 2048
    max_new_rows: int = 256
    dtype: torch.dtype = torch.bfloat16
    nprog: int | None = None
    nsplit: int | None = None
    block_n: int | None = None
    block_n_qkv: int | None = None
    block_n_mlp: int | None = None
    block_vocab: int | None = None
    block_k: int | None = None
    block_kv: int | None = None
    stages: int = 4
    num_warps: int | None = None
    lm_warp_rank: bool | None = None
    weight_dtype: torch.dtype | None = None
    attention_bias: bool = False
    hidden_half_early: bool | None = None
    stream_k_linear: bool | None = None
    l2_prefetch: int | None = None
    token_qkv_table: bool | None = None
    block_m: int | None = None
    tail_row_tile: bool = True
    tail_one_pass: bool | str | None = None

    def __post_init__(self):
        TreeConfig(self.total_tokens, self.depth, self.top_k)  # validates the tree shape
        if self.num_heads * self.head_dim <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a positive multiple of num_kv_heads "
                             f"{self.num_kv_heads}")
        if self.hidden_size % 16:
            raise ValueError(f"hidden_size {self.hidden_size} must be a multiple of 16 for the fused kernel")
        if self.head_dim & (self.head_dim - 1) or self.head_dim < 16:
            raise ValueError(f"head_dim {self.head_dim} must be a power of two >= 16 for the fused kernel")
        for name in ("block_n", "block_n_qkv"):
            bn = getattr(self, name)
            if bn is not None and (self.head_dim % bn or bn % 2 or bn < 16):
                raise ValueError(f"{name} {bn} must be even, >= 16 and divide head_dim {self.head_dim}")
        if self.block_m is not None and (self.block_m & (self.block_m - 1) or not 16 <= self.block_m <= 128):
            raise ValueError(f"block_m {self.block_m} must be a power of two in 16..128")
        if self.tail_one_pass_mask() and not self.tail_row_tile:
            raise ValueError("tail_one_pass needs tail_row_tile (there is no tail tile to take in one pass)")
        if self.block_n_mlp is not None and (self.block_n_mlp & (self.block_n_mlp - 1) or self.block_n_mlp < 16):
            raise ValueError(f"block_n_mlp {self.block_n_mlp} must be a power of two >= 16")
        if self.block_vocab is not None and (self.block_vocab & (self.block_vocab - 1)
                                             or self.block_vocab < max(16, self.kp)):
            raise ValueError(f"block_vocab {self.block_vocab} must be a power of two >= 16 and >= the padded "
                             f"top_k {self.kp}")
        if self.max_len < self.max_new_rows + self.depth * self.top_k:
            raise ValueError(f"max_len {self.max_len} cannot hold max_new_rows {self.max_new_rows} plus the "
                             f"{self.depth * self.top_k} tree rows")
        if self.draft_vocab < self.top_k:
            raise ValueError(f"draft vocabulary {self.draft_vocab} is smaller than top_k {self.top_k}")
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype must be float32, float16 or bfloat16, got {self.dtype}")
        if self.weight_dtype not in (None, self.dtype, _FP8):
            raise TypeError(f"weight_dtype must be None (the model dtype) or torch.float8_e4m3fn, got "
                            f"{self.weight_dtype}")
        if self.l2_prefetch is not None and self.l2_prefetch < 0:
            raise ValueError(f"l2_prefetch {self.l2_prefetch} must be >= 0 (chunks) or None (the default)")
        if self.draft_vocab > _MAX_VOCAB:
            raise ValueError(f"draft vocabulary {self.draft_vocab} exceeds the kernel's 32-bit ranking-key index "
                             f"({_MAX_VOCAB})")

    @classmethod
    def from_head(cls, head: DraftHead, tree_config: TreeConfig | None = None, **kw) -> DrafterConfig:
        """Shapes from an :class:`~eagle_triton.Eagle3DraftHead` (its dtype), tree from ``tree_config``."""
        if getattr(head, "kind", None) != "eagle3":
            raise ValueError(f"the fused drafter supports EAGLE-3 heads only, got kind {getattr(head, 'kind', None)!r}")
        tc = tree_config or TreeConfig()
        c = head.config
        kw.setdefault("dtype", head.dtype)
        kw.setdefault("weight_dtype", _FP8 if getattr(head, "is_fp8", False) else None)
        at = head.midlayer.self_attn
        kw.setdefault("attention_bias", any(m.bias is not None for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj)))
        return cls(hidden_size=c.hidden_size, num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                   head_dim=c.head_dim, intermediate_size=c.intermediate_size, draft_vocab=head.draft_vocab_size,
                   feature_width=head.feature_width, vocab_size=c.vocab_size, rms_eps=float(c.rms_norm_eps),
                   has_d2t=bool(head.has_vocab_map), top_k=tc.top_k, depth=tc.depth, total_tokens=tc.total_tokens,
                   **kw)

    def with_(self, **kw) -> DrafterConfig:
        return replace(self, **kw)

    # derived sizes
    @property
    def tree(self) -> TreeConfig:
        return TreeConfig(self.total_tokens, self.depth, self.top_k)

    @property
    def fp8(self) -> bool:
        """Whether the linear layers stream FP8 weights."""
        return self.weight_dtype == _FP8

    @property
    def kp(self) -> int:
        return max(2, _pow2(self.top_k))

    @property
    def num_candidates(self) -> int:
        return self.top_k + self.depth * self.top_k**2

    @property
    def token_table_bytes(self) -> int:
        """Bytes of the q/k/v table of :attr:`token_qkv_table` (fp32, a row per draft-vocabulary token)."""
        return 4 * self.draft_vocab * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def tail_one_pass_mask(self) -> int:
        """The products that take the tail tile in one pass with the last full tile (:attr:`tail_one_pass`), as the
        kernel's mask: 1 o_proj, 2 gate/up, 4 down."""
        top = self.tail_one_pass
        every = sum(_ONE_PASS_PRODUCTS.values())
        if top is None:
            return 0 if self.fp8 or not self.tail_row_tile else every
        if isinstance(top, int) and top in (0, 1):  # a bool (or a tuning string's 0 / 1)
            return every if top else 0
        if not isinstance(top, str):
            raise TypeError(f"tail_one_pass must be None, a bool or a '/'-separated string of products, got {top!r}")
        mask = 0
        for name in filter(None, top.split("/")):
            if name not in _ONE_PASS_PRODUCTS:
                raise ValueError(f"tail_one_pass names an unknown product {name!r} (known: "
                                 f"{', '.join(_ONE_PASS_PRODUCTS)})")
            mask |= _ONE_PASS_PRODUCTS[name]
        return mask

    def uses_token_table(self) -> bool:
        """Whether the tree steps read the embedding half of q/k/v from the table (:attr:`token_qkv_table`)."""
        if self.token_qkv_table is not None:
            return bool(self.token_qkv_table)
        return self.token_table_bytes <= self.head_weight_bytes

    def _linear_bytes(self, rows: int, weights: int) -> int:
        """Bytes of linear layers with ``rows`` output rows and ``weights`` weights: FP8 weights are one byte each
        plus an fp32 scale per output row."""
        return weights + 4 * rows if self.fp8 else weights * self.dtype.itemsize

    @property
    def fc_weight_bytes(self) -> int:
        """Bytes of fc (the root step streams it once per draft)."""
        return self._linear_bytes(self.hidden_size, self.hidden_size * self.feature_width)

    def step_weight_bytes(self, qkv_halves: int = 2) -> int:
        """Bytes of the midlayer and lm_head weights one forward streams; ``qkv_halves=1``: q/k/v's hidden half only
        (a tree step with the q/k/v table)."""
        H, QW, KVW = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        rows = (QW + 2 * KVW) + H + 2 * self.intermediate_size + H + self.draft_vocab
        weights = qkv_halves * H * (QW + 2 * KVW) + QW * H + 3 * H * self.intermediate_size + self.draft_vocab * H
        return self._linear_bytes(rows, weights)

    @property
    def head_weight_bytes(self) -> int:
        """Bytes of the head's weights: the linear layers (:attr:`fc_weight_bytes`, :meth:`step_weight_bytes`)
        and the embedding table."""
        emb = self.vocab_size * self.hidden_size * self.dtype.itemsize
        return self.fc_weight_bytes + self.step_weight_bytes() + emb

    def qkv_tiles(self, block_n: int) -> int:
        """Output tiles of q, k and v at tile width ``block_n`` (the kernel's QKV work units)."""
        return -(-self.num_heads * self.head_dim // block_n) + 2 * -(-self.num_kv_heads * self.head_dim // block_n)

    def resolved_nprog(self, device) -> int:
        if self.nprog is not None:
            return int(self.nprog)
        dev = torch.device(device)
        if dev.type == "cuda":
            return torch.cuda.get_device_properties(dev).multi_processor_count
        return 1

    def launch_params(self, device, batch: int, new_rows: int) -> dict:
        """Every constexpr of the kernel for this device (block sizes shrink under the interpreter)."""
        interp = torch.device(device).type != "cuda"
        nprog = self.resolved_nprog(device)
        K, H = self.top_k, self.hidden_size
        gq = self.num_heads // self.num_kv_heads
        mq = max(batch * K, batch)
        # 64 keys per attention block; 32 where a GQA group's query block has 128 rows or more (K x heads per KV
        # head, e.g. 8 at 70B): its [rows, keys] scores then spill at 64 (sm_90 build: 55 local loads and stores
        # against 26) and the 70B 60/7/10 draft takes 7.052 ms against 6.994 at 32 (Qwen3-8B's 64-row blocks: 2.355
        # against 2.360; bench/results/session29_2026-11-28/att_*.json)
        bq = max(16, _pow2(K * gq))
        bkv = self.block_kv or (16 if interp else 32 if bq >= 128 else 64)
        # one row tile holds every tree row of a step where it can (each extra tile re-streams the weights); the
        # tile does not depend on the new rows of the root step, so prompts of any length share one compiled kernel
        bm = self.block_m or (16 if interp else min(128, max(16, _pow2(mq))))
        # tail_row_tile: the tree rows past the full row tiles take a tile of their own power-of-two size (at batch
        # 16 of a top-10 tree, 160 rows: 128 + 32 instead of 128 + 128); the root step's rows take it where they fit
        bmt = 0
        if self.tail_row_tile and batch * K > bm and (batch * K) % bm:
            bmt = max(16, _pow2((batch * K) % bm))
            bmt = bmt if bmt < bm else 0
        # 128-wide vocabulary tiles: 2.74 -> 2.66 ms over 64 at batch 1 (gpu_2026-11-22d/profile_5_tunings.log)
        bnv = self.block_vocab or (max(16, self.kp) if interp else max(128, self.kp))
        # Weight tiles of 64 rows (bench/results/probe_stream_gemv_h100.json: 16-row tiles cap one SM near 1.6 TB/s
        # of the whole GPU, 32-64 rows reach 2.0-2.6); RoPE pairs features within a head, so bn | head_dim. 32-row
        # tiles for fc/o/down (128 tiles on 132 SMs instead of 64) measured no faster: those phases are bound by
        # the whole GPU's bandwidth, not by the idle SMs. 8 warps: batch 1 3.41 -> 3.01 ms over 4 warps
        # (gpu_2026-11-22d/profile_1_baseline_warps.log).
        # Small heads (SmolLM2: H 576, intermediate 1536) have too few 64-wide tiles to spread over the SMs (9 for
        # fc/o/down, 24 for gate/up): a phase then lasts as long as one program's serial K loop. 16-wide fc/o/down
        # tiles, 32-wide gate/up tiles and 128-wide reduction chunks: SmolLM2 16/3/4 draft 0.200 -> 0.186 ms
        # (bench/results/session15_2026-11-27/s15_smollm2_tiles.json).
        small = not interp and H < 1024
        bn = self.block_n or (16 if interp or small else min(64, self.head_dim))
        # q/k/v tiles of 128 features (a whole head) for up to 32 rows: the inline RMSNorm of a chunk is shared by
        # twice the weight bytes, as in gate/up (two 64-wide tiles) and lm_head (128-wide tiles); q/k/v 51 -> 43 us
        # per step at batch 1 (docs/fused_drafter.md, levers table). 64 features for more rows (8.4 -> 8.8 ms at batch
        # 16 with 128) and for the 128-row root tiles of long prompts (BNQR).
        bnq = self.block_n_qkv or (16 if interp else min(128 if bm <= 32 else 64, self.head_dim))
        bnqr = self.block_n_qkv or (16 if interp else min(64, self.head_dim))
        # gate/up: 64-wide tiles (each a gate and an up tile); 128-wide with FP8 weights at heads >= 4096 wide, where
        # a converted chunk's activation fragments then serve twice the columns per warp (H200, 60/7/10,
        # bench/results/session35_2026-11-28/gu128/: 8B batch 1 1.551 / 1.544 -> 1.519 / 1.520 ms, batch 2 2.495 ->
        # 2.384, batch 4 3.535 -> 3.266, batch 8 4.615 -> 4.514, batch 16 level; Qwen3-8B 1.478 -> 1.454; 70B 3.84 ->
        # 3.73; bf16 slower: 8B 1.767 -> 1.814); the 2048-wide 1B-class head slower with it (0.889 -> 0.950)
        bng = self.block_n_mlp or (16 if interp else 32 if small else 128 if self.fp8 and H >= 4096 else 64)
        warps = self.num_warps or (4 if interp else 8)
        elem = self.dtype.itemsize
        welem = 1 if self.fp8 else elem  # FP8 weights: one byte per weight in the pipeline buffers

        def smem(bk: int, width: int, rows: int, we: int = welem) -> int:  # a pipelined loop's activation + weight
            return self.stages * bk * (elem * rows + we * width + elem)  # buffers

        def fit(bk: int, width: int, rows: int = bm, pick: int = welem) -> int:  # the pipelined K loop's tiles
            if not interp:  # must fit in smem: the chunk that fits with ``pick`` bytes per weight (default: the real
                # size, FP8 one byte), checked with the real size
                budget = _SMEM_BUDGET_FP8 if pick == 1 else _SMEM_BUDGET
                while bk > 32 and smem(bk, width, rows, pick) > budget:
                    bk //= 2
                if smem(bk, width, rows) > budget:
                    raise ValueError(f"a {rows}-row x {width}-wide product tile needs {smem(bk, width, rows)} bytes "
                                     f"of pipeline buffers at the smallest reduction chunk ({bk}), over the "
                                     f"{budget}-byte shared-memory budget: use fewer stages or narrower tiles")
            return bk

        def chunk(width: int, rows: int = bm, weight_bytes: int = welem) -> int:  # a product's reduction chunk:
            # block_k, or the largest that fits with ``weight_bytes`` per weight (checked with the real size)
            # 128-deep chunks with FP8 weights (H200, bench/results/session30_2026-11-28/defaults/bk128_*, block_k=128
            # against the 256 / 128 / 64 chosen as for bf16): 60/7/10 8B 1.741 -> 1.726 ms, Qwen3-8B 1.664 -> 1.650,
            # 70B 4.171 -> 4.152, the 1B-class head 1.057 -> 0.968, batch 4 3.77 -> 3.67; at 128-row tiles too since
            # the FP8 budget (_SMEM_BUDGET_FP8) holds lm_head's and gate/up's 128-deep buffers; bf16 level (1.964
            # either way), so it keeps 256 where that fits
            start = 32 if interp else 128 if small or weight_bytes == 1 else 256
            return min(self.block_k or fit(start, width, rows, weight_bytes), _pow2(H))

        def bkq_of(bk_: int) -> int:  # the q/k/v reduction chunk divides H: chunks split the 2H input at H
            while H % bk_:
                bk_ //= 2
            return bk_

        # the root step of a prompt longer than bm rows: 128-row tiles for fc and q/k/v (32 under the interpreter),
        # their chunks chosen as for 16-bit weights whatever the weights (64 at 128 rows): FP8's 128 there makes the
        # root q/k/v spill (sm_90 build, 8B: 47 local loads and stores against none) and was not measured
        bmr = max(bm, 32 if interp else 128)
        # tail_one_pass: a paired product holds the tail's activation chunks beside the full tile's (fc's chunk
        # shares o's and down's bkl)
        tp1 = self.tail_one_pass_mask() if bmt else 0
        pairs = {name for name, bit in _ONE_PASS_PRODUCTS.items() if tp1 & bit}
        rows_l = bm + (bmt if pairs & {"o", "down"} else 0)
        rows_g = bm + (bmt if "gate_up" in pairs else 0)
        bk, bkg, bkl, bkr = chunk(bnv), chunk(2 * bng, rows_g), chunk(bn, rows_l), chunk(bn, bmr, elem)
        bkq, bkqr = bkq_of(chunk(bnq)), bkq_of(chunk(bnqr, bmr, elem))
        nth = -(-H // bn)
        # the hidden half early (hidden_half_early): programs hq_p0.. have no RM or SEL unit (the tree rows fit one
        # row tile: RM's units are rows, SEL's sequences); one program (the interpreter) does it after its SEL; on
        # only where at least half the programs are left for it (at 128-row tiles only 4 of 132 would be)
        hq_p0 = min(nprog - 1, bm)
        # None: where it measured faster (bench/results/session27_2026-11-28: batch 1 -34 to -42 us per 60/7/10
        # draft at the 8B and Qwen3-8B shapes, -21 at 70B; slower at batch 2-6 (8B +26 to +202 us, 70B up to +540)
        # and with FP8 weights (+39); flat at SmolLM2's head). With the q/k/v table the next q/k/v streams nothing
        # then, and it measured faster at batch 1 and 2, FP8 too, slower at 4 (session33_2026-11-28/tq*, tqb*)
        tq = self.uses_token_table()
        if self.hidden_half_early is None:
            want = not small and ((batch == 1 and not self.fp8) or (tq and batch <= 2))
        else:
            want = self.hidden_half_early
        hq = bool(want) and mq <= bm and nprog - hq_p0 >= nprog // 2
        # the most programs sharing one stream-K q/k/v tile at any chunking (sizes the partial-sum buffer)
        # (a power of two: the owner polls the flags of all parts of a tile as one vector)
        nseg = _pow2(max(streamk_max_sharing(self.qkv_tiles(bnq), 2 * H // bkq, nprog),
                         streamk_max_sharing(self.qkv_tiles(bnqr), 2 * H // bkqr, nprog),
                         streamk_max_sharing(self.qkv_tiles(bnq), H // bkq, nprog) if hq or tq else 1))
        nsegh = _pow2(streamk_max_sharing(self.qkv_tiles(bnq), H // bkq, nprog - hq_p0)) if hq else 1
        # fc, o, gate/up and down stream-K by default for heads >= 1024 wide, every row tile with its own part /
        # flag region: whole tiles leave SMs idle (down and o: 64 tiles on 132 SMs) or unevenly loaded (gate/up:
        # 224 tiles), and with FP8 weights each program's K loop, not the GPU's bandwidth, bounds a product (the
        # measured figures: the class docstring, stream_k_linear). NSEGL: the most programs sharing one of their
        # tiles (a power of two, as NSEG).
        skl = (not small) if self.stream_k_linear is None else bool(self.stream_k_linear)
        nsegl = 1
        if skl:
            sharing = [streamk_max_sharing(nth, cdiv(kdim, bkl), nprog)
                       for kdim in (self.feature_width, self.num_heads * self.head_dim, self.intermediate_size)]
            nsegl = _pow2(max(*sharing, streamk_max_sharing(cdiv(self.intermediate_size, bng), cdiv(H, bkg), nprog)))
        nsplit = self.nsplit or (2 if interp else max(1, min(32, _pow2(max(1, nprog // (batch * self.num_kv_heads))) )))
        nsplit = _pow2(nsplit)
        npp = _pow2(nprog)
        # int32 keys of a program's lm_head tiles (16-bit dtypes, ranked by warps) index its tiles in 16 bits
        key_rows = cdiv(cdiv(self.draft_vocab, bnv), nprog) * bnv
        lmw_fits = self.dtype.itemsize != 2 or key_rows <= _TILE_KEY_ROWS
        if self.lm_warp_rank and not lmw_fits:
            raise ValueError(f"lm_warp_rank=True: a program holds {key_rows} vocabulary rows of the draft vocabulary "
                             f"{self.draft_vocab} ({nprog} programs, {bnv}-wide tiles), beyond the 16-bit index of "
                             f"its int32 tile keys ({_TILE_KEY_ROWS}); use more programs or lm_warp_rank=None")
        # by default ranked by warps at row tiles of <= 64 rows, and at every row tile with FP8 weights (measured:
        # class docstring); 16-bit weights at 128-row tiles merge inside the loop
        lmw = ((bm <= 64 or self.fp8) and lmw_fits) if self.lm_warp_rank is None else bool(self.lm_warp_rank)
        # L2 prefetch (l2_prefetch, measured figures in the class docstring): by default 2 chunks at 128-row tiles
        # of 4096-wide heads on sm_90 and newer (the compile-only build for sm_90 sees no GPU); the interpreter has
        # no L2 to warm
        sm90 = not torch.cuda.is_available() or torch.cuda.get_device_capability(torch.device(device))[0] >= 9
        if self.l2_prefetch and not interp and not sm90:
            raise ValueError(f"l2_prefetch needs an sm_90 or newer GPU, got "
                             f"{torch.cuda.get_device_name(torch.device(device))}")
        if interp:
            pf = 0
        elif self.l2_prefetch is None:
            pf = 2 if sm90 and bm >= 128 and H == 4096 else 0
        else:
            pf = int(self.l2_prefetch)
        # RM ranks int32 keys where a 16-bit value and the draft-vocabulary row fit them (_rm_phase)
        rm32 = self.dtype.itemsize == 2 and self.draft_vocab <= 65536
        return dict(
            H=H, W=self.feature_width, NH=self.num_heads, NKV=self.num_kv_heads, HD=self.head_dim,
            INTER=self.intermediate_size, VD=self.draft_vocab, HAS_D2T=self.has_d2t,
            K=K, KP=self.kp, D=self.depth, T=self.total_tokens - 1, TP=_pow2(self.total_tokens),
            NCP=_pow2(self.num_candidates), CP=_pow2(self.depth + 2),
            NPROG=nprog, NPP=npp, NSPLIT=nsplit,
            BM=bm, BN=bn, BNQ=bnq, BNQR=bnqr, BNG=bng, BNV=bnv, BKL=bkl, BKG=bkg, BK=bk, num_warps=warps, BKV=bkv,
            BQ=bq, NTH=nth, NTHP=_pow2(nth), BKQ=bkq, NSEG=nseg, BMR=bmr, BKR=bkr, BKQR=bkqr,
            IEEE=self.dtype == torch.float32, STAGES=1 if interp else self.stages,
            LMW=lmw, W8=self.fp8, HAS_BIAS=bool(self.attention_bias), HQ=hq, HQ_P0=hq_p0 if hq else 0, NSEGH=nsegh,
            SKL=skl, NSEGL=nsegl, PF=pf, TQ=tq, RM32=rm32, BMT=bmt,
            TP1=tp1,
        )


def streamk_range(pid: int, total: int, nprog: int) -> tuple[int, int]:
    """Program ``pid``'s chunks ``[lo, hi)`` of a stream-K product with ``total`` (tile, chunk) pairs (the kernel's
    schedule)."""
    return pid * total // nprog, (pid + 1) * total // nprog


def streamk_owner(g: int, total: int, nprog: int) -> int:
    """The program whose stream-K range holds chunk ``g`` (the kernel's ``_streamk_owner``)."""
    return ((g + 1) * nprog - 1) // total


def streamk_max_sharing(n_tiles: int, chunks: int, nprog: int) -> int:
    """The most programs whose stream-K ranges share one tile of ``chunks`` chunks."""
    total = n_tiles * chunks
    return max(streamk_owner(t * chunks + chunks - 1, total, nprog) - streamk_owner(t * chunks, total, nprog) + 1
               for t in range(n_tiles))


# ------------------------------------------------------------------------------------------------ weights
@dataclass
class FusedDrafterWeights:
    """The head's tensors in the layout the kernel reads (all contiguous, on one device).

    ``cos``/``sin`` are the head's fp32 RoPE tables ``[P, head_dim]`` (the kernel rounds them to the model dtype
    as the reference does). ``embed_rstd`` is fp32 ``[vocab]``: the input RMSNorm's ``rsqrt(mean(x**2) + eps)``
    of every embedding row, computed once here (the kernel then reads one number per row instead of the row).
    ``head`` keeps the module for the reference path. ``qkv_table``: the fp32 q/k/v table of
    :attr:`DrafterConfig.token_qkv_table` once a launch built it (:func:`token_qkv_table`), else ``None``.
    ``wsc``: with FP8 weights (fc ... lm_head then ``float8_e4m3fn``) the fp32 per-output-channel scales of the
    matrices concatenated in the order of :attr:`SCALED` (:meth:`scale` gives one matrix's); ``wb``: the q, k, v
    and o_proj biases concatenated (model dtype, zeros for a layer without one; :meth:`bias`). A one-element
    placeholder each where unused.
    """

    SCALED = ("fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head")
    BIASED = ("wq", "wk", "wv", "wo")

    fc: torch.Tensor
    embed: torch.Tensor
    input_norm: torch.Tensor
    hidden_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    post_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    d2t: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    embed_rstd: torch.Tensor
    head: DraftHead | None = None
    qkv_norm: torch.Tensor | None = None  # input_norm ++ hidden_norm (derived)
    wsc: torch.Tensor | None = None
    wb: torch.Tensor | None = None
    qkv_table: torch.Tensor | None = None

    def __post_init__(self):
        if self.qkv_norm is None:
            self.qkv_norm = torch.cat([self.input_norm, self.hidden_norm]).contiguous()
        if self.wsc is None:
            self.wsc = torch.ones(1, dtype=torch.float32, device=self.fc.device)
        if self.wb is None:
            self.wb = torch.zeros(1, dtype=self.input_norm.dtype, device=self.fc.device)

    @property
    def fp8(self) -> bool:
        return self.fc.dtype == _FP8

    @property
    def has_bias(self) -> bool:
        return self.wb.numel() > 1

    def _slice(self, packed: torch.Tensor, order, name: str) -> torch.Tensor:
        off = 0
        for n in order:
            rows = getattr(self, n).shape[0]
            if n == name:
                return packed[off:off + rows]
            off += rows
        raise KeyError(name)

    def scale(self, name: str) -> torch.Tensor | None:
        """fp32 per-output-channel scales of FP8 matrix ``name`` (e.g. ``"wq"``), or ``None`` without FP8."""
        return self._slice(self.wsc, self.SCALED, name) if self.fp8 else None

    def bias(self, name: str) -> torch.Tensor | None:
        """The bias of ``"wq"``, ``"wk"``, ``"wv"`` or ``"wo"`` (zeros where the layer has none), or ``None`` when
        the head has no attention bias."""
        return self._slice(self.wb, self.BIASED, name) if self.has_bias else None

    @classmethod
    def from_head(cls, head: DraftHead, max_positions: int) -> Weights:
        if getattr(head, "kind", None) != "eagle3":
            raise ValueError("Weights.from_head: the fused drafter supports EAGLE-3 heads only")
        m = head.midlayer
        rot = m.self_attn.rotary_emb
        rot.ensure_length(max_positions)
        c = lambda t: t.detach().contiguous()  # noqa: E731
        d2t = head.d2t if head.has_vocab_map else torch.zeros(1, dtype=torch.long, device=head.device)
        emb = head.embed_tokens.weight.detach()
        emb_rstd = torch.cat([torch.rsqrt(e.float().pow(2).mean(-1) + m.input_layernorm.eps)
                              for e in emb.split(16384)])  # in slices: no fp32 copy of the whole table
        at, mlp = m.self_attn, m.mlp
        lins = (head.fc, at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                head.lm_head)
        fp8 = getattr(head, "is_fp8", False)
        if fp8 and not all(hasattr(lin, "weight_scale") for lin in lins):
            raise ValueError("Weights.from_head: every linear layer of an FP8 head must be FP8 (quantize_fp8())")
        wsc = torch.cat([lin.weight_scale.float() for lin in lins]).contiguous() if fp8 else None
        qkvo = (at.q_proj, at.k_proj, at.v_proj, at.o_proj)
        wb = None
        if any(lin.bias is not None for lin in qkvo):
            wb = torch.cat([lin.bias.detach() if lin.bias is not None else
                            torch.zeros(lin.out_features, dtype=emb.dtype, device=emb.device) for lin in qkvo])
            wb = wb.to(emb.dtype).contiguous()
        return cls(
            fc=c(head.fc.weight), embed=c(head.embed_tokens.weight), input_norm=c(m.input_layernorm.weight),
            hidden_norm=c(m.hidden_norm.weight), wq=c(m.self_attn.q_proj.weight), wk=c(m.self_attn.k_proj.weight),
            wv=c(m.self_attn.v_proj.weight), wo=c(m.self_attn.o_proj.weight),
            post_norm=c(m.post_attention_layernorm.weight), w_gate=c(m.mlp.gate_proj.weight),
            w_up=c(m.mlp.up_proj.weight), w_down=c(m.mlp.down_proj.weight), final_norm=c(head.norm.weight),
            lm_head=c(head.lm_head.weight), d2t=c(d2t.long()),
            cos=c(rot.cos_cached[:max_positions].float()), sin=c(rot.sin_cached[:max_positions].float()),
            embed_rstd=emb_rstd.contiguous(), head=head, wsc=wsc, wb=wb,
        )

    def tensors(self):
        return [getattr(self, f.name) for f in fields(self)
                if f.name not in ("head", "qkv_norm", "wsc", "wb", "qkv_table")]

    def check(self, cfg: DrafterConfig) -> None:
        H, W, INTER, V = cfg.hidden_size, cfg.feature_width, cfg.intermediate_size, cfg.draft_vocab
        QW, KVW = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        want = dict(fc=(H, W), embed=(cfg.vocab_size, H), input_norm=(H,), hidden_norm=(H,), wq=(QW, 2 * H),
                    wk=(KVW, 2 * H), wv=(KVW, 2 * H), wo=(H, QW), post_norm=(H,), w_gate=(INTER, H), w_up=(INTER, H),
                    w_down=(H, INTER), final_norm=(H,), lm_head=(V, H), qkv_norm=(2 * H,))
        dev = self.fc.device
        wdt = _FP8 if cfg.fp8 else cfg.dtype
        for name, shape in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ValueError(f"weights.{name} has shape {list(t.shape)}, expected {list(shape)}")
            want_dt = wdt if name in self.SCALED else cfg.dtype
            if t.dtype != want_dt:
                raise TypeError(f"weights.{name} has dtype {t.dtype}, the drafter config says {want_dt}")
            if t.device != dev or not t.is_contiguous():
                raise ValueError(f"weights.{name} must be contiguous on {dev}")
        if (tuple(self.embed_rstd.shape) != (cfg.vocab_size,) or self.embed_rstd.dtype != torch.float32
                or self.embed_rstd.device != dev):
            raise ValueError(f"weights.embed_rstd must be float32 [{cfg.vocab_size}] on {dev}, got "
                             f"{self.embed_rstd.dtype} {list(self.embed_rstd.shape)} on {self.embed_rstd.device}")
        n_sc = 2 * H + QW + 2 * KVW + 2 * INTER + H + V
        if cfg.fp8 and (tuple(self.wsc.shape) != (n_sc,) or self.wsc.dtype != torch.float32 or self.wsc.device != dev):
            raise ValueError(f"weights.wsc must hold the {n_sc} fp32 scales of the FP8 matrices on {dev}, got "
                             f"{self.wsc.dtype} {list(self.wsc.shape)} on {self.wsc.device}")
        if cfg.attention_bias and (tuple(self.wb.shape) != (QW + 2 * KVW + H,) or self.wb.dtype != cfg.dtype
                                   or self.wb.device != dev):
            raise ValueError(f"weights.wb must hold the {QW + 2 * KVW + H} q/k/v/o biases ({cfg.dtype}) on {dev}, "
                             f"got {self.wb.dtype} {list(self.wb.shape)} on {self.wb.device}")
        if self.has_bias != bool(cfg.attention_bias):
            raise ValueError(f"the weights {'have' if self.has_bias else 'lack'} attention biases but the drafter "
                             f"config says attention_bias={cfg.attention_bias}")
        if cfg.has_d2t and tuple(self.d2t.shape) != (V,):
            raise ValueError(f"weights.d2t has shape {list(self.d2t.shape)}, expected [{V}]")
        tab = self.qkv_table
        if tab is not None and (tuple(tab.shape) != (V, QW + 2 * KVW) or tab.dtype != torch.float32
                                or tab.device != dev or not tab.is_contiguous()):
            raise ValueError(f"weights.qkv_table must be contiguous float32 [{V}, {QW + 2 * KVW}] on {dev}, got "
                             f"{tab.dtype} {list(tab.shape)} on {tab.device}")
        if self.cos.shape[0] < cfg.max_len + cfg.depth + 1 or self.cos.shape[1] != cfg.head_dim:
            raise ValueError(f"RoPE tables {list(self.cos.shape)} must cover max_len + depth + 1 = "
                             f"{cfg.max_len + cfg.depth + 1} positions of head_dim {cfg.head_dim}")


def token_qkv_table(cfg: DrafterConfig, weights: Weights, rows_per_slice: int = 2048) -> torch.Tensor:
    """The embedding half of q/k/v for every draft-vocabulary token (:attr:`DrafterConfig.token_qkv_table`):
    fp32 ``[draft_vocab, q + k + v features]``, row ``v`` = ``W[:, :H] @ xn(v)`` over the q, k and v matrices
    (FP8: the e4m3 values, unscaled; the kernel's epilogue scales the whole sum), where ``xn(v)`` is the
    input-normalised embedding row of ``v``'s target token rounded as the kernel rounds it (the row times its
    ``embed_rstd`` in the model dtype, times the norm weight, in the model dtype). Each sum is computed in fp64 and
    rounded once; slices of ``rows_per_slice`` tokens bound the fp64 temporaries."""
    H, V, dt = cfg.hidden_size, cfg.draft_vocab, cfg.dtype
    w = weights
    dev = w.fc.device
    w_e = torch.cat([w.wq[:, :H].float(), w.wk[:, :H].float(), w.wv[:, :H].float()]).double()
    g = w.input_norm.float()
    out = torch.empty(V, w_e.shape[0], dtype=torch.float32, device=dev)
    for lo in range(0, V, rows_per_slice):
        v = torch.arange(lo, min(V, lo + rows_per_slice), device=dev)
        tok = v + w.d2t[v] if cfg.has_d2t else v
        x = w.embed[tok].float() * w.embed_rstd[tok][:, None]
        xn = (g * x.to(dt).float()).to(dt)
        out[lo:lo + len(v)] = (xn.double() @ w_e.T).float()
    return out


def _table_for(cfg: DrafterConfig, weights: Weights) -> torch.Tensor:
    """``weights.qkv_table``, built on first use (never inside a CUDA-graph capture: it allocates and computes)."""
    if weights.qkv_table is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the fused drafter's q/k/v table (DrafterConfig.token_qkv_table) is built on the first "
                               "launch: launch once before capturing a CUDA graph")
        weights.qkv_table = token_qkv_table(cfg, weights)
    return weights.qkv_table


# ------------------------------------------------------------------------------------------------ buffers
@dataclass
class FusedDrafterBuffers:
    """Preallocated device memory of one drafter: the persistent draft KV and every scratch/output buffer.

    ``k_cache``/``v_cache``: ``[B, max_len, nkv, hd]`` post-RoPE rows (accepted rows first, then scratch tree
    rows); ``kv_len``: ``[B]`` int32 rows held per sequence (advanced on device by each draft). Outputs of the last
    draft: ``draft_tokens [B, T+1]``, ``retrieve [B, T, D+2]`` (-1 padded), ``tree_mask [B, 1, T+1, T+1]``,
    ``positions [B, T+1]``, ``parents [B, T+1]``, ``num_leaves [B]``, ``max_depth [B]``. ``status[0]`` becomes
    1 if a draft ran out of KV capacity (rows past ``max_len`` were dropped), 2 if ``num_new`` named more new rows
    than the features held (the kernel cannot raise without a host sync; :func:`launch_drafter_ref` raises).
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_len: torch.Tensor
    scratch: dict = field(default_factory=dict)
    draft_tokens: torch.Tensor | None = None
    retrieve: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    num_leaves: torch.Tensor | None = None
    max_depth: torch.Tensor | None = None
    barrier: torch.Tensor | None = None
    status: torch.Tensor | None = None
    profile: torch.Tensor | None = None
    batch: int = 1
    new_rows: int = 1
    nprog: int = 1

    @classmethod
    def allocate(cls, cfg: DrafterConfig, device, batch: int | None = None, new_rows: int | None = None,
                 kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> Buffers:
        """Buffers for ``batch`` sequences (default ``cfg.max_batch``) and ``new_rows`` rows per draft (default
        ``cfg.max_new_rows``). ``kv``: ``(k_cache, v_cache, kv_len)`` to use as the draft KV instead of new ones
        (``[batch, cfg.max_len, nkv, hd]`` contiguous, ``[batch]`` int32): buffer sets of several batch sizes can
        share the first rows of one draft KV."""
        B = cfg.max_batch if batch is None else int(batch)
        S = cfg.max_new_rows if new_rows is None else int(new_rows)
        if not 1 <= B <= cfg.max_batch:
            raise ValueError(f"batch {B} outside 1..max_batch={cfg.max_batch}")
        if not 1 <= S <= cfg.max_new_rows:
            raise ValueError(f"new_rows {S} outside 1..max_new_rows={cfg.max_new_rows}")
        dev = torch.device(device)
        p = cfg.launch_params(dev, B, S)
        dt = cfg.dtype
        H, K, D, T = cfg.hidden_size, cfg.top_k, cfg.depth, cfg.total_tokens - 1
        KP, NCP, NPP, NSPLIT, NTH = p["KP"], p["NCP"], p["NPP"], p["NSPLIT"], p["NTH"]
        QW = cfg.num_heads * cfg.head_dim
        # partial sums and flags of the stream-K q/k/v, at the tree-row tiling or the long-prompt root tiling
        n_part = p["NSEG"] * max(cfg.qkv_tiles(p["BNQ"]) * p["BM"] * p["BNQ"],
                                 cfg.qkv_tiles(p["BNQR"]) * p["BMR"] * p["BNQR"])
        n_flag = p["NSEG"] * max(cfg.qkv_tiles(p["BNQ"]), cfg.qkv_tiles(p["BNQR"]))
        if p["SKL"]:  # and of the stream-K fc, o, down (NTH tiles) and gate/up (gate's parts, then up's), a region
            # per row tile of the tree rows (the most rows o, gate/up and down take)
            n_gu, n_mc = cdiv(cfg.intermediate_size, p["BNG"]), cdiv(B * K, p["BM"])
            n_part = max(n_part, n_mc * p["NSEGL"] * p["BM"] * max(NTH * p["BN"], 2 * n_gu * p["BNG"]))
            n_flag = max(n_flag, n_mc * p["NSEGL"] * max(NTH, 2 * n_gu))
        mcap = max(B * S, B * K)
        mq = B * K
        lm_tiles = cdiv(cdiv(cfg.draft_vocab, p["BNV"]), p["NPROG"])  # the most vocabulary tiles of a program
        e = lambda *s, dtype=dt: torch.empty(*s, dtype=dtype, device=dev)  # noqa: E731
        z = lambda *s, dtype=torch.int32: torch.zeros(*s, dtype=dtype, device=dev)  # noqa: E731
        scratch = dict(
            hbuf=e(2, mcap, H), hss=e(2, mcap, NTH, dtype=torch.float32), qbuf=e(mcap, QW),
            part=e(n_part, dtype=torch.float32), flag=z(n_flag),
            # the hidden half of the next q/k/v, one part per (tile, program holding chunks of it)
            hq_part=e(cfg.qkv_tiles(p["BNQ"]) * p["NSEGH"] * p["BM"] * p["BNQ"] if p["HQ"] else 1,
                      dtype=torch.float32),
            att_o=e(mq * cfg.num_heads * NSPLIT, cfg.head_dim, dtype=torch.float32),
            att_ml=e(mq * cfg.num_heads * NSPLIT * 2, dtype=torch.float32), attn=e(mq, QW), h1=e(mq, H),
            h1ss=e(mq, NTH, dtype=torch.float32),
            act=e(mq, cfg.intermediate_size), lm_key=e(mq * NPP * KP, dtype=torch.int64),
            lm_ms=e(mq * NPP * 2, dtype=torch.float32),
            # per program: the keys of its lm_head tiles, [tiles, BM, BNV] (int32 keys for 16-bit dtypes; only
            # when they are ranked after the product loop)
            lm_scr=e(p["NPROG"] * lm_tiles * p["BM"] * p["BNV"] if p["LMW"] else 1,
                     dtype=torch.int32 if p["LMW"] and dt.itemsize == 2 else torch.int64),
            ch_lp=e(mq, KP, dtype=torch.float32),
            ch_id=z(mq, KP), tok_in=z(mq, dtype=torch.int64), src=z(mq), sc=z(B, KP, dtype=torch.float32),
            fr=z(B, KP), anc=z(2, B, KP, D + 1), cand_sc=z(B, NCP, dtype=torch.float32),
            cand_tok=z(B, NCP, dtype=torch.int64), par_list=z(B, 1 + D * K),
        )
        kvshape = (B, cfg.max_len, cfg.num_kv_heads, cfg.head_dim)
        if kv is None:
            kv = (torch.zeros(kvshape, dtype=dt, device=dev), torch.zeros(kvshape, dtype=dt, device=dev), z(B))
        elif (tuple(kv[0].shape) != kvshape or tuple(kv[1].shape) != kvshape or not kv[0].is_contiguous()
              or not kv[1].is_contiguous() or tuple(kv[2].shape) != (B,) or kv[2].dtype != torch.int32):
            raise ValueError(f"kv must be contiguous k/v caches {list(kvshape)} and int32 kv_len [{B}], got "
                             f"{[list(t.shape) for t in kv]}")
        # the outputs a host reads after a draft share one allocation, so that one device->host copy moves them
        # (integrations.safeailab reads the batch-1 tree's leaf count, depth, retrieve indices and mask)
        num_leaves, max_depth, retrieve, tree_mask = _zeros_in_one_allocation(
            dev, ((B,), torch.int64), ((B,), torch.int64), ((B, T, D + 2), torch.int64),
            ((B, 1, T + 1, T + 1), torch.float32))
        return cls(
            k_cache=kv[0], v_cache=kv[1], kv_len=kv[2], scratch=scratch,
            draft_tokens=z(B, T + 1, dtype=torch.int64), retrieve=retrieve,
            tree_mask=tree_mask, positions=z(B, T + 1, dtype=torch.int64),
            parents=z(B, T + 1, dtype=torch.int64), num_leaves=num_leaves,
            max_depth=max_depth, barrier=z(2), status=z(1),
            profile=z(p["NPROG"], PROFILE_SLOTS, dtype=torch.int64), batch=B, new_rows=S, nprog=p["NPROG"],
        )

    def reset(self) -> None:
        """Forget every sequence's draft KV (start of a generation) and clear the control words."""
        self.kv_len.zero_()
        self.barrier.zero_()
        self.status.zero_()
        self.scratch["flag"].zero_()


def _zeros_in_one_allocation(device, *specs: tuple[tuple[int, ...], torch.dtype]) -> list[torch.Tensor]:
    """Zeroed contiguous tensors of ``specs`` (``(shape, dtype)`` each), one after another in a single allocation,
    each at a 16-byte boundary (the pointer alignment Triton specializes kernels on)."""
    offsets, end = [], 0
    for shape, dtype in specs:
        end = -(-end // 16) * 16
        offsets.append(end)
        end += math.prod(shape) * dtype.itemsize
    block = torch.zeros(end, dtype=torch.uint8, device=device)
    return [block[o:o + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for o, (shape, dtype) in zip(offsets, specs, strict=True)]


# ------------------------------------------------------------------------------------------------ I/O types
@dataclass
class DraftInputs:
    """One draft's inputs for ``B`` sequences.

    features: ``[B, S, W]`` target features of the rows not yet in the draft KV (padded to ``S``).
    input_ids: ``[B, S]`` int64 token paired with each row (row ``j`` pairs feature ``j`` with token ``j + 1`` of
        the sequence); the last valid entry of each row, ``input_ids[b, num_new[b] - 1]``, is the root token.
    num_new: ``[B]`` int32 valid rows per sequence on the device, or ``None`` for ``S`` everywhere.
    """

    features: torch.Tensor
    input_ids: torch.Tensor
    num_new: torch.Tensor | None = None


# The old, generic names of FusedDrafterWeights and FusedDrafterBuffers, kept for callers.
Weights = FusedDrafterWeights
Buffers = FusedDrafterBuffers


class DraftOutput(tuple):
    """``(draft_tokens, retrieve_indices, tree_mask, tree_position_ids)`` plus ``.fallback`` (True when the
    PyTorch reference ran instead of the kernel), ``.reason`` and ``.buffers`` (parents, leaf counts)."""

    def __new__(cls, items, fallback: bool = False, reason: str = "", buffers: Buffers | None = None):
        obj = super().__new__(cls, items)
        obj.fallback = fallback
        obj.reason = reason
        obj.buffers = buffers
        return obj

    draft_tokens = property(lambda self: self[0])
    retrieve_indices = property(lambda self: self[1])
    tree_mask = property(lambda self: self[2])
    tree_position_ids = property(lambda self: self[3])


def _as_inputs(X) -> DraftInputs:
    if isinstance(X, DraftInputs):
        return X
    if isinstance(X, (tuple, list)) and len(X) in (2, 3):
        return DraftInputs(*X)
    raise TypeError("X must be DraftInputs(features, input_ids, num_new) or a (features, input_ids[, num_new]) tuple")


def _check_launch(cfg: DrafterConfig, X: DraftInputs, weights: Weights, bufs: Buffers) -> torch.Tensor:
    f, ids = X.features, X.input_ids
    if f.dim() != 3 or f.shape[-1] != cfg.feature_width:
        raise ValueError(f"features must be [B, S, {cfg.feature_width}], got {list(f.shape)}")
    B, S = f.shape[:2]
    if B != bufs.batch:
        raise ValueError(f"features hold {B} sequences but the buffers were allocated for {bufs.batch}")
    if S > bufs.new_rows:
        raise ValueError(f"features hold {S} rows per sequence; the buffers hold at most {bufs.new_rows} "
                         "(Buffers.allocate(new_rows=...))")
    if f.dtype != cfg.dtype:
        raise TypeError(f"features dtype {f.dtype} differs from the drafter's {cfg.dtype}")
    if tuple(ids.shape) != (B, S) or ids.dtype != torch.int64:
        raise ValueError(f"input_ids must be int64 [B, S] = [{B}, {S}], got {ids.dtype} {list(ids.shape)}")
    dev = weights.fc.device
    if weights.fp8 != cfg.fp8 or weights.has_bias != bool(cfg.attention_bias):
        raise ValueError(f"weights (FP8 {weights.fp8}, attention bias {weights.has_bias}) do not match the drafter "
                         f"config (FP8 {cfg.fp8}, attention bias {cfg.attention_bias}): build both from one head")
    for name, t in (("features", f), ("input_ids", ids), ("k_cache", bufs.k_cache)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but the weights are on {dev}")
    nn_ = X.num_new
    if nn_ is None:  # S rows everywhere: one cached device tensor per S (no allocation or fill per launch)
        nn_ = bufs.scratch.get(("num_new", S))
        if nn_ is None:
            nn_ = bufs.scratch[("num_new", S)] = torch.full((B,), S, dtype=torch.int32, device=dev)
    elif tuple(nn_.shape) != (B,) or nn_.dtype != torch.int32 or nn_.device != dev:
        raise ValueError(f"num_new must be int32 [{B}] on {dev}, got {nn_.dtype} {list(nn_.shape)} on {nn_.device}")
    return nn_


# ------------------------------------------------------------------------------------------------ launch
_RESIDENT_CHECKED: set = set()


class _LaunchPlan:
    """The kernel's keyword arguments for one (config, device, batch, profile), and whether its grid was checked
    resident."""

    __slots__ = ("kw", "nprog", "resident_key", "checked")

    def __init__(self, cfg: DrafterConfig, device: torch.device, batch: int, profile: bool):
        p = cfg.launch_params(device, batch, 1)  # the constexprs do not depend on the new rows
        self.kw = dict(PROFILE=profile, **p)
        self.nprog = p["NPROG"]
        self.resident_key = (device, cfg.dtype, tuple(sorted(self.kw.items())))
        self.checked = self.resident_key in _RESIDENT_CHECKED


@functools.lru_cache(maxsize=64)
def _launch_plan(cfg: DrafterConfig, device: torch.device, batch: int, profile: bool) -> _LaunchPlan:
    """Launch parameters computed once per (config, device, batch): :meth:`DrafterConfig.launch_params` costs
    ~80 us of Python (the stream-K sharing scan), paid before every launch otherwise."""
    return _LaunchPlan(cfg, device, batch, profile)


def _check_resident(kernel, nprog: int, num_warps: int, device) -> None:
    """Raise unless ``nprog`` programs of the compiled ``kernel`` fit on the device at once (the grid barriers
    wait for every program: a program that is not resident would never arrive)."""
    props = torch.cuda.get_device_properties(device)
    sms = props.multi_processor_count
    per_sm = -(-nprog // sms)
    kernel._init_handles()
    smem = int(kernel.metadata.shared)
    regs = int(getattr(kernel, "n_regs", 0) or 0)
    threads = 32 * num_warps
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    threads_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    need = dict(shared=(per_sm * (smem + 1024), smem_sm), registers=(per_sm * regs * threads, regs_sm),
                threads=(per_sm * threads, threads_sm))
    over = {k: v for k, v in need.items() if v[0] > v[1]}
    if over:
        detail = ", ".join(f"{k} {a} > {b}" for k, (a, b) in over.items())
        raise ValueError(f"{nprog} programs need {per_sm} resident per SM on {sms} SMs, which does not fit "
                         f"({detail}; {smem} B shared memory and {regs} registers per thread per program): the "
                         "persistent kernel would deadlock. Use fewer programs (nprog) or smaller tiles.")


def launch_drafter(cfg: DrafterConfig, X, weights: Weights, bufs: Buffers, fallback: bool = True,
                   profile: bool = False) -> DraftOutput:
    """Draft one EAGLE-2 tree per sequence with the fused persistent kernel (one launch, no host sync).

    Parameters
    ----------
    cfg: the drafter's :class:`DrafterConfig`.
    X: :class:`DraftInputs` ``(features [B, S, W], input_ids [B, S], num_new [B] | None)``.
    weights: :class:`Weights` of the head, bufs: :class:`Buffers` (its draft KV advances by ``num_new``).
    fallback: where no GPU (or Triton) is available, run :func:`launch_drafter_ref` instead, with a warning, and
        mark the result (``.fallback``); with ``fallback=False`` that raises ``RuntimeError``.
    profile: build the variant that records every program's arrival time at every grid barrier in
        ``bufs.profile`` (see :func:`profile_phases`); GPU only, for benchmarks.

    Returns
    -------
    :class:`DraftOutput` ``(draft_tokens [B, T+1], retrieve_indices [B, T, D+2] (-1 padded), tree_mask
    [B, 1, T+1, T+1] float, tree_position_ids [B, T+1])``: views of ``bufs``, overwritten by the next launch.
    """
    X = _as_inputs(X)
    ok, why = triton_available(X.features.device)
    if not ok:
        if not fallback:
            raise RuntimeError(f"fused drafter unavailable: {why}")
        warnings.warn(f"fused drafter unavailable ({why}); running the PyTorch reference drafter", RuntimeWarning,
                      stacklevel=2)
        out = launch_drafter_ref(cfg, X, weights, bufs)
        return DraftOutput(tuple(out), fallback=True, reason=why, buffers=bufs)
    num_new = _check_launch(cfg, X, weights, bufs)
    from .kernel import fused_drafter_kernel

    B, S = X.features.shape[:2]
    plan = _launch_plan(cfg, X.features.device, B, bool(profile))
    if plan.nprog != bufs.nprog:
        raise ValueError(f"buffers were allocated for {bufs.nprog} programs, the config now gives {plan.nprog}")
    sc = bufs.scratch
    w = weights
    mcap = sc["hbuf"].shape[1]
    args = (
        w.fc, w.embed_rstd, w.qkv_norm, w.wq, w.wk, w.wv, w.wo, w.post_norm, w.w_gate, w.w_up,
        w.w_down, w.final_norm, w.lm_head, w.d2t, w.cos, w.sin, w.wsc, w.wb,
        _table_for(cfg, w) if plan.kw["TQ"] else w.wsc,
        X.features, X.input_ids, num_new,
        bufs.k_cache, bufs.v_cache, bufs.kv_len,
        sc["hbuf"], sc["hss"], sc["qbuf"], sc["part"], sc["flag"], sc["hq_part"], sc["att_o"], sc["att_ml"],
        sc["attn"], sc["h1"], sc["h1ss"], sc["act"], sc["lm_key"],
        sc["lm_ms"], sc["lm_scr"], sc["ch_lp"], sc["ch_id"], sc["tok_in"], sc["src"], sc["sc"], sc["fr"], sc["anc"],
        sc["cand_sc"], sc["cand_tok"], sc["par_list"],
        bufs.draft_tokens, bufs.retrieve, bufs.tree_mask, bufs.positions, bufs.parents, bufs.num_leaves,
        bufs.max_depth, bufs.barrier, bufs.status, bufs.profile,
        B, S, cfg.max_len, mcap, _element_offset(sc["hbuf"], w.embed), cfg.rms_eps, math.sqrt(cfg.head_dim),
    )
    kw = plan.kw
    if not plan.checked and not _interpreting():
        if plan.resident_key not in _RESIDENT_CHECKED:  # compile first: a grid that cannot be resident deadlocks
            _check_resident(fused_drafter_kernel.warmup(*args, grid=(plan.nprog,), **kw), plan.nprog,
                            kw["num_warps"], X.features.device)
            _RESIDENT_CHECKED.add(plan.resident_key)
        plan.checked = True
    fused_drafter_kernel[(plan.nprog,)](*args, **kw)
    return DraftOutput((bufs.draft_tokens, bufs.retrieve, bufs.tree_mask, bufs.positions), buffers=bufs)


def _element_offset(base: torch.Tensor, other: torch.Tensor) -> int:
    """Elements from ``base`` to ``other`` (same dtype and device): lets the kernel address both through one
    pointer."""
    delta = other.data_ptr() - base.data_ptr()
    if base.dtype != other.dtype or base.device != other.device or delta % base.element_size():
        raise ValueError(f"cannot address {other.dtype} tensor at {other.data_ptr():#x} from {base.dtype} buffer at "
                         f"{base.data_ptr():#x} on {base.device}")
    return delta // base.element_size()


def profile_phases(cfg: DrafterConfig, bufs: Buffers, per_program: bool = False) -> list[dict]:
    """Per-phase times of the last ``launch_drafter(..., profile=True)``, from the barrier arrival times.

    A phase starts when the previous barrier releases (the last program's arrival there) and ends at the last
    arrival at its own barrier. Each entry: ``phase`` (e.g. ``"s3.LM"``), ``us`` (start to last arrival),
    ``mean_us`` (start to the mean arrival: ``us - mean_us`` is load imbalance plus the barrier's cost); with
    ``per_program`` also ``arrivals_us``, every program's arrival (program order), from the phase's start: whether
    the same programs arrive last phase after phase.
    """
    D = cfg.depth
    names = ["FC"]
    for s in range(D + 1):
        names += [f"s{s}.{n}" for n in ("QKV", "ATT", "COMB", "O", "GU", "DOWN", "LM", "RM")]
        names.append(f"s{s}.SEL" if s < D else f"s{s}.SEL+tree")
    t = bufs.profile.to("cpu", torch.float64)
    arrivals = [t[:, i] for i in range(1, len(names))] + [t[:, PROFILE_SLOTS - 1]]
    out, start = [], t[:, 0].min()
    for name, arr in zip(names, arrivals, strict=True):
        out.append(dict(phase=name, us=float(arr.max() - start) / 1e3, mean_us=float(arr.mean() - start) / 1e3))
        if per_program:
            out[-1]["arrivals_us"] = [round(float(a - start) / 1e3, 3) for a in arr]
        start = arr.max()
    # stamps inside phases (slots 100+, program 0, last step): microseconds since the previous stamp
    sub = [(i, float(t[0, i])) for i in range(100, PROFILE_SLOTS - 1) if t[0, i] > 0]
    for (i, v), (_, prev) in zip(sub[1:], sub[:-1], strict=True):
        out.append(dict(phase=f"stamp{i}", us=(v - prev) / 1e3, mean_us=(v - prev) / 1e3))
    return out


def launch_drafter_ref(cfg: DrafterConfig, X, weights: Weights, bufs: Buffers) -> DraftOutput:
    """:func:`launch_drafter` computed by the PyTorch reference drafter, one sequence at a time (host syncs).

    Reads and advances the same draft KV in ``bufs`` and fills the same output buffers.
    """
    X = _as_inputs(X)
    if weights.head is None:
        raise ValueError("launch_drafter_ref needs weights.head (build Weights with Weights.from_head)")
    num_new = _check_launch(cfg, X, weights, bufs)
    head, tc = weights.head, cfg.tree
    B = X.features.shape[0]
    T, D = cfg.total_tokens - 1, cfg.depth
    for b in range(B):
        n = int(num_new[b])
        L0 = int(bufs.kv_len[b])
        if L0 + n + D * cfg.top_k > cfg.max_len:
            bufs.status.fill_(1)
            raise RuntimeError(f"sequence {b}: {L0} + {n} rows plus the tree exceed max_len {cfg.max_len}")
        ref = TorchDraftBackend(head, tc)
        if L0 > 0:
            ref.stable_kv = ((bufs.k_cache[b, :L0].permute(1, 0, 2)[None].contiguous(),
                              bufs.v_cache[b, :L0].permute(1, 0, 2)[None].contiguous()),)
        # input_ids of the reference: any L0 + 1 leading tokens (unused once the KV holds them), then the new ones
        ids = torch.cat([torch.zeros(1, L0 + 1, dtype=torch.long, device=X.input_ids.device),
                         X.input_ids[b:b + 1, :n]], dim=1)
        tree = ref.draft(X.features[b:b + 1, :n], ids)
        k, v = ref.stable_kv[0]
        bufs.k_cache[b, :L0 + n] = k[0].permute(1, 0, 2)
        bufs.v_cache[b, :L0 + n] = v[0].permute(1, 0, 2)
        bufs.kv_len[b] = L0 + n
        bufs.draft_tokens[b] = tree.draft_tokens[0]
        bufs.retrieve[b] = tree.retrieve_indices_padded[0]
        bufs.tree_mask[b] = tree.tree_mask[0]
        bufs.positions[b] = tree.positions[0]
        bufs.parents[b] = tree.parents[0]
        bufs.num_leaves[b] = tree.num_leaves[0]
        bufs.max_depth[b] = tree.max_depth[0]
    assert bufs.retrieve.shape[1] == T
    return DraftOutput((bufs.draft_tokens, bufs.retrieve, bufs.tree_mask, bufs.positions), buffers=bufs)


# ------------------------------------------------------------------------------------------------ backend
def fill_start_meta(meta: torch.Tensor, slot: int, first: int, n: int) -> torch.Tensor:
    """``meta [3]`` (int64, on the device) set to a start chunk's ``(slot, first row, valid rows)`` for
    :meth:`FusedDraftBackend.start_rows_chunk`, by three fills (a Python list would be a host-to-device copy)."""
    for i, value in enumerate((slot, first, n)):
        meta[i:i + 1].fill_(value)
    return meta


class FusedDraftBackend:
    """``TreeDrafter(head, tree_config, backend="triton")``: the fused kernel behind the reference's interface.

    Options: ``max_len`` (draft-KV rows per sequence; grows on demand), ``nprog``, ``fallback`` (True: use the
    reference drafter with a warning where the kernel cannot run: no GPU and no interpreter, or an EAGLE-1 head).
    ``self.fallback_reason`` says why the reference runs ("" when the kernel runs).
    """

    name = "triton"

    def __init__(self, head: DraftHead, tree_config: TreeConfig, max_len: int | None = None, nprog: int | None = None,
                 fallback: bool = True, **tuning):
        self.head = head
        self.cfg_tree = tree_config
        self.fallback_reason = ""
        self._replay: _PaddedRows | None = None  # draft_replayed's static rows and graphs
        #: draft_replayed's default for ``padded`` (None: on CUDA); the CPU probes and tests set it to take the
        #: CUDA path's padded rows under the interpreter
        self.replay_padded: bool | None = None
        self._kv_views: tuple | None = None  # (buffers, permuted k and v caches) for stable_kv
        if head.kind != "eagle3":
            self.fallback_reason = f"the fused drafter supports EAGLE-3 heads only (got {head.kind})"
        else:
            ok, why = triton_available(head.device)
            if not ok:
                self.fallback_reason = why
            else:  # a head shape the kernel cannot run is refused now, not at the first draft
                try:
                    DrafterConfig.from_head(head, tree_config, max_new_rows=1, **dict(tuning, nprog=nprog)
                                            ).launch_params(head.device, 1, 1)
                except ValueError as exc:
                    self.fallback_reason = f"the fused drafter cannot run this head: {exc}"
        if self.fallback_reason:
            if not fallback:
                raise RuntimeError(f"fused drafter unavailable: {self.fallback_reason}")
            warnings.warn(f"fused drafter unavailable ({self.fallback_reason}); using the PyTorch reference drafter",
                          RuntimeWarning, stacklevel=3)
            self._ref = TorchDraftBackend(head, tree_config)
            return
        self._ref = None
        self._tuning = dict(tuning, nprog=nprog)
        self._max_len = max_len or 256
        self._cfg = None
        self.bufs = None
        self._kv_store: tuple | None = None  # (k, v, kv_len) of every slot: the draft KV the buffer sets share
        self._buckets: dict[int, tuple[DrafterConfig, Buffers]] = {}  # batch size -> its config and buffers
        self.weights = None
        self._kv_len = 0

    # -- state ------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        if self._ref is not None:
            return self._ref.reset()
        self._kv_len = 0
        if self.bufs is not None:
            self.bufs.reset()

    @property
    def kv_len(self) -> int:
        return self._ref.kv_len if self._ref is not None else self._kv_len

    @property
    def stable_kv(self):
        if self._ref is not None:
            return self._ref.stable_kv
        L = self._kv_len
        if L == 0:
            return None
        views = self._kv_views
        if views is None or views[0] is not self.bufs:  # [B, nkv, max_len, hd] views, made once per buffer set
            bufs = self.bufs
            k, v = bufs.k_cache.permute(0, 2, 1, 3), bufs.v_cache.permute(0, 2, 1, 3)
            views = self._kv_views = (bufs, k, v, tuple(k.shape), k.stride())
        _, k, v, (B, nkv, _, hd), stride = views
        # the first L rows as one as_strided each (cheaper for the host than indexing: it runs once per draft)
        return ((k.as_strided((B, nkv, L, hd), stride), v.as_strided((B, nkv, L, hd), stride)),)

    def _ensure(self, batch: int, new_rows: int, min_len: int = 0) -> None:
        """Buffers for ``batch`` sequences, ``new_rows`` new rows and at least ``min_len`` draft-KV rows (beyond the
        rows held plus the new ones and the tree's).

        Buffer sets are kept per batch size (a batch bucket), all sharing the first rows of one draft KV, so that a
        batch moving between buckets reallocates nothing and graphs captured on a bucket's buffers stay valid; the
        shared draft KV only grows (then every bucket's buffers are made anew)."""
        tc = self.cfg_tree
        need_len = max(self._kv_len + new_rows + tc.depth * tc.top_k, min_len)
        cfg = self._cfg
        if (cfg is not None and self.bufs.batch == batch and new_rows <= cfg.max_new_rows
                and need_len <= cfg.max_len):
            return
        if self.bufs is not None and self._kv_len and self.bufs.batch != batch:
            raise ValueError(f"batch changed from {self.bufs.batch} to {batch} without reset()")
        bucket = self._buckets.get(batch)
        if bucket is not None and new_rows <= bucket[0].max_new_rows and need_len <= bucket[0].max_len:
            self._cfg, self.bufs = bucket
            if self._kv_len == 0:  # nothing held: the bucket's share of the draft KV may hold another's rows
                self.bufs.reset()
            return
        max_len = max(self._max_len, _pow2(need_len))
        max_new = max(_pow2(new_rows), cfg.max_new_rows if cfg is not None else 1)
        max_new = min(max_new, max_len - tc.depth * tc.top_k)
        store = self._kv_store
        if store is None or store[0].shape[0] < batch or store[0].shape[1] < max_len:
            old = self.bufs
            slots = max(batch, store[0].shape[0] if store is not None else 1)
            shape = (slots, max_len, self.head.config.num_key_value_heads, self.head.config.head_dim)
            dev = self.head.device
            self._kv_store = (torch.zeros(shape, dtype=self.head.dtype, device=dev),
                              torch.zeros(shape, dtype=self.head.dtype, device=dev),
                              torch.zeros(slots, dtype=torch.int32, device=dev))
            self._buckets.clear()
            bufs = self._new_bucket(batch, max_len, max_new)
            if old is not None and self._kv_len:  # keep the rows drafted so far (the batch is the same)
                bufs.k_cache[:, :self._kv_len] = old.k_cache[:, :self._kv_len]
                bufs.v_cache[:, :self._kv_len] = old.v_cache[:, :self._kv_len]
                bufs.kv_len.fill_(self._kv_len)
        else:
            self._new_bucket(batch, store[0].shape[1], max_new)
        self._max_len = max(self._max_len, self._cfg.max_len)

    def _new_bucket(self, batch: int, max_len: int, max_new: int) -> Buffers:
        """A buffer set for ``batch`` sequences on the first rows of the shared draft KV (kept for that batch
        size); it becomes the current one."""
        tc = self.cfg_tree
        cfg = DrafterConfig.from_head(self.head, tc, max_batch=batch, max_len=max_len,
                                      max_new_rows=min(max_new, max_len - tc.depth * tc.top_k), **self._tuning)
        if self.weights is None or self.weights.cos.shape[0] < max_len + tc.depth + 1:
            table = self.weights.qkv_table if self.weights is not None else None  # (independent of the length)
            self.weights = Weights.from_head(self.head, max_len + tc.depth + 1)
            self.weights.qkv_table = table
            self.weights.check(cfg)
        if cfg.uses_token_table():  # built here, not in a launch a CUDA graph may be capturing
            _table_for(cfg, self.weights)
        k, v, n = self._kv_store
        bufs = Buffers.allocate(cfg, self.head.device, batch=batch, new_rows=cfg.max_new_rows,
                                kv=(k[:batch], v[:batch], n[:batch]))
        if self._kv_len == 0:  # nothing held: the shared draft KV's lengths may be another bucket's
            bufs.kv_len.zero_()
        self._buckets[batch] = (cfg, bufs)
        self._cfg, self.bufs = cfg, bufs
        return bufs

    # -- drafting ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def draft(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, sampling: bool = False,
              copy_outputs: bool = True) -> DraftTree:
        """One tree (see :meth:`TreeDrafter.draft`). ``copy_outputs=False`` returns the drafter's own output buffers
        instead of copies (no device work after the kernel): they are overwritten by the next draft, so only a
        caller that is done with a tree before drafting the next may ask for them (the SafeAILab patch does)."""
        if self._ref is not None:
            return self._ref.draft(hidden_states, input_ids, sampling=sampling)
        check_draft_inputs(self.head, hidden_states, input_ids, self._kv_len)
        B, S = hidden_states.shape[:2]
        self._ensure(B, S)
        new_ids = input_ids[:, 1 + self._kv_len:].to(device=hidden_states.device, dtype=torch.long).contiguous()
        launch_drafter(self._cfg, DraftInputs(hidden_states.contiguous(), new_ids), self.weights, self.bufs,
                       fallback=False)
        self._kv_len += S
        bufs = self.bufs
        keep = (lambda t: t.clone()) if copy_outputs else (lambda t: t)
        # sampling reorders the rows into a new tensor: no copy of the leaf-ordered rows first (without copies,
        # back into the buffer: the outputs stay in one allocation)
        tree = DraftTree(
            draft_tokens=keep(bufs.draft_tokens), tree_mask=keep(bufs.tree_mask), positions=keep(bufs.positions),
            parents=keep(bufs.parents), retrieve_indices_padded=bufs.retrieve if sampling else keep(bufs.retrieve),
            num_leaves=keep(bufs.num_leaves), max_depth=keep(bufs.max_depth),
        )
        if not sampling:
            return tree
        return tree.in_sampling_order() if copy_outputs else _reordered_in_place(tree)

    # -- device-paced drafting (the engine's step graphs) -------------------------------------------------------
    def reserve(self, max_len: int, max_new_rows: int, batch: int = 1) -> None:
        """Allocate the draft KV and buffers once for up to ``max_len`` accepted rows per sequence and up to
        ``max_new_rows`` new rows per draft, so :meth:`draft_rows` never reallocates (a CUDA graph keeps the
        buffers' addresses). Keeps rows already drafted."""
        if self._ref is not None:
            raise RuntimeError(f"the fused drafter is not running ({self.fallback_reason})")
        if self._kv_len < 0:
            raise RuntimeError("reserve() after draft_rows() needs a reset() first (the draft KV length is on the "
                               "device)")
        tc = self.cfg_tree
        need = int(max_len) + tc.depth * tc.top_k
        cfg = self._cfg
        if cfg is not None and self.bufs.batch == batch and cfg.max_new_rows >= max_new_rows and cfg.max_len >= need:
            return
        self._max_len = max(self._max_len, _pow2(need))
        self._ensure(batch, _pow2(max(int(max_new_rows), 1)), min_len=need)

    def forget_rows(self, keep: torch.Tensor) -> None:
        """Zero the draft KV length of every sequence whose ``keep [B]`` int32 is 0 (device work only; after
        :meth:`reserve`): a freed batch slot, or one about to take a new sequence."""
        if self.bufs is None:
            raise RuntimeError("forget_rows() before reserve()")
        self.bufs.kv_len.mul_(keep)

    @torch.no_grad()
    def start_rows(self, slot: int, features: torch.Tensor, new_ids: torch.Tensor) -> None:
        """Start sequence ``slot``'s draft KV with rows ``features [N, W]`` (``new_ids [N]``: the token after each
        row) at positions ``0 .. N-1``, its length becoming ``N`` (device work only, after :meth:`reserve`).

        A prompt's rows before its last are rows a draft ingests but never drafts from: only their K/V are kept, so
        they are computed here by a few batched products (:func:`~eagle_triton.fused.multikernel.draft_kv_rows`)
        instead of by an eager draft over the whole prompt, and the sequence's first draft is a graphed
        :meth:`draft_rows` of its last row like every later one. This is :meth:`start_rows_chunk` over all ``N``
        rows at once (the engine runs fixed-size chunks of it from a CUDA graph)."""
        self.begin_start(slot, features, new_ids)
        meta = torch.empty(3, dtype=torch.int64, device=features.device)
        self.start_rows_chunk(fill_start_meta(meta, slot, 0, features.shape[0]), features, new_ids)

    def begin_start(self, slot: int, features: torch.Tensor, new_ids: torch.Tensor) -> None:
        """The host's part of a sequence start of ``N`` rows (``features [N, W]``, ``new_ids [N]``) in ``slot``,
        before its chunks: checks of the back end, the buffers, the shapes and room for the rows plus a draft; then
        the draft KV's length is the device's only (as after :meth:`draft_rows`; a replayed chunk runs no Python)."""
        if self._ref is not None:
            raise RuntimeError(f"start_rows needs the fused kernel ({self.fallback_reason})")
        if self.bufs is None:
            raise RuntimeError("start_rows() before reserve()")
        bufs, cfg = self.bufs, self._cfg
        N = features.shape[0]
        if features.dim() != 2 or new_ids.shape != (N,) or features.shape[1] != self.head.feature_width:
            raise ValueError(f"start_rows: features must be [N, {self.head.feature_width}] and new_ids [N], got "
                             f"{list(features.shape)} and {list(new_ids.shape)}")
        if not 0 <= slot < bufs.batch:
            raise ValueError(f"start_rows: slot {slot} is not one of the {bufs.batch} reserved")
        tc = self.cfg_tree
        if N + bufs.new_rows + tc.depth * tc.top_k > cfg.max_len:
            raise ValueError(f"start_rows: {N} rows plus a draft ({bufs.new_rows} new rows and the tree's "
                             f"{tc.depth * tc.top_k}) exceed the draft KV's {cfg.max_len} rows: reserve() more")
        self._kv_len = -1

    @torch.no_grad()
    def start_rows_chunk(self, meta: torch.Tensor, features: torch.Tensor, new_ids: torch.Tensor) -> None:
        """One chunk of a sequence start, with static shapes and every length on the device (capturable):
        ``meta [3]`` int64 holds ``(slot, first row, valid rows n)``; rows ``j < n`` of ``features [C, W]`` /
        ``new_ids [C]`` go into draft-KV rows ``first + j`` of the slot (as :meth:`start_rows` puts them), and the
        slot's length becomes ``first + n`` (so chunks in order leave the whole start's length). Rows ``j >= n``
        are padding: the cache rows they would reach keep their contents. The caller runs :meth:`begin_start` for
        the whole start first (host checks and state; a chunk never writes past the cache, and the slot is clamped
        to the buffers)."""
        if self.bufs is None:
            raise RuntimeError("start_rows_chunk() before reserve()")
        from .multikernel import draft_kv_rows

        bufs, w = self.bufs, self.weights
        C, dev = features.shape[0], features.device
        slot = meta[0].clamp(0, bufs.batch - 1)
        j = torch.arange(C, device=dev)
        pos = meta[1] + j
        rows = pos.clamp(max=bufs.k_cache.shape[1] - 1)  # padding rows past the cache end land on its last row
        k, v = draft_kv_rows(self._cfg, w, features.to(self.head.dtype), new_ids.long(),
                             pos.clamp(max=w.cos.shape[0] - 1))
        keep = (j < meta[2]).view(C, 1, 1)
        slots = slot.expand(C)
        for cache, new in ((bufs.k_cache, k), (bufs.v_cache, v)):
            # padding rows write back what they read: a row both a valid and a padding row write is impossible
            # (valid rows end N + a draft's rows before the cache end), and duplicated padding rows agree
            cache.index_put_((slots, rows), torch.where(keep, new, cache[slots, rows]))
        bufs.kv_len.index_put_((slot.view(1),), (meta[1] + meta[2]).view(1).to(bufs.kv_len.dtype))

    def keep_rows(self, rows: list[int], batch: int) -> None:
        """Keep only the draft KV of sequences ``rows`` (in that order) in the first rows of the buffers for
        ``batch >= len(rows)`` sequences (a batch moving its last sequences to a smaller batch): the rows that move
        are copied on the device, in place; within the allocated slots nothing is reallocated."""
        if self.bufs is None:
            raise RuntimeError("keep_rows() before reserve()")
        n, old_cfg = len(rows), self._cfg
        if not 1 <= n <= batch or len(set(rows)) != n or not all(0 <= r < self.bufs.batch for r in rows):
            raise ValueError(f"keep_rows: rows {rows} must be distinct rows of the {self.bufs.batch} held, at most "
                             f"batch={batch}")
        k, v, kv_len = self._kv_store
        if batch > k.shape[0]:  # beyond the slots allocated: a larger draft KV, the kept rows copied over
            idx = torch.tensor(rows, device=kv_len.device)
            kept = (k.index_select(0, idx), v.index_select(0, idx), kv_len.index_select(0, idx))
            self._kv_store, self._buckets = None, {}
            self._kv_len, self.bufs, self._cfg = 0, None, None
            self._ensure(batch, old_cfg.max_new_rows, min_len=old_cfg.max_len)
            for dst, src in zip(self._kv_store, kept, strict=True):
                dst[:n].copy_(src)
        else:
            move_slots_to_front(rows, (k, 0), (v, 0), (kv_len, 0))
            kv_len[n:].zero_()  # every slot beyond the kept ones is empty, in every bucket
            bucket = self._buckets.get(batch)
            if bucket is not None and bucket[0].max_new_rows >= old_cfg.max_new_rows:
                self._cfg, self.bufs = bucket
            else:
                self._new_bucket(batch, k.shape[1], old_cfg.max_new_rows)

    @torch.no_grad()
    def draft_rows(self, features: torch.Tensor, new_ids: torch.Tensor, num_new: torch.Tensor | None = None,
                   sampling: bool = False) -> DraftTree:
        """Draft from ``features [B, S, W]`` rows not yet in the draft KV, ``num_new [B]`` int32 of them valid (on
        the device; ``None``: all ``S``), ``new_ids [B, S]`` the token after each row (the last valid one is the
        root). No host synchronisation and no allocation after :meth:`reserve`: capturable in a CUDA graph.

        The tree's tensors are views of the drafter's buffers, overwritten by the next draft. The draft KV's length
        advances on the device only: mixing this with :meth:`draft` needs a :meth:`reset` in between.
        """
        if self._ref is not None:
            raise RuntimeError(f"draft_rows needs the fused kernel ({self.fallback_reason})")
        B, S = features.shape[:2]
        cfg = self._cfg
        if cfg is None or self.bufs.batch != B or S > self.bufs.new_rows:
            raise ValueError(f"draft_rows: {B} x {S} new rows exceed the reserved buffers "
                             f"({self.bufs.batch if self.bufs else 0} x {self.bufs.new_rows if self.bufs else 0}); "
                             "call reserve(max_len, max_new_rows) first")
        self._kv_len = -1  # unknown on the host from here on (reset() restores it)
        out = launch_drafter(cfg, DraftInputs(features, new_ids, num_new), self.weights, self.bufs, fallback=False)
        bufs = self.bufs
        tree = DraftTree(draft_tokens=out.draft_tokens, tree_mask=out.tree_mask, positions=bufs.positions,
                         parents=bufs.parents, retrieve_indices_padded=out.retrieve_indices,
                         num_leaves=bufs.num_leaves, max_depth=bufs.max_depth)
        return tree.in_sampling_order() if sampling else tree

    def draft_replayed(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, sampling: bool = False,
                       max_len: int = 2048, padded: bool | None = None) -> DraftTree:
        """:meth:`draft` with ``copy_outputs=False``, for loops that draft a few rows at a time (SafeAILab's
        ``topK_genrate``): up to ``depth + 2`` new rows go into static buffers, padded, with their count on the
        device (:meth:`draft_rows`), and on CUDA the launch is replayed from a CUDA graph after two eager calls, so a
        call costs the host no launch work (Triton binds ~70 arguments per launch). Longer inputs (a prompt) take
        the plain launch. ``max_len``: the accepted rows to reserve room for (grows when exceeded; a reallocation
        drops the graphs). ``padded``: use the padded rows (default: :attr:`replay_padded`, else on CUDA). The tree
        is the drafter's own buffers, valid until the next draft.

        A call with a row count, sampling mode, dtype and device seen before (the steady state) checks only what
        can change between calls (the draft KV's length against ``input_ids``, the room left) and does two copies
        (the new rows' features and ids into the static rows) and the replay: each row count has its own graph,
        whose count lives in a device tensor written once.
        """
        if torch.is_grad_enabled():  # one check instead of a no_grad context per call (SafeAILab drafts under one)
            with torch.no_grad():
                return self.draft_replayed(hidden_states, input_ids, sampling, max_len, padded)
        st = self._replay
        if st is not None and st.bufs is self.bufs:
            entry = st.entries.get((sampling, hidden_states.shape, hidden_states.dtype, hidden_states.device))
            if entry is not None:
                L = self._kv_len
                ids_shape = input_ids.shape
                # what the slow path would check or grow: room for max_len and L + C rows (reserve), the rows
                # against the draft KV (check_draft_inputs), the padded path chosen
                if (0 <= L <= st.room - st.rows and max_len <= st.room and len(ids_shape) == 2
                        and ids_shape[1] == L + 1 + entry.rows and ids_shape[0] == 1
                        and (padded if padded is not None else
                             st.cuda if self.replay_padded is None else self.replay_padded)):
                    return self._run_padded(st, entry, hidden_states, input_ids, L, sampling)
        if input_ids.device != hidden_states.device:  # (the fast path's copy moves them itself)
            input_ids = input_ids.to(hidden_states.device)
        if self._ref is not None:
            return self._ref.draft(hidden_states, input_ids, sampling=sampling)
        check_draft_inputs(self.head, hidden_states, input_ids, self._kv_len)
        B, S = hidden_states.shape[:2]
        C = self.cfg_tree.depth + 2
        cuda = hidden_states.device.type == "cuda" and not _interpreting()
        default = cuda if self.replay_padded is None else self.replay_padded
        if B != 1 or S > C or self._cfg is None or not (default if padded is None else padded):
            return self.draft(hidden_states, input_ids, sampling=sampling, copy_outputs=False)
        L = self._kv_len
        self.reserve(max(int(max_len), L + C), C)
        st = self._replay
        if st is None or st.bufs is not self.bufs:
            tc = self.cfg_tree
            st = self._replay = _PaddedRows(self.bufs, C, self._cfg.max_len - tc.depth * tc.top_k,
                                            self.head.feature_width, hidden_states.dtype, hidden_states.device, cuda)
        key = (sampling, hidden_states.shape, hidden_states.dtype, hidden_states.device)
        entry = st.entries.get(key)
        if entry is None:
            entry = st.entries[key] = _PaddedEntry(st, S)
        return self._run_padded(st, entry, hidden_states, input_ids, L, sampling)

    def _run_padded(self, st: _PaddedRows, entry: _PaddedEntry, hidden_states: torch.Tensor,
                    input_ids: torch.Tensor, L: int, sampling: bool) -> DraftTree:
        """Copy the new rows into the static rows and draft: replay the entry's graph, or launch (on CUDA: two
        eager launches per sampling mode, then a graph per row count)."""
        entry.feats.copy_(hidden_states)
        entry.ids.copy_(input_ids[:, L + 1:])
        graph = entry.graph
        if graph is not None:
            graph.replay()
            tree = entry.tree
        elif not st.cuda or st.runs.get(sampling, 0) < 2:
            st.runs[sampling] = st.runs.get(sampling, 0) + 1
            tree = entry.tree = self._launch_padded(st, entry, sampling)
        else:
            graph, tree = _capture_graph(lambda: self._launch_padded(st, entry, sampling))
            entry.graph, entry.tree = graph, tree
            graph.replay()
        self._kv_len = L + entry.rows
        return tree

    def _launch_padded(self, st: _PaddedRows, entry: _PaddedEntry, sampling: bool) -> DraftTree:
        """The launch a padded entry's graph holds. A sampling tree's rows are put back into the retrieve buffer
        in their new order, so that every output stays in the buffers' one allocation (one host copy moves them)."""
        tree = self.draft_rows(st.feats, st.ids, entry.num)
        return _reordered_in_place(tree) if sampling else tree


def _reordered_in_place(tree: DraftTree) -> DraftTree:
    """``tree.in_sampling_order()`` with the reordered rows written back into ``tree``'s retrieve buffer (the
    drafter's own, overwritten by the next draft anyway)."""
    rows = tree.in_sampling_order().retrieve_indices_padded
    tree.retrieve_indices_padded.copy_(rows)
    return replace(tree, sampling=True)


def _capture_graph(launch):
    """``(graph, outputs)``: ``launch()`` captured in a CUDA graph (the tests substitute a CPU stand-in)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch()
    return graph, out


class _PaddedRows:
    """:meth:`FusedDraftBackend.draft_replayed`'s static inputs for one set of buffers: ``C`` padded feature and id
    rows, and one :class:`_PaddedEntry` per (sampling, input shape, dtype, device) seen. ``room``: the accepted rows
    the buffers hold beside the tree's scratch rows; ``cuda``: launches are captured in graphs; ``runs``: eager
    launches so far per sampling mode."""

    __slots__ = ("bufs", "rows", "room", "feats", "ids", "entries", "runs", "cuda")

    def __init__(self, bufs: Buffers, rows: int, room: int, width: int, dtype: torch.dtype, device: torch.device,
                 cuda: bool):
        self.bufs, self.rows, self.room, self.cuda = bufs, rows, room, cuda
        self.feats = torch.zeros(1, rows, width, dtype=dtype, device=device)
        self.ids = torch.zeros(1, rows, dtype=torch.long, device=device)
        self.entries: dict = {}
        self.runs: dict = {}


class _PaddedEntry:
    """One row count ``rows`` of the padded path: the static rows it writes (views), its count on the device
    (written once: no fill per call), and its captured graph with the tree that graph fills (``None`` until
    captured)."""

    __slots__ = ("rows", "feats", "ids", "num", "graph", "tree")

    def __init__(self, st: _PaddedRows, rows: int):
        self.rows = rows
        self.feats, self.ids = st.feats[:, :rows], st.ids[:, :rows]
        self.num = torch.full((1,), rows, dtype=torch.int32, device=st.feats.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tree: DraftTree | None = None
