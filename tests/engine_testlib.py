"""Helpers shared by the engine tests: tiny random transformers models and stub drafters."""

from __future__ import annotations

import random

import torch

from eagle_triton import TreeConfig
from eagle_triton.tree import DraftTree, build_tree_buffers


def tiny_llama(vocab=128, hidden=64, layers=8, heads=4, kv_heads=2, seed=0, std=0.15, model="llama", **extra):
    """A random transformers Llama-family causal LM (fp32, eval) with weights spread enough to give varied
    greedy continuations. ``model``: llama, qwen2, qwen3, mistral."""
    import transformers as tf

    classes = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
               "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM), "mistral": (tf.MistralConfig, tf.MistralForCausalLM)}
    cfg_cls, model_cls = classes[model]
    cfg = cfg_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    m = model_cls(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() > 1:
                p.copy_(std * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return m


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    """transformers' own greedy decoding: the new tokens."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_token_id, pad_token_id=0 if eos_token_id is None else eos_token_id)
    return out[0, len(prompt):].tolist()


class OracleDrafter:
    """A stub drafter that knows the target's greedy continuation and proposes it.

    Each tree is ``tree_config``-sized: a chain whose first ``k`` tokens are the true continuation (``k`` random in
    ``[0, depth + 1]``, biased to long chains), followed by wrong tokens, plus distractor nodes hung under random
    earlier nodes. So steps accept anything from 0 to ``depth + 1`` drafts, exercising long accepted chunks.
    """

    feature_mode = None

    def __init__(self, sequence: list[int], tree_config: TreeConfig, vocab: int, seed: int = 0, p_full: float = 0.6):
        self.sequence = list(sequence)
        self.tree_config = tree_config
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.p_full = p_full
        self.calls = 0

    def reset(self) -> None:
        pass

    def draft(self, hidden_states, input_ids, sampling: bool = False) -> DraftTree:
        self.calls += 1
        ids = input_ids[0].tolist()
        assert self.sequence[:len(ids)] == ids, "the engine's accepted tokens diverged from the greedy continuation"
        cont = self.sequence[len(ids):]
        T, levels = self.tree_config.num_draft_nodes, self.tree_config.max_levels
        chain_len = min(levels, T)
        k = chain_len if self.rng.random() < self.p_full else self.rng.randint(0, chain_len)
        k = min(k, len(cont))
        tokens, parents, depth = [ids[-1]], [-1], [0]
        for j in range(chain_len):
            good = cont[j] if j < len(cont) else 0
            tokens.append(good if j < k else (good + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab)
            parents.append(j)
            depth.append(j + 1)
        while len(tokens) < T + 1:
            p = self.rng.randrange(len(tokens))
            if depth[p] >= levels:
                continue
            tokens.append(self.rng.randrange(self.vocab))
            parents.append(p)
            depth.append(depth[p] + 1)
        # Node order must put parents first; it does (appended after their parent). Sort not needed.
        dev = input_ids.device  # trees live where the engine's tensors do
        parents_t = torch.tensor([parents], device=dev)
        mask, positions, retrieve, num_leaves, max_depth = build_tree_buffers(parents_t, levels, sampling)
        return DraftTree(draft_tokens=torch.tensor([tokens], device=dev), tree_mask=mask.unsqueeze(1).float(),
                         positions=positions, parents=parents_t, retrieve_indices_padded=retrieve,
                         num_leaves=num_leaves, max_depth=max_depth, sampling=sampling)


class OracleRowsDrafter(OracleDrafter):
    """:class:`OracleDrafter` in the device-paced form (``draft_rows``): it rebuilds the accepted sequence from the
    rows the engine hands it, so the engine runs its queued, device-paced steps (the test drafter itself reads the
    row count on the host, which costs nothing on the CPU)."""

    drafts_rows = True

    def reset(self) -> None:
        self._seq: list[int] | None = None

    def reserve(self, max_len: int, max_new_rows: int) -> None:
        pass

    def start_rows(self, slot: int, features, new_ids: torch.Tensor) -> None:
        """A generation starts: the prompt's rows but the last (``prompt[1:-1]``'s tokens); the first draft gets
        the last row (the root)."""
        self._seq = self.sequence[:1] + new_ids.tolist()

    def draft_rows(self, features, new_ids, num_new=None, sampling: bool = False) -> DraftTree:
        n = new_ids.shape[1] if num_new is None else int(num_new[0])
        self._seq += new_ids[0, :n].tolist()
        return self.draft(features, torch.tensor([self._seq], device=new_ids.device), sampling)
