"""Adapters for objects in SafeAILab EAGLE's layout (``EaModel`` with an ``ea_layer`` draft ``Model``).

:func:`head_from_ea_layer` builds an eagle_triton draft head that *shares* the ``ea_layer``'s parameters (no copy),
so a drafter reads exactly the weights the EAGLE object holds. :func:`patch_ea_model_with_triton_drafter` routes
``ea_layer.topK_genrate`` through an eagle_triton drafter with the same outputs and draft-KV behaviour.
"""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np
import torch

from ..config import TreeConfig
from ..drafter import TreeDrafter
from ..fused.host import FusedDraftBackend
from ..heads import DraftHeadConfig, Eagle1DraftHead, Eagle3DraftHead

__all__ = ["head_from_ea_layer", "tree_config_from_ea_layer", "patch_ea_model_with_triton_drafter", "EaLayerDrafter",
           "rope_base_of_ea_layer"]

_CONFIG_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
    "vocab_size", "draft_vocab_size", "target_hidden_size", "rms_norm_eps", "max_position_embeddings",
    "pad_token_id", "bias", "qkv_bias",
)


def _field(cfg, name: str):
    return cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)


def _rotary_modules(ea_layer) -> list[tuple[str, torch.nn.Module]]:
    """The draft layer's own RoPE modules (``midlayer.self_attn.rotary_emb`` or ``layers.{i}.self_attn...``)."""
    return [(name, mod) for name, mod in ea_layer.named_modules()
            if name.endswith("rotary_emb") and hasattr(mod, "inv_freq")]


def _base_from_inv_freq(inv_freq: torch.Tensor) -> float:
    """The base of ``inv_freq[i] = base ** (-2 i / dim)``, read from the slowest frequency (the most digits),
    rounded to 3 significant digits when that still reproduces the table (bases are round numbers; a table kept
    in fp16/bf16 by ``.to(dtype)`` carries only a few digits of it)."""
    f = inv_freq.detach().double().cpu().flatten()
    dim = 2 * f.numel()
    if f.numel() < 2:
        raise ValueError("a RoPE table with one frequency does not determine its base")
    base = float(f[-1] ** (-dim / (dim - 2)))
    rounded = float(f"{base:.3g}")
    return rounded if _inv_freq_matches(inv_freq, rounded) else base


def _inv_freq_matches(inv_freq: torch.Tensor, base: float) -> bool:
    f = inv_freq.detach().double().cpu().flatten()
    dim = 2 * f.numel()
    want = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    tol = 1e-5 if inv_freq.dtype in (torch.float32, torch.float64) else 1e-2
    return bool(torch.allclose(f, want, rtol=tol, atol=0.0))


def rope_base_of_ea_layer(ea_layer) -> float | None:
    """The RoPE base SafeAILab's draft layer uses, from every place it can be written down.

    Sources: the config's ``rope_theta`` (transformers < 5, SafeAILab's ``EConfig``), ``rope_parameters`` and
    ``rope_scaling`` (transformers >= 5 move ``rope_theta`` into these dicts, and a config there has no
    ``rope_theta`` attribute), and the layer's rotary module itself (its ``base``, or its ``inv_freq`` table).
    Returns ``None`` when none says anything (EAGLE then uses 10000). Raises ``ValueError`` when they disagree, or
    when the draft layer asks for RoPE scaling (EAGLE draft heads use plain RoPE).
    """
    cfg = getattr(ea_layer, "config", None)
    found: dict[str, float] = {}
    theta = _field(cfg, "rope_theta") if cfg is not None else None
    if theta is not None:
        found["config.rope_theta"] = float(theta)
    for name in ("rope_parameters", "rope_scaling"):
        params = _field(cfg, name) if cfg is not None else None
        if not isinstance(params, dict):
            continue
        kind = params.get("rope_type", params.get("type"))
        if kind not in (None, "default"):
            raise ValueError(f"ea_layer.config.{name} asks for RoPE type {kind!r} ({params}); eagle_triton's draft "
                             "heads implement plain RoPE only, as SafeAILab's EAGLE heads use")
        if params.get("rope_theta") is not None:
            found[f"config.{name}['rope_theta']"] = float(params["rope_theta"])
    tables = []
    for path, mod in _rotary_modules(ea_layer):
        base = getattr(mod, "base", None)
        if isinstance(base, (int, float)) and not isinstance(base, bool):
            found[f"ea_layer.{path}.base"] = float(base)
        tables.append((path, mod.inv_freq))
    if not found and tables:
        found[f"ea_layer.{tables[0][0]}.inv_freq"] = _base_from_inv_freq(tables[0][1])
    values = set(found.values())
    if len(values) > 1:
        detail = ", ".join(f"{k} = {v:g}" for k, v in found.items())
        raise ValueError(f"the draft layer's RoPE base is ambiguous ({detail}): refusing to guess which one its "
                         "weights were trained with")
    base = values.pop() if values else None
    for path, inv_freq in tables:
        if inv_freq.device.type != "meta" and not _inv_freq_matches(inv_freq, 10000.0 if base is None else base):
            said = ", ".join(f"{k} = {v:g}" for k, v in found.items()) or "nothing (default 10000)"
            raise ValueError(f"ea_layer.{path}.inv_freq is a RoPE table of base ~{_base_from_inv_freq(inv_freq):g}, "
                             f"but the config says {said}: refusing to draft with a RoPE base the layer does not use")
    return base


def _config_of(ea_layer) -> DraftHeadConfig:
    cfg = getattr(ea_layer, "config", None)
    if cfg is None:
        raise TypeError("ea_layer has no .config: not an EAGLE draft model in SafeAILab's layout")
    data: dict[str, Any] = {}
    for name in _CONFIG_FIELDS:
        value = _field(cfg, name)
        if value is not None:
            data[name] = value
    base = rope_base_of_ea_layer(ea_layer)
    if base is not None:
        data["rope_theta"] = base
    if "midlayer" in dict(ea_layer.named_children()) and "draft_vocab_size" not in data:
        data["draft_vocab_size"] = ea_layer.lm_head.weight.shape[0]
    if "fc" in dict(ea_layer.named_children()) and "bias" not in data:
        data["bias"] = ea_layer.fc.bias is not None
    return DraftHeadConfig.from_dict(data)


def _share(dst: torch.nn.Module, src: torch.nn.Module, path: str) -> None:
    """Point every parameter and buffer of ``dst`` at ``src``'s tensor of the same name (shape-checked)."""
    src_params = dict(src.named_parameters())
    src_buffers = dict(src.named_buffers())
    for name, p in list(dst.named_parameters()):
        if name not in src_params:
            if name.endswith(".bias"):
                continue
            raise TypeError(f"{path} has no parameter {name!r}: not in SafeAILab's draft-head layout")
        s = src_params[name]
        if s.shape != p.shape:
            raise ValueError(f"{path}.{name} has shape {list(s.shape)}, the head expects {list(p.shape)}")
        mod_name, _, attr = name.rpartition(".")
        setattr(dst.get_submodule(mod_name) if mod_name else dst, attr, s)
    for name in ("d2t", "t2d"):
        if name in dict(dst.named_buffers()) and name in src_buffers:
            setattr(dst, name, src_buffers[name])


def head_from_ea_layer(ea_layer, lm_head=None):
    """An :class:`Eagle3DraftHead` (``ea_layer.midlayer``) or :class:`Eagle1DraftHead` (``ea_layer.layers``)
    whose parameters are the ``ea_layer``'s own tensors. EAGLE-1 heads need the target's ``lm_head``."""
    config = _config_of(ea_layer)
    children = dict(ea_layer.named_children())
    if "midlayer" in children:
        with torch.device("meta"):
            head = Eagle3DraftHead(config)
        # RoPE tables are buffers computed from the config: rebuild them on the real device.
        dev = ea_layer.fc.weight.device
        head = head.to_empty(device=dev)
        head.midlayer.self_attn.rotary_emb.__init__(config.head_dim, config.max_position_embeddings, config.rope_base)
        head.midlayer.self_attn.rotary_emb.to(dev)
        if config.effective_draft_vocab == config.vocab_size and not hasattr(ea_layer, "d2t"):
            head.d2t.zero_()
    elif "layers" in children:
        with torch.device("meta"):
            head = Eagle1DraftHead(config)
        dev = ea_layer.fc.weight.device
        head = head.to_empty(device=dev)
        for layer in head.layers:
            layer.self_attn.rotary_emb.__init__(config.head_dim, config.max_position_embeddings, config.rope_base)
            layer.self_attn.rotary_emb.to(dev)
        head.set_target_lm_head(lm_head)
    else:
        raise TypeError("ea_layer has neither .midlayer (EAGLE-3) nor .layers (EAGLE-1)")
    _share(head, ea_layer, "ea_layer")
    return head.eval()


def tree_config_from_ea_layer(ea_layer) -> TreeConfig:
    """SafeAILab stores ``total_tokens`` as ``total_token - 1``; TreeConfig counts the root."""
    return TreeConfig(int(ea_layer.total_tokens) + 1, int(ea_layer.depth), int(ea_layer.top_k))


def _tree_key(ea_layer) -> tuple[int, int, int]:
    return int(ea_layer.total_tokens), int(ea_layer.depth), int(ea_layer.top_k)


class SafeAILabOutputs:
    """Turns a :class:`~eagle_triton.DraftTree` into ``topK_genrate``'s four outputs, placed as SafeAILab places
    them: ``draft_tokens [1, T+1]`` and ``tree_position_ids [T+1]`` on the device, ``retrieve_indices [R, C]``
    (exact shape) and ``tree_mask [1, 1, T+1, T+1]`` float on the CPU (its code indexes tensors on any GPU of a
    multi-GPU target with them, and needs ``R`` and ``C`` on the host anyway).

    The CPU tensors cost one device->host copy per call, which is also the call's one synchronisation (a blocking
    copy into pinned memory: the copy and a wait on the current stream). Where the tree's leaf count, depth, padded
    retrieve indices and mask lie in one allocation (the fused drafter's output buffers), the copy moves their byte
    span straight into a cached host buffer; otherwise (the reference drafter's trees, or a sampling tree, whose
    rows were reordered into a new tensor) they are first packed into a cached device buffer (two copy kernels).

    Every output is a view, built once per tree layout (:class:`_OutputPlan`): the device outputs are the tree's
    own tensors (the fused drafter's buffers, valid until the next draft), and the CPU outputs are views of the host
    buffer, overwritten by the next call's copy (SafeAILab is done with a tree before it drafts the next). ``R``
    and ``C`` are read through a NumPy view of that buffer, and the exact ``[R, C]`` view is cached per pair: in the
    steady state a call does the copy and nothing else on tensors.
    """

    def __init__(self):
        self._tree = None  # the tree the plan was made for (graph replays return the same tree object)
        self._plan: _OutputPlan | None = None
        self._direct: _OutputPlan | None = None  # the last plan over a tree's own allocation ...
        self._packed: _OutputPlan | None = None  # ... and over the packing buffers (reused while sizes hold)

    def _plan_for(self, tree) -> _OutputPlan:
        d = self._direct
        if d is not None and d.holds(tree):
            return d
        d = _OutputPlan.direct(tree)
        if d is not None:
            self._direct = d
            return d
        p = self._packed
        if p is None or not p.fits(tree):
            p = self._packed = _OutputPlan.packed(tree)
        return p

    def __call__(self, tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if tree is not self._tree:
            self._plan, self._tree = self._plan_for(tree), tree
        plan = self._plan
        if plan.pack is not None:
            plan.pack(tree)
        plan.host.copy_(plan.src)  # on a GPU into pinned memory, blocking: the call's one host synchronisation
        R, C = int(plan.leaves[0]), int(plan.depth[0])
        retrieve = plan.exact.get((R, C))
        if retrieve is None:
            if not (0 < R <= plan.retrieve.shape[0] and 0 <= C < plan.retrieve.shape[1]):
                raise RuntimeError(f"the drafter's tree has {R} leaves of depth {C}, outside its retrieve buffer "
                                   f"{list(plan.retrieve.shape)}")
            retrieve = plan.exact[(R, C)] = plan.retrieve[:R, :C + 1]
        if plan.pack is not None:
            return tree.draft_tokens, retrieve, plan.mask, tree.positions[0]
        return plan.tokens, retrieve, plan.mask, plan.positions


class _OutputPlan:
    """How :class:`SafeAILabOutputs` moves one tree layout to the host: the device bytes ``src`` (a byte span of
    the tree's own allocation, or the packing buffer that ``pack(tree)`` fills) and their host copy ``host``, with
    host views of the leaf count and depth (NumPy), of the padded retrieve indices of sequence 0 and of its mask,
    and the exact retrieve views per ``(R, C)`` made so far. A direct plan also keeps the device outputs' views."""

    __slots__ = ("parts", "src", "host", "pack", "leaves", "depth", "retrieve", "mask", "exact", "tokens",
                 "positions")

    def __init__(self, src: torch.Tensor, host: torch.Tensor, offsets: tuple[int, int, int, int], shapes, pack=None):
        self.src, self.host, self.pack = src, host, pack
        o_leaves, o_depth, o_ret, o_mask = offsets
        ret_shape, mask_shape = shapes
        arr = host.numpy()
        self.leaves = arr[o_leaves:o_leaves + 8].view(np.int64)
        self.depth = arr[o_depth:o_depth + 8].view(np.int64)
        n_ret, n_mask = math.prod(ret_shape) * 8, math.prod(mask_shape) * 4
        self.retrieve = host[o_ret:o_ret + n_ret].view(torch.int64).view(ret_shape)[0]
        self.mask = host[o_mask:o_mask + n_mask].view(torch.float32).view(mask_shape)[:1]
        self.exact: dict = {}
        self.parts: tuple = ()
        self.tokens = self.positions = None

    def holds(self, tree) -> bool:
        """Whether ``tree``'s tensors are the ones this direct plan was made for."""
        p = self.parts
        return (tree.num_leaves is p[0] and tree.max_depth is p[1] and tree.retrieve_indices_padded is p[2]
                and tree.tree_mask is p[3] and tree.draft_tokens is p[4] and tree.positions is p[5])

    def fits(self, tree) -> bool:
        """Whether this packed plan's buffers take ``tree``'s sizes."""
        return (self.src.device == tree.retrieve_indices_padded.device
                and self.retrieve.shape == tree.retrieve_indices_padded.shape[1:]
                and self.mask.shape[1:] == tree.tree_mask.shape[1:])

    @classmethod
    def direct(cls, tree) -> _OutputPlan | None:
        """A plan over the byte span of ``tree``'s leaf count, depth, retrieve indices and float32 mask, when they
        lie close together in one allocation (the fused drafter's buffers), else ``None``."""
        parts = (tree.num_leaves, tree.max_depth, tree.retrieve_indices_padded, tree.tree_mask)
        dtypes = (torch.int64, torch.int64, torch.int64, torch.float32)
        dev = parts[0].device
        storage = parts[0].untyped_storage()
        if any(t.dtype != dt or t.device != dev or not t.is_contiguous()
               or t.untyped_storage().data_ptr() != storage.data_ptr() for t, dt in zip(parts, dtypes, strict=True)):
            return None
        lo = min(t.data_ptr() for t in parts)
        hi = max(t.data_ptr() + t.numel() * t.element_size() for t in parts)
        if hi - lo > 2 * sum(t.numel() * t.element_size() for t in parts) + 256:
            return None  # the span would carry much more than the outputs
        if any((t.data_ptr() - lo) % t.element_size() for t in parts):
            return None
        src = torch.empty(0, dtype=torch.uint8, device=dev).set_(storage, lo - storage.data_ptr(), (hi - lo,))
        plan = cls(src, _host_buffer(hi - lo, dev), tuple(t.data_ptr() - lo for t in parts),
                   (parts[2].shape, parts[3].shape))
        plan.parts = (*parts, tree.draft_tokens, tree.positions)
        plan.tokens, plan.positions = tree.draft_tokens, tree.positions[0]
        return plan

    @classmethod
    def packed(cls, tree) -> _OutputPlan:
        """A plan that packs sequence 0's leaf count, depth, retrieve indices (int64) and mask (float32) into one
        device buffer first (two copy kernels per call)."""
        retrieve, mask = tree.retrieve_indices_padded[:1], tree.tree_mask[:1]
        dev = retrieve.device
        n_long = 2 + retrieve.numel()
        nbytes = 8 * n_long + 4 * mask.numel()
        staging = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        longs = staging[:8 * n_long].view(torch.int64)
        floats = staging[8 * n_long:].view(torch.float32).view(mask.shape)

        def pack(tree):
            torch.cat([tree.num_leaves[:1], tree.max_depth[:1], tree.retrieve_indices_padded[:1].reshape(-1)],
                      out=longs)
            floats.copy_(tree.tree_mask[:1])

        return cls(staging, _host_buffer(nbytes, dev), (0, 8, 16, 8 * n_long), (retrieve.shape, mask.shape), pack)


def _host_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """The host side of a transfer from ``device`` (bytes): pinned memory for a GPU (a direct DMA, and a blocking
    copy into it waits on the current stream only)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")


class EaLayerDrafter:
    """A replacement for ``ea_layer.topK_genrate`` backed by an eagle_triton :class:`TreeDrafter`.

    Outputs are placed as SafeAILab places them (see :class:`SafeAILabOutputs`: one device->host transfer per
    call). The draft KV stays in the drafter and is mirrored into ``ea_layer.stable_kv`` (views, no copy); when
    EAGLE's ``reset_kv()`` sets that to ``None``, the drafter resets. Changing ``ea_layer.top_k``/``depth``/
    ``total_tokens`` rebuilds the drafter.
    """

    def __init__(self, ea_layer, backend: str, lm_head=None):
        self.ea_layer = ea_layer
        self.head = head_from_ea_layer(ea_layer, lm_head=lm_head)
        self.backend = backend
        self._eagle1 = self.head.kind == "eagle1"
        # stable_kv is a plain attribute of SafeAILab's layer: written into its __dict__, not through
        # nn.Module.__setattr__ (which first looks for a parameter, buffer or module of that name)
        self._state = ea_layer.__dict__ if isinstance(ea_layer, torch.nn.Module) and not any(
            "stable_kv" in getattr(ea_layer, d, {}) for d in ("_parameters", "_buffers", "_modules")) else None
        self._build(ea_layer)
        self._outputs = SafeAILabOutputs()

    def _build(self, ea) -> None:
        self._raw_key = (ea.total_tokens, ea.depth, ea.top_k)
        self._key = _tree_key(ea)
        self.drafter = TreeDrafter(self.head, tree_config_from_ea_layer(ea), backend=self.backend)
        impl = self.drafter._impl
        self._fused = impl if isinstance(impl, FusedDraftBackend) else None

    def draft(self, hidden_states, input_ids, head=None, sampling: bool = False):
        """One tree as a :class:`~eagle_triton.DraftTree` (device tensors only), keeping ``stable_kv`` in step.
        With the fused drafter its tensors are the drafter's own buffers, valid until the next draft (as SafeAILab
        uses ``topK_genrate``'s outputs: each step is done with a tree before it drafts the next)."""
        ea = self.ea_layer
        raw = (ea.total_tokens, ea.depth, ea.top_k)
        if raw != self._raw_key:  # the tree settings as written (compared as ints only when they change)
            if _tree_key(ea) != self._key:
                self._build(ea)
            self._raw_key = raw
        if self._eagle1 and head is not None:
            self.head.set_target_lm_head(head)
        state = self._state if self._state is not None else ea.__dict__
        if state.get("stable_kv") is None:
            self.drafter.reset()
        fused = self._fused
        if fused is not None:  # SafeAILab is done with a tree before it drafts the next: no copies of the outputs
            tree = fused.draft_replayed(hidden_states, input_ids, sampling=sampling)
            kv = fused.stable_kv
        else:
            if input_ids.device != hidden_states.device:
                input_ids = input_ids.to(hidden_states.device)
            tree = self.drafter.draft(hidden_states, input_ids, sampling=sampling)
            kv = self.drafter.stable_kv
        if self._state is not None:
            self._state["stable_kv"] = kv if kv is not None else ()
        else:
            ea.stable_kv = kv if kv is not None else ()
        return tree

    def __call__(self, hidden_states, input_ids, head=None, logits_processor=None):
        return self._outputs(self.draft(hidden_states, input_ids, head, sampling=logits_processor is not None))


def patch_ea_model_with_triton_drafter(model, use_triton: bool = True, backend: str | None = None):
    """Route drafting of an EAGLE model in SafeAILab's layout through eagle_triton's drafter.

    ``model`` has an ``ea_layer`` with ``topK_genrate(hidden_states, input_ids, head, logits_processor)`` and the
    draft weights (``fc``, ``midlayer`` or ``layers``, ``norm``, ``lm_head``, ``d2t``, ``embed_tokens``) and tree
    settings (``top_k``, ``depth``, ``total_tokens``, ``stable_kv``). With ``use_triton=True`` drafting uses the
    fused Triton drafter (``backend="triton"``, falling back to the PyTorch reference with a warning where no GPU is
    available); ``use_triton=False`` restores the original method. Returns ``model``.
    """
    ea_layer = getattr(model, "ea_layer", model)
    if not hasattr(ea_layer, "topK_genrate"):
        raise TypeError("model has no ea_layer.topK_genrate: not an EAGLE model in SafeAILab's layout")
    original = getattr(ea_layer, "_eagle_triton_original_topK_genrate", None)
    if not use_triton:
        if original is not None:
            if original is _CLASS_METHOD:
                del ea_layer.topK_genrate
            else:
                ea_layer.topK_genrate = original
            del ea_layer._eagle_triton_original_topK_genrate
        return model
    if original is None:
        inst = ea_layer.__dict__.get("topK_genrate")
        ea_layer._eagle_triton_original_topK_genrate = inst if inst is not None else _CLASS_METHOD
    chosen = backend or _default_backend()
    ea_layer.topK_genrate = EaLayerDrafter(ea_layer, chosen)
    return model


_CLASS_METHOD = types.SimpleNamespace(note="the class's own topK_genrate")


def _default_backend() -> str:
    """The fused Triton drafter on a GPU; the PyTorch reference (with a warning) elsewhere."""
    if torch.cuda.is_available():
        from ..drafter import available_draft_backends

        if "triton" in available_draft_backends():
            return "triton"
    import warnings

    warnings.warn("no GPU (or no fused drafter): drafting with eagle_triton's PyTorch reference back end",
                  RuntimeWarning, stacklevel=3)
    return "torch"
