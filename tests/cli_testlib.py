"""Helpers of the CLI tests: a byte-level tokenizer and a tiny random Llama engine (fast on a CPU, no files)."""

from __future__ import annotations

import torch

from eagle_triton.engine import loading as _loading

_load_target = _loading.load_target  # the real one, even where a test replaces the module's
VOCAB = 257  # 256 bytes + <eos>


def byte_tokenizer():
    """A GPT-2-style byte-level BPE tokenizer without merges: one token per UTF-8 byte (so a multi-byte character
    spans several tokens), plus ``<eos>`` (id 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    # GPT-2's byte -> printable character table, in byte order
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs), strict=True))
    assert set(table.values()) == set(alphabet)
    vocab = {table[b]: b for b in range(256)}
    vocab["<eos>"] = 256
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


def tiny_target(seed: int = 0):
    """A fast-path target over a random 4-layer Llama with the byte vocabulary and no EOS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # varied greedy continuations (the default init is near uniform)
        model.lm_head.weight.mul_(30.0)
    return _load_target(model, device="cpu", dtype="float32")


def tiny_head(seed: int = 0):
    from eagle_triton.testing import random_eagle3_head

    return random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=VOCAB, draft_vocab_size=64, seed=seed)


def tiny_engine(head: bool = False, seed: int = 0, max_length: int = 256):
    """An :class:`EagleEngine` over :func:`tiny_target` (with a random EAGLE-3 head when ``head``)."""
    from eagle_triton import TreeConfig
    from eagle_triton.engine.engine import EagleEngine

    return EagleEngine(tiny_target(seed), tiny_head(seed) if head else None, TreeConfig(8, 2, 3),
                       max_length=max_length, tokenizer=byte_tokenizer())
