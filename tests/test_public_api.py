"""The public face: the core namespace, ops with their ``_ref`` twins, and every old import path still working."""

import importlib
import inspect
import warnings

import pytest

import eagle_triton as et
from eagle_triton import ops


def test_every_public_name_resolves():
    for name in et.__all__:
        assert getattr(et, name) is not None, name
    for name in ops.__all__:
        assert getattr(ops, name) is not None, name


def test_core_namespace_is_small_and_warning_free():
    assert len(et.__all__) <= 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in et.__all__:
            getattr(et, name)


def test_ops_have_references_with_the_same_signature():
    names = [n for n in ops.__all__ if n + "_ref" in ops.__all__]
    assert len(names) >= 14
    # launch tuning (splits, tile configs, chunk widths, a caller's bound on lengths that plans the launches, a table
    # precomputed from an input that is passed too, when the kernel may read that table) and host validation
    # switches: not part of the math
    knobs = {"num_splits", "validate", "config", "block_k", "max_seqlen", "tree_ancestors", "tree_ancestors_early"}

    def params(f):
        return [n for n, p in inspect.signature(f).parameters.items()
                if n not in knobs and p.kind is not inspect.Parameter.VAR_KEYWORD]

    for name in names:
        op, ref = getattr(ops, name), getattr(ops, name + "_ref")
        assert params(op) == params(ref), name


def test_integration_entry_points_are_exported():
    for name in ["TreeDrafter", "TreeConfig", "Eagle3DraftHead", "Eagle1DraftHead", "EagleEngine",
                 "patch_ea_model_with_triton_drafter", "optimize_eagle_with_triton", "fused_draft_token_generation",
                 "GPUAssertionError", "frontier_generate", "register_triton_backend", "EAGLEConfig", "EAGLEInference"]:
        assert name in et.__all__, name
    from eagle_triton import eagle_utils, spec_utils

    for name in ["organize_draft_results", "build_tree_structure", "verify_tree_greedy", "compute_tree_statistics",
                 "TreeMaskMode"]:
        assert hasattr(eagle_utils, name), name
    for name in ["fast_topk_torch", "select_top_k_tokens", "generate_token_bitmask", "sample_from_logits",
                 "calculate_acceptance_rate", "pad_to_alignment", "next_power_of_2"]:
        assert hasattr(spec_utils, name), name


@pytest.mark.parametrize("old, new", [
    ("eagle_triton.compat.sglang", "eagle_triton.integrations.sglang"),
    ("eagle_triton.frontier", "eagle_triton.integrations.frontier"),
    ("eagle_triton.eagle_utils", "eagle_triton.integrations.aiter_tree_utils"),
    ("eagle_triton.spec_utils", "eagle_triton.integrations.aiter_spec_utils"),
    ("eagle_triton.integrations.seeds", "eagle_triton.integrations.optimize"),
    ("eagle_triton.drafter.tree", "eagle_triton.tree"),
])
def test_old_module_paths_are_the_new_modules(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_names_import_the_same_objects():
    from eagle_triton.compat.sglang import build_tree_kernel_efficient as a
    from eagle_triton.drafter.tree import DraftTree as t_old
    from eagle_triton.frontier import StubDraftBackend as s_old
    from eagle_triton.fused import Buffers, FusedDrafterBuffers, FusedDrafterWeights, Weights
    from eagle_triton.integrations.sglang import build_tree_kernel_efficient as b

    assert a is b and t_old is et.DraftTree and Weights is FusedDrafterWeights and Buffers is FusedDrafterBuffers
    assert s_old is importlib.import_module("eagle_triton.drafter.stub").StubDraftBackend


@pytest.mark.parametrize("name, module, attr", [
    ("verify_tree", "eagle_triton.ops", "verify_tree"),
    ("lm_head_topk_ref", "eagle_triton.ops", "lm_head_topk_ref"),
    ("eagle_to_sglang", "eagle_triton.ops", "eagle_to_sglang"),
    ("DrafterConfig", "eagle_triton.fused", "DrafterConfig"),
    ("launch_drafter", "eagle_triton.fused", "launch_drafter"),
    ("Weights", "eagle_triton.fused", "FusedDrafterWeights"),
    ("Buffers", "eagle_triton.fused", "FusedDrafterBuffers"),
])
def test_moved_top_level_names_still_import_with_a_warning(name, module, attr):
    with pytest.warns(DeprecationWarning, match=f"eagle_triton.{name} moved"):
        value = getattr(et, name)
    assert value is getattr(importlib.import_module(module), attr)
    with pytest.warns(DeprecationWarning):
        exec(f"from eagle_triton import {name}", {})


def test_stub_backend_needs_no_prior_import():
    """Back ends come from a table resolved on use, not from import side effects (fresh interpreter)."""
    import subprocess
    import sys

    code = ("import eagle_triton as et\nfrom eagle_triton.testing import random_eagle3_head\n"
            "d = et.TreeDrafter(random_eagle3_head(), et.TreeConfig(8, 2, 3), backend='stub')\n"
            "import sys; assert 'eagle_triton.integrations.frontier' not in sys.modules\n"
            "assert isinstance(d._impl, et.DraftBackend)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_backend_is_a_clear_error():
    from eagle_triton.testing import random_eagle3_head

    with pytest.raises(ValueError, match="unknown drafter backend 'nope'"):
        et.TreeDrafter(random_eagle3_head(), et.TreeConfig(8, 2, 3), backend="nope")
