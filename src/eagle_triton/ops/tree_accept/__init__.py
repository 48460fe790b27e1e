"""Greedy tree acceptance on EAGLE's buffers in two launches: :func:`tree_accept_greedy` (+ ``_ref``)."""

from .op import tree_accept_greedy
from .reference import tree_accept_greedy_ref

__all__ = ["tree_accept_greedy", "tree_accept_greedy_ref"]
