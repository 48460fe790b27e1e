"""The package reads bottom-up: no module imports from a higher layer, and the subpackages form no cycle.

Layers, lowest first (a module may import its own layer and the layers below):

0. ``config``, ``tree``, ``heads``: tree shapes, tree buffers, draft heads and their layers.
1. ``drafter``, ``ops``: the drafters and the kernels (each beside its reference).
2. ``fused``, ``engine``: the fused drafter and the engine, built on drafters and kernels.
3. ``integrations``, ``train`` (and the old alias modules ``compat``, ``frontier``, ``eagle_utils``,
   ``spec_utils``): other projects' APIs and training, built on the engine.
4. ``commands``, ``cli``, ``__main__``, ``selfcheck``, ``envinfo``, ``testing`` and every ``bench`` module
   (``ops/<op>/bench.py`` sits beside its op but drives it the way a user would, through the integrations).
5. the package root ``eagle_triton`` (the public namespace).

Imports inside functions count as much as module-level ones. The only reference upwards is by name, in the drafter
back-end table (``drafter/backends.py``: ``"module:Class"`` strings resolved on use), which no import statement
makes. Importing ``__version__`` from the package root is allowed everywhere (metadata, not code).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "eagle_triton"

LAYERS: dict[str, int] = {
    "config": 0, "tree": 0, "heads": 0, "fileio": 0,
    "drafter": 1, "ops": 1,
    "fused": 2, "engine": 2,
    "integrations": 3, "train": 3, "compat": 3, "frontier": 3, "eagle_utils": 3, "spec_utils": 3,
    "commands": 4, "cli": 4, "__main__": 4, "selfcheck": 4, "envinfo": 4, "testing": 4,
}
ROOT_LAYER = 5


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


MODULES = {_module_name(p)[0]: p for p in sorted(SRC.rglob("*.py"))}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return ROOT_LAYER
    if parts[-1] == "bench":
        return 4
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module} is in no layer: add eagle_triton.{parts[1]} to LAYERS in {__file__}")
    return LAYERS[parts[1]]


def imports_of(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, imported module)`` for every import of an ``eagle_triton`` module in ``path`` (or in ``source``,
    read as if it were that file)."""
    module, is_pkg = _module_name(path)
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "eagle_triton"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "eagle_triton":
                continue
            for alias in node.names:  # `from pkg import sub` imports the submodule when there is one
                sub = f"{target}.{alias.name}"
                if sub in MODULES:
                    out.append((node.lineno, sub))
                elif not (target == "eagle_triton" and alias.name == "__version__"):
                    out.append((node.lineno, target))
    return out


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_import(module):
    mine = layer_of(module)
    bad = [f"line {line}: {target} (layer {layer_of(target)})" for line, target in imports_of(MODULES[module])
           if layer_of(target) > mine]
    assert not bad, f"{module} (layer {mine}) imports from a higher layer: {bad}"


def test_subpackages_form_no_cycle():
    def unit(module: str) -> str:
        parts = module.split(".")
        if parts[-1] == "bench":
            return "<bench>"  # the benchmark scripts form their own top-layer unit
        return parts[1] if len(parts) > 1 else "<root>"

    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for _, target in imports_of(path):
            a, b = unit(module), unit(target)
            if a != b:
                graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle between subpackages: " + " -> ".join(trail + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_checker_sees_an_upward_import():
    """The test can fail: an ops module importing the engine is reported."""
    path = SRC / "ops" / "verify" / "op.py"
    found = [t for _, t in imports_of(path, path.read_text() + "\n\ndef f():\n    from ...engine import EagleEngine\n")]
    assert "eagle_triton.engine" in found and layer_of("eagle_triton.engine") > layer_of("eagle_triton.ops.verify.op")
