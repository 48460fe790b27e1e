"""Tree verification in PyTorch: which drafted tokens the target accepts, and the bonus token.

Both rules are batched over a leading ``B``, keep every tensor on the device (no host synchronisation) and return
an :class:`AcceptResult` in SGLang's conventions. On CUDA, :func:`accept_tree` runs the Triton kernel
:func:`eagle_triton.ops.verify_tree` instead (greedy: identical result; sampling: EAGLE's one-coin-per-sibling
rule, the same distribution), and these PyTorch rules are the CPU path.

* Greedy (:func:`accept_greedy`, SafeAILab ``evaluate_posterior`` with ``logits_processor=None``): the longest
  root-to-leaf prefix whose every token equals the target's argmax after its parent; the bonus token is the
  argmax after the last accepted node.
* Sampling (:func:`accept_sampling`, EAGLE's lossless rule for one-hot drafts): walking down from the root, the
  children of the current node are tried in ascending node index (descending draft probability); child ``x`` is
  accepted with probability ``p(x)`` where ``p`` is the processed target distribution after the current node,
  renormalised after each rejection. With one coin ``u`` per node this is: accept the first child whose inclusive
  cumulative probability (children in order) exceeds ``u``. If no child is accepted the bonus token is drawn from
  ``p`` with the tried children removed (renormalised); after a leaf it is drawn from the full ``p``. Every
  emitted token is therefore distributed exactly as the target's next-token distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams, probs_from_logits, sample_from_probs

__all__ = ["AcceptResult", "accept_greedy", "accept_sampling", "accept_tree", "accept_with_kernel"]


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
    """Greedy verification.

    Parameters
    ----------
    draft_tokens: ``[B, N]`` int64 tree tokens, node 0 the root.
    retrieve_indices: ``[B, R, C]`` int64 root-to-leaf node paths, -1 padded (rows and columns).
    logits: ``[B, N, V]`` target logits after each node.
    """
    B, R, C = retrieve_indices.shape
    pred = logits.argmax(dim=-1)  # [B, N]
    valid = retrieve_indices >= 0
    idx = retrieve_indices.clamp(min=0).view(B, R * C)
    cand = torch.where(valid, draft_tokens.gather(1, idx).view(B, R, C), torch.full_like(retrieve_indices, -1))
    pred_at = pred.gather(1, idx).view(B, R, C)
    match = (cand[:, :, 1:] == pred_at[:, :, :-1]) & valid[:, :, 1:]
    lens = match.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [B, R]
    accept_len, best = lens.max(dim=-1)
    path = retrieve_indices.gather(1, best.view(B, 1, 1).expand(B, 1, C)).squeeze(1)  # [B, C]
    col = torch.arange(C, device=path.device).view(1, C)
    keep = col <= accept_len.view(B, 1)
    accept_index = torch.where(keep, path, torch.full_like(path, -1))
    tokens = torch.where(keep, pred.gather(1, path.clamp(min=0)), torch.full_like(path, -1))
    return AcceptResult(accept_index, accept_len, tokens)


def accept_sampling(
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingParams,
    max_path: int,
    generator: torch.Generator | None = None,
    coins: torch.Tensor | None = None,
) -> AcceptResult:
    """Lossless sampling verification of one-hot drafts (EAGLE / SpecInfer rule; see the module docstring).

    Parameters
    ----------
    draft_tokens: ``[B, N]`` int64, node 0 the root.
    parents: ``[B, N]`` int64 parent node of each node (-1 for the root); parents precede children.
    logits: ``[B, N, V]`` raw target logits after each node (``params`` are applied here).
    params: temperature / top-p / top-k of the target distribution.
    max_path: ``C``, the longest root-to-leaf path in nodes (tree depth + 1); outputs are ``[B, C]``.
    generator: RNG for the coins and the bonus draw.
    coins: optional ``[B, N]`` uniforms in ``[0, 1)``, coin ``[b, n]`` chooses among node ``n``'s children.

    Siblings holding the same token are tried once (the later duplicate is ignored).
    """
    B, N = draft_tokens.shape
    C = int(max_path)
    dev = draft_tokens.device
    if coins is None:
        coins = torch.rand(B, N, generator=generator, device=dev)
    bidx = torch.arange(B, device=dev)
    lower = torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)
    dup = ((parents[:, :, None] == parents[:, None, :]) & (draft_tokens[:, :, None] == draft_tokens[:, None, :])
           & lower).any(-1)
    tok = draft_tokens.clamp(min=0)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    n = torch.zeros(B, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    path = torch.full((B, C), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    tokens = torch.full((B, C), -1, dtype=torch.long, device=dev)
    for _ in range(C):
        p = probs_from_logits(logits[bidx, cur], params)  # [B, V]
        is_child = (parents == cur.view(B, 1)) & ~dup
        q = p.gather(1, tok) * is_child
        hit = is_child & (q > 0) & (coins[bidx, cur].view(B, 1) < q.cumsum(dim=1))
        move = ~done & hit.any(dim=1) & (n < C - 1)
        finish = ~done & ~move
        child = hit.to(torch.int8).argmax(dim=1)
        tried = torch.zeros_like(p).scatter_add_(1, tok, is_child.to(p.dtype)) > 0
        resid = p.masked_fill(tried, 0.0)
        resid = torch.where(resid.sum(dim=1, keepdim=True) > 0, resid, p)  # all mass rejected: a null event
        bonus = sample_from_probs(resid, generator)
        emit = torch.where(move, draft_tokens[bidx, child], torch.where(finish, bonus, tokens[bidx, n]))
        tokens[bidx, n] = emit
        n_next = n + move.to(torch.long)
        path[bidx, n_next] = torch.where(move, child, path[bidx, n_next])
        cur = torch.where(move, child, cur)
        n = n_next
        done = done | finish
    return AcceptResult(path, n, tokens)


def accept_with_kernel(tree, logits: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None = None) -> AcceptResult:
    """:func:`eagle_triton.ops.verify_tree` (one Triton program per sequence) in :class:`AcceptResult` form."""
    from ..ops import verify_tree

    draft_tokens, retrieve = tree.draft_tokens, tree.retrieve_indices_padded
    B, N = draft_tokens.shape
    dev = draft_tokens.device
    if params.greedy:
        accept_len, path, bonus = verify_tree(draft_tokens, retrieve, target_logits=logits)
    else:
        probs = probs_from_logits(logits, params).float().contiguous()
        coins = torch.rand(B, N, generator=generator, device=dev)
        final = torch.rand(B, generator=generator, device=dev)
        accept_len, path, bonus = verify_tree(draft_tokens, retrieve, target_probs=probs, uniform_samples=coins,
                                              uniform_samples_for_final_sampling=final)
    C = path.shape[1]
    col = torch.arange(C, device=dev).view(1, C)
    n = accept_len.view(B, 1)
    drafted = draft_tokens.gather(1, torch.cat([path[:, 1:], path[:, :1]], 1).clamp(min=0))
    tokens = torch.where(col < n, drafted, torch.where(col == n, bonus.view(B, 1), torch.full_like(path, -1)))
    accept_index = torch.where(col <= n, path, torch.full_like(path, -1))
    return AcceptResult(accept_index, accept_len, tokens)


def accept_tree(tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                use_kernel: bool | None = None) -> AcceptResult:
    """Verify a :class:`~eagle_triton.DraftTree` with the rule ``params`` calls for: the Triton kernel on CUDA
    (``use_kernel=None``), the PyTorch rules elsewhere."""
    if use_kernel if use_kernel is not None else (logits.is_cuda and tree.draft_tokens.is_cuda):
        return accept_with_kernel(tree, logits, params, generator)
    if params.greedy:
        return accept_greedy(tree.draft_tokens, tree.retrieve_indices_padded, logits)
    return accept_sampling(tree.draft_tokens, tree.parents, logits, params, tree.retrieve_indices_padded.shape[-1],
                           generator)
