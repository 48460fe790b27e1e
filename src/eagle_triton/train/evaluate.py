"""Greedy acceptance of a draft head, measured without an engine.

Under greedy decoding, the tokens a speculative engine emits are exactly the target's greedy continuation, and
each verification accepts the longest root-to-node path of the draft tree that matches it, plus one bonus token.
So the mean accepted length can be computed from the greedy continuation alone: draft a tree (with
:class:`~eagle_triton.TreeDrafter`, the reference drafter) from each accepted prefix, walk it along the
continuation, and advance by ``matched + 1``. The target features of accepted tokens are taken from one forward
over the whole sequence (the engine gets the same values from its verification passes, up to rounding).
"""

from __future__ import annotations

import time

import torch

from ..config import TreeConfig
from ..drafter import TreeDrafter
from .data import _chat_ids, _stop_ids
from .target import target_forward

__all__ = ["accepted_along_path", "greedy_acceptance", "greedy_continuation"]


def accepted_along_path(draft_tokens: torch.Tensor, retrieve_indices: torch.Tensor, future: torch.Tensor) -> int:
    """Number of drafted tokens a greedy verifier accepts.

    Parameters
    ----------
    draft_tokens: ``[T + 1]`` tree tokens (node 0 is the root).
    retrieve_indices: ``[R, C]`` root-to-leaf node paths, ``-1`` padded.
    future: the target's continuation after the root, ``[>= C - 1]`` (``-1`` padded past its end).
    """
    ri = retrieve_indices.to(draft_tokens.device)
    C = ri.shape[1]
    fut = torch.full((C - 1,), -1, dtype=torch.long, device=draft_tokens.device)
    n = min(C - 1, future.numel())
    fut[:n] = future[:n].to(draft_tokens.device)
    path_tok = torch.where(ri[:, 1:] >= 0, draft_tokens[ri[:, 1:].clamp(min=0)], torch.full_like(ri[:, 1:], -2))
    match = (path_tok == fut[None]).long().cumprod(dim=1)
    return int(match.sum(dim=1).max())


@torch.no_grad()
def greedy_continuation(target, tok, prompt_ids: list[int], max_new_tokens: int) -> torch.Tensor:
    """The target's greedy continuation (stopping after its first stop token), self-consistent under one full
    forward: it is cut where that forward's argmax disagrees with ``generate`` (a near-tie in low precision)."""
    dev = target.device
    x = torch.tensor([prompt_ids], device=dev)
    out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                          pad_token_id=tok.pad_token_id)
    cont = out[0, len(prompt_ids):].tolist()
    stop = _stop_ids(tok)
    for i, t in enumerate(cont):
        if t in stop:
            cont = cont[: i + 1]
            break
    seq = torch.tensor([prompt_ids + cont], device=dev)
    am = target(seq).logits[0, len(prompt_ids) - 1: -1].argmax(-1)
    agree = (am == seq[0, len(prompt_ids):]).long().cumprod(0)
    keep = int(agree.sum())
    return seq[0, len(prompt_ids): len(prompt_ids) + keep]


_DEFAULT_TREE = TreeConfig(60, 7, 10)  # frozen dataclass: safe to share as a default


@torch.no_grad()
def greedy_acceptance(target, tok, head, prompts: list[str], tree_configs=(_DEFAULT_TREE,),
                      max_new_tokens: int = 256, chat: bool = True, backend: str = "torch",
                      progress: bool = False) -> dict:
    """Mean accepted length (tokens per target forward: accepted drafts + 1) per tree configuration.

    Returns ``{"<total>/<depth>/<top_k>": {"mean_accepted_length", "steps", "tokens", "histogram",
    "ended_out_of_vocab"}, ...}`` plus ``"num_prompts"``, ``"seconds"`` and ``"tokens_out_of_vocab"`` (the tokens
    of the target's continuation that steps produce, all but the prefill's first, outside the head's draft
    vocabulary; of ``"continuation_tokens"``). ``ended_out_of_vocab``
    counts the steps that stopped before the tree's depth on such a token: one no draft could have proposed.
    """
    t0 = time.time()
    dev = target.device
    configs = [c if isinstance(c, TreeConfig) else TreeConfig(*c) for c in tree_configs]
    drafters = {c: TreeDrafter(head, c, backend=backend) for c in configs}
    stats = {c: {"steps": 0, "tokens": 0, "histogram": [0] * (c.depth + 3), "ended_out_of_vocab": 0} for c in configs}
    in_vocab = head.t2d.to(dev, torch.bool) if head.has_vocab_map else None  # None: every id can be drafted
    oov = cont_tokens = 0
    it = prompts
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(prompts, desc="acceptance", unit="prompt")
    for p in it:
        ids = _chat_ids(tok, [{"role": "user", "content": p}]) if chat else tok(p).input_ids
        cont = greedy_continuation(target, tok, ids, max_new_tokens)
        if cont.numel() < 2:
            continue
        seq = torch.cat([torch.tensor(ids, device=dev), cont])
        outside = (~in_vocab[seq]).tolist() if in_vocab is not None else [False] * seq.numel()
        oov += sum(outside[len(ids) + 1:])  # the steps' tokens (the first comes with the prefill)
        cont_tokens += cont.numel() - 1
        feats = target_forward(target, seq[None], logits=False).features.to(head.dtype)
        for c, drafter in drafters.items():
            drafter.reset()
            P = len(ids)
            while P < seq.numel() - 1:
                tree = drafter.draft(feats[:, drafter.kv_len: P], seq[None, : P + 1])
                a = accepted_along_path(tree.draft_tokens[0], tree.retrieve_indices, seq[P + 1:])
                # the step's tokens: a accepted drafts and the target's own next one, cut at the continuation's end
                # (a path that matches every remaining token has no bonus token left: the last step ends at the cap)
                n = min(a + 1, seq.numel() - 1 - P)
                st = stats[c]
                st["steps"] += 1
                st["tokens"] += n
                st["histogram"][n] += 1
                st["ended_out_of_vocab"] += int(a < c.depth and n == a + 1 and outside[P + n])
                P += n
    out = {}
    for c, st in stats.items():
        out[f"{c.total_tokens}/{c.depth}/{c.top_k}"] = {
            "mean_accepted_length": st["tokens"] / max(1, st["steps"]), **st}
    out["num_prompts"] = len(prompts)
    out["tokens_out_of_vocab"], out["continuation_tokens"] = oov, cont_tokens
    out["seconds"] = time.time() - t0
    return out
