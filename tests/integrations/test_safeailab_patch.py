"""patch_ea_model_with_triton_drafter on a stand-in with SafeAILab's attribute layout."""

import pytest
import torch
from spec_topk_genrate import spec_standin

from eagle_triton import TreeConfig
from eagle_triton.integrations.safeailab import head_from_ea_layer, patch_ea_model_with_triton_drafter
from eagle_triton.testing import random_eagle3_head


def test_head_shares_the_ea_layer_weights():
    model = spec_standin(random_eagle3_head(), TreeConfig(20, 3, 4))
    head = head_from_ea_layer(model.ea_layer)
    assert head.fc.weight is model.ea_layer.fc.weight
    assert head.midlayer.mlp.down_proj.weight is model.ea_layer.midlayer.mlp.down_proj.weight
    assert head.d2t is model.ea_layer.d2t


@pytest.mark.parametrize("cfg", [(20, 3, 4), (60, 7, 10)])
def test_patched_drafting_equals_original_over_a_generation(cfg):
    base = random_eagle3_head()
    tc = TreeConfig(*cfg)
    orig, patched = spec_standin(base, tc), spec_standin(base, tc)
    with pytest.warns(RuntimeWarning, match="PyTorch reference"):
        patch_ea_model_with_triton_drafter(patched)
    W = base.feature_width
    ids = torch.randint(0, 256, (1, 8))
    feats = torch.randn(1, 7, W)
    for model in (orig, patched):
        model.ea_layer.reset_kv()
    for step in range(3):
        a = orig.ea_layer.topK_genrate(feats, ids, None, None if step != 1 else object())
        b = patched.ea_layer.topK_genrate(feats, ids, None, None if step != 1 else object())
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y) and x.device == y.device
        for (k, v), (k2, v2) in zip(orig.ea_layer.stable_kv, patched.ea_layer.stable_kv, strict=True):
            assert torch.equal(k, k2) and torch.equal(v, v2)
        row = a[1][0]
        acc = a[0][0, row[row >= 0][1:2]]
        ids = torch.cat([ids, acc[None], torch.randint(0, 256, (1, 1))], 1)
        feats = torch.randn(1, acc.numel() + 1, W)
    # reset_kv() on the EAGLE object resets the patched drafter too
    patched.ea_layer.reset_kv()
    orig.ea_layer.reset_kv()
    ids = torch.randint(0, 256, (1, 5))
    feats = torch.randn(1, 4, W)
    assert torch.equal(orig.ea_layer.topK_genrate(feats, ids, None, None)[0],
                       patched.ea_layer.topK_genrate(feats, ids, None, None)[0])


def test_use_triton_false_restores_the_original():
    model = spec_standin(random_eagle3_head(), TreeConfig(20, 3, 4))
    bound = model.ea_layer.topK_genrate
    with pytest.warns(RuntimeWarning):
        patch_ea_model_with_triton_drafter(model)
    assert model.ea_layer.topK_genrate != bound
    patch_ea_model_with_triton_drafter(model, use_triton=False)
    assert model.ea_layer.topK_genrate == bound and "topK_genrate" not in model.ea_layer.__dict__


def test_rejects_objects_without_the_layout():
    with pytest.raises(TypeError, match="SafeAILab's layout"):
        patch_ea_model_with_triton_drafter(torch.nn.Linear(2, 2))


def test_eagle1_layout_uses_the_target_head_argument():
    from eagle_triton.testing import random_eagle1_head

    base = random_eagle1_head()
    tc = TreeConfig(20, 3, 4)
    orig, patched = spec_standin(base, tc), spec_standin(base, tc)
    patch_ea_model_with_triton_drafter(patched, backend="torch")
    ids = torch.randint(0, 256, (1, 6))
    feats = torch.randn(1, 5, base.feature_width)
    a = orig.ea_layer.topK_genrate(feats, ids, base.target_lm_head, None)
    b = patched.ea_layer.topK_genrate(feats, ids, base.target_lm_head, None)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_changing_the_tree_settings_rebuilds_the_drafter():
    """``ea_layer.top_k``/``depth``/``total_tokens`` written between generations take effect at the next call (the
    drafter is rebuilt), and rewriting the same values keeps it."""
    base = random_eagle3_head(seed=3, lm_head_scale=6.0)
    orig, patched = spec_standin(base, TreeConfig(20, 3, 4)), spec_standin(base, TreeConfig(20, 3, 4))
    patch_ea_model_with_triton_drafter(patched, backend="torch")
    drafter = patched.ea_layer.topK_genrate
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 256, (1, 6), generator=g)
    feats = torch.randn(1, 5, base.feature_width, generator=g)
    # (top_k, depth, total_tokens): the patched values, then new ones, then the new ones written again
    for settings, kept in (((4, 3, 19), True), ((3, 2, 11), False), ((3, 2, 11), True)):
        first = drafter.drafter
        for model in (orig, patched):
            model.ea_layer.top_k, model.ea_layer.depth, model.ea_layer.total_tokens = settings
            model.ea_layer.reset_kv()
        spec = orig.ea_layer._spec
        spec.top_k, spec.depth, spec.total_tokens = settings
        a = orig.ea_layer.topK_genrate(feats, ids, None, None)
        b = patched.ea_layer.topK_genrate(feats, ids, None, None)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
        assert b[0].shape[1] == settings[2] + 1
        assert (drafter.drafter is first) == kept
