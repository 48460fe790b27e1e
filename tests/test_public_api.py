"""Every public name imports from ``eagle_triton``; every op has its ``_ref`` twin with the same signature."""

import inspect

import eagle_triton as et


def test_every_public_name_resolves():
    for name in et.__all__:
        assert getattr(et, name) is not None, name


def test_ops_have_references_with_the_same_signature():
    ops = [n for n in et.__all__ if n + "_ref" in et.__all__]
    assert len(ops) >= 14
    knobs = {"num_splits", "validate"}  # launch tuning / host validation switches, not part of the math

    def params(f):
        return [n for n, p in inspect.signature(f).parameters.items()
                if n not in knobs and p.kind is not inspect.Parameter.VAR_KEYWORD]

    for name in ops:
        op, ref = getattr(et, name), getattr(et, name + "_ref")
        assert params(op) == params(ref), name


def test_seed_entry_points_are_exported():
    for name in ["TreeDrafter", "TreeConfig", "Eagle3DraftHead", "Eagle1DraftHead", "EagleEngine",
                 "patch_ea_model_with_triton_drafter", "optimize_eagle_with_triton", "fused_draft_token_generation",
                 "GPUAssertionError", "frontier_generate", "register_triton_backend", "EAGLEConfig", "EAGLEInference",
                 "DrafterConfig", "Weights", "Buffers", "launch_drafter"]:
        assert name in et.__all__, name
    from eagle_triton import eagle_utils, spec_utils

    for name in ["organize_draft_results", "build_tree_structure", "verify_tree_greedy", "compute_tree_statistics",
                 "TreeMaskMode"]:
        assert hasattr(eagle_utils, name), name
    for name in ["fast_topk_torch", "select_top_k_tokens", "generate_token_bitmask", "sample_from_logits",
                 "calculate_acceptance_rate", "pad_to_alignment", "next_power_of_2"]:
        assert hasattr(spec_utils, name), name
