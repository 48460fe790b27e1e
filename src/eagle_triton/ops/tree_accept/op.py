"""Launcher of greedy tree acceptance (two launches, no host sync, graph-capturable)."""

from __future__ import annotations

import torch

from .._utils import cdiv, check_tensor, is_capturing, is_interpreter, next_power_of_2
from .kernel import _argmax_split_kernel, _tree_accept_kernel

__all__ = ["tree_accept_greedy", "AOT_SPECS"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: Feature elements a program copies per load/store pair: a whole EAGLE-3 row of an 8B target (3 x 4096) in one
#: pair. The copy loop's iterations are dependent round trips (a store may alias the next load), and 1024-wide
#: chunks made the 12 of an 8B row most of the kernel's time (7.7 us in a 60/7/10 verify against 2.1 us with no
#: features, H100). The interpreter takes 16-wide chunks, so the CPU tests run the loop.
_FEATURE_BLOCK = 16384


def _check_out(out, B: int, C: int, features):
    if len(out) != 4:
        raise ValueError(f"out must be (accept_index, accept_len, tokens, features), got {len(out)} entries")
    shapes = ((B, C), (B,), (B, C))
    for name, t, shape in zip(("accept_index", "accept_len", "tokens"), out[:3], shapes, strict=True):
        if t is not None:  # rows may be strided (e.g. columns of a larger step-output buffer)
            check_tensor(f"out {name}", t, shape=shape, dtypes=(torch.int64,), last_dim_contiguous=len(shape) > 1)
    if out[3] is not None:
        if features is None:
            raise ValueError("out features given without features to gather")
        check_tensor("out features", out[3], shape=(B, C, features.shape[-1]), dtypes=(features.dtype,),
                     last_dim_contiguous=True)


def tree_accept_greedy(
    draft_tokens: torch.Tensor,
    retrieve_indices: torch.Tensor,
    logits: torch.Tensor | None,
    features: torch.Tensor | None = None,
    out: tuple | None = None,
    next_inputs: tuple | None = None,
    validate: bool = True,
    argmax_keys: torch.Tensor | None = None,
):
    """Greedy verification of EAGLE trees (SafeAILab ``evaluate_posterior``, greedy): the longest root-to-leaf
    prefix whose every draft equals the target's argmax after its parent, the bonus token (the argmax after the
    last accepted node) and, optionally, the features of the accepted path's rows, in two launches (a split argmax
    of the logits, then one walk of the paths per sequence) instead of an argmax, SGLang's sibling links and a
    dozen small gathers.

    Parameters
    ----------
    draft_tokens : ``[B, N]`` int64 tree tokens, node 0 the root.
    retrieve_indices : ``[B, R, C]`` int64 root-to-leaf node paths, -1 padded (``DraftTree.retrieve_indices_padded``),
        valid rows first.
    logits : ``[B, N, V]`` fp16/bf16/fp32 target logits after each node (NaN-free; argmax ties go to the first
        index, as ``torch.argmax``); None with ``argmax_keys``.
    features : optional ``[B, N, W]`` rows to gather along the accepted path (e.g. the target features the next
        draft ingests).
    out : optional ``(accept_index, accept_len, tokens, features)`` tensors to write into (each may be None);
        e.g. the caller's static buffers, so no copy follows.
    next_inputs : optional ``(ids [B, C] int64, num_new [B] int32)`` written as the next EAGLE draft's inputs: the
        emitted tokens with the -1 padding as 0, and ``accept_len + 1`` (the rows it ingests).
    validate : check ``retrieve_indices`` values on the host (a device sync) when no CUDA graph is being captured;
        the kernels clamp every node index, so unchecked input never reads out of bounds.
    argmax_keys : ``[B, N]`` int64 instead of ``logits``: each node's argmax packed as
        :func:`~eagle_triton.ops.target_linear.target_linear` writes it (``argmax_keys``, e.g. a target forward's
        lm_head that stores no logits): one launch, no argmax pass over the logits.

    Returns
    -------
    ``(accept_index [B, C], accept_len [B], tokens [B, C], features [B, C, W] or None)``: node indices of the root
    and the accepted drafts (-1 padded), the number of accepted drafts, the emitted tokens (the accepted drafts then
    the bonus token, -1 padded) and the rows ``features[b, max(accept_index[b, c], 0)]``.
    """
    check_tensor("draft_tokens", draft_tokens, ndim=2, dtypes=(torch.int64,), last_dim_contiguous=True)
    B, N = draft_tokens.shape
    dev = draft_tokens.device
    check_tensor("retrieve_indices", retrieve_indices, ndim=3, dtypes=(torch.int64,), device=dev,
                 last_dim_contiguous=True)
    if retrieve_indices.shape[0] != B:
        raise ValueError(f"retrieve_indices holds {retrieve_indices.shape[0]} sequences, draft_tokens {B}")
    R, C = retrieve_indices.shape[1:]
    if (logits is None) == (argmax_keys is None):
        raise ValueError("give exactly one of logits and argmax_keys")
    if argmax_keys is not None:
        check_tensor("argmax_keys", argmax_keys, shape=(B, N), dtypes=(torch.int64,), device=dev,
                     last_dim_contiguous=True)
        if argmax_keys.stride(0) != N:
            raise ValueError("argmax_keys must be contiguous")
        V = 1
    else:
        check_tensor("logits", logits, ndim=3, dtypes=_FLOATS, device=dev, last_dim_contiguous=True)
        if tuple(logits.shape[:2]) != (B, N):
            raise ValueError(f"logits must be [B={B}, N={N}, V], got {list(logits.shape)}")
        V = logits.shape[2]
    if R < 1 or C < 1 or N < 1 or V < 1:
        raise ValueError(f"empty tree or vocabulary: N={N}, R={R}, C={C}, V={V}")
    if features is not None:
        check_tensor("features", features, ndim=3, device=dev, last_dim_contiguous=True)
        if tuple(features.shape[:2]) != (B, N):
            raise ValueError(f"features must be [B={B}, N={N}, W], got {list(features.shape)}")
    if out is not None:
        _check_out(out, B, C, features)
    if next_inputs is not None:
        if len(next_inputs) != 2:
            raise ValueError(f"next_inputs must be (ids, num_new), got {len(next_inputs)} entries")
        check_tensor("next_inputs ids", next_inputs[0], shape=(B, C), dtypes=(torch.int64,), device=dev,
                     last_dim_contiguous=True)
        check_tensor("next_inputs num_new", next_inputs[1], shape=(B,), dtypes=(torch.int32,), device=dev)
    if validate and not is_capturing(dev) and B > 0:
        lo, hi = torch.stack([retrieve_indices.min(), retrieve_indices.max()]).tolist()
        if lo < -1 or hi >= N:
            raise ValueError(f"retrieve_indices in [{lo}, {hi}] outside [-1, N={N})")
    out = tuple(out) if out is not None else (None, None, None, None)
    acc_idx = out[0] if out[0] is not None else torch.empty(B, C, dtype=torch.int64, device=dev)
    acc_len = out[1] if out[1] is not None else torch.empty(B, dtype=torch.int64, device=dev)
    tokens = out[2] if out[2] is not None else torch.empty(B, C, dtype=torch.int64, device=dev)
    feats = None
    if features is not None:
        feats = out[3] if out[3] is not None else features.new_empty(B, C, features.shape[2])
    if B == 0:
        return acc_idx, acc_len, tokens, feats
    interp = is_interpreter()
    if argmax_keys is None:
        block_v = min(next_power_of_2(V), 128 if interp else 4096)  # small slices in tests: several splits per row
        S = cdiv(V, block_v)
        pmax = torch.empty(B * N * S, dtype=torch.float32, device=dev)
        pidx = torch.empty(B * N * S, dtype=torch.int32, device=dev)
        _argmax_split_kernel[(B * N, S)](logits, pmax, pidx, N, V, S, logits.stride(0), logits.stride(1),
                                         BLOCK_V=block_v, num_warps=1 if interp else 4)
        keys = draft_tokens  # an unread stand-in
    else:
        S, pmax, pidx, keys = 1, draft_tokens, draft_tokens, argmax_keys  # unread stand-ins for the split maxima
    pred = torch.empty(B, N, dtype=torch.int64, device=dev)
    f = features if features is not None else draft_tokens  # an unread stand-in
    fo = feats if feats is not None else draft_tokens.view(B, N, 1)
    ids, num_new = next_inputs if next_inputs is not None else (tokens, acc_len)  # unread stand-ins
    W = features.shape[2] if features is not None else 1
    _tree_accept_kernel[(B, C if features is not None else 1)](  # programs past the first copy features only
        draft_tokens, retrieve_indices, pmax, pidx, keys, pred, f, acc_idx, acc_len, tokens, fo, ids, num_new,
        N, R, C, S, W,
        draft_tokens.stride(0), retrieve_indices.stride(0), retrieve_indices.stride(1),
        f.stride(0), f.stride(1), fo.stride(0), fo.stride(1),
        acc_idx.stride(0), acc_len.stride(0), tokens.stride(0), ids.stride(0), num_new.stride(0),
        BLOCK_N=max(2, next_power_of_2(N)), BLOCK_R=max(2, next_power_of_2(R)), BLOCK_C=max(2, next_power_of_2(C)),
        BLOCK_S=max(2, next_power_of_2(S)),
        BLOCK_W=min(16 if interp else _FEATURE_BLOCK, max(16, next_power_of_2(W))),
        FEATS=features is not None, NEXT=next_inputs is not None, KEYS=argmax_keys is not None,
        num_warps=1 if interp else 4,
    )
    return acc_idx, acc_len, tokens, feats


def _aot_specs():
    """Compile-only specs for tests/test_compile_targets.py: bf16 logits of the Llama-3.1-8B vocabulary (32 argmax
    slices) and a 60/7/10 tree (61 nodes, 60 paths of 9 columns) with 12288-wide EAGLE-3 features."""
    sig = {n: "i32" for n in _argmax_split_kernel.arg_names}
    sig.update({"x_ptr": "*bf16", "max_ptr": "*fp32", "idx_ptr": "*i32", "BLOCK_V": "constexpr"})
    specs = [(_argmax_split_kernel, sig, {"BLOCK_V": 4096}, {"num_warps": 4, "div16": ["V", "stride_b", "stride_n"]})]
    sig = {n: "i32" for n in _tree_accept_kernel.arg_names}
    sig.update({n: "*i64" for n in ("tok_ptr", "ri_ptr", "key_ptr", "pred_ptr", "acc_idx_ptr", "acc_len_ptr",
                                    "tokens_ptr", "ids_ptr")})
    sig.update({"max_ptr": "*fp32", "idx_ptr": "*i32", "feat_ptr": "*bf16", "out_feat_ptr": "*bf16",
                "num_new_ptr": "*i32"})
    const = dict(BLOCK_N=64, BLOCK_R=64, BLOCK_C=16, BLOCK_S=32, BLOCK_W=16384, FEATS=True, NEXT=True)
    sig.update({k: "constexpr" for k in const})
    specs.append((_tree_accept_kernel, sig, const, {"num_warps": 4}))
    keys = dict(const, KEYS=True)  # the argmax keys of the lm_head instead of the split maxima
    specs.append((_tree_accept_kernel, {**sig, "KEYS": "constexpr"}, keys, {"num_warps": 4}))
    return specs


#: ``(kernel, signature, constexprs, options)`` tuples compiled for sm_90 by tests/test_compile_targets.py.
AOT_SPECS = _aot_specs()
