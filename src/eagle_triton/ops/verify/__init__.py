"""Tree verification: sgl-kernel-compatible greedy / target-only sampling ops and EAGLE-style ``verify_tree``."""

from .op import tree_speculative_sampling_target_only, verify_tree, verify_tree_greedy
from .reference import tree_speculative_sampling_target_only_ref, verify_tree_greedy_ref, verify_tree_ref

__all__ = [
    "verify_tree_greedy",
    "verify_tree_greedy_ref",
    "tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only_ref",
    "verify_tree",
    "verify_tree_ref",
]
