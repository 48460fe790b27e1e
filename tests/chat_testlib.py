"""A tiny chat tokenizer built in code (characters, ChatML template) and a tiny random Llama target that uses it:
training and acceptance tests run on them without downloads."""

import torch

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT
    tok.padding_side = "left"
    return tok


def tiny_chat_model(tok, heads: int = 4, kv_heads: int = 2):
    """A 5-layer random Llama over ``tok``'s 112 ids, with peaked next-token distributions (something to learn).
    ``heads=3, kv_heads=1`` gives head_dim 16, which the fused drafter runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=112, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      rms_norm_eps=1e-5,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # the default init is near uniform
        model.lm_head.weight.mul_(40.0)
    return model.eval().requires_grad_(False)


def save_tiny_chat_target(folder, **model_kw) -> str:
    """The tiny chat model and its tokenizer saved as a transformers model folder; returns its path."""
    tok = tiny_tokenizer()
    model = tiny_chat_model(tok, **model_kw)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)
