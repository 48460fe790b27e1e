"""Argument validation shared by the verification ops and their references."""

from __future__ import annotations

import torch

from .._utils import check_tensor


def _contig(name, t):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_sgl_common(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                     retrive_next_sibling):
    """Checks shared by ``verify_tree_greedy`` and ``tree_speculative_sampling_target_only``; returns (bs, D, S1)."""
    check_tensor("candidates", candidates, ndim=2, dtypes=(torch.int64,))
    bs, D = candidates.shape
    dev = candidates.device
    if D < 1:
        raise ValueError("candidates must have at least one column (the root)")
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        check_tensor(name, t, shape=(bs, D), dtypes=(torch.int64,), device=dev)
    check_tensor("predicts", predicts, ndim=1, dtypes=(torch.int32,), device=dev)
    if predicts.numel() < bs * D:
        raise ValueError(f"predicts holds {predicts.numel()} entries, below bs * D = {bs * D}")
    check_tensor("accept_index", accept_index, ndim=2, dtypes=(torch.int32,), device=dev)
    if accept_index.shape[0] != bs or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index must be [bs, num_spec_step] = [{bs}, >=1], got {list(accept_index.shape)}")
    check_tensor("accept_token_num", accept_token_num, shape=(bs,), dtypes=(torch.int32,), device=dev)
    for name, t in (("predicts", predicts), ("accept_index", accept_index), ("accept_token_num", accept_token_num),
                    ("candidates", candidates), ("retrive_index", retrive_index),
                    ("retrive_next_token", retrive_next_token), ("retrive_next_sibling", retrive_next_sibling)):
        _contig(name, t)
    return bs, D, accept_index.shape[1]


def check_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                 retrive_next_sibling, target_predict):
    bs, D, S1 = check_sgl_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                 retrive_next_token, retrive_next_sibling)
    check_tensor("target_predict", target_predict, shape=(bs, D), dtypes=(torch.int64,), device=candidates.device)
    _contig("target_predict", target_predict)
    return bs, D, S1


def check_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                   retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                   draft_probs, threshold_single, threshold_acc):
    bs, D, S1 = check_sgl_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                 retrive_next_token, retrive_next_sibling)
    dev = candidates.device
    check_tensor("target_probs", target_probs, ndim=3, dtypes=(torch.float32,), device=dev)
    if target_probs.shape[:2] != (bs, D) or target_probs.shape[2] < 1:
        raise ValueError(f"target_probs must be [bs, D, V] = [{bs}, {D}, V], got {list(target_probs.shape)}")
    check_tensor("draft_probs", draft_probs, shape=tuple(target_probs.shape), dtypes=(torch.float32,), device=dev)
    check_tensor("uniform_samples", uniform_samples, shape=(bs, D), dtypes=(torch.float32,), device=dev)
    check_tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, shape=(bs,),
                 dtypes=(torch.float32,), device=dev)
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs),
                    ("uniform_samples", uniform_samples),
                    ("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling)):
        _contig(name, t)
    for name, v in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v}")
    return bs, D, S1, target_probs.shape[2]


def check_eagle(draft_tokens, retrieve_indices, target_logits, target_probs, uniform_samples,
                uniform_samples_for_final_sampling):
    """Checks for :func:`verify_tree`; returns ``(B, N, C, V, sampling)``."""
    check_tensor("draft_tokens", draft_tokens, ndim=2, dtypes=(torch.int64,))
    B, N = draft_tokens.shape
    dev = draft_tokens.device
    check_tensor("retrieve_indices", retrieve_indices, ndim=3, dtypes=(torch.int64,), device=dev)
    if retrieve_indices.shape[0] != B or retrieve_indices.shape[2] < 1:
        raise ValueError(f"retrieve_indices must be [B, R, C] with B = {B}, got {list(retrieve_indices.shape)}")
    C = retrieve_indices.shape[2]
    sampling = target_probs is not None
    if sampling:
        if target_logits is not None:
            raise ValueError("pass either target_logits (greedy) or target_probs (sampling), not both")
        check_tensor("target_probs", target_probs, ndim=3, dtypes=(torch.float32,), device=dev)
        if target_probs.shape[:2] != (B, N):
            raise ValueError(f"target_probs must be [B, N, V] = [{B}, {N}, V], got {list(target_probs.shape)}")
        _contig("target_probs", target_probs)
        if uniform_samples is None or uniform_samples_for_final_sampling is None:
            raise ValueError("sampling verification needs uniform_samples [B, N] and "
                             "uniform_samples_for_final_sampling [B] (RNG passed as tensors)")
        check_tensor("uniform_samples", uniform_samples, shape=(B, N), dtypes=(torch.float32,), device=dev)
        check_tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, shape=(B,),
                     dtypes=(torch.float32,), device=dev)
        V = target_probs.shape[2]
    else:
        if target_logits is None:
            raise ValueError("greedy verification needs target_logits [B, N, V]")
        check_tensor("target_logits", target_logits, ndim=3, device=dev)
        if target_logits.shape[:2] != (B, N):
            raise ValueError(f"target_logits must be [B, N, V] = [{B}, {N}, V], got {list(target_logits.shape)}")
        V = target_logits.shape[2]
    return B, N, C, V, sampling
