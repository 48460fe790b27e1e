"""bench/results/headline.json: the figures the README quotes, each traced to a committed result file.

Checks the schema, that every figure is its source file's number (rounded), that ratio = value / floor (or
baseline), and that the README prints the same figures: every cell of its result tables and every quoted snippet.
"""

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADLINE = ROOT / "bench" / "results" / "headline.json"
README = ROOT / "README.md"
REQUIRED = {"name": str, "value": (int, float, str), "unit": str, "device": str, "date": str, "commit": str,
            "source": str}
# the README tables whose every numeric cell must be a headline figure, found by a column they alone have: the drafter
# table, the engine table (the issue-18 one, bench/engine_table.py, or the older one), the 8B step table (optional)
RESULT_TABLE_COLUMNS = ("fused persistent kernel", "speculative tok/s", "step ms", "break-even accepted length")
REQUIRED_TABLES = (("fused persistent kernel",), ("speculative tok/s", "step ms"))


def _entries() -> list[dict]:
    return json.loads(HEADLINE.read_text())["entries"]


def _decimals(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def _resolve(doc, path):
    """Follow a source_path: keys and list indices, or {field: value} filters that must match one list item."""
    for step in path:
        if isinstance(step, dict):
            hits = [item for item in doc if all(item.get(k) == v for k, v in step.items())]
            assert len(hits) == 1, f"filter {step} matches {len(hits)} items"
            doc = hits[0]
        else:
            doc = doc[step]
    return doc


def _readme_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of the README as (header, rows), cells stripped."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


def _number(cell: str) -> str | None:
    """The number a result cell prints ('**2.51 ms**' -> '2.51', '1.28x' -> '1.28'), None for other cells."""
    m = re.fullmatch(r"\**\s*([0-9]+(?:\.[0-9]+)?)\s*(?:ms|x)?\s*\**", cell)
    return m.group(1) if m else None


def _close(stored: float, printed: str, stored_decimals: int = 3) -> bool:
    """printed is stored (or the value stored rounds from) at the printed precision."""
    return abs(stored - float(printed)) <= 0.5 * 10 ** -_decimals(printed) + 0.5 * 10**-stored_decimals + 1e-9


def test_schema_and_unique_names():
    entries = _entries()
    assert entries, "headline.json has no entries"
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), "duplicate names"
    for e in entries:
        for key, kind in REQUIRED.items():
            assert isinstance(e.get(key), kind), f"{e.get('name')}: {key} missing or not {kind}"
        assert re.fullmatch(r"[a-z0-9_]+", e["name"]), e["name"]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", e["date"]), e["name"]
        assert re.fullmatch(r"[0-9a-f]{7,40}", e["commit"]), e["name"]
        refs = [k for k in ("floor", "baseline") if k in e]
        assert len(refs) <= 1, f"{e['name']}: floor and baseline"
        assert ("ratio" in e) == bool(refs), f"{e['name']}: ratio goes with a floor or a baseline"
        assert e["readme"], f"{e['name']}: where does the README print it?"


def test_the_fused_drafter_and_engine_figures_are_there():
    names = {e["name"] for e in _entries()}
    for name in ("draft_8b_60_7_10_b1", "smollm2_plain_tok_s", "smollm2_spec_tok_s", "smollm2_spec_speedup",
                 "smollm2_best_tree", "spec_step_8b_60_7_10", "drafter_in_step_8b", "projected_8b_tok_s_tau6",
                 "fp8_tau_ratio", "safeailab_8b_topk_call_patched"):
        assert name in names


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_figure_is_its_source_files_number(entry):
    source = ROOT / entry["source"]
    assert source.is_file(), f"{entry['source']} does not exist"
    doc = json.loads(source.read_text())
    for key in ("value", "floor", "baseline"):
        if key in entry:
            raw = _resolve(doc, entry["source_path" if key == "value" else f"{key}_source_path"])
            if isinstance(entry[key], str):  # a name, e.g. the best tree: copied as is
                assert entry[key] == raw, f"{key} {entry[key]!r} is not {raw!r}"
                continue
            nd = _decimals(repr(float(entry[key])))
            assert entry[key] == round(raw, nd), f"{key} {entry[key]} is not {raw} rounded"


@pytest.mark.parametrize("entry", [e for e in _entries() if "ratio" in e], ids=lambda e: e["name"])
def test_ratio_is_value_over_floor_or_baseline(entry):
    ref = entry.get("floor", entry.get("baseline"))
    # value and ref are rounded copies (the ratio comes from the unrounded numbers): allow their rounding
    half_units = [0.5 * 10 ** -_decimals(repr(float(x))) for x in (entry["value"], ref)]
    slack = entry["ratio"] * (half_units[0] / entry["value"] + half_units[1] / ref) + 0.5e-3
    assert math.isclose(entry["ratio"], entry["value"] / ref, abs_tol=slack)


def test_readme_prints_the_headline_figures():
    text = README.read_text()
    flat = " ".join(text.split())
    tables = _readme_tables(text)
    for e in _entries():
        for where in e["readme"]:
            field = where.get("field", "value")
            stored = e[field]
            if "text" in where:
                assert where["text"] in flat, f"{e['name']}: README no longer says {where['text']!r}"
                assert where["printed"] in where["text"]
                if isinstance(stored, str):
                    assert stored == where["printed"], f"{e['name']}: {stored!r} vs {where['printed']!r}"
                    continue
                assert _close(stored, where["printed"]), f"{e['name']}: {field} {stored} vs {where['printed']}"
                continue
            cells = []
            for header, rows in tables:
                if where["column"] in header:
                    col = header.index(where["column"])
                    cells += [r[col] for r in rows if r[: len(where["row"])] == where["row"]]
            assert len(cells) == 1, f"{e['name']}: README row {where['row']} / {where['column']!r} not found once"
            printed = _number(cells[0])
            assert printed is not None and _close(stored, printed), f"{e['name']}: {field} {stored} vs {cells[0]!r}"


def test_every_result_table_cell_is_a_headline_figure():
    covered = {(tuple(w["row"]), w["column"]) for e in _entries() for w in e["readme"] if "row" in w}
    tables = [t for t in _readme_tables(README.read_text()) if any(c in t[0] for c in RESULT_TABLE_COLUMNS)]
    for required in REQUIRED_TABLES:
        assert any(c in t[0] for t in tables for c in required), f"no README result table with a column {required}"
    for header, rows in tables:
        nkey = 3 if "floor" in header else 2  # (tree, scenario, batch) or (dtype, drafter)
        for row in rows:
            for col, cell in enumerate(row[nkey:], start=nkey):
                if _number(cell) is not None:
                    assert (tuple(row[:nkey]), header[col]) in covered, f"README cell {row[:nkey]} / {header[col]}"


def test_result_files_cited_by_the_docs_and_code_exist():
    """A `bench/results/...` path quoted in the README, the docs, the bench notes or src/ names a committed file or
    folder (a glob must match one); removed files are cited as `git show <commit>:bench/results/...`."""
    cited = re.compile(r"(?<![0-9a-f]:)bench/results/[A-Za-z0-9_.*/-]*")
    files = [README, *ROOT.glob("docs/*.md"), *ROOT.glob("bench/**/*.md"), *ROOT.glob("src/**/*.py"),
             *ROOT.glob("src/**/*.md")]
    missing = []
    for f in files:
        for path in cited.findall(f.read_text()):
            path = path.rstrip(".,")
            if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert not missing, missing
