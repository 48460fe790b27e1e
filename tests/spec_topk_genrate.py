"""Test fixture: SafeAILab EAGLE's draft forward and ``topK_genrate``, transcribed from the algorithm spec
(/shared/reference/EAGLE_ALGORITHM.md sections 1.1, 1.2 and 2) with the reference's own control flow: growing
concatenated KV, dense additive masks, Python loops and host lists for the tree buffers.

It reads the weights of an eagle_triton head through its ``state_dict`` but shares no code with the package, so
bit-identical outputs show that the package reproduces the specified algorithm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _rms(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def _rope_tables(dim, base, length=2048):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    t = torch.arange(length, dtype=torch.float32)
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class SpecDraftModel:
    """A draft head as the spec describes it, one forward per call, ``stable_kv`` kept like the reference."""

    def __init__(self, head, tree_cfg):
        self.sd = {k: v for k, v in head.state_dict().items()}
        c = head.config
        self.kind = head.kind
        self.H, self.nh, self.nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        self.hd = self.H // self.nh
        self.eps = c.rms_norm_eps
        self.cos, self.sin = _rope_tables(self.hd, 10000.0 if c.rope_theta is None else c.rope_theta)
        self.vocab_map = head.has_vocab_map
        self.target_head = getattr(head, "target_lm_head", None)
        self.num_layers = c.num_hidden_layers
        self.top_k, self.depth, self.total_tokens = tree_cfg.top_k, tree_cfg.depth, tree_cfg.total_tokens - 1
        self.stable_kv = None
        self.ties = False  # set by topK_genrate when a ranking was not well defined (see _topk)

    def _lin(self, x, name, bias=False):
        b = self.sd.get(name + ".bias")
        return F.linear(x, self.sd[name + ".weight"], b)

    def _mask(self, q_len, past_len, tree_mask):
        neg = torch.finfo(torch.float32).min
        combined = None
        if q_len > 1:
            m = torch.full((q_len, q_len), neg)
            cond = torch.arange(q_len)
            m.masked_fill_(cond < (cond + 1).view(q_len, 1), 0)
            if past_len > 0:
                m = torch.cat([torch.zeros(q_len, past_len), m], dim=-1)
            combined = m[None, None]
        expanded = torch.zeros(1, 1, q_len, past_len + q_len)  # all-ones padding mask, inverted
        combined = expanded if combined is None else expanded + combined
        if tree_mask is not None:
            combined[:, :, -tree_mask.shape[2]:, -tree_mask.shape[3]:][tree_mask == 0] = neg
        return combined

    def _attn(self, x, prefix, pos, mask, past):
        b, q_len, _ = x.shape
        q = self._lin(x, prefix + "q_proj").view(b, q_len, self.nh, self.hd).transpose(1, 2)
        k = self._lin(x, prefix + "k_proj").view(b, q_len, self.nkv, self.hd).transpose(1, 2)
        v = self._lin(x, prefix + "v_proj").view(b, q_len, self.nkv, self.hd).transpose(1, 2)
        cos = self.cos.to(v.dtype)[pos].unsqueeze(1)
        sin = self.sin.to(v.dtype)[pos].unsqueeze(1)
        q = q * cos + _rot(q) * sin
        k = k * cos + _rot(k) * sin
        if past is not None:
            k = torch.cat([past[0], k], 2)
            v = torch.cat([past[1], v], 2)
        present = (k, v)
        rep = self.nh // self.nkv
        kk = k[:, :, None].expand(b, self.nkv, rep, k.shape[2], self.hd).reshape(b, self.nh, k.shape[2], self.hd)
        vv = v[:, :, None].expand(b, self.nkv, rep, v.shape[2], self.hd).reshape(b, self.nh, v.shape[2], self.hd)
        w = torch.matmul(q, kk.transpose(2, 3)) / math.sqrt(self.hd)
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, vv).transpose(1, 2).contiguous().reshape(b, q_len, self.H)
        return self._lin(o, prefix + "o_proj"), present

    def _mlp(self, x, prefix):
        return self._lin(F.silu(self._lin(x, prefix + "gate_proj")) * self._lin(x, prefix + "up_proj"),
                         prefix + "down_proj")

    def forward(self, hidden, input_ids, position_ids=None, past_key_values=None, tree_mask=None):
        b, s, _ = hidden.shape
        past_len = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        pos = (torch.arange(past_len, past_len + s).view(1, s) if position_ids is None
               else position_ids.view(-1, s).long())
        mask = self._mask(s, past_len, tree_mask)
        emb = F.embedding(input_ids, self.sd["embed_tokens.weight"]).to(hidden.dtype)
        presents = []
        if self.kind == "eagle3":
            h = self._lin(hidden, "fc") if hidden.shape[-1] != emb.shape[-1] else hidden
            res = h
            x = torch.cat((_rms(emb, self.sd["midlayer.input_layernorm.weight"], self.eps),
                           _rms(h, self.sd["midlayer.hidden_norm.weight"], self.eps)), dim=-1)
            a, p = self._attn(x, "midlayer.self_attn.", pos, mask,
                              None if past_key_values is None else past_key_values[0])
            h = res + a
            h = h + self._mlp(_rms(h, self.sd["midlayer.post_attention_layernorm.weight"], self.eps), "midlayer.mlp.")
            presents.append(p)
        else:
            h = self._lin(torch.cat((emb, hidden), dim=-1), "fc")
            for i in range(self.num_layers):
                pre = f"layers.{i}."
                res = h
                x = h if i == 0 else _rms(h, self.sd[pre + "input_layernorm.weight"], self.eps)
                a, p = self._attn(x, pre + "self_attn.", pos, mask,
                                  None if past_key_values is None else past_key_values[i])
                h = res + a
                h = h + self._mlp(_rms(h, self.sd[pre + "post_attention_layernorm.weight"], self.eps), pre + "mlp.")
                presents.append(p)
        return h, tuple(presents)

    def head_logits(self, h):
        if self.kind == "eagle3":
            return F.linear(_rms(h, self.sd["norm.weight"], self.eps), self.sd["lm_head.weight"])
        return self.target_head(h)

    def map_ids(self, ids):
        return ids + self.sd["d2t"][ids] if self.vocab_map else ids

    @torch.no_grad()
    def _topk(self, x, k, order=True):
        """``torch.topk(x, k, dim=-1)``, noting in ``self.ties`` when its result is not well defined, as torch.topk's
        choice and order among equal values are unspecified: equal values among the ``k + 1`` largest of a row, or,
        when only the chosen set matters (``order=False``), equal ``k``-th and ``(k + 1)``-th values."""
        top = torch.topk(x, min(k + 1, x.shape[-1]), dim=-1).values
        same = top[..., 1:] == top[..., :-1]
        if bool((same if order else same[..., k - 1:]).any()):
            self.ties = True
        return torch.topk(x, k, dim=-1)

    def topK_genrate(self, hidden_states, input_ids, sampling=False):
        K, D, T = self.top_k, self.depth, self.total_tokens
        self.ties = False
        sample_token = input_ids[:, -1]
        scores_list, parents_list, ss_token = [], [], []
        input_ids = input_ids[:, 1:]
        len_posi = input_ids.shape[1]
        if self.stable_kv is not None:
            kv_len = self.stable_kv[0][0].shape[2]
            out_hidden, past = self.forward(hidden_states, input_ids[:, kv_len:], past_key_values=self.stable_kv)
        else:
            out_hidden, past = self.forward(hidden_states, input_ids)
        self.stable_kv = past
        last_hidden = out_hidden[:, -1]
        last_p = F.log_softmax(self.head_logits(last_hidden), dim=-1)
        top = self._topk(last_p, K)
        topk_index, topk_p = top.indices, top.values
        scores = topk_p[0]
        scores_list.append(scores[None])
        parents_list.append(torch.zeros(1, dtype=torch.long))
        ss_token.append(self.map_ids(topk_index))
        input_ids = self.map_ids(topk_index)
        input_hidden = last_hidden[None].repeat(1, K, 1)
        tree_mask_init = torch.eye(K)[None, None]
        tree_mask = tree_mask_init
        topk_cs_index = torch.arange(K)
        for i in range(D):
            position_ids = len_posi + torch.zeros(K, dtype=torch.long)
            out_hidden, past = self.forward(input_hidden, input_ids, position_ids=position_ids, past_key_values=past,
                                            tree_mask=tree_mask)
            len_posi += 1
            bias = 1 + K ** 2 * max(0, i - 1) + (K if i > 0 else 0)
            parents_list.append(topk_cs_index + bias)
            last_p = F.log_softmax(self.head_logits(out_hidden[0]), dim=-1)
            top = self._topk(last_p, K)
            topk_index, topk_p = top.indices, top.values
            cu_scores = topk_p + scores[:, None]
            topk_cs = self._topk(cu_scores.view(-1), K)
            topk_cs_index, topk_cs_p = topk_cs.indices, topk_cs.values
            scores = topk_cs_p
            out_ids = topk_cs_index // K
            input_hidden = out_hidden[:, out_ids]
            input_ids = self.map_ids(topk_index.view(-1)[topk_cs_index][None])
            ss_token.append(self.map_ids(topk_index))
            scores_list.append(cu_scores)
            tree_mask = torch.cat((tree_mask[:, :, out_ids], tree_mask_init), dim=3)

        scores_flat = torch.cat(scores_list, dim=0).view(-1)
        tokens_flat = torch.cat(ss_token, dim=0).view(-1)
        top_scores_index = torch.sort(self._topk(scores_flat, T, order=False).indices).values
        draft_tokens = torch.cat((sample_token, tokens_flat[top_scores_index]), dim=0)
        draft_parents = torch.cat(parents_list, dim=0)[top_scores_index // K].long()
        mask_index = torch.searchsorted(top_scores_index, draft_parents - 1, right=False)
        mask_index[draft_parents == 0] = -1
        mask_index = mask_index + 1
        mask_index_list = mask_index.tolist()
        tree_mask = torch.eye(T + 1).bool()
        tree_mask[:, 0] = True
        for i in range(T):
            tree_mask[i + 1].add_(tree_mask[mask_index_list[i]])
        tree_position_ids = torch.sum(tree_mask, dim=1) - 1
        tree_mask = tree_mask.float()[None, None]
        max_depth = int(torch.max(tree_position_ids)) + 1
        noleaf_index = torch.unique(mask_index).tolist()
        leaf_num = T - (len(noleaf_index) - 1)
        retrieve = [[-1] * max_depth for _ in range(leaf_num)]
        rid = 0
        pos_list = tree_position_ids.tolist()
        for i in range(T + 1):
            if i not in noleaf_index:
                cid = i
                for j in reversed(range(pos_list[i] + 1)):
                    retrieve[rid][j] = cid
                    cid = mask_index_list[cid - 1]
                rid += 1
        if sampling:
            retrieve = sorted(retrieve, key=lambda row: [x if x >= 0 else T + 5 for x in row])
        return draft_tokens[None], torch.tensor(retrieve, dtype=torch.long), tree_mask, tree_position_ids


def spec_standin(head, tree_cfg):
    """:class:`eagle_triton.testing.SafeAILabStandIn` over a private copy of ``head`` whose ``topK_genrate`` is
    this transcription, so that patched and unpatched SafeAILab-layout objects are compared against it."""
    import copy

    from eagle_triton.testing import SafeAILabStandIn

    head = copy.deepcopy(head)
    return SafeAILabStandIn(head, tree_cfg, spec=SpecDraftModel(head, tree_cfg))
