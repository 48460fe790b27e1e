"""Launchers of the tree verification ops: validation, launch, and the sm_90 compile specs."""

from __future__ import annotations

import torch

from .._utils import is_interpreter, next_power_of_2
from ..tree_convert import eagle_to_sglang
from ._checks import check_eagle, check_greedy, check_sampling
from .kernel import _tree_verify_kernel

__all__ = ["verify_tree_greedy", "tree_speculative_sampling_target_only", "verify_tree", "AOT_SPECS"]


def _block_v(V: int, cap: int = 2048) -> int:
    # EAGLE's rule tests membership of a [BLOCK_V, BLOCK_N] tile against the rejected tokens: a smaller cap.
    return max(16, min(next_power_of_2(V), 128 if is_interpreter() else cap))


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification in place: drop-in for ``sgl_kernel.verify_tree_greedy``.

    Parameters
    ----------
    predicts : Tensor
        Output, 1-D int32 with at least ``bs * D`` entries: ``predicts[x]`` = the token following accepted node
        ``x`` (flat index). Entries off the accepted path are not written.
    accept_index : Tensor
        Output, ``[bs, num_spec_step]`` int32, pre-filled -1 by the caller: flat indices (``retrive_index``
        values) of the root and the accepted nodes.
    accept_token_num : Tensor
        Output, ``[bs]`` int32: accepted drafts, excluding the bonus token (``n + 1`` tokens are emitted).
    candidates : Tensor
        ``[bs, D]`` int64 tree tokens, root in column 0.
    retrive_index, retrive_next_token, retrive_next_sibling : Tensor
        ``[bs, D]`` int64, as written by :func:`build_tree_kernel_efficient`.
    target_predict : Tensor
        ``[bs, D]`` int64 target argmax after each node, read at the flat index of the last accepted node.

    Notes
    -----
    Walks first-child / next-sibling lists and accepts the first sibling whose token equals the target's
    prediction; at most ``num_spec_step - 1`` levels, at most ``D`` siblings per level, and a link outside
    ``[0, D)`` ends its list (sgl-kernel does not guard against corrupt links; we do).
    """
    bs, D, S1 = check_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                             retrive_next_token, retrive_next_sibling, target_predict)
    if bs == 0:
        return
    _tree_verify_kernel[(bs,)](
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, target_predict, target_predict, target_predict, target_predict, target_predict,
        D, S1, 1, bs * D, predicts.numel(), 1.0, 1.0,
        RULE=0, EAGLE_OUT=False, BLOCK_C=2, BLOCK_N=2, BLOCK_V=16, num_warps=1,
    )


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Tree speculative sampling in place: drop-in for ``sgl_kernel.tree_speculative_sampling_target_only``.

    Parameters
    ----------
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling
        As in :func:`verify_tree_greedy`.
    uniform_samples : Tensor
        ``[bs, D]`` float32 coins: ``uniform_samples[b, x]`` chooses among node ``x``'s children (``[b, 0]`` for
        the root's).
    uniform_samples_for_final_sampling : Tensor
        ``[bs]`` float32 coin for the bonus / correction token.
    target_probs : Tensor
        ``[bs, D, V]`` float32 target distribution after each node (temperature / top-k / top-p applied).
    draft_probs : Tensor
        ``[bs, D, V]`` float32, **zeros from the caller; mutated**: a rejected child's target probability is
        written at ``[b, parent, token]``.
    threshold_single, threshold_acc : float
        In ``[0, 1]``; 1.0 (default) is lossless. ``threshold_acc`` is clamped to >= 1e-9 as sgl-kernel does.
    deterministic : bool
        Accepted for signature compatibility; this kernel is always deterministic.

    Notes
    -----
    Acceptance rule (sgl-kernel's AOT rule): one coin per accepted node; walking the children in list order, child
    ``x`` adds ``p(x) = target_probs[b, parent, x]`` to ``acc`` and is accepted iff
    ``coin <= acc / threshold_acc`` or ``p(x) >= threshold_single`` (with thresholds 1 this samples the target
    exactly over the drafted children). Final token: drawn from ``relu(target - draft)`` at the last accepted node
    (``target`` alone when all ``num_spec_step - 1`` levels were accepted) with ``u = coin * sum``, the first index
    whose inclusive cumulative sum exceeds ``u``; when rounding leaves no such index the **last index with positive
    residual** is taken (the newer sgl-kernel fallback; ``V - 1`` only if the residual is all zero).
    """
    bs, D, S1, V = check_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                  retrive_next_token, retrive_next_sibling, uniform_samples,
                                  uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
                                  threshold_acc)
    if bs == 0:
        return
    _tree_verify_kernel[(bs,)](
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, candidates, uniform_samples, uniform_samples_for_final_sampling, target_probs,
        draft_probs, D, S1, V, bs * D, predicts.numel(), float(threshold_single), max(float(threshold_acc), 1e-9),
        RULE=1, EAGLE_OUT=False, BLOCK_C=2, BLOCK_N=2, BLOCK_V=_block_v(V), num_warps=4,
    )


def verify_tree(
    draft_tokens: torch.Tensor,
    retrieve_indices: torch.Tensor,
    target_logits: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    uniform_samples: torch.Tensor | None = None,
    uniform_samples_for_final_sampling: torch.Tensor | None = None,
):
    """EAGLE-style tree verification on EAGLE's buffers (greedy or lossless sampling), with no host sync.

    Parameters
    ----------
    draft_tokens : Tensor
        ``[B, N]`` int64 tree tokens, node 0 the root (``DraftTree.draft_tokens``).
    retrieve_indices : Tensor
        ``[B, R, C]`` int64 root-to-leaf node paths, -1 padded (``DraftTree.retrieve_indices_padded``, ``C = depth
        + 2``); only the parent relation is used, children are tried in increasing node index.
    target_logits : Tensor, optional
        ``[B, N, V]`` target logits after each node. Greedy verification: the target token is ``argmax``.
    target_probs : Tensor, optional
        ``[B, N, V]`` float32 target probabilities after each node (temperature / top-k / top-p applied, rows
        normalised). Selects sampling verification.
    uniform_samples : Tensor, optional
        ``[B, N]`` float32 in ``[0, 1)``: ``uniform_samples[b, x]`` is the coin used when node ``x`` is tried.
    uniform_samples_for_final_sampling : Tensor, optional
        ``[B]`` float32 coin for the bonus token.

    Returns
    -------
    accept_length : ``[B]`` int64, accepted drafts (the bonus token excluded).
    accept_path : ``[B, C]`` int64, node indices root first (``accept_path[:, 0] == 0``), -1 padded.
    bonus_token : ``[B]`` int64, the token to append after the accepted drafts.

    Notes
    -----
    Sampling implements SafeAILab EAGLE's rule (EAGLE_ALGORITHM.md 3.5): siblings are tried in order, each with its
    own coin; sibling ``x`` is accepted with probability ``p(x) / rem`` (``rem`` = target mass not yet rejected at
    this level, i.e. ``p`` renormalised after zeroing rejected siblings); after a full rejection the bonus token is
    drawn from ``p`` with the rejected siblings zeroed, otherwise from ``p`` at the last accepted node. A token
    already tried at the level is skipped. sgl-kernel's one-coin cumulative rule
    (:func:`tree_speculative_sampling_target_only`) accepts child ``k`` when the coin falls in
    ``[sum_{j<k} p_j, sum_{j<=k} p_j]``, which has the same probability ``p_k`` and the same residual, so for one-hot
    (deterministic top-k) drafts both rules sample the target distribution exactly; tests check both by frequency.
    """
    B, N, C, V, sampling = check_eagle(draft_tokens, retrieve_indices, target_logits, target_probs,
                                       uniform_samples, uniform_samples_for_final_sampling)
    dev = draft_tokens.device
    accept_length = torch.empty(B, dtype=torch.int64, device=dev)
    accept_path = torch.empty(B, C, dtype=torch.int64, device=dev)
    bonus = torch.empty(B, dtype=torch.int64, device=dev)
    if B == 0:
        return accept_length, accept_path, bonus
    cand, _, nt, ns = eagle_to_sglang(draft_tokens, retrieve_indices)
    block_c = max(2, next_power_of_2(C))
    if not sampling:
        target_predict = target_logits.argmax(-1).contiguous()
        _tree_verify_kernel[(B,)](
            bonus, accept_path, accept_length, cand, cand, nt, ns, target_predict, target_predict, target_predict,
            target_predict, target_predict, N, C, 1, B * N, B, 1.0, 1.0,
            RULE=0, EAGLE_OUT=True, BLOCK_C=block_c, BLOCK_N=2, BLOCK_V=16, num_warps=1,
        )
    else:
        _tree_verify_kernel[(B,)](
            bonus, accept_path, accept_length, cand, cand, nt, ns, cand, uniform_samples,
            uniform_samples_for_final_sampling, target_probs, target_probs, N, C, V, B * N, B, 1.0, 1.0,
            RULE=2, EAGLE_OUT=True, BLOCK_C=block_c, BLOCK_N=max(2, next_power_of_2(N)), BLOCK_V=_block_v(V, 512),
            num_warps=4,
        )
    return accept_length, accept_path, bonus


def _spec(rule: int, eagle_out: bool, block_c: int, block_n: int, block_v: int):
    i32p, i64p = "*i32", "*i64"
    out = (i64p, i64p, i64p) if eagle_out else (i32p, i32p, i32p)
    sig = {
        "out_tok_ptr": out[0], "out_idx_ptr": out[1], "out_num_ptr": out[2],
        "cand_ptr": i64p, "ri_ptr": i64p, "nt_ptr": i64p, "ns_ptr": i64p, "tp_ptr": i64p,
        "coin_ptr": "*fp32", "coin_final_ptr": "*fp32", "probs_ptr": "*fp32", "draft_ptr": "*fp32",
        "D": "i32", "S1": "i32", "V": "i32", "n_flat": "i32", "n_pred": "i32",
        "thr_single": "fp32", "thr_acc": "fp32",
    }
    cst = {"RULE": rule, "EAGLE_OUT": eagle_out, "BLOCK_C": block_c, "BLOCK_N": block_n, "BLOCK_V": block_v}
    return (_tree_verify_kernel, sig, cst)


#: ``(kernel, signature, constexprs)`` triples for the compile-only sm_90 gate.
AOT_SPECS = [
    _spec(0, False, 2, 2, 16),
    _spec(1, False, 2, 2, 2048),
    _spec(0, True, 16, 2, 16),
    _spec(2, True, 16, 64, 512),
]
