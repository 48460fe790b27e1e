"""The target model runners: the interface the engine drives, and the fast Llama-family implementation.

:class:`LlamaTarget` is a compact (gpt-fast style) implementation of Llama 2/3.x (llama3 rope scaling included),
Mistral, Qwen2/2.5 (q/k/v bias) and Qwen3 (q/k RMSNorm), with weights taken from a transformers model (so GGUF
files load through transformers) or read from a safetensors checkpoint directory. It owns a static KV cache and
runs three kinds of forward: prefill (causal over the prompt), decode (one token) and tree verification (the
``T + 1`` tree tokens with the ancestor mask and depth-based positions). On CUDA the decode and verify steps are
replayed from CUDA graphs. Each forward returns logits and the draft head's features: the EAGLE-3 taps (residual
stream entering layers ``2, L // 2, L - 3``, concatenated in ascending layer order) or the final normalised hidden
state (EAGLE-1).

The cache has ``batch_size`` slots (``setup``; default 1): a batched target prefills one sequence per slot and
verifies, commits and decodes every slot in one forward over their ``B S`` rows (``verify_rows``, ``commit_rows``,
``decode_rows``), each slot at its own length. Through the fused forward a sequence's rows round exactly as when
it runs alone.

Two forwards share the weights and the cache. The PyTorch forward (``ops="torch"``, the CPU default) is the eager
layer sequence. The fused Triton forward (``ops="triton"``, or ``"auto"`` on CUDA; on the CPU ``ops="triton"``
runs it under Triton's interpreter) is seven batch-invariant launches per layer (see :mod:`eagle_triton.ops`): the
q/k/v product, RoPE (+ Qwen3 q/k norm) fused with the KV-cache write, attention (two launches: the key splits and
their combine), the o product with the residual add, the gate/up product with SiLU·mul in its epilogue, the down
product with the residual add; then the final RMSNorm and the lm_head product. The input and post-attention
RMSNorms are folded by default (``norm_mode="folded"``): their weights are multiplied into the q/k/v and gate/up
weights at load, the kernels that write the residual stream (embedding, o, down) also write per-tile partial sums
of squares, and the next product scales each output row by its ``rstd`` in the epilogue. On the H100
(``bench/results/session11_2026-11-26/``) that made SmolLM2's decode step 0.734 ms against 0.800 with a separate
RMSNorm kernel (``norm_mode="kernel"``) and its 60-row verify 0.950 against 1.051; at the Llama-3.1-8B shape 5.718
against 5.804 and 6.427 against 6.516. Normalising the row inside the product (``"partials"``, ``"prologue"``)
measured slower than both: that per-element work runs on every padded row of a tile, in every chunk. Every kernel
reduces a row in an order that does not depend on how many
rows run with it, so a verify row, a decode row and a prefill row round alike (bf16
speculation can equal plain decoding bit for bit once the attention is invariant too). Prefill runs through the
same kernels in fixed-size chunks (``PREFILL_CHUNKS``), and no kernel is specialised on the row count, so no
prompt length compiles anything new. Weight layout: q/k/v are concatenated into one ``[(Hq + 2 Hkv) D, H]`` matrix
and gate/up into one ``[2 I, H]`` matrix (``cat(gate, up)``; the kernel streams row ``n`` of each half for output
column ``n``), both at load; the other weights are used as loaded.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..heads.eagle3 import eagle3_tap_layers
from ..heads.layers import rms_norm as _rms_norm
from ..heads.layers import rotate_half as _rotate_half
from ..ops._utils import is_interpreter
from .backend import TritonOps, select_ops
from .cuda_graphs import GraphedStep
from .kv_cache import StaticKVCache

__all__ = ["TargetModel", "LlamaTarget", "TargetConfig", "eagle3_tap_layers", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

#: Prefill chunk sizes of the fused forward, largest first: a prompt runs in full chunks of the largest size, then
#: its remaining rows in the smallest size that holds them (padded), each size replayed from its own CUDA graphs.
#: Larger chunks read the weights fewer times, smaller ones waste fewer padded rows (SmolLM2 on the H100: 16 rows
#: 0.90 ms, 64 rows 1.00, 256 rows 1.71: a 100-token chat prompt in a 256-row chunk paid for 156 padded rows, hence
#: the 128); the kernels' results do not depend on the chunking (batch invariance).
PREFILL_CHUNKS = (256, 128, 64, 16)


class TargetModel:
    """What the engine needs from a target model (batch 1).

    Attributes: ``vocab_size``, ``hidden_size``, ``num_layers``, ``device``, ``dtype``, ``eos_token_ids`` (list),
    ``feature_mode`` (``None``, ``"eagle3"`` or ``"eagle1"``), ``length`` (committed tokens, host int).

    Methods
    -------
    setup(max_length, feature_mode): allocate caches for sequences of up to ``max_length`` tokens (plus one tree).
        (:class:`LlamaTarget` also takes ``batch_size``: that many cache slots, stepped together by its
        ``verify_rows`` / ``decode_rows`` / ``commit_rows``, each slot prefilled by ``prefill(ids, slot)``.)
    reset(): forget the sequence.
    prefill(input_ids [1, N]) -> (logits [1, V] of the last row, features [1, N, W] or None); commits N rows.
    decode(input_ids [1, 1]) -> (logits [1, V], features [1, 1, W] or None); commits the row.
    verify(tokens [1, T+1], depths [1, T+1], tree_mask [1, T+1, T+1] bool, or float with cells > 0.5 true (a
        drafter's mask as it is)) -> (logits [1, T+1, V], features [1, T+1, W] or None); rows are written but not
        committed.
    commit(accept_index [1, C], accept_len [1], accept_len_host): keep root + accepted path of the verified tree.
    input_embeddings() -> ``[V, H]`` tensor (the draft head's ``embed_tokens``); lm_head(h) -> logits.
    """

    feature_mode: str | None = None
    #: True when the runner keeps its lengths on the device and offers ``verify_rows`` / ``decode_rows`` /
    #: ``commit_rows`` / ``note_committed`` (steps queue without host reads: :class:`LlamaTarget`)
    device_lengths: bool = False

    def feature_width(self, mode: str | None) -> int:
        if mode == "eagle3":
            return 3 * self.hidden_size
        if mode == "eagle1":
            return self.hidden_size
        return 0


@dataclass(frozen=True)
class TargetConfig:
    """Shape and options of a Llama-family target, read from a transformers config."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, cfg) -> TargetConfig:
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"the fast target path supports model types {SUPPORTED_MODEL_TYPES}, got {model_type!r}; "
                "use the generic transformers path (target_impl='generic') for other models"
            )
        act = getattr(cfg, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"fast target path: hidden_act {act!r} is not supported (only silu)")
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        window = getattr(cfg, "sliding_window", None)
        active = window is not None and (model_type == "mistral" or bool(getattr(cfg, "use_sliding_window", False)))
        return cls(
            model_type=model_type, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers, num_heads=heads,
            num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=float(cfg.rms_norm_eps),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            sliding_window=int(window) if active else None,
        )


class _Layer:
    __slots__ = ("w_qkv", "b_qkv", "w_o", "b_o", "w_gate_up", "b_gate_up", "w_down", "b_down", "ln_in", "ln_post",
                 "q_norm", "k_norm")


def _rotary_from_config(hf_config, device):
    """``(inv_freq [D/2] fp32, attention_scaling)`` computed by transformers' own rotary class for the config, so
    every rope type it knows (default, llama3, linear, dynamic at init, yarn...) matches it exactly."""
    model_type = hf_config.model_type
    import importlib

    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    cls_name = {"llama": "LlamaRotaryEmbedding", "mistral": "MistralRotaryEmbedding", "qwen2": "Qwen2RotaryEmbedding",
                "qwen3": "Qwen3RotaryEmbedding"}[model_type]
    rope = getattr(mod, cls_name)(config=hf_config)  # the signature's other arguments vary across versions
    return rope.inv_freq.detach().float().to(device), float(getattr(rope, "attention_scaling", 1.0))


NORM_MODES = ("partials", "kernel", "prologue", "folded")


def _norm_mode(norm_mode: str | None, inline_norm: bool | None) -> str:
    """``norm_mode``, or the older ``inline_norm`` spelling of it (``True``: prologue, ``False``: kernel)."""
    if inline_norm is not None:
        legacy = "prologue" if inline_norm else "kernel"
        if norm_mode is not None and norm_mode != legacy:
            raise ValueError(f"inline_norm={inline_norm} means norm_mode={legacy!r}, which contradicts "
                             f"norm_mode={norm_mode!r}; pass norm_mode only")
        return legacy
    norm_mode = "folded" if norm_mode is None else norm_mode
    if norm_mode not in NORM_MODES:
        raise ValueError(f"norm_mode must be one of {NORM_MODES}, got {norm_mode!r}")
    return norm_mode


class LlamaTarget(TargetModel):
    """Fast Llama-family runner. Build with :meth:`from_hf` or :meth:`from_pretrained`.

    Parameters
    ----------
    config: the :class:`TargetConfig`.
    state_dict: transformers parameter names (``model.layers.{i}.self_attn.q_proj.weight`` ...); q/k/v/o and MLP
        biases and the Qwen3 ``q_norm``/``k_norm`` are used when present.
    inv_freq, attention_scaling: RoPE frequencies and cos/sin scale (from transformers' rotary class).
    device, dtype: where and in what precision the weights live.
    ops: ``"auto"`` (Triton kernels and the fused forward on CUDA when available), ``"torch"`` or ``"triton"``
        (on the CPU: Triton's interpreter, for tests).
    fused_forward: use the fused batch-invariant Triton forward (default: whenever the Triton ops are selected);
        ``False`` keeps the PyTorch layer sequence with the Triton attention (the previous CUDA path).
    linear_configs: tile configurations of the weight products by name (``"qkv"``, ``"o"``, ``"gate_up"``,
        ``"down"``, ``"lm_head"``), default :func:`eagle_triton.ops.target_linear.default_config` per shape.
    norm_mode: fused forward only, how the input/post-attention RMSNorms are applied (all batch-invariant; they
        round alike up to the order of the row's sum of squares): ``"folded"`` (default): the norm weights folded
        into the q/k/v and gate/up weights at load (``W * w_norm``, rounded once), the rows streamed unnormalised
        and each output row scaled by its ``rstd`` (from the partial sums of squares the producing kernels write)
        in the product's epilogue: no norm launches and no per-element prologue work; it differs from the others
        by the rounding of the normalised row and of the folded weights (within the dtype's tolerance of
        transformers' layers). ``"kernel"``: a separate RMSNorm kernel before the product. ``"partials"``: from the
        partial sums, the normalisation in the q/k/v and gate/up products' prologue (slower on the H100: 8B
        decode 7.53 against 6.04 ms, SmolLM2 1.21 against 1.03 ms). ``"prologue"``: every program of the product
        re-reads its row tile to sum the squares (slower than ``"kernel"``: +7.6 / +12 us per q/k/v / gate-up
        product at 1 row, +21 / +72 us at 60 rows, ``bench/results/target_forward_2026-11-24/``). The final norm
        is always its own kernel (its output is the lm_head input and the EAGLE-1 feature).
    inline_norm: the older spelling: ``True`` is ``norm_mode="prologue"``, ``False`` is ``norm_mode="kernel"``.
    fuse_rope: fused forward only: RoPE and the KV-cache write as the epilogue of the q/k/v product
        (:func:`eagle_triton.ops.rope_kv.target_qkv_rope`: one launch less per layer, batch-invariant; within a
        last bit of the two kernels) where the head shape allows (``head_dim >= 32``, no Qwen3 q/k norm);
        ``False``: always the two.
    cuda_graphs: capture the decode and verify steps on CUDA (default: on for CUDA).
    eos_token_ids: end-of-sequence ids (the engine's default stop tokens).
    """

    def __init__(self, config: TargetConfig, state_dict: dict[str, torch.Tensor], inv_freq: torch.Tensor,
                 attention_scaling: float = 1.0, device=None, dtype: torch.dtype | None = None, ops: str = "auto",
                 cuda_graphs: bool | None = None, eos_token_ids=None, fused_forward: bool | None = None,
                 linear_configs: dict | None = None, inline_norm: bool | None = None,
                 norm_mode: str | None = None, fuse_rope: bool = True):
        self.config = c = config
        first = state_dict["model.embed_tokens.weight"]
        self.device = torch.device(device) if device is not None else first.device
        self.dtype = dtype or first.dtype
        self.vocab_size, self.hidden_size, self.num_layers = c.vocab_size, c.hidden_size, c.num_layers
        self.eos_token_ids = list(eos_token_ids or [])
        if ops == "triton" and self.device.type == "cpu" and is_interpreter():
            self.ops = TritonOps()  # the kernels run under Triton's interpreter (tests)
        else:
            self.ops = select_ops(self.device, ops)
        is_triton = isinstance(self.ops, TritonOps)
        self.fused_forward = is_triton if fused_forward is None else bool(fused_forward)
        if self.fused_forward and not is_triton:
            raise ValueError("fused_forward=True needs the Triton ops (ops='triton', or 'auto' on CUDA)")
        self._linear_overrides = dict(linear_configs or {})
        self.fuse_rope = bool(fuse_rope)
        self.norm_mode = _norm_mode(norm_mode, inline_norm)
        self.use_cuda_graphs = (self.device.type == "cuda") if cuda_graphs is None else bool(cuda_graphs)
        if self.use_cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs=True needs a CUDA device")
        self.inv_freq = inv_freq.float().to(self.device)
        self.attention_scaling = attention_scaling
        self._load(state_dict)
        if self.norm_mode == "folded" and self.fused_forward:
            from ..ops.target_linear import fold_norm_weight

            for L in self.layers:  # w_qkv and w_gate_up are this runner's own (concatenated at load)
                L.w_qkv = fold_norm_weight(L.w_qkv, L.ln_in)
                L.w_gate_up = fold_norm_weight(L.w_gate_up, L.ln_post)
        self._linear_configs = self._make_linear_configs() if self.fused_forward else {}
        self.cache: StaticKVCache | None = None  # the slots stepped now: a view of the first slots of _store
        self._store: StaticKVCache | None = None  # every allocated slot
        self._buckets: dict[int, StaticKVCache] = {}
        #: changes whenever the cache storage is reallocated (every graph captured on the old one is stale)
        self.cache_generation = 0
        self.feature_mode: str | None = None
        self.taps: tuple[int, ...] = ()
        self._graphs = GraphedStep(self._step) if self.use_cuda_graphs else None
        # Full prefill chunks of the fused forward replay graphs too (one with the lm_head, one without, for every
        # cache slot: see _chunk_graph), created on first use.
        self._use_chunk_graphs = self.use_cuda_graphs and self.fused_forward
        self._chunk_graphs: dict[bool, GraphedStep] = {}
        self._prefill_slot = torch.zeros(1, dtype=torch.int32, device=self.device)  # the slot a prefill writes
        self._prefill_row = torch.zeros(1, dtype=torch.long, device=self.device)  # its last chunk's last prompt row
        self._chunk_pool = None  # one CUDA-graph memory pool for every chunk graph (they never run concurrently)
        self._max_length = 0
        self.batch_size = 1
        self._slot_lens: list[int] = [0]  # host mirrors of the slots' lengths when batch_size > 1

    # -- construction ------------------------------------------------------------------------------------------
    def _w(self, sd, name, required=True):
        t = sd.get(name)
        if t is None:
            if required:
                raise KeyError(f"target weights lack {name!r}")
            return None
        return t.detach().to(device=self.device, dtype=self.dtype)

    def _load(self, sd: dict[str, torch.Tensor]) -> None:
        c = self.config
        self.embed = self._w(sd, "model.embed_tokens.weight")
        if tuple(self.embed.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(f"embed_tokens has shape {list(self.embed.shape)}, config says "
                             f"[{c.vocab_size}, {c.hidden_size}]")
        self.norm = self._w(sd, "model.norm.weight")
        lm = sd.get("lm_head.weight")
        self.lm_head_weight = self.embed if (lm is None or c.tie_word_embeddings) else self._w(sd, "lm_head.weight")
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            L = _Layer()
            q, k, v = (self._w(sd, p + f"self_attn.{n}_proj.weight") for n in "qkv")
            L.w_qkv = torch.cat([q, k, v], 0)
            biases = [self._w(sd, p + f"self_attn.{n}_proj.bias", False) for n in "qkv"]
            if any(b is not None for b in biases):
                sizes = (q.shape[0], k.shape[0], v.shape[0])
                L.b_qkv = torch.cat([b if b is not None else torch.zeros(n, device=self.device, dtype=self.dtype)
                                     for b, n in zip(biases, sizes, strict=True)])
            else:
                L.b_qkv = None
            L.w_o = self._w(sd, p + "self_attn.o_proj.weight")
            L.b_o = self._w(sd, p + "self_attn.o_proj.bias", False)
            gate, up = self._w(sd, p + "mlp.gate_proj.weight"), self._w(sd, p + "mlp.up_proj.weight")
            L.w_gate_up = torch.cat([gate, up], 0)
            bg, bu = self._w(sd, p + "mlp.gate_proj.bias", False), self._w(sd, p + "mlp.up_proj.bias", False)
            L.b_gate_up = None if bg is None else torch.cat([bg, bu])
            L.w_down = self._w(sd, p + "mlp.down_proj.weight")
            L.b_down = self._w(sd, p + "mlp.down_proj.bias", False)
            L.ln_in = self._w(sd, p + "input_layernorm.weight")
            L.ln_post = self._w(sd, p + "post_attention_layernorm.weight")
            L.q_norm = self._w(sd, p + "self_attn.q_norm.weight", False)
            L.k_norm = self._w(sd, p + "self_attn.k_norm.weight", False)
            expect = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
            if L.w_qkv.shape != (expect, c.hidden_size):
                raise ValueError(f"layer {i}: q/k/v projections give {list(L.w_qkv.shape)}, config implies "
                                 f"[{expect}, {c.hidden_size}]")
            self.layers.append(L)

    def _make_linear_configs(self) -> dict:
        """One fixed tile configuration per weight shape (never per row count: batch invariance)."""
        from ..ops.target_linear import default_config

        shapes = {"qkv": self.layers[0].w_qkv.shape, "o": self.layers[0].w_o.shape,
                  "gate_up": (self.layers[0].w_gate_up.shape[0] // 2, self.hidden_size),
                  "down": self.layers[0].w_down.shape, "lm_head": self.lm_head_weight.shape}
        unknown = set(self._linear_overrides) - set(shapes) - {"qkv_rope"}
        if unknown:
            raise ValueError(f"linear_configs has unknown names {sorted(unknown)}; use "
                             f"{sorted(shapes) + ['qkv_rope']}")
        cfgs = {name: self._linear_overrides.get(name)
                or default_config(n, k, self.device, self.dtype, silu_mul=name == "gate_up")
                for name, (n, k) in shapes.items()}
        cfgs["qkv_rope"] = self._qkv_rope_config()
        return cfgs

    def _qkv_rope_config(self):
        """Tiles of the q/k/v product with the RoPE/KV-write epilogue, or None where the forward keeps the two
        kernels (``fuse_rope=False``, Qwen3's q/k norm, a head too narrow, or an explicit ``"qkv"`` override
        without a ``"qkv_rope"`` one)."""
        from ..ops.rope_kv import qkv_rope_config

        c = self.config
        if not self.fuse_rope or self.layers[0].q_norm is not None:
            return None
        if "qkv_rope" in self._linear_overrides:
            return self._linear_overrides["qkv_rope"]
        if "qkv" in self._linear_overrides:
            return None
        return qkv_rope_config(c.num_heads, c.num_kv_heads, c.head_dim, self.hidden_size, self.device, self.dtype)

    @classmethod
    def from_hf(cls, model, device=None, dtype=None, **kwargs) -> LlamaTarget:
        """Take the weights of a transformers ``*ForCausalLM`` (Llama, Mistral, Qwen2, Qwen3).

        Tensors already on ``device`` in ``dtype`` are shared, not copied (except the fused q/k/v and gate/up).
        """
        cfg = model.config
        tcfg = TargetConfig.from_hf(cfg)
        sd = dict(model.state_dict())
        dev = torch.device(device) if device is not None else next(model.parameters()).device
        rope = getattr(getattr(model, "model", None), "rotary_emb", None)
        if rope is not None and hasattr(rope, "inv_freq"):
            inv_freq, scaling = rope.inv_freq.detach().float(), float(getattr(rope, "attention_scaling", 1.0))
        else:
            inv_freq, scaling = _rotary_from_config(cfg, "cpu")
        kwargs.setdefault("eos_token_ids", _eos_ids(model))
        return cls(tcfg, sd, inv_freq, scaling, device=dev, dtype=dtype or next(model.parameters()).dtype, **kwargs)

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None, **kwargs) -> LlamaTarget:
        """Read a transformers-format checkpoint directory (``config.json`` + safetensors, sharded or not)."""
        from safetensors.torch import load_file

        from .fast_config import read_simple_llama_config

        root = Path(path)
        if not (root / "config.json").is_file():
            raise FileNotFoundError(f"{root} has no config.json (not a transformers checkpoint directory)")
        simple = read_simple_llama_config(root)  # plain Llama configs skip ~2 s of transformers imports
        if simple is not None:
            cfg, inv_freq, scaling = simple
        else:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(str(root))
            inv_freq, scaling = _rotary_from_config(cfg, "cpu")
        tcfg = TargetConfig.from_hf(cfg)
        index = root / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (root / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError(f"{root} has no model.safetensors or model.safetensors.index.json")
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            if not (root / f).is_file():
                raise FileNotFoundError(f"shard {f} listed in {index} is missing")
            try:
                sd.update(load_file(str(root / f)))
            except Exception as e:  # safetensors raises its own error type for corrupt headers
                raise ValueError(f"cannot read safetensors file {root / f}: {e}") from e
        dtype = dtype or _config_dtype(cfg) or torch.float32
        eos = _as_list(getattr(cfg, "eos_token_id", None))
        gen = root / "generation_config.json"
        if gen.is_file():
            eos = _as_list(json.loads(gen.read_text()).get("eos_token_id")) or eos
        kwargs.setdefault("eos_token_ids", eos)
        return cls(tcfg, sd, inv_freq, scaling, device=device or "cpu", dtype=dtype, **kwargs)

    # -- caches ------------------------------------------------------------------------------------------------
    def setup(self, max_length: int, feature_mode: str | None = None, batch_size: int = 1) -> None:
        """Allocate the KV cache for ``max_length`` rows per sequence (callers add room for one tree) in
        ``batch_size`` slots, choose features, and forget every slot.

        The storage only grows: a smaller ``batch_size`` than allocated runs on the first slots of it (a *bucket*,
        :meth:`StaticKVCache.first_slots`), so the CUDA graphs captured for each batch size stay valid while the
        engine moves between them; :attr:`cache_generation` changes only when the storage is reallocated.

        A batched target (``batch_size > 1``) prefills one sequence per slot (:meth:`prefill` with ``slot``) and
        steps all slots at once (:meth:`verify_rows`, :meth:`decode_rows`, :meth:`commit_rows`); the batch-1
        methods :meth:`decode`, :meth:`verify`, :meth:`commit` and :attr:`length` are for ``batch_size == 1``.
        """
        c = self.config
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if feature_mode not in (None, "eagle3", "eagle1"):
            raise ValueError(f"feature_mode must be None, 'eagle3' or 'eagle1', got {feature_mode!r}")
        if c.sliding_window is not None and max_length > c.sliding_window:
            raise ValueError(f"{c.model_type} uses a sliding window of {c.sliding_window} tokens, which the fast path "
                             f"does not implement; use max_length <= {c.sliding_window}")
        store = self._store
        if store is None or store.max_length < max_length or store.k.shape[1] < batch_size:
            slots = max(batch_size, store.k.shape[1] if store is not None else 1)  # slots only grow
            self.cache = self._store = None  # free the old buffers before allocating the new ones
            self._buckets.clear()
            self._store = StaticKVCache(c.num_layers, slots, max_length, c.num_kv_heads, c.head_dim, self.dtype,
                                        self.device)
            self.cache_generation += 1
            n = self._store.max_length
            t = torch.arange(n, device=self.device, dtype=torch.float32)
            freqs = t[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cos = (emb.cos() * self.attention_scaling).to(self.dtype)
            self.sin = (emb.sin() * self.attention_scaling).to(self.dtype)
            self._reset_graphs()
        self._use_bucket(batch_size)
        if feature_mode != self.feature_mode:
            self.feature_mode = feature_mode
            self.taps = eagle3_tap_layers(c.num_layers) if feature_mode == "eagle3" else ()
            self._reset_graphs()
        self.reset()

    def _reset_graphs(self) -> None:
        if self._graphs is not None:
            self._graphs.reset()
        self._chunk_graphs.clear()  # their functions captured views of the old cache
        self._chunk_pool = None

    def reset(self, slot: int | None = None) -> None:
        """Forget every sequence, or only the one in ``slot`` (the other slots keep their rows)."""
        if self.cache is None:
            return
        if slot is None:
            self.cache.reset()
            self._slot_lens = [0] * self.batch_size
            return
        self._check_slot(slot)
        self.cache.seqlens[slot:slot + 1].zero_()
        self._set_host_len(slot, 0)

    def _use_bucket(self, batch_size: int) -> None:
        """Step the first ``batch_size`` slots of the storage from now on (one cache view per size, kept, so that
        graphs captured on it find the same object)."""
        view = self._buckets.get(batch_size)
        if view is None:
            view = self._buckets[batch_size] = self._store.first_slots(batch_size)
        self.cache, self.batch_size = view, batch_size

    def keep_slots(self, slots: list[int], batch_size: int) -> None:
        """Keep only the sequences of ``slots`` (in that order) in the first slots of a ``batch_size >= len(slots)``
        bucket: a batch whose last sequences fit a smaller batch moves them there (the rows of the slots that move
        are copied on the device, in place; the bucket's other slots are emptied). Nothing is reallocated within the
        allocated slots, so no graph needs capturing again."""
        if self.cache is None:
            raise ValueError("call setup() before keep_slots()")
        slots = [self._check_slot(s) for s in slots]
        if not 1 <= len(slots) <= batch_size:
            raise ValueError(f"keep_slots: {len(slots)} slots do not fit batch_size {batch_size}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"keep_slots: slots {slots} repeat a slot")
        lens, n = self.lengths, len(slots)
        if batch_size > self._store.k.shape[1]:  # beyond the storage: grow it (a reallocation), rows copied over
            old = self._store
            self.setup(old.max_length, self.feature_mode, batch_size)
            idx = torch.tensor(slots, device=self.device)
            self._store.k[:, :n].copy_(old.k.index_select(1, idx))
            self._store.v[:, :n].copy_(old.v.index_select(1, idx))
            self._store.seqlens[:n].copy_(old.seqlens.index_select(0, idx))
        else:
            self._store.move_slots(slots)
            self._store.seqlens[n:].zero_()  # every slot beyond the kept ones is empty, in every bucket
            self._use_bucket(batch_size)
        self._slot_lens = [lens[s] for s in slots] + [0] * (batch_size - n)
        self.cache.host_len = self._slot_lens[0] if batch_size == 1 else 0

    def _check_slot(self, slot) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.batch_size:
            raise ValueError(f"slot must be an int in [0, {self.batch_size}) (the batch_size given to setup), "
                             f"got {slot!r}")
        return slot

    def _host_len(self, slot: int) -> int:
        """Host mirror of ``slot``'s committed rows (batch 1: the cache's own ``host_len``)."""
        return self.cache.host_len if self.batch_size == 1 else self._slot_lens[slot]

    def _set_host_len(self, slot: int, n: int) -> None:
        if self.batch_size == 1:
            self.cache.host_len = n
        else:
            self._slot_lens[slot] = n

    def _check_slot_room(self, slot: int, n: int) -> None:
        if self.batch_size == 1:
            self.cache.check_room(n)
        elif self._slot_lens[slot] + n > self.cache.max_length:
            raise ValueError(f"KV cache capacity exceeded in slot {slot}: {self._slot_lens[slot]} rows held + {n} "
                             f"new > {self.cache.max_length} allocated")

    def _check_batch_room(self, n: int) -> None:
        """Capacity for ``n`` more rows in every slot, from the host mirrors (a lower bound of the device lengths,
        so this never reads the device and never refuses a step that fits)."""
        held = max(self.lengths)
        if held + n > self.cache.max_length:
            raise ValueError(f"KV cache capacity exceeded: a slot holds {held} rows + {n} new > "
                             f"{self.cache.max_length} allocated")

    def _kv(self, slot: int | None):
        """``(k [NL, b, Lmax, Hkv, D], v, seqlens [b])``: every slot (``slot=None``) or views of one slot."""
        c = self.cache
        if slot is None:
            return c.k, c.v, c.seqlens
        return c.k[:, slot:slot + 1], c.v[:, slot:slot + 1], c.seqlens[slot:slot + 1]

    @property
    def length(self) -> int:
        """Committed rows known to the host (batch 1; a batched target has one per slot: :attr:`lengths`)."""
        if self.cache is not None and self.batch_size != 1:
            raise ValueError(f"a target set up with batch_size={self.batch_size} has one length per slot: read "
                             "`lengths`")
        return 0 if self.cache is None else self.cache.host_len

    @property
    def lengths(self) -> list[int]:
        """Committed rows of each slot known to the host (they lag the device by the steps not yet noted with
        :meth:`note_committed`)."""
        if self.cache is None:
            return []
        return [self._host_len(b) for b in range(self.batch_size)]

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else self.cache.max_length

    def input_embeddings(self) -> torch.Tensor:
        return self.embed

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.lm_head_weight)

    # -- forward -----------------------------------------------------------------------------------------------
    def _forward(self, tokens, positions, tree_mask, kv_limit, last_only: bool, slot: int | None = None,
                 want_features: bool = True, argmax: bool = False):
        """``kv_limit``: an upper bound on the rows any query row reads (or None): the fused forward plans its
        attention launches with it, the eager CPU ops read only that many rows. ``want_features=False``: no
        features (plain decoding; the fused forward then skips gathering them). ``argmax`` (fused forward only,
        every row's logits): return each row's argmax key instead of its logits (:attr:`fused_argmax`)."""
        tree_mask = self._tree_mask_arg(tree_mask)
        if self.fused_forward:
            return self._forward_fused(tokens, positions, tree_mask, last_only, slot=slot, kv_limit=kv_limit,
                                       want_features=want_features, argmax=argmax)
        limit = kv_limit if self.ops.reads_kv_limit else None
        logits, feats = self._forward_torch(tokens, positions, tree_mask, limit, last_only, slot=slot)
        return logits, (feats if want_features else None)

    def _tree_mask_arg(self, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The tree mask as the forward's attention takes it. A float mask (cells ``> 0.5`` true: the drafters'
        ``tree_mask[:, 0]``) goes to the fused forward's attention as it is, which reads it without a conversion
        launch; the other forwards' attention ops take bool (``> 0.5`` here, once per forward)."""
        if tree_mask is None or tree_mask.dtype == torch.bool:
            return tree_mask
        if tree_mask.is_floating_point():
            if self.fused_forward and tree_mask.dtype in (torch.float16, torch.bfloat16, torch.float32):
                return tree_mask
            return tree_mask > 0.5
        return tree_mask.to(torch.bool)

    @functools.cached_property
    def _attention_split(self) -> int | None:
        """Key positions per split of the fused forward's attention (None without it; fixed by the dtype and head
        shape, so read once)."""
        if not self.fused_forward:
            return None
        from ..ops.target_attention.op import target_attention_config

        c = self.config
        return target_attention_config(self.dtype, c.head_dim, c.num_heads // c.num_kv_heads).split

    def attention_bucket(self, kv_limit: int | None) -> int | None:
        """The ``kv_limit`` a captured step is planned with, from an upper bound on the rows it reads: one split
        (contexts within one attention split need no launch that merges splits) or None (any length). One graph
        per bucket."""
        split = self._attention_split
        return split if split is not None and kv_limit is not None and kv_limit <= split else None

    def _forward_fused(self, tokens, positions, tree_mask, last_only: bool, want_logits: bool = True,
                       slot: int | None = None, cache_slots: torch.Tensor | None = None,
                       last_row: torch.Tensor | None = None, kv_limit: int | None = None,
                       want_features: bool = True, argmax: bool = False):
        """The fused batch-invariant forward of ``tokens [B, S]`` written at cache rows ``seqlens[b] + j`` (every
        slot, ``B = batch_size``; or ``B = 1`` into ``slot``). The weight products run over the ``B S`` rows,
        each row reduced in an order independent of the others, so a sequence's rows round as when it runs
        alone. ``cache_slots`` (int32 ``[B]`` on the device, instead of ``slot``): sequence ``b`` uses slot
        ``cache_slots[b]`` of the whole storage, chosen at run time (one prefill graph serves every slot).
        ``last_row`` (int64 ``[1]`` on the device, with ``last_only``): the row whose logits are computed.
        ``kv_limit``: an upper bound on every row's key count (``target_attention``'s ``max_seqlen``).
        ``argmax`` (with ``want_logits``, every row, ``last_only`` False): instead of the logits, each row's argmax
        key (int64 ``[B, S]``, :func:`~eagle_triton.ops.target_linear.argmax_from_keys`): the lm_head merges its
        tiles' maxima into them and stores no logits, and the final norm resets them (no launch of its own)."""
        from .. import ops as tops
        from ..ops.rope_kv import target_rope_kv
        from ..ops.target_linear import target_embedding, target_linear, target_rms_norm

        if argmax and want_logits and (last_only or last_row is not None):
            raise ValueError("argmax keys are made for every row (last_only=False, no last_row)")
        attention = tops.target_attention
        c, cfg = self.config, self._linear_configs
        if cache_slots is None:
            k_all, v_all, seqlens = self._kv(slot)
        else:
            k_all, v_all, seqlens = self._store.k, self._store.v, self._store.seqlens
        B, S = tokens.shape
        M = B * S
        eps, hd = c.rms_norm_eps, c.head_dim
        scale = hd ** -0.5
        # Partial sums of squares of the residual stream (norm_mode "partials"): ss_mlp is written by the embedding
        # gather and the down products and read by the next q/k/v product (or the final norm), ss_attn is written
        # by the o products and read by the gate/up product. Row-major [S, P]: a reading program loads its row
        # tile's partials as one contiguous block (each partial is written once and read by every program of the
        # next product, so the layout serves the reads).
        ss_mlp = ss_attn = None
        if self.norm_mode in ("partials", "folded"):
            ss_mlp = self._sumsq_buffer(M, "down")
            ss_attn = self._sumsq_buffer(M, "o")
        x = target_embedding(tokens.reshape(M), self.embed, sumsq_out=ss_mlp, validate=False)  # [M, H]
        pos = positions.reshape(B, S)
        # EAGLE-3 features [M, 3H]: the down product that makes a tapped layer's input writes it straight into that
        # tap's slice (the next layer reads the strided view as its x: the kernels take any row stride), so no
        # concatenation runs; a tap no down product makes (the embedding, a layer tapped twice: shallow targets
        # only) is copied in.
        H = self.hidden_size
        eagle3 = want_features and self.feature_mode == "eagle3"
        feats = torch.empty(M, len(self.taps) * H, device=self.device, dtype=self.dtype) if eagle3 else None
        tap_out = [feats[:, j * H:(j + 1) * H] for j in range(len(self.taps))] if eagle3 else []
        # the tree's ancestor table, made once and read by every layer's attention instead of the mask
        ancestors = None if tree_mask is None else tops.tree_ancestors(tree_mask, validate=False)
        for i, L in enumerate(self.layers):
            for j, t in enumerate(self.taps if eagle3 else ()):
                if t == i and tap_out[j].data_ptr() != x.data_ptr():
                    tap_out[j].copy_(x)
            k_cache, v_cache = k_all[i], v_all[i]
            if cfg["qkv_rope"] is not None:  # one kernel: the q/k/v product with RoPE and the KV write
                q = self._qkv_rope(x, ss_mlp, L, k_cache, v_cache, seqlens, pos, cache_slots, cfg["qkv_rope"])
            else:
                qkv = self._normed_linear(x, ss_mlp, L.ln_in, L.w_qkv, L.b_qkv, cfg["qkv"])
                q = target_rope_kv(qkv, k_cache, v_cache, seqlens, pos, self.cos, self.sin, c.num_heads,
                                   c.num_kv_heads, L.q_norm, L.k_norm, eps, validate=False, cache_slots=cache_slots)
            o = attention(q.view(B, S, c.num_heads, hd), k_cache, v_cache, seqlens, tree_mask,
                          softmax_scale=scale, validate=False, cache_slots=cache_slots, max_seqlen=kv_limit,
                          tree_ancestors=ancestors, tree_ancestors_early=True)
            x = target_linear(o.view(M, c.num_heads * hd), L.w_o, L.b_o, residual=x, sumsq_out=ss_attn,
                              config=cfg["o"], validate=False)
            h = self._normed_linear(x, ss_attn, L.ln_post, L.w_gate_up, L.b_gate_up, cfg["gate_up"], silu_mul=True)
            out = tap_out[self.taps.index(i + 1)] if eagle3 and i + 1 in self.taps else None  # a tapped input
            x = target_linear(h, L.w_down, L.b_down, residual=x, sumsq_out=ss_mlp, config=cfg["down"], out=out,
                              validate=False)
        # The final norm stays a kernel of its own: its output is both the lm_head input and the EAGLE-1 feature.
        keys = torch.empty(M, dtype=torch.int64, device=self.device) if argmax and want_logits else None
        h = target_rms_norm(x, self.norm, eps, sumsq=ss_mlp, validate=False, reset_argmax_keys=keys)
        if not want_features:
            feats = None
        elif self.feature_mode == "eagle3":
            feats = feats.view(B, S, -1)
        elif self.feature_mode == "eagle1":
            feats = h.view(B, S, -1)
        else:
            feats = None
        logits = None
        if want_logits:
            if last_row is not None:  # a prefill chunk's last prompt row (a device index: padded chunks)
                rows = h.view(B, S, -1).index_select(1, last_row).view(B, -1)
            else:
                rows = h.view(B, S, -1)[:, -1] if last_only else h  # last_only: each sequence's last row
            if keys is not None:
                target_linear(rows, self.lm_head_weight, config=cfg["lm_head"], validate=False, argmax_keys=keys,
                              store_output=False)
                return keys.view(B, S), feats
            logits = target_linear(rows, self.lm_head_weight, config=cfg["lm_head"],
                                   validate=False).view(B, 1 if last_only else S, -1)
        return logits, feats

    def _sumsq_buffer(self, S: int, producer: str) -> torch.Tensor:
        """fp32 row-major ``[S, P]`` for the partial sums of squares the ``producer`` product writes
        (``P`` = its output tiles); the embedding gather writes the same ``P`` as the down product, so every q/k/v
        product reads one partial count (one compiled variant). The rows are padded to a multiple of 16 floats
        (a view of the first ``P`` columns): the readers' ``[rows, P]`` loads are then 16-byte vectors (at
        SmolLM2's ``P = 36`` the scalar loads more than doubled the q/k/v product's instructions)."""
        from ..ops.target_linear import sumsq_width

        P = sumsq_width(self.hidden_size, self._linear_configs[producer])
        return torch.empty(S, -(-P // 16) * 16, device=self.device, dtype=torch.float32)[:, :P]

    def _norm_inputs(self, x, sumsq, norm_weight):
        """The rows and RMSNorm arguments of a normed product as ``norm_mode`` says: the norm in the product's
        prologue from the partial sums of squares ``sumsq`` (``"partials"``) or from the row itself
        (``"prologue"``), as its own kernel first (``"kernel"``), or folded into the weight with ``rstd`` applied to
        the product (``"folded"``)."""
        from ..ops.target_linear import target_rms_norm

        eps = self.config.rms_norm_eps
        if self.norm_mode == "kernel":
            return target_rms_norm(x, norm_weight, eps, validate=False), {}
        if self.norm_mode == "folded":  # norm_weight is folded into weight (at load): rstd scales the product
            return x, dict(eps=eps, sumsq=sumsq, norm_folded=True)
        return x, dict(norm_weight=norm_weight, eps=eps, sumsq=sumsq)

    def _normed_linear(self, x, sumsq, norm_weight, weight, bias, config, silu_mul: bool = False):
        """``linear(rms_norm(x))`` (:meth:`_norm_inputs`)."""
        from ..ops.target_linear import target_linear

        x, norm = self._norm_inputs(x, sumsq, norm_weight)
        return target_linear(x, weight, bias, silu_mul=silu_mul, config=config, validate=False, **norm)

    def _qkv_rope(self, x, sumsq, L, k_cache, v_cache, seqlens, pos, cache_slots, config):
        """:func:`~eagle_triton.ops.rope_kv.target_qkv_rope` of the layer's normed input (:meth:`_norm_inputs`)."""
        from ..ops.rope_kv import target_qkv_rope

        c = self.config
        x, norm = self._norm_inputs(x, sumsq, L.ln_in)
        return target_qkv_rope(x, L.w_qkv, L.b_qkv, k_cache, v_cache, seqlens, pos, self.cos, self.sin, c.num_heads,
                               c.num_kv_heads, config=config, validate=False, cache_slots=cache_slots, **norm)

    def _chunk_step(self, tokens, last: bool, kv_limit: int | None = None):
        """One prefill chunk of the slot in ``_prefill_slot`` (a device scalar) at rows ``seqlens[slot] + j``
        (the slot and its length read on the device: one graph per chunk kind serves every slot). ``kv_limit``:
        eager chunks plan their attention with the chunk's last row (the graphs, for any length, without)."""
        n = tokens.shape[1]
        slot = self._prefill_slot
        positions = (self._store.seqlens.index_select(0, slot).long() + torch.arange(n, device=self.device))
        return self._forward_fused(tokens, positions.view(1, n), None, last_only=True, want_logits=last,
                                   cache_slots=slot, last_row=self._prefill_row, kv_limit=kv_limit)

    def _chunk_graph(self, last: bool) -> GraphedStep:
        """The CUDA graphs of full prefill chunks (keyed by chunk size inside), with or without the lm_head, for
        every slot: the slot is a device input. Each holds its own output buffers; their intermediates share one
        memory pool."""
        g = self._chunk_graphs.get(last)
        if g is None:
            g = self._chunk_graphs[last] = GraphedStep(lambda tokens, last=last: self._chunk_step(tokens, last))
            if self._chunk_pool is None:
                self._chunk_pool = torch.cuda.graph_pool_handle()
            g.pool = self._chunk_pool
        return g

    def _prefill_fused(self, ids: torch.Tensor, slot: int = 0):
        """Prefill through the fused kernels in chunks whose sizes are ``PREFILL_CHUNKS``.

        A prompt of ``N`` rows runs in full chunks of the largest size, then its remaining rows in one chunk of the
        smallest size that holds them, padded (on CUDA every chunk replays a graph, so a prompt of up to the largest
        size is one forward): the padding rows write K/V rows past the prompt, which nothing reads before a later
        step writes its own rows there, and their outputs are dropped; the row whose logits come back is a device
        input. Rows round alike in any chunk (batch-invariant kernels), so the chunking never changes a bit. Where
        the padding would not fit the cache, the remaining rows run as one exact chunk (eager; the kernels take any
        row count without recompiling).
        """
        N = ids.shape[1]
        big = PREFILL_CHUNKS[0]
        base = self._host_len(slot)
        seqlen = self.cache.seqlens[slot:slot + 1]
        self._prefill_slot.fill_(slot)
        pieces = [(s0, big) for s0 in range(0, N - big, big)]  # (first row, rows): full chunks, then the rest
        s0 = len(pieces) * big
        pieces.append((s0, N - s0))
        feats, logits = [], None
        for idx, (s0, n) in enumerate(pieces):
            last = idx == len(pieces) - 1
            C = min(c for c in PREFILL_CHUNKS if c >= n)
            if base + s0 + C > self.cache.max_length:  # no room for the padding: the exact rows
                C = n
            chunk = ids[:, s0:s0 + n]
            if C > n:
                chunk = torch.cat([chunk, chunk.new_zeros(1, C - n)], dim=1)
            seqlen.fill_(base + s0)
            self._set_host_len(slot, base + s0)
            if last:
                self._prefill_row.fill_(n - 1)
            graph = self._chunk_graph(last) if self._use_chunk_graphs and C in PREFILL_CHUNKS else None
            if graph is not None:
                logits, f = graph(("chunk", C), chunk)
            else:
                logits, f = self._chunk_step(chunk, last, base + s0 + C)
            if f is not None:  # the prompt's rows only; clone: a graph's outputs are overwritten by its next replay
                feats.append(f[:, :n].clone())
        seqlen.fill_(base + N)
        self._set_host_len(slot, base + N)
        return logits, (torch.cat(feats, dim=1) if feats else None)

    def _forward_torch(self, tokens, positions, tree_mask, kv_limit, last_only: bool, slot: int | None = None):
        """Run the layers on ``tokens [B, S]`` written at rows ``seqlens[b] + j`` (every slot, or ``B = 1`` into
        ``slot``); returns (logits, features)."""
        c, ops = self.config, self.ops
        k_all, v_all, seqlens = self._kv(slot)
        B, S = tokens.shape
        x = F.embedding(tokens, self.embed)
        cos = self.cos[positions].unsqueeze(2)  # [B, S, 1, D]
        sin = self.sin[positions].unsqueeze(2)
        taps = []
        nq, nkv, hd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.head_dim
        scale = hd ** -0.5
        for i, L in enumerate(self.layers):
            for t in self.taps:
                if t == i:
                    taps.append(x)
            h = _rms_norm(x, L.ln_in, c.rms_norm_eps)
            qkv = F.linear(h, L.w_qkv, L.b_qkv)
            q = qkv[..., :nq].view(B, S, c.num_heads, hd)
            k = qkv[..., nq:nq + nkv].view(B, S, c.num_kv_heads, hd)
            v = qkv[..., nq + nkv:].reshape(B, S, c.num_kv_heads, hd)
            if L.q_norm is not None:
                q = _rms_norm(q, L.q_norm, c.rms_norm_eps)
                k = _rms_norm(k, L.k_norm, c.rms_norm_eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache, v_cache = k_all[i], v_all[i]
            ops.append_kv_cache(k_cache, v_cache, k, v, seqlens)
            o = ops.tree_attention(q, k_cache, v_cache, seqlens, tree_mask, softmax_scale=scale,
                                   kv_limit=kv_limit)
            x = x + F.linear(o.reshape(B, S, nq), L.w_o, L.b_o)
            h = _rms_norm(x, L.ln_post, c.rms_norm_eps)
            gu = F.linear(h, L.w_gate_up, L.b_gate_up)
            gate, up = gu.chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, L.w_down, L.b_down)
        h = _rms_norm(x, self.norm, c.rms_norm_eps)
        if self.feature_mode == "eagle3":
            feats = torch.cat(taps, dim=-1)
        elif self.feature_mode == "eagle1":
            feats = h
        else:
            feats = None
        logits = self.lm_head(h[:, -1:] if last_only else h)
        return logits, feats

    def _step(self, tokens, positions, tree_mask, kv_limit=None):
        """The fixed-shape step captured in CUDA graphs (decode: ``tree_mask=None``; verify: the tree mask)."""
        return self._forward(tokens, positions, tree_mask, kv_limit, last_only=False)

    def _run(self, tokens, positions, tree_mask):
        S = tokens.shape[1]
        self.cache.check_room(S)
        limit = self.cache.host_len + S  # host-paced: the exact length
        if self._graphs is not None:  # keyed by the mask's dtype too: a copy into another dtype would convert it
            return self._graphs((S, None if tree_mask is None else tree_mask.dtype), tokens, positions, tree_mask,
                                kv_limit=self.attention_bucket(limit))
        return self._forward(tokens, positions, tree_mask, limit, last_only=False)

    def _check_ids(self, ids: torch.Tensor, what: str) -> torch.Tensor:
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError(f"{what} must be [1, S] token ids, got shape {list(ids.shape)}")
        return ids.to(self.device, torch.long)

    def _require_batch1(self) -> None:
        if self.cache is not None and self.batch_size != 1:
            raise ValueError(f"decode/verify/commit step a batch-1 target; this one was set up with batch_size="
                             f"{self.batch_size}: use decode_rows/verify_rows/commit_rows")

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, slot: int = 0):
        """Prefill one sequence ``input_ids [1, N]`` after the rows ``slot`` holds (the other slots are untouched);
        returns its last row's logits ``[1, V]`` and its features ``[1, N, W]`` (or None)."""
        ids = self._check_ids(input_ids, "input_ids")
        slot = self._check_slot(slot)
        N = ids.shape[1]
        self._check_slot_room(slot, N)
        if self.fused_forward:
            logits, feats = self._prefill_fused(ids, slot)
            return logits[:, -1].clone(), feats
        base = self._host_len(slot)
        positions = torch.arange(base, base + N, device=self.device).view(1, N)
        logits, feats = self._forward(ids, positions, None, base + N, last_only=True, slot=slot)
        self.cache.seqlens[slot:slot + 1].add_(N)
        self._set_host_len(slot, base + N)
        return logits[:, -1], feats

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor):
        self._require_batch1()
        ids = self._check_ids(input_ids, "input_ids")
        positions = self.cache.seqlens.view(1, 1).long()
        logits, feats = self._run(ids, positions, None)
        self.cache.advance(1)
        return logits[:, -1], feats

    @torch.no_grad()
    def verify(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor):
        self._require_batch1()
        ids = self._check_ids(tokens, "tree tokens")
        positions = self.cache.seqlens.view(1, 1).long() + depths.to(self.device).long()
        return self._run(ids, positions, tree_mask.to(self.device))  # bool, or float read as > 0.5 (_forward)

    def commit(self, accept_index: torch.Tensor, accept_len: torch.Tensor, accept_len_host: int) -> None:
        self._require_batch1()
        self.cache.compact(self.ops, accept_index, accept_len, accept_len_host)

    # -- device-paced steps (lengths on the device; capturable in the engine's step graphs) --------------------
    @property
    def device_lengths(self) -> bool:
        """Every length lives on the device (``cache.seqlens``) and no op reads it back, so the engine may queue
        steps without reading: with the Triton ops, or on the CPU (where the PyTorch ops' host reads cost no
        synchronisation). The PyTorch ops on CUDA read lengths on the host (KV compaction)."""
        return isinstance(self.ops, TritonOps) or self.device.type == "cpu"

    def _check_rows(self, what: str, t: torch.Tensor, shape: tuple) -> None:
        """Shape check of a step input (metadata only: no device read, so capturable)."""
        if self.cache is None:
            raise ValueError("call setup() before stepping the target")
        if tuple(t.shape) != shape:
            raise ValueError(f"{what} must have shape {list(shape)} (batch_size={self.batch_size}), got "
                             f"{list(t.shape)}")

    @property
    def fused_argmax(self) -> bool:
        """Whether :meth:`verify_rows` and :meth:`decode_rows` can return argmax keys instead of logits
        (``argmax=True``): the fused forward's lm_head writes them and no logits (greedy decoding)."""
        return self.fused_forward

    def verify_rows(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor,
                    kv_limit: int | None = None, argmax: bool = False):
        """:meth:`verify` of every slot at once, without device reads or its own CUDA graph (the caller captures
        the whole step): ``tokens [B, S]``, ``depths [B, S]``, ``tree_mask [B, S, S]`` bool, or float with cells
        ``> 0.5`` true (``B = batch_size``; sequences with smaller trees pad theirs with rows no real row sees; a
        drafter's float mask ``tree.tree_mask[:, 0]`` is read as it is by the fused forward, with no conversion
        launch in the step), written at rows
        ``seqlens[b] + j`` and not committed. Returns ``(logits [B, S, V], features [B, S, W] or None)``; with
        ``argmax`` and :attr:`fused_argmax`, each row's argmax key (int64 ``[B, S]``) instead of its logits.

        ``kv_limit``: an upper bound on the rows the step reads in any slot (an exact shortcut of the eager CPU
        attention; the fused forward plans its attention launches with it: see :meth:`attention_bucket`).
        """
        B = self.batch_size
        S = tokens.shape[-1]
        self._check_rows("tokens", tokens, (B, S))
        self._check_rows("depths", depths, (B, S))
        self._check_rows("tree_mask", tree_mask, (B, S, S))
        self._check_batch_room(S)
        positions = depths.long() + self.cache.seqlens.view(B, 1)  # int64 (one kernel: promotion in the add)
        return self._forward(tokens, positions, tree_mask, kv_limit, last_only=False,
                             argmax=argmax and self.fused_argmax)

    def decode_rows(self, tokens: torch.Tensor, kv_limit: int | None = None, want_features: bool = True,
                    argmax: bool = False):
        """One plain decode step of ``tokens [B, 1]`` at row ``seqlens[b]`` of every slot, committed on the
        device only (see :meth:`note_committed`). Returns ``(logits [B, V], features [B, 1, W] or None)``;
        ``want_features=False`` (plain decoding): None. ``argmax`` with :attr:`fused_argmax`: argmax keys
        (int64 ``[B]``) instead of the logits."""
        B = self.batch_size
        self._check_rows("tokens", tokens, (B, 1))
        self._check_batch_room(1)
        positions = self.cache.seqlens.view(B, 1).long()
        logits, feats = self._forward(tokens, positions, None, kv_limit, last_only=False,
                                      want_features=want_features, argmax=argmax and self.fused_argmax)
        self.cache.seqlens.add_(1)
        return logits[:, -1], feats

    def commit_rows(self, accept_index: torch.Tensor, accept_len: torch.Tensor,
                    rows_kept: torch.Tensor | None = None) -> None:
        """:meth:`commit` of every slot on the device only: ``accept_index [B, C]`` (tree rows of root + accepted
        path), ``accept_len [B]`` (accepted drafts), optionally ``rows_kept`` (``accept_len + 1`` as int32 ``[B]``);
        the host mirrors follow in :meth:`note_committed`."""
        B = self.batch_size
        self._check_rows("accept_index", accept_index, (B, accept_index.shape[-1]))
        self._check_rows("accept_len", accept_len, (B,))
        self.cache.compact(self.ops, accept_index, accept_len, None, rows_kept)

    def note_committed(self, n) -> None:
        """Advance the host mirrors of the lengths by rows the device already committed: ``n`` an int (batch 1)
        or one host int per slot (a list, tuple or CPU tensor of ``batch_size`` values)."""
        if isinstance(n, torch.Tensor):
            n = n.tolist()
        counts = [int(v) for v in n] if isinstance(n, (list, tuple)) else [int(n)]
        if len(counts) != self.batch_size:
            raise ValueError(f"note_committed needs one count per slot ({self.batch_size}), got {len(counts)}")
        for b, k in enumerate(counts):
            self._set_host_len(b, self._host_len(b) + k)


def _as_list(x) -> list[int]:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [int(v) for v in x]
    return [int(x)]


def _eos_ids(model) -> list[int]:
    gen = getattr(model, "generation_config", None)
    eos = _as_list(getattr(gen, "eos_token_id", None)) if gen is not None else []
    return eos or _as_list(getattr(model.config, "eos_token_id", None))


def _config_dtype(cfg) -> torch.dtype | None:
    d = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if isinstance(d, torch.dtype):
        return d
    if isinstance(d, str) and hasattr(torch, d):
        return getattr(torch, d)
    return None
