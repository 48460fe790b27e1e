"""Triton kernels of the speculative step, each beside a PyTorch reference with the same signature (``op`` and
``op_ref``, in the same op folder).

Dimension glossary used in the docstrings: ``B``/``bs`` batch, ``D`` SGLang tree size including the root
(``draft_token_num``), ``N = T + 1`` EAGLE tree size including the root, ``S`` draft steps, ``K`` top-k,
``V`` vocabulary, ``C`` columns of EAGLE's retrieve indices (``depth + 2``).

Experimental (tested, no production caller yet; see each docstring): :func:`draft_tree_attention`,
:func:`lm_head_topk`.
"""

from .attention import draft_tree_attention, draft_tree_attention_ref, tree_attention, tree_attention_ref
from .kv_cache import append_kv_cache, append_kv_cache_ref, compact_kv_cache, compact_kv_cache_ref
from .lm_head_topk import lm_head_topk, lm_head_topk_ref
from .rope_kv import target_qkv_rope, target_qkv_rope_ref, target_rope_kv, target_rope_kv_ref
from .sampling import (
    philox_uniform,
    philox_uniform_ref,
    sampling_from_probs,
    sampling_from_probs_ref,
    softmax_with_temperature,
    softmax_with_temperature_ref,
    top_k_renorm_probs,
    top_k_renorm_probs_ref,
    top_p_renorm_probs,
    top_p_renorm_probs_ref,
)
from .target_attention import target_attention, target_attention_ref, tree_ancestors, tree_ancestors_ref
from .target_linear import (
    target_embedding,
    target_embedding_ref,
    target_linear,
    target_linear_ref,
    target_rms_norm,
    target_rms_norm_ref,
)
from .tree_accept import tree_accept_greedy, tree_accept_greedy_ref
from .tree_build import build_tree_kernel_efficient, build_tree_kernel_efficient_ref
from .tree_convert import eagle_accept_to_sglang, eagle_to_sglang, sglang_accept_to_eagle, sglang_to_eagle
from .verify import (
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_ref,
    verify_tree,
    verify_tree_greedy,
    verify_tree_greedy_ref,
    verify_tree_ref,
)

__all__ = [
    # tree building (SGLang-compatible) and conversions between SGLang's and EAGLE's tree layouts
    "build_tree_kernel_efficient",
    "build_tree_kernel_efficient_ref",
    "eagle_to_sglang",
    "sglang_to_eagle",
    "eagle_accept_to_sglang",
    "sglang_accept_to_eagle",
    # verification
    "tree_accept_greedy",
    "tree_accept_greedy_ref",
    "verify_tree",
    "verify_tree_ref",
    "verify_tree_greedy",
    "verify_tree_greedy_ref",
    "tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only_ref",
    # sampling
    "softmax_with_temperature",
    "softmax_with_temperature_ref",
    "top_k_renorm_probs",
    "top_k_renorm_probs_ref",
    "top_p_renorm_probs",
    "top_p_renorm_probs_ref",
    "sampling_from_probs",
    "sampling_from_probs_ref",
    "philox_uniform",
    "philox_uniform_ref",
    # attention and the static KV cache
    "tree_attention",
    "tree_attention_ref",
    "append_kv_cache",
    "append_kv_cache_ref",
    "compact_kv_cache",
    "compact_kv_cache_ref",
    # batch-invariant target forward: embedding gather, weight products with fused norm/epilogues, RoPE + KV
    # write, attention
    "target_linear",
    "target_linear_ref",
    "target_rms_norm",
    "target_rms_norm_ref",
    "target_embedding",
    "target_embedding_ref",
    "target_rope_kv",
    "target_rope_kv_ref",
    "target_qkv_rope",
    "target_qkv_rope_ref",
    "target_attention",
    "target_attention_ref",
    "tree_ancestors",
    "tree_ancestors_ref",
    # experimental (no production caller yet)
    "draft_tree_attention",
    "draft_tree_attention_ref",
    "lm_head_topk",
    "lm_head_topk_ref",
]
