"""Adapters for objects in SafeAILab EAGLE's layout (``EaModel`` with an ``ea_layer`` draft ``Model``).

:func:`head_from_ea_layer` builds an eagle_triton draft head that *shares* the ``ea_layer``'s parameters (no copy),
so a drafter reads exactly the weights the EAGLE object holds. :func:`patch_ea_model_with_triton_drafter` routes
``ea_layer.topK_genrate`` through an eagle_triton drafter with the same outputs and draft-KV behaviour.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ..config import TreeConfig
from ..drafter import TreeDrafter
from ..heads import DraftHeadConfig, Eagle1DraftHead, Eagle3DraftHead

__all__ = ["head_from_ea_layer", "tree_config_from_ea_layer", "patch_ea_model_with_triton_drafter", "EaLayerDrafter"]

_CONFIG_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
    "vocab_size", "draft_vocab_size", "target_hidden_size", "rms_norm_eps", "max_position_embeddings",
    "rope_theta", "pad_token_id", "bias", "qkv_bias",
)


def _config_of(ea_layer) -> DraftHeadConfig:
    cfg = getattr(ea_layer, "config", None)
    if cfg is None:
        raise TypeError("ea_layer has no .config: not an EAGLE draft model in SafeAILab's layout")
    data: dict[str, Any] = {}
    for name in _CONFIG_FIELDS:
        value = cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)
        if value is not None:
            data[name] = value
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


class EaLayerDrafter:
    """A replacement for ``ea_layer.topK_genrate`` backed by an eagle_triton :class:`TreeDrafter`.

    Outputs are placed as SafeAILab places them (``retrieve_indices`` and ``tree_mask`` on the CPU,
    ``draft_tokens``/``tree_position_ids`` on the hidden states' device). The draft KV stays in the drafter and is
    mirrored into ``ea_layer.stable_kv``; when EAGLE's ``reset_kv()`` sets that to ``None``, the drafter resets.
    """

    def __init__(self, ea_layer, backend: str, lm_head=None):
        self.ea_layer = ea_layer
        self.head = head_from_ea_layer(ea_layer, lm_head=lm_head)
        self.backend = backend
        self.drafter = TreeDrafter(self.head, tree_config_from_ea_layer(ea_layer), backend=backend)

    def __call__(self, hidden_states, input_ids, head=None, logits_processor=None):
        cfg = tree_config_from_ea_layer(self.ea_layer)
        if cfg != self.drafter.tree_config:
            self.drafter = TreeDrafter(self.head, cfg, backend=self.backend)
        if self.head.kind == "eagle1" and head is not None:
            self.head.set_target_lm_head(head)
        if getattr(self.ea_layer, "stable_kv", None) is None:
            self.drafter.reset()
        tree = self.drafter.draft(hidden_states, input_ids.to(hidden_states.device),
                                  sampling=logits_processor is not None)
        self.ea_layer.stable_kv = self.drafter.stable_kv if self.drafter.stable_kv is not None else ()
        return (tree.draft_tokens, tree.retrieve_indices.cpu(), tree.tree_mask[:1].cpu(),
                tree.tree_position_ids)


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
