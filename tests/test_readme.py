"""The README's Python examples run as written (each block in a fresh namespace)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    import torch

    torch.set_num_threads(1)
    exec(compile(BLOCKS[index], f"README.md:python-block-{index}", "exec"), {"__name__": f"readme_{index}"})
