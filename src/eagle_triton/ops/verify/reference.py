"""PyTorch references of the tree verification ops (the specification; loop-clear, computed on the host).

Three acceptance rules share one walk over SGLang's linked-list tree (first child, then siblings in list order):

* ``greedy``: accept the first child whose token equals the target's argmax after the current node.
* ``sgl`` (sgl-kernel's ``tree_speculative_sampling_target_only``, AOT rule): one coin per accepted node;
  sibling ``x`` adds ``p(x)`` to a running sum ``acc`` and is accepted iff ``coin <= acc / threshold_acc`` or
  ``p(x) >= threshold_single``; a rejected sibling's target probability is written into ``draft_probs`` (the caller
  passes zeros) so that the final token is drawn from ``relu(target - draft)``.
* ``eagle`` (SafeAILab EAGLE's ``evaluate_posterior``, EAGLE_ALGORITHM.md 3.5): one coin per tried sibling;
  sibling ``x`` is accepted iff ``u * rem < p(x)`` where ``rem`` is the target mass left after zeroing the siblings
  rejected so far (i.e. ``u < p(x) / rem``, the renormalised probability); a token already tried at this level is
  skipped. The final token is drawn from the target with the rejected siblings zeroed.

Final-token sampling (both sampling rules): ``u = coin_final * sum(r)`` and the token is the first index whose
inclusive cumulative sum of ``r`` exceeds ``u`` among entries with ``r > 0``; if none does (rounding when
``coin_final`` is close to 1), the **last index with positive residual**, or ``V - 1`` when ``r`` is all zero.
All arithmetic is float32, in the kernels' order.

Walk bounds (also in the kernels): at most ``num_spec_step - 1`` accepted levels, at most ``D`` siblings per level,
and a link outside ``[0, D)`` ends its list, so cyclic or corrupt links cannot hang or index out of a row.
"""

from __future__ import annotations

import numpy as np
import torch

from ._checks import check_eagle, check_greedy, check_sampling

__all__ = [
    "verify_tree_greedy_ref",
    "tree_speculative_sampling_target_only_ref",
    "verify_tree_ref",
]

_F = np.float32


def _sample_residual(r: np.ndarray, coin: np.float32) -> int:
    """First index with cumsum(r) > coin * sum(r) among r > 0; else the last positive index; else V - 1."""
    r = r.astype(_F)
    total = _F(r.sum(dtype=_F))
    u = _F(_F(coin) * total)
    cdf = np.cumsum(r, dtype=_F)
    hit = np.nonzero((cdf > u) & (r > 0))[0]
    if hit.size:
        return int(hit[0])
    pos = np.nonzero(r > 0)[0]
    return int(pos[-1]) if pos.size else r.shape[0] - 1


def _walk(rule, D, S1, cand, ri, nt, ns, target_of, probs_row, coin_of, thr_single=1.0, thr_acc=1.0,
          on_reject=None):
    """Walk one request's tree. Returns ``(path_nodes, tokens_accepted, last_node, tried_tokens_at_end)``."""
    path = [0]
    toks = []
    last = 0
    valid = lambda x: 0 <= x < D  # noqa: E731

    def first_link(x):
        return int(x) if valid(x) else -1

    cur = first_link(nt[0])
    lvl = 1
    acc = _F(0.0)
    rem = _F(1.0)
    tried: list[int] = []
    coin = coin_of(0) if rule == "sgl" else None
    sib = 0
    while lvl < S1 and cur >= 0:
        tok = int(cand[cur])
        if rule == "greedy":
            accept = tok == target_of(last)
        elif rule == "sgl":
            p = _F(probs_row(last, tok))
            acc = _F(acc + p)
            accept = bool(_F(coin) <= _F(acc / _F(thr_acc))) or bool(p >= _F(thr_single))
        else:
            p = _F(0.0) if tok in tried else _F(probs_row(last, tok))
            accept = bool(_F(_F(coin_of(cur)) * rem) < p)
        if accept:
            toks.append(tok)
            path.append(cur)
            last = cur
            lvl += 1
            sib = 0
            acc, rem, tried = _F(0.0), _F(1.0), []
            if rule == "sgl":
                coin = coin_of(cur)
            nxt = nt[cur]
        else:
            if rule == "sgl" and on_reject is not None:
                on_reject(last, tok, p)
            if rule == "eagle":
                rem = _F(rem - p)
                tried.append(tok)
            sib += 1
            nxt = ns[cur]
        cur = int(nxt) if (valid(nxt) and sib < D) else -1
    return path, toks, last, tried


def _record_sgl_path(ai_row, pred, path, toks, flat) -> None:
    """Write an accepted path in sgl-kernel's layout: the nodes' flat indices into ``ai_row`` (a row of
    ``accept_index``) and each accepted token into ``pred`` at its parent's flat index."""
    ai_row[0] = flat(0)
    for k in range(1, len(path)):
        prev = flat(path[k - 1])
        if 0 <= prev < pred.shape[0]:
            pred[prev] = toks[k - 1]
        ai_row[k] = flat(path[k])


def verify_tree_greedy_ref(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, target_predict) -> None:
    """Reference of :func:`eagle_triton.ops.verify_tree_greedy` (same signature, same in-place writes)."""
    bs, D, S1 = check_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                             retrive_next_token, retrive_next_sibling, target_predict)
    cand, ri = candidates.cpu().numpy(), retrive_index.cpu().numpy()
    nt, ns = retrive_next_token.cpu().numpy(), retrive_next_sibling.cpu().numpy()
    tp = target_predict.reshape(-1).cpu().numpy()
    pred = predicts.cpu().numpy().copy()
    ai = accept_index.cpu().numpy().copy()
    an = accept_token_num.cpu().numpy().copy()
    nflat = bs * D
    for b in range(bs):
        # the walk's callbacks read request b's rows; b is bound as a default so each closure keeps its own
        def flat(node, b=b):
            return int(ri[b, node])

        def target_of(node, flat=flat):
            return int(tp[flat(node)]) if 0 <= flat(node) < nflat else -1

        path, toks, last, _ = _walk("greedy", D, S1, cand[b], ri[b], nt[b], ns[b], target_of, None, None)
        _record_sgl_path(ai[b], pred, path, toks, flat)
        an[b] = len(path) - 1
        if 0 <= flat(last) < pred.shape[0]:
            pred[flat(last)] = target_of(last)
    predicts.copy_(torch.from_numpy(pred))
    accept_index.copy_(torch.from_numpy(ai))
    accept_token_num.copy_(torch.from_numpy(an))


def tree_speculative_sampling_target_only_ref(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
    uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single=1.0,
    threshold_acc=1.0, deterministic=True,
) -> None:
    """Reference of :func:`eagle_triton.ops.tree_speculative_sampling_target_only` (same signature and writes)."""
    bs, D, S1, V = check_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                  retrive_next_token, retrive_next_sibling, uniform_samples,
                                  uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
                                  threshold_acc)
    thr_acc = max(float(threshold_acc), 1e-9)
    cand, ri = candidates.cpu().numpy(), retrive_index.cpu().numpy()
    nt, ns = retrive_next_token.cpu().numpy(), retrive_next_sibling.cpu().numpy()
    coins = uniform_samples.cpu().numpy()
    coins_f = uniform_samples_for_final_sampling.cpu().numpy()
    tprobs = target_probs.cpu().numpy()
    dprobs = draft_probs.cpu().numpy().copy()
    pred = predicts.cpu().numpy().copy()
    ai = accept_index.cpu().numpy().copy()
    an = accept_token_num.cpu().numpy().copy()
    for b in range(bs):
        # the walk's callbacks read request b's rows; b is bound as a default so each closure keeps its own
        def flat(node, b=b):
            return int(ri[b, node])

        def probs_row(node, tok, b=b):
            return tprobs[b, node, tok] if 0 <= tok < V else _F(0.0)

        def coin_of(node, b=b):
            return coins[b, node]

        def on_reject(node, tok, p, b=b):
            if 0 <= tok < V:
                dprobs[b, node, tok] = p

        path, toks, last, _ = _walk("sgl", D, S1, cand[b], ri[b], nt[b], ns[b], None, probs_row, coin_of,
                                    threshold_single, thr_acc, on_reject)
        _record_sgl_path(ai[b], pred, path, toks, flat)
        n = len(path) - 1
        an[b] = n
        q = tprobs[b, last]
        r = np.maximum(q - dprobs[b, last], 0) if n != S1 - 1 else np.maximum(q, 0)
        if 0 <= flat(last) < pred.shape[0]:
            pred[flat(last)] = _sample_residual(r, coins_f[b])
    predicts.copy_(torch.from_numpy(pred))
    accept_index.copy_(torch.from_numpy(ai))
    accept_token_num.copy_(torch.from_numpy(an))
    draft_probs.copy_(torch.from_numpy(dprobs))


def verify_tree_ref(draft_tokens, retrieve_indices, target_logits=None, target_probs=None, uniform_samples=None,
                    uniform_samples_for_final_sampling=None):
    """Reference of :func:`eagle_triton.ops.verify_tree` (same signature and outputs)."""
    from ..tree_convert import eagle_to_sglang

    B, N, C, V, sampling = check_eagle(draft_tokens, retrieve_indices, target_logits, target_probs,
                                       uniform_samples, uniform_samples_for_final_sampling)
    dev = draft_tokens.device
    cand, _, nt, ns = (t.cpu().numpy() for t in eagle_to_sglang(draft_tokens, retrieve_indices))
    accept_len = np.zeros(B, dtype=np.int64)
    path_out = np.full((B, C), -1, dtype=np.int64)
    bonus = np.zeros(B, dtype=np.int64)
    if not sampling:
        tp = target_logits.argmax(-1).cpu().numpy()
    else:
        tprobs = target_probs.cpu().numpy()
        coins = uniform_samples.cpu().numpy()
        coins_f = uniform_samples_for_final_sampling.cpu().numpy()
    for b in range(B):
        # the walk's callbacks read request b's rows; b is bound as a default so each closure keeps its own
        if not sampling:
            def target_of(node, b=b):
                return int(tp[b, node])

            path, _, last, _ = _walk("greedy", N, C, cand[b], None, nt[b], ns[b], target_of, None, None)
            bonus[b] = tp[b, last]
        else:
            def probs_row(node, tok, b=b):
                return tprobs[b, node, tok] if 0 <= tok < V else _F(0.0)

            def coin_of(node, b=b):
                return coins[b, node]

            path, _, last, tried = _walk("eagle", N, C, cand[b], None, nt[b], ns[b], None, probs_row, coin_of)
            r = np.maximum(tprobs[b, last], 0).astype(_F)
            for t in tried:
                if 0 <= t < V:
                    r[t] = 0
            bonus[b] = _sample_residual(r, coins_f[b])
        accept_len[b] = len(path) - 1
        path_out[b, : len(path)] = path
    return (torch.from_numpy(accept_len).to(dev), torch.from_numpy(path_out).to(dev), torch.from_numpy(bonus).to(dev))
