"""The engine's "auto" drafter: the fused kernel for an EAGLE-3 head on CUDA, the reference drafter elsewhere."""

from types import SimpleNamespace

import pytest
import torch

from eagle_triton import TreeConfig
from eagle_triton.engine import engine as engine_mod


@pytest.mark.parametrize("kind,device,asked,expected", [
    ("eagle3", "cuda", "auto", "triton"),
    ("eagle3", "cpu", "auto", "torch"),
    ("eagle1", "cuda", "auto", "torch"),
    ("eagle3", "cuda", "graph", "graph"),
    ("eagle3", "cpu", "torch", "torch"),
])
def test_auto_drafter_choice(monkeypatch, kind, device, asked, expected):
    made = {}

    def fake_tree_drafter(head, tree_config, backend):
        made.update(head=head, tree_config=tree_config, backend=backend)
        return "drafter"

    monkeypatch.setattr(engine_mod, "TreeDrafter", fake_tree_drafter)
    head = SimpleNamespace(kind=kind, device=torch.device(device))
    fake_engine = SimpleNamespace(tree_config=TreeConfig(20, 3, 4), _drafter_options={})
    assert engine_mod.EagleEngine._make_drafter(fake_engine, head, asked) == "drafter"
    assert made["backend"] == expected and made["head"] is head
