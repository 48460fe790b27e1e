"""SGLang-compatible EAGLE tree builder: ``build_tree_kernel_efficient`` (Triton) and its PyTorch reference."""

from .op import build_tree_kernel_efficient
from .reference import build_tree_kernel_efficient_ref, tree_parents_ref

__all__ = ["build_tree_kernel_efficient", "build_tree_kernel_efficient_ref", "tree_parents_ref"]
