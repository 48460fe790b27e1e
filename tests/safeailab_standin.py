"""Test fixture: a stand-in for SafeAILab EAGLE objects, built to their attribute layout (``EaModel.ea_layer`` is a
``cnets.Model`` with ``fc``, ``midlayer``, ``norm``, ``lm_head``, ``d2t``, ``t2d``, ``embed_tokens``, ``top_k``,
``depth``, ``total_tokens`` = total_token - 1, ``stable_kv``, ``reset_kv()`` and ``topK_genrate``). Its
``topK_genrate`` is the spec transcription, so patched and unpatched objects can be compared."""

import copy
import types

from spec_topk_genrate import SpecDraftModel
from torch import nn

from eagle_triton import TreeConfig


class EaLayerStandIn(nn.Module):
    def __init__(self, head, tree_cfg: TreeConfig):
        super().__init__()
        src = copy.deepcopy(head)
        self.config = types.SimpleNamespace(**src.config.to_dict())
        for name in ("embed_tokens", "fc", "midlayer", "norm", "lm_head", "layers"):
            if hasattr(src, name):
                setattr(self, name, getattr(src, name))
        if src.kind == "eagle3":
            self.register_buffer("d2t", src.d2t.clone())
            self.register_buffer("t2d", src.t2d.clone())
        self.top_k, self.depth, self.total_tokens = tree_cfg.top_k, tree_cfg.depth, tree_cfg.total_tokens - 1
        self.stable_kv = None
        self._spec = SpecDraftModel(src, tree_cfg)

    def reset_kv(self):
        self.stable_kv = None

    def topK_genrate(self, hidden_states, input_ids, head, logits_processor):
        self._spec.stable_kv = self.stable_kv
        out = self._spec.topK_genrate(hidden_states, input_ids, sampling=logits_processor is not None)
        self.stable_kv = self._spec.stable_kv
        return out


class EaModelStandIn(nn.Module):
    def __init__(self, head, tree_cfg: TreeConfig):
        super().__init__()
        self.ea_layer = EaLayerStandIn(head, tree_cfg)
