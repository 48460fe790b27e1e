"""Conversions between SGLang's linked-list tree and SafeAILab EAGLE's tree buffers (pure PyTorch).

Every function is batched over a leading ``B`` and free of host synchronisation (graph-capturable), so an engine
can draft with one convention and verify with the other.

Conventions
-----------
* **EAGLE** (:class:`eagle_triton.DraftTree`): ``draft_tokens [B, N]`` (node 0 = root), ``retrieve_indices
  [B, R, C]`` root-to-leaf node paths right-padded with -1 (rows past the leaf count all -1), ``tree_mask
  [B, 1, N, N]`` float ancestor-or-self mask, ``tree_position_ids [B, N]`` node depths (root 0).
* **SGLang** (sgl-kernel's ``build_tree_kernel_efficient``): ``candidates [B, D]`` (root first),
  ``retrive_index [B, D] = b * D + node``, ``retrive_next_token`` (first child) and ``retrive_next_sibling``
  (next sibling) links, -1 terminated, children in increasing node order; positions ``seq_len + depth``;
  verification outputs ``accept_index [B, S+1]`` (flat indices, -1 padded), ``accept_token_num [B]`` and
  ``predicts [B*D]`` (token following each accepted node).

Both sides order a node's children by increasing node index (EAGLE's lexicographic retrieve order for sampling
tries siblings in that order; sgl-kernel's head insertion produces it), so a tree converted either way is verified
identically. Trees must be well formed (every node reachable from the root); on malformed links the outputs are
unspecified but the functions never loop or index out of bounds.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..tree import build_tree_buffers

__all__ = [
    "EagleTreeBuffers",
    "parents_from_retrieve_indices",
    "parents_to_linked_lists",
    "linked_lists_to_parents",
    "eagle_to_sglang",
    "sglang_to_eagle",
    "sglang_accept_to_eagle",
    "eagle_accept_to_sglang",
]


class EagleTreeBuffers(NamedTuple):
    """EAGLE-layout tree buffers produced by :func:`sglang_to_eagle`."""

    draft_tokens: torch.Tensor  # [B, N] int64
    retrieve_indices: torch.Tensor  # [B, N-1, max_levels+1] int64, -1 padded
    tree_mask: torch.Tensor  # [B, 1, N, N] float
    tree_position_ids: torch.Tensor  # [B, N] int64 depths
    parents: torch.Tensor  # [B, N] int64, -1 for the root
    num_leaves: torch.Tensor  # [B] int64


def parents_from_retrieve_indices(retrieve_indices: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Parent of every node from EAGLE's root-to-leaf paths: ``[B, R, C]`` -> ``[B, num_nodes]`` (-1 for the root and
    for nodes no path visits)."""
    if retrieve_indices.dim() != 3:
        raise ValueError(f"retrieve_indices must be [B, R, C], got shape {list(retrieve_indices.shape)}")
    B = retrieve_indices.shape[0]
    child = retrieve_indices[:, :, 1:]
    par = retrieve_indices[:, :, :-1]
    valid = (child >= 0) & (child < num_nodes) & (par >= 0) & (par < num_nodes)
    trash = torch.full_like(child, num_nodes)
    out = torch.full((B, num_nodes + 1), -1, dtype=torch.int64, device=retrieve_indices.device)
    out.scatter_(1, torch.where(valid, child, trash).reshape(B, -1), torch.where(valid, par, -1).reshape(B, -1).long())
    return out[:, :num_nodes]


def parents_to_linked_lists(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang links from parent pointers: ``(next_token, next_sibling)``, each ``[B, N]`` int64, -1 terminated;
    first child = smallest child index, siblings in increasing index order."""
    B, N = parents.shape
    nodes = torch.arange(N, device=parents.device)
    child_of = parents.unsqueeze(1) == nodes.view(1, N, 1)  # [B, p, c]
    first = torch.where(child_of, nodes.view(1, 1, N), N).min(2).values
    next_token = torch.where(first < N, first, -1)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & (parents >= 0).unsqueeze(2)
    same &= nodes.view(1, 1, N) > nodes.view(1, N, 1)
    nxt = torch.where(same, nodes.view(1, 1, N), N).min(2).values
    next_sibling = torch.where(nxt < N, nxt, -1)
    return next_token.long(), next_sibling.long()


def linked_lists_to_parents(retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor) -> torch.Tensor:
    """Parent pointers from SGLang links: ``[B, D]`` -> ``[B, D]`` int64 (-1 for the root and unreachable nodes).

    A list head's parent is the node whose ``next_token`` points at it; any other node inherits the parent of its
    previous sibling, resolved by pointer jumping (``ceil(log2 D) + 1`` vectorised steps, no loop over nodes).
    """
    B, D = retrive_next_token.shape
    dev = retrive_next_token.device
    nodes = torch.arange(D, device=dev).expand(B, D)
    nt, ns = retrive_next_token, retrive_next_sibling
    ok_nt = (nt >= 0) & (nt < D)
    ok_ns = (ns >= 0) & (ns < D)
    head_owner = torch.full((B, D + 1), -1, dtype=torch.int64, device=dev)
    head_owner.scatter_(1, torch.where(ok_nt, nt, D), torch.where(ok_nt, nodes, -1))
    prev = torch.full((B, D + 1), -1, dtype=torch.int64, device=dev)
    prev.scatter_(1, torch.where(ok_ns, ns, D), torch.where(ok_ns, nodes, -1))
    val = head_owner[:, :D].clone()
    jump = torch.where(val >= 0, nodes, prev[:, :D])  # where to look for the parent
    jump = torch.where(jump >= 0, jump, nodes)
    for _ in range(max(1, (D - 1).bit_length()) + 1):
        val = torch.where(val >= 0, val, val.gather(1, jump))
        jump = jump.gather(1, jump)
    val[:, 0] = -1
    return val


def eagle_to_sglang(draft_tokens: torch.Tensor, retrieve_indices: torch.Tensor):
    """EAGLE buffers -> SGLang verification inputs.

    Parameters
    ----------
    draft_tokens : ``[B, N]`` int64, node 0 the root.
    retrieve_indices : ``[B, R, C]`` int64 root-to-leaf paths, -1 padded (``DraftTree.retrieve_indices_padded``).

    Returns
    -------
    ``(candidates [B, N], retrive_index [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N])`` int64,
    ready for :func:`eagle_triton.ops.verify_tree_greedy` / ``tree_speculative_sampling_target_only`` with
    ``accept_index`` of width ``C``.
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, N], got shape {list(draft_tokens.shape)}")
    B, N = draft_tokens.shape
    if retrieve_indices.shape[0] != B:
        raise ValueError(f"batch mismatch: draft_tokens {B} vs retrieve_indices {retrieve_indices.shape[0]}")
    parents = parents_from_retrieve_indices(retrieve_indices, N)
    nt, ns = parents_to_linked_lists(parents)
    ri = torch.arange(B * N, device=draft_tokens.device).view(B, N)
    return draft_tokens.long().contiguous(), ri, nt, ns


def sglang_to_eagle(
    candidates: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    max_levels: int,
    sampling: bool = False,
) -> EagleTreeBuffers:
    """SGLang tree -> EAGLE buffers.

    Parameters
    ----------
    candidates : ``[B, D]`` tokens, root first (``draft_tokens.view(B, D)`` of SGLang's wrapper).
    retrive_next_token, retrive_next_sibling : ``[B, D]`` int64 links.
    max_levels : deepest level below the root (SGLang's ``spec_steps``); ``retrieve_indices`` gets
        ``max_levels + 1`` columns.
    sampling : order retrieve rows lexicographically (EAGLE's sampling order) instead of by leaf index.
    """
    if (candidates.dim() != 2 or retrive_next_token.shape != candidates.shape
            or retrive_next_sibling.shape != candidates.shape):
        raise ValueError(
            f"candidates and links must all be [B, D], got {list(candidates.shape)}, {list(retrive_next_token.shape)}, "
            f"{list(retrive_next_sibling.shape)}"
        )
    parents = linked_lists_to_parents(retrive_next_token, retrive_next_sibling)
    mask, positions, retrieve, num_leaves, _ = build_tree_buffers(parents, max_levels, sampling)
    return EagleTreeBuffers(candidates.long(), retrieve, mask.unsqueeze(1).float(), positions, parents, num_leaves)


def sglang_accept_to_eagle(
    accept_index: torch.Tensor, accept_token_num: torch.Tensor, predicts: torch.Tensor, draft_token_num: int
):
    """SGLang verification outputs -> ``(accept_length [B], accept_path [B, S+1] node indices -1 padded,
    bonus_token [B])``, all int64."""
    B = accept_index.shape[0]
    base = torch.arange(B, device=accept_index.device).unsqueeze(1) * draft_token_num
    ai = accept_index.long()
    path = torch.where(ai >= 0, ai - base, -1)
    n = accept_token_num.long()
    last = ai.gather(1, n.unsqueeze(1)).squeeze(1)
    bonus = predicts.long()[last.clamp(min=0)]
    return n, path, bonus


def eagle_accept_to_sglang(
    accept_length: torch.Tensor, accept_path: torch.Tensor, bonus_token: torch.Tensor, draft_tokens: torch.Tensor
):
    """EAGLE verification outputs -> SGLang's ``(predicts [B*N] int32, accept_index [B, C] int32,
    accept_token_num [B] int32)``; ``predicts`` is -1 off the accepted path."""
    B, N = draft_tokens.shape
    C = accept_path.shape[1]
    dev = draft_tokens.device
    base = torch.arange(B, device=dev).unsqueeze(1) * N
    on = accept_path >= 0
    accept_index = torch.where(on, accept_path + base, -1)
    # predicts[path[k]] = token of path[k+1] for k < n, predicts[path[n]] = bonus.
    nxt = torch.cat([accept_path[:, 1:], torch.full_like(accept_path[:, :1], -1)], 1)
    tok = torch.where(nxt >= 0, draft_tokens.gather(1, nxt.clamp(min=0)), -1)
    k = torch.arange(C, device=dev).unsqueeze(0)
    tok = torch.where(k == accept_length.unsqueeze(1), bonus_token.unsqueeze(1), tok)
    predicts = torch.full((B * N + 1,), -1, dtype=torch.int64, device=dev)
    predicts.scatter_(0, torch.where(on, accept_index, B * N).reshape(-1), torch.where(on, tok, -1).reshape(-1))
    return predicts[: B * N].int(), accept_index.int(), accept_length.int()
