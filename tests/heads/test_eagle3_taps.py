"""The EAGLE-3 tap rule is one function, and training and serving feed a head the same features."""

import pytest
import torch

from eagle_triton import engine, heads, train
from eagle_triton.engine import LlamaTarget
from eagle_triton.engine.hf_target import HFTarget
from eagle_triton.heads import eagle3_tap_layers
from eagle_triton.train.target import target_forward


def test_one_rule_everywhere():
    assert engine.eagle3_tap_layers is heads.eagle3_tap_layers is train.eagle3_tap_layers


@pytest.mark.parametrize("layers", [7, 8, 16, 30, 32, 36, 80])
def test_rule_is_safeailab_s_for_real_depths(layers):
    """SafeAILab taps the states entering layers {2, L//2, L-3} in ascending layer order; distinct from L = 7."""
    assert eagle3_tap_layers(layers) == (2, layers // 2, layers - 3)
    assert len(set(eagle3_tap_layers(layers))) == 3


@pytest.mark.parametrize("layers, taps", [(3, (0, 1, 2)), (4, (1, 2, 2)), (5, (2, 2, 2)), (6, (2, 3, 3))])
def test_shallow_targets_keep_three_ascending_taps(layers, taps):
    assert eagle3_tap_layers(layers) == taps


@pytest.mark.parametrize("layers", [0, 1, 2])
def test_too_shallow_is_an_error(layers):
    with pytest.raises(ValueError, match=">= 3 layers"):
        eagle3_tap_layers(layers)


@pytest.mark.parametrize("layers", [4, 8])  # 4: the rules of training and serving differed here before
def test_training_and_serving_features_agree(layers):
    from engine_testlib import tiny_llama

    model = tiny_llama(layers=layers)
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(layers))
    trained_on = target_forward(model, ids, logits=False).features
    for target in (LlamaTarget.from_hf(model), HFTarget(model)):
        target.setup(32, "eagle3")
        _, served = target.prefill(ids)
        torch.testing.assert_close(served, trained_on, rtol=1e-5, atol=1e-5)
