"""The CLI's draft-tree defaults depend on the device; explicit options always win. (The shipped head's measured
tree, which replaces these defaults for it, is tested in test_tuned_trees.py; here the model is another one.)"""

import argparse

import pytest

from eagle_triton.commands.generate import DEFAULT_TREES, add_tree_arguments, tree_from_args


def _args(*argv, device="cpu"):
    p = argparse.ArgumentParser()
    add_tree_arguments(p)
    ns = p.parse_args(list(argv))
    ns.device = device
    ns.target, ns.draft = "some/other-target", "some/other-head"  # not the shipped head: the built-in defaults
    return ns


def test_cpu_default_tree():
    t = tree_from_args(_args())
    assert (t.total_tokens, t.depth, t.top_k) == DEFAULT_TREES["cpu"]


def test_explicit_and_partial_options():
    t = tree_from_args(_args("--total-tokens", "60", "--depth", "7", "--draft-top-k", "10"))
    assert (t.total_tokens, t.depth, t.top_k) == (60, 7, 10)
    t = tree_from_args(_args("--depth", "2"))
    assert (t.total_tokens, t.depth, t.top_k) == (DEFAULT_TREES["cpu"][0], 2, DEFAULT_TREES["cpu"][2])


@pytest.mark.gpu
def test_cuda_default_tree():
    t = tree_from_args(_args(device="cuda"))
    assert (t.total_tokens, t.depth, t.top_k) == DEFAULT_TREES["cuda"] == (60, 7, 10)


def test_help_states_both_defaults():
    p = argparse.ArgumentParser()
    add_tree_arguments(p)
    text = " ".join(p.format_help().split())
    assert "60/7/10 (total/depth/top-k) on CUDA" in text and "/".join(map(str, DEFAULT_TREES["cpu"])) in text
