"""The multi-kernel drafter: the same draft as the fused kernel, as a sequence of PyTorch (cuBLAS) operations
with static shapes and no host synchronisation, so that a whole draft can be captured in one CUDA graph.

It is the baseline the fused kernel must beat at every batch size, and a drafter back end of its own
(``TreeDrafter(head, tree_config, backend="graph")``; on CUDA each ``(batch, rows)`` shape is captured once and
replayed). It keeps its draft KV in the fused drafter's :class:`~eagle_triton.fused.FusedDrafterBuffers` layout
(``[B, max_len, nkv, hd]`` plus ``kv_len [B]``), and computes every value in the model dtype in the reference's
operation order, batched over sequences.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import TreeConfig
from ..drafter.reference import check_draft_inputs
from ..heads.base import DraftHead
from ..heads.fp8 import fp8_linear
from ..heads.layers import apply_rope as _rope
from ..heads.layers import rms_norm as _rms
from ..tree import DraftTree, frontier_parent_offset, rank_topk, select_tree_nodes
from .host import DrafterConfig, Weights

__all__ = ["multikernel_draft", "draft_kv_rows", "GraphDraftBackend", "MultiKernelDrafter"]


def _lin(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for weight matrix ``name`` of ``w``: with FP8 weights (and/or an attention bias) the product of
    :func:`~eagle_triton.heads.fp8.fp8_linear`, as the head's modules compute it."""
    t, scale, bias = getattr(w, name), w.scale(name), (w.bias(name) if name in w.BIASED else None)
    if scale is not None:
        return fp8_linear(x, t, scale, bias)
    return x @ t.t() if bias is None else F.linear(x, t, bias)  # (nn.Linear's op where there is a bias)


def _midlayer_input(cfg: DrafterConfig, w: Weights, h, emb):
    """The midlayer's input: the token embeddings and the hidden rows, each RMS-normed, side by side."""
    return torch.cat((_rms(emb, w.input_norm, cfg.rms_eps), _rms(h, w.hidden_norm, cfg.rms_eps)), dim=-1)


def _rope_at(w: Weights, pos, dt):
    """The RoPE tables at ``pos [..., M]`` as ``[..., M, 1, hd]`` in dtype ``dt`` (broadcast over heads)."""
    return w.cos[pos].to(dt).unsqueeze(-2), w.sin[pos].to(dt).unsqueeze(-2)


def draft_kv_rows(cfg: DrafterConfig, w: Weights, features: torch.Tensor, ids: torch.Tensor,
                  positions: torch.Tensor | None = None):
    """The draft-KV rows a draft writes for rows ``features [N, W]`` (``ids [N]``: the token after each row) at
    ``positions [N]`` (default ``0 .. N-1``; within the RoPE tables): ``(k, v)``, each ``[N, nkv, hd]``, K after
    RoPE. Only K and V: what a draft keeps of a row it ingests but does not draft from (the prompt's rows before
    the last)."""
    N = features.shape[0]
    h = _lin(w, "fc", features)
    x = _midlayer_input(cfg, w, h, w.embed[ids].to(h.dtype))
    k = _lin(w, "wk", x).view(N, cfg.num_kv_heads, cfg.head_dim)
    v = _lin(w, "wv", x).view(N, cfg.num_kv_heads, cfg.head_dim)
    if positions is None:
        positions = torch.arange(N, device=features.device)
    cos, sin = _rope_at(w, positions, h.dtype)
    return _rope(k, cos, sin), v


def _layer(cfg: DrafterConfig, w: Weights, h, emb, pos, k_cache, v_cache, slots, key_mask):
    """One midlayer forward for rows ``[B, M]``: writes their K/V at ``slots [B, M]`` and attends with
    ``key_mask [B, M, Lmax]`` (True = visible). Returns the output hidden ``[B, M, H]``."""
    B, M, _ = h.shape
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x = _midlayer_input(cfg, w, h, emb)
    q = _lin(w, "wq", x).view(B, M, nh, hd)
    k = _lin(w, "wk", x).view(B, M, nkv, hd)
    v = _lin(w, "wv", x).view(B, M, nkv, hd)
    dt = h.dtype
    cos, sin = _rope_at(w, pos, dt)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    idx = slots.view(B, M, 1, 1).expand(B, M, nkv, hd)
    k_cache.scatter_(1, idx, k)
    v_cache.scatter_(1, idx, v)
    rep = nh // nkv
    kk = k_cache.repeat_interleave(rep, dim=2).permute(0, 2, 3, 1)  # [B, nh, hd, Lmax+1]
    vv = v_cache.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)  # [B, nh, Lmax+1, hd]
    s = torch.matmul(q.permute(0, 2, 1, 3), kk) / math.sqrt(hd)  # [B, nh, M, Lmax+1]
    s = s.float().masked_fill(~key_mask.unsqueeze(1), torch.finfo(torch.float32).min)
    p = F.softmax(s, dim=-1, dtype=torch.float32).to(dt)
    o = torch.matmul(p, vv).permute(0, 2, 1, 3).reshape(B, M, nh * hd)
    h1 = h + _lin(w, "wo", o)
    x2 = _rms(h1, w.post_norm, cfg.rms_eps)
    return h1 + _lin(w, "w_down", F.silu(_lin(w, "w_gate", x2)) * _lin(w, "w_up", x2))


def _logp(cfg: DrafterConfig, w: Weights, h):
    return F.log_softmax(_lin(w, "lm_head", _rms(h, w.final_norm, cfg.rms_eps)), dim=-1)


def _to_target(cfg: DrafterConfig, w: Weights, ids):
    return ids + w.d2t[ids] if cfg.has_d2t else ids


def multikernel_draft(cfg: DrafterConfig, w: Weights, features, input_ids, num_new, k_cache, v_cache, kv_len,
                      sampling: bool = False) -> DraftTree:
    """Draft one tree per sequence with PyTorch operations only (static shapes, no host sync).

    features ``[B, S, W]``, input_ids ``[B, S]`` (row tokens; ``input_ids[b, num_new[b]-1]`` is the root), num_new
    ``[B]`` (int), caches ``[B, max_len + 1, nkv, hd]`` (the last row is a trash row for padded rows), kv_len
    ``[B]`` (advanced in place). Returns a batched :class:`DraftTree`.
    """
    B, S, _ = features.shape
    K, D, T = cfg.top_k, cfg.depth, cfg.total_tokens - 1
    dev = features.device
    Lmax1 = k_cache.shape[1]
    trash = Lmax1 - 1
    num_new = num_new.long()
    L0 = kv_len.long()
    L = L0 + num_new
    ar_s = torch.arange(S, device=dev)
    keys = torch.arange(Lmax1, device=dev)
    # root step: K/V of every new row, the rest for the last row only
    h = _lin(w, "fc", features)
    emb = w.embed[input_ids].to(h.dtype)
    valid = ar_s[None, :] < num_new[:, None]
    pos = L0[:, None] + ar_s[None, :]
    slots = torch.where(valid, pos, torch.full_like(pos, trash))
    last = (num_new - 1).view(B, 1)
    key_mask = (keys[None, None, :] < L[:, None, None]) & (keys[None, None, :] != trash)
    # only the last row's output is needed, but its K/V and those of all rows before it are: run the layer on
    # every row with the last row's mask (a causal mask for the others would give the same K/V, unused outputs)
    key_mask = key_mask.expand(B, S, Lmax1)
    out = _layer(cfg, w, h, emb, pos.clamp(max=w.cos.shape[0] - 1), k_cache, v_cache, slots, key_mask)
    h_last = out.gather(1, last.view(B, 1, 1).expand(B, 1, out.shape[-1]))  # [B, 1, H]
    lp, idx = torch.topk(_logp(cfg, w, h_last[:, 0]), K, dim=-1)  # [B, K]
    scores = lp
    toks = _to_target(cfg, w, idx)
    scores_list, tokens_list = [lp], [toks]
    parents_list = [torch.zeros(B, 1, dtype=torch.long, device=dev)]
    frontier = torch.arange(K, device=dev).expand(B, K)
    hid = h_last.expand(B, K, h_last.shape[-1])
    ids = toks
    DK = max(D * K, K)
    ar_k = torch.arange(K, device=dev)
    ar_dk = torch.arange(DK, device=dev)
    # no index_put with Python scalars (a host-to-device copy, illegal under graph capture)
    tmask = (ar_dk[None, None, :] == ar_k[None, :, None]).expand(B, K, DK)
    rel = keys[None, :] - L[:, None]  # [B, Lmax1] tree-relative slot
    in_tree = (rel >= 0) & (rel < DK)
    relc = rel.clamp(0, DK - 1)
    bidx = torch.arange(B, device=dev)[:, None]
    for i in range(D):
        slots = L[:, None] + i * K + ar_k[None, :]
        pos = (L + i)[:, None].expand(B, K)
        tv = tmask.gather(2, relc[:, None, :].expand(B, K, Lmax1)) & in_tree[:, None, :]
        km = (keys[None, None, :] < L[:, None, None]) | tv
        emb = w.embed[ids].to(hid.dtype)
        out = _layer(cfg, w, hid, emb, pos, k_cache, v_cache, slots, km)
        parents_list.append(frontier + frontier_parent_offset(i, K))
        lp, idx = torch.topk(_logp(cfg, w, out), K, dim=-1)  # [B, K, K]
        cu = lp + scores[:, :, None]
        scores, frontier = rank_topk(cu.view(B, -1), K)
        prow = frontier // K
        hid = out.gather(1, prow[:, :, None].expand(B, K, out.shape[-1]))
        ids = _to_target(cfg, w, idx.view(B, -1).gather(1, frontier))
        tokens_list.append(_to_target(cfg, w, idx).view(B, -1))
        scores_list.append(cu.view(B, -1))
        new = (ar_dk[None, None, :] == ((i + 1) * K + ar_k)[None, :, None]) & (i + 1 < D)
        tmask = tmask.gather(1, prow[:, :, None].expand(B, K, DK)) | new
    kv_len.add_(num_new.to(kv_len.dtype))
    scores_flat = torch.cat(scores_list, dim=1)
    tokens_flat = torch.cat(tokens_list, dim=1)
    parents_flat = torch.cat(parents_list, dim=1)
    selected = select_tree_nodes(scores_flat, T)
    root = input_ids.gather(1, last).view(B)
    del bidx
    return DraftTree.from_selection(root, tokens_flat, selected, parents_flat, K, D + 1, sampling)


class MultiKernelDrafter:
    """Preallocated state of the multi-kernel drafter for ``B`` sequences and ``S`` new rows, with optional
    CUDA-graph capture (:meth:`capture`, then :meth:`replay`)."""

    def __init__(self, cfg: DrafterConfig, weights: Weights, batch: int, new_rows: int, device):
        self.cfg, self.w = cfg, weights
        kvshape = (batch, cfg.max_len + 1, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache = torch.zeros(kvshape, dtype=cfg.dtype, device=device)
        self.v_cache = torch.zeros(kvshape, dtype=cfg.dtype, device=device)
        self.kv_len = torch.zeros(batch, dtype=torch.int32, device=device)
        self.features = torch.zeros(batch, new_rows, cfg.feature_width, dtype=cfg.dtype, device=device)
        self.input_ids = torch.zeros(batch, new_rows, dtype=torch.long, device=device)
        self.num_new = torch.full((batch,), new_rows, dtype=torch.int32, device=device)
        self.graph = None
        self.out = None

    def run(self, sampling: bool = False) -> DraftTree:
        return multikernel_draft(self.cfg, self.w, self.features, self.input_ids, self.num_new, self.k_cache,
                                 self.v_cache, self.kv_len, sampling)

    def capture(self, sampling: bool = False) -> None:
        """Capture one draft (advancing kv_len by num_new per replay) in a CUDA graph."""
        saved = (self.k_cache.clone(), self.v_cache.clone(), self.kv_len.clone())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self.run(sampling)  # warm-up (cuBLAS handles, allocator)
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.run(sampling)
        self.k_cache.copy_(saved[0])
        self.v_cache.copy_(saved[1])
        self.kv_len.copy_(saved[2])

    def replay(self) -> DraftTree:
        self.graph.replay()
        return self.out


class GraphDraftBackend:
    """``TreeDrafter(head, tree_config, backend="graph")``: the multi-kernel drafter (CUDA graphs on CUDA)."""

    name = "graph"

    def __init__(self, head: DraftHead, tree_config: TreeConfig, max_len: int = 2048, use_graph: bool | None = None):
        if head.kind != "eagle3":
            raise ValueError("the graph drafter supports EAGLE-3 heads only")
        self.head, self.tc = head, tree_config
        self.max_len = max_len
        self.use_graph = head.device.type == "cuda" if use_graph is None else use_graph
        self.cfg = DrafterConfig.from_head(head, tree_config, max_len=max_len, max_new_rows=1)
        self.w = Weights.from_head(head, max_len + tree_config.depth + 2)
        self._state = {}
        self._kv = None
        self._kv_len = 0

    def reset(self) -> None:
        self._kv_len = 0
        self._kv = None

    @property
    def kv_len(self) -> int:
        return self._kv_len

    @property
    def stable_kv(self):
        if self._kv is None or self._kv_len == 0:
            return None
        k, v = self._kv
        return ((k[:, :self._kv_len].permute(0, 2, 1, 3), v[:, :self._kv_len].permute(0, 2, 1, 3)),)

    @torch.no_grad()
    def draft(self, hidden_states, input_ids, sampling: bool = False) -> DraftTree:
        check_draft_inputs(self.head, hidden_states, input_ids, self._kv_len)
        B, S = hidden_states.shape[:2]
        if self._kv_len + S + self.tc.depth * self.tc.top_k > self.max_len:
            raise ValueError(f"draft KV capacity {self.max_len} exceeded; pass a larger max_len")
        key = (B, S, sampling)
        st = self._state.get(key)
        if st is None:
            st = MultiKernelDrafter(self.cfg, self.w, B, S, hidden_states.device)
            if self._kv is not None:
                st.k_cache, st.v_cache = self._kv
            if self.use_graph:
                st.kv_len.fill_(self._kv_len)
                st.capture(sampling)
            self._state[key] = st
        if self._kv is None:
            self._kv = (st.k_cache, st.v_cache)
        for other in self._state.values():  # all shapes share one KV
            other.k_cache, other.v_cache = self._kv
        st.features.copy_(hidden_states)
        st.input_ids.copy_(input_ids[:, 1 + self._kv_len:])
        st.kv_len.fill_(self._kv_len)
        tree = st.replay() if self.use_graph else st.run(sampling)
        self._kv_len += S
        return DraftTree(**{f: (getattr(tree, f).clone() if torch.is_tensor(getattr(tree, f)) else getattr(tree, f))
                            for f in ("draft_tokens", "tree_mask", "positions", "parents", "retrieve_indices_padded",
                                      "num_leaves", "max_depth", "sampling")})
