"""Tree verification for the engine: which drafted tokens the target accepts, and the bonus token.

Every rule is batched over a leading ``B`` and returns an :class:`AcceptResult` in SGLang's conventions.

* Greedy (:func:`accept_greedy`, SafeAILab ``evaluate_posterior`` with ``logits_processor=None``): the longest
  root-to-leaf prefix whose every token equals the target's argmax after its parent; the bonus token is the
  argmax after the last accepted node. PyTorch, no host synchronisation; the Triton kernel gives the same result.
* Sampling: EAGLE's lossless rule for one-hot drafts, one rule on every device. Walking down from the root, the
  children of the current node are tried in ascending node index with one coin each: child ``x`` is accepted iff
  ``u_x * rem < p(x)``, where ``p`` is the processed target distribution after the current node and ``rem`` the
  mass not yet rejected at this level (i.e. with probability ``p(x) / rem``, the renormalised probability); a token
  already tried at this level is skipped. The bonus token is drawn by inverse CDF with one more coin from ``p``
  with the rejected children removed (the full ``p`` after a leaf). Every emitted token is therefore distributed
  exactly as the target's next-token distribution. On CUDA the rule runs in the Triton kernel
  :func:`eagle_triton.ops.verify_tree`; elsewhere in its reference :func:`eagle_triton.ops.verify_tree_ref` (a
  host loop). Both take their coins from the same generator in the same order (``[B, N]`` sibling coins, then
  ``[B]`` final coins), so the CPU and GPU paths can be compared seed for seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops._utils import is_interpreter
from ..ops.tree_accept import tree_accept_greedy, tree_accept_greedy_ref
from ..ops.verify import verify_tree, verify_tree_ref
from ..tree import build_tree_buffers
from .sampling import SamplingParams, draw_uniform, probs_from_logits

__all__ = ["AcceptResult", "accept_greedy", "accept_greedy_rows", "accept_sampling", "accept_tree", "accept_tree_probs",
           "accept_with_kernel", "greedy_pick_rows"]


@dataclass
class AcceptResult:
    """Outcome of verifying one tree per sequence.

    Attributes
    ----------
    accept_index: ``[B, C]`` int64 tree-node indices of the root and the accepted drafts, in path order, -1 padded.
    accept_len: ``[B]`` int64 number of accepted drafts (root excluded; SGLang's ``accept_token_num``).
    tokens: ``[B, C]`` int64 emitted tokens: the ``accept_len`` accepted drafts then the bonus token, -1 padded.
    """

    accept_index: torch.Tensor
    accept_len: torch.Tensor
    tokens: torch.Tensor


def accept_greedy(draft_tokens: torch.Tensor, retrieve_indices: torch.Tensor, logits: torch.Tensor) -> AcceptResult:
    """Greedy verification (:func:`eagle_triton.ops.tree_accept_greedy_ref`).

    Parameters
    ----------
    draft_tokens: ``[B, N]`` int64 tree tokens, node 0 the root.
    retrieve_indices: ``[B, R, C]`` int64 root-to-leaf node paths, -1 padded (rows and columns).
    logits: ``[B, N, V]`` target logits after each node.
    """
    return AcceptResult(*tree_accept_greedy_ref(draft_tokens, retrieve_indices, logits)[:3])


def _greedy_kernel(logits: torch.Tensor, use_kernel: bool | None) -> bool:
    """Whether greedy acceptance runs the kernels: asked for, or by default for 16/32-bit logits on CUDA or under
    Triton's interpreter (float64 logits keep the reference: the kernels compare in fp32)."""
    if use_kernel is not None:
        return use_kernel
    return logits.dtype in (torch.float16, torch.bfloat16, torch.float32) and (logits.is_cuda or is_interpreter())


def _scores(scores: torch.Tensor, keys: bool, use_kernel: bool | None):
    """The accept function and its ``(logits, argmax_keys)`` arguments for ``scores``: logits, or with ``keys``
    the int64 argmax keys of a target forward (:meth:`~eagle_triton.engine.target.LlamaTarget.verify_rows`)."""
    if keys:
        kernel = use_kernel if use_kernel is not None else (scores.is_cuda or is_interpreter())
        return (tree_accept_greedy if kernel else tree_accept_greedy_ref), None, scores
    return (tree_accept_greedy if _greedy_kernel(scores, use_kernel) else tree_accept_greedy_ref), scores, None


def accept_greedy_rows(tree, logits: torch.Tensor, features: torch.Tensor | None = None, out: tuple | None = None,
                       next_inputs: tuple | None = None, use_kernel: bool | None = None, keys: bool = False):
    """Greedy verification of a :class:`~eagle_triton.DraftTree` for the engine's steps, with the features of the
    accepted rows gathered and every result optionally written into the caller's buffers (``out``, and the next
    draft's inputs ``next_inputs``): the two
    launches of :func:`eagle_triton.ops.tree_accept_greedy` on CUDA and under Triton's interpreter (the CPU tests;
    ``use_kernel=None``), else its reference. ``keys``: ``logits`` holds the target's argmax keys ``[B, N]``
    instead (one launch). Returns ``(accept_index, accept_len, tokens, features)``."""
    fn, lg, ak = _scores(logits, keys, use_kernel)
    return fn(tree.draft_tokens, tree.retrieve_indices_padded, lg, features, out=out, next_inputs=next_inputs,
              validate=False, argmax_keys=ak)


def greedy_pick_rows(logits: torch.Tensor, root_paths: torch.Tensor, out_len: torch.Tensor, out_token: torch.Tensor,
                     next_ids: torch.Tensor, next_num_new: torch.Tensor, use_kernel: bool | None = None,
                     keys: bool = False) -> None:
    """Plain greedy decoding's pick, written into a step's buffers: each row's argmax of ``logits [B, V]`` as the
    acceptance of a tree with no drafts (:func:`accept_greedy_rows`' two launches, instead of torch's one-block
    argmax and three copies; ``keys``: ``logits`` holds the argmax keys ``[B]``, one launch). ``root_paths``:
    ``[B, 1, 1]`` zeros (the root's path); ``out_len`` ``[B]`` gets 0, ``out_token`` ``[B, 1]`` and ``next_ids``
    ``[B, 1]`` the token, ``next_num_new`` ``[B]`` int32 one."""
    fn, lg, ak = _scores(logits.unsqueeze(1), keys, use_kernel)
    fn(next_ids, root_paths, lg, out=(None, out_len, out_token, None), next_inputs=(next_ids, next_num_new),
       validate=False, argmax_keys=ak)


def _accept_by_verify_rule(verify, draft_tokens: torch.Tensor, retrieve_indices: torch.Tensor, logits: torch.Tensor,
                           params: SamplingParams, generator: torch.Generator | None = None,
                           coins: torch.Tensor | None = None, final_coins: torch.Tensor | None = None,
                           probs: torch.Tensor | None = None) -> AcceptResult:
    """Run ``verify`` (:func:`~eagle_triton.ops.verify_tree` or its reference) and lay its outputs out as an
    :class:`AcceptResult`. Coins not given are drawn from ``generator``: ``[B, N]`` first, then ``[B]``.
    ``probs``: the processed target distributions (then ``logits`` and ``params`` are not used)."""
    B, N = draft_tokens.shape
    dev = draft_tokens.device
    if probs is None and params.greedy:
        accept_len, path, bonus = verify(draft_tokens, retrieve_indices, target_logits=logits)
    else:
        if probs is None:
            probs = probs_from_logits(logits, params)
        probs = probs.float().contiguous()
        if coins is None:
            coins = draw_uniform(generator, B, N, device=dev)
        if final_coins is None:
            final_coins = draw_uniform(generator, B, device=dev)
        accept_len, path, bonus = verify(draft_tokens, retrieve_indices, target_probs=probs,
                                         uniform_samples=coins.to(device=dev, dtype=torch.float32),
                                         uniform_samples_for_final_sampling=final_coins.to(dev, torch.float32))
    C = path.shape[1]
    col = torch.arange(C, device=dev).view(1, C)
    n = accept_len.view(B, 1)
    drafted = draft_tokens.gather(1, torch.cat([path[:, 1:], path[:, :1]], 1).clamp(min=0))
    tokens = torch.where(col < n, drafted, torch.where(col == n, bonus.view(B, 1), torch.full_like(path, -1)))
    accept_index = torch.where(col <= n, path, torch.full_like(path, -1))
    return AcceptResult(accept_index, accept_len, tokens)


def accept_sampling(
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingParams,
    max_path: int,
    generator: torch.Generator | None = None,
    coins: torch.Tensor | None = None,
    final_coins: torch.Tensor | None = None,
) -> AcceptResult:
    """Lossless sampling verification of one-hot drafts (EAGLE's rule; see the module docstring), computed by
    :func:`eagle_triton.ops.verify_tree_ref`, the specification of the GPU kernel.

    Parameters
    ----------
    draft_tokens: ``[B, N]`` int64, node 0 the root.
    parents: ``[B, N]`` int64 parent node of each node (-1 for the root); parents precede children.
    logits: ``[B, N, V]`` raw target logits after each node (``params`` are applied here).
    params: temperature / top-p / top-k of the target distribution.
    max_path: ``C``, the longest root-to-leaf path in nodes (tree depth + 1); outputs are ``[B, C]``.
    generator: RNG for the coins not given.
    coins: optional ``[B, N]`` uniforms in ``[0, 1)``: coin ``[b, n]`` decides node ``n`` when it is tried.
    final_coins: optional ``[B]`` uniforms in ``[0, 1)`` for the bonus token's inverse-CDF draw.
    """
    _, _, retrieve, _, _ = build_tree_buffers(parents, int(max_path) - 1)
    return _accept_by_verify_rule(verify_tree_ref, draft_tokens, retrieve, logits, params, generator, coins,
                                  final_coins)


def accept_with_kernel(tree, logits: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None = None) -> AcceptResult:
    """:func:`eagle_triton.ops.verify_tree` (one Triton program per sequence) in :class:`AcceptResult` form."""
    return _accept_by_verify_rule(verify_tree, tree.draft_tokens, tree.retrieve_indices_padded, logits, params,
                                  generator)


def accept_tree(tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                use_kernel: bool | None = None) -> AcceptResult:
    """Verify a :class:`~eagle_triton.DraftTree` with the rule ``params`` calls for: the Triton kernel on CUDA
    (``use_kernel=None``); elsewhere :func:`accept_greedy` or the kernel's reference, drawing the same coins."""
    if use_kernel if use_kernel is not None else (logits.is_cuda and tree.draft_tokens.is_cuda):
        return accept_with_kernel(tree, logits, params, generator)
    if params.greedy:
        return accept_greedy(tree.draft_tokens, tree.retrieve_indices_padded, logits)
    return _accept_by_verify_rule(verify_tree_ref, tree.draft_tokens, tree.retrieve_indices_padded, logits, params,
                                  generator)


def accept_tree_probs(tree, probs: torch.Tensor, generator, use_kernel: bool | None = None) -> AcceptResult:
    """The sampling rule of :func:`accept_tree` on already processed distributions ``probs [B, N, V]`` (one row
    per sequence, each with its own parameters: :func:`~eagle_triton.engine.sampling.probs_from_logits_rows`;
    a one-hot row verifies greedily). ``tree`` in sampling order; coins from ``generator`` as in
    :func:`accept_tree`, so a :class:`~eagle_triton.engine.sampling.RowRNG` row draws what a sequence alone
    draws."""
    kernel = use_kernel if use_kernel is not None else (probs.is_cuda and tree.draft_tokens.is_cuda)
    return _accept_by_verify_rule(verify_tree if kernel else verify_tree_ref, tree.draft_tokens,
                                  tree.retrieve_indices_padded, None, None, generator, probs=probs)
