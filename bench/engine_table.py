"""The README's engine tables, printed from a ``bench_engine.json`` (``python bench/engine_table.py FILE``).

Each table cell that prints a figure is described once, here: its JSON path, its precision and its headline name.
``bench/make_headline.py`` turns the same descriptions into headline entries, so the README's table (pasted from this
script's output) and ``headline.json`` cannot disagree; ``tests/bench/test_headline.py`` checks both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_headline import resolve  # noqa: E402  (one path walker for the table and the headline entries)

SHORT = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
TAUS = (3, 4, 5, 6)
SMOLLM2_HEADER = ["dtype", "tree", "tok/s", "speedup", "mean accepted length", "identical output", "step ms",
                  "prefill ms"]
LLAMA8B_HEADER = ["step", "tree", "ms", "floor ms", "vs floor", "draft ms in step", "drafter alone ms",
                  "break-even accepted length", *(f"projected tok/s, τ={t}" for t in TAUS)]
HF_ROW = "transformers `generate`"


def _fmt(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def _tk(tree: str) -> str:
    return tree.replace("/", "_")


class Table:
    """A markdown table being built: rows of printed cells, and the figures (headline entry descriptions) behind
    them. A figure: ``name``, ``unit``, ``path``, ``decimals``, ``readme`` (where it is printed), and optionally
    ``ref_kind``/``ref_path`` (floor or baseline), ``note``, ``projection``."""

    def __init__(self, doc: dict, header: list[str], nkey: int = 2):
        self.doc, self.header, self.nkey = doc, header, nkey
        self.rows: list[list[str]] = []
        self.figures: list[dict] = []

    def row(self, key: list[str]) -> None:
        """Start a row with its first cells (the rest filled by :meth:`figure`)."""
        self.rows.append(list(key) + [""] * (len(self.header) - len(key)))

    def figure(self, key: list[str], column: str, name: str, unit: str, path: list, decimals: int, *,
               suffix: str = "", ref: tuple | None = None, ratio_column: str | None = None, note: str | None = None,
               projection: bool = False) -> None:
        """Print the number at ``path`` in ``column`` of the last row; ``ref``: (kind, path, column or None)."""
        value = resolve(self.doc, path)
        self.set(column, _fmt(value, decimals) + suffix)
        fig = {"name": name, "unit": unit, "path": path, "decimals": decimals,
               "readme": [{"row": key, "column": column, "field": "value"}]}
        if ref is not None:
            kind, ref_path, ref_column = ref
            fig.update(ref_kind=kind, ref_path=ref_path)
            if ref_column is not None:
                self.set(ref_column, _fmt(resolve(self.doc, ref_path), decimals))
                fig["readme"].append({"row": key, "column": ref_column, "field": kind})
            if ratio_column is not None:
                self.set(ratio_column, _fmt(value / resolve(self.doc, ref_path), 2) + "x")
                fig["readme"].append({"row": key, "column": ratio_column, "field": "ratio"})
        if note:
            fig["note"] = note
        if projection:
            fig["projection"] = True
        self.figures.append(fig)

    def set(self, column: str, text: str) -> None:
        """Print ``text`` (not a figure) in ``column`` of the last row."""
        self.rows[-1][self.header.index(column)] = text

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)


def smollm2_table(doc: dict) -> tuple[Table, list[tuple[str, dict]]]:
    """The SmolLM2 table (plain, every tree, transformers' generate) and its caption: (table, [(sentence,
    figure)]), each caption figure printed in its sentence."""
    part = doc["parts"]["smollm2"]
    base = ["parts", "smollm2", "runs"]
    t = Table(doc, SMOLLM2_HEADER)
    best_dtype, best_tree = part.get("best_tree_dtype"), part.get("best_tree")
    hf = doc["parts"].get("hf_generate")
    for run in part["runs"]:
        dt, short = run["dtype"], SHORT.get(run["dtype"], run["dtype"])
        rp = base + [{"dtype": dt}]
        if "plain" not in run:
            t.row([short, "not measured"])
            continue
        key = [short, "plain"]
        t.row(key)
        stem = f"engine_smollm2_{short}_plain"
        # issue 18's name for our plain decoding (the speed-ups' baseline) is the best tree's dtype's plain row
        t.figure(key, "tok/s", "smollm2_plain_tok_s" if dt == best_dtype else f"{stem}_tok_s", "tok/s",
                 rp + ["plain", "tokens_per_second"], 1)
        t.figure(key, "step ms", f"{stem}_step_ms", "ms", rp + ["plain", "step_ms"], 3)
        t.figure(key, "prefill ms", f"{stem}_prefill_ms", "ms", rp + ["plain", "prefill_ms"], 2)
        for tr in run["trees"]:
            tree = tr["tree"]
            named = dt == best_dtype and tree == best_tree
            key = [short, tree + (" (best)" if tree == run.get("best_tree") else "")]
            if tr.get("skipped"):
                t.row([short, tree, f"not measured ({tr['skipped']})"])
                continue
            t.row(key)
            tp = rp + ["trees", {"tree": tree}]
            stem = f"engine_smollm2_{short}_{_tk(tree)}"
            t.figure(key, "tok/s", "smollm2_spec_tok_s" if named else f"{stem}_spec_tok_s", "tok/s",
                     tp + ["speculative_tokens_per_second"], 1,
                     ref=("baseline", rp + ["plain", "tokens_per_second"], None), ratio_column="speedup",
                     note=None if not named else f"the best tree ({tree}, {short}); baseline: our plain decoding")
            t.figure(key, "mean accepted length", f"{stem}_accepted_length", "tokens per step",
                     tp + ["mean_accepted_length"], 2)
            t.set("identical output", f"{tr['identical_prompts']}/{tr['prompts']}")
            t.figure(key, "step ms", f"{stem}_step_ms", "ms", tp + ["step_ms"], 3)
            t.figure(key, "prefill ms", f"{stem}_prefill_ms", "ms", tp + ["prefill_ms"], 2)
        if hf and hf.get("dtype") == dt and "tokens_per_second" in hf:
            key = [short, HF_ROW]
            t.row(key)
            t.figure(key, "tok/s", f"hf_generate_smollm2_{short}_tok_s", "tok/s",
                     ["parts", "hf_generate", "tokens_per_second"], 1, note=hf.get("cache"))
    caption = []
    if best_tree is not None:
        short = SHORT.get(best_dtype, best_dtype)
        bp = base + [{"dtype": best_dtype}, "trees", {"tree": best_tree}]
        sentence = f"Best tree ({short}, by speculative tok/s): {best_tree}"
        caption.append((sentence + ".", {
            "name": "smollm2_best_tree", "unit": "tree (total/depth/top-k)", "path": ["parts", "smollm2", "best_tree"],
            "decimals": None, "readme": [{"text": sentence, "printed": best_tree}]}))
        speedup = resolve(doc, bp + ["speedup"])
        sentence = f"{_fmt(speedup, 2)}x our plain decoding"
        caption.append((f"It runs at {sentence}.", {
            "name": "smollm2_spec_speedup", "unit": "x (speculative / plain tok/s)", "path": bp + ["speedup"],
            "decimals": 2, "readme": [{"text": sentence, "printed": _fmt(speedup, 2)}]}))
    return t, caption


def llama8b_table(doc: dict) -> tuple[Table, str]:
    """The Llama-3.1-8B-shape step table (plain and speculative ms per step beside their floors, break-even
    accepted length, projected tok/s) and its caption."""
    part = doc["parts"]["llama8b"]
    base = ["parts", "llama8b"]
    t = Table(doc, LLAMA8B_HEADER)
    if "plain" in part:
        key = ["plain", "—"]
        t.row(key)
        t.figure(key, "ms", "plain_step_8b", "ms", base + ["plain", "step_ms"], 2,
                 ref=("floor", base + ["target_floor_ms"], "floor ms"), ratio_column="vs floor")
    for tr in part.get("trees", []):
        tree = tr["tree"]
        key = ["speculative", tree]
        if tr.get("skipped"):
            t.row([*key, f"not measured ({tr['skipped']})"])
            continue
        t.row(key)
        tp = base + ["trees", {"tree": tree}]
        main = tree == "60/7/10"
        stem = "_8b" if main else f"_8b_{_tk(tree)}"
        t.figure(key, "ms", f"spec_step_8b_{_tk(tree)}", "ms", tp + ["step_ms"], 2,
                 ref=("floor", tp + ["spec_floor_ms"], "floor ms"), ratio_column="vs floor",
                 note="floor: the target's weights once plus the drafter's floor, at the copy bandwidth of the run")
        if tr.get("draft_ms_per_step") is not None:
            t.figure(key, "draft ms in step", f"drafter_in_step{stem}", "ms", tp + ["draft_ms_per_step"], 2,
                     note=tr.get("draft_timing"))
        if tr.get("drafter_alone_ms") is not None:
            t.figure(key, "drafter alone ms", f"drafter_alone{stem}", "ms", tp + ["drafter_alone_ms"], 2)
        t.figure(key, "break-even accepted length", f"break_even_accepted_length{stem}", "tokens per step",
                 tp + ["break_even_accepted_length"], 2)
        for tau in TAUS:
            t.figure(key, f"projected tok/s, τ={tau}",
                     f"projected_8b_tok_s_tau{tau}" if main else f"projected_8b_{_tk(tree)}_tok_s_tau{tau}",
                     "tok/s (projection)", tp + ["projection", "tokens_per_second", str(tau)], 1,
                     note="a projection, not a measurement: accepted length tau / the measured speculative step "
                          "time (random weights accept about 1 token per step)", projection=True)
    bw = part.get("copy_bandwidth_B_per_s")
    caption = (f"Llama-3.1-8B shape, random weights, bf16, batch 1, {part.get('prompt_tokens')}-token prompt; floors: "
               f"bytes / the copy bandwidth of the same run ({bw / 1e12:.2f} TB/s); projected tok/s = accepted "
               "length τ / the measured speculative step (a projection: random weights accept about one token per "
               "step)." if bw else "")
    return t, caption


def render(doc: dict) -> str:
    """The README block(s) for every part the JSON holds."""
    out = []
    parts = doc.get("parts", {})
    if "smollm2" in parts:
        t, caption = smollm2_table(doc)
        out += [t.markdown(), "", " ".join(s for s, _ in caption)]
    if "llama8b" in parts:
        t, caption = llama8b_table(doc)
        out += ["", t.markdown(), "", caption]
    return "\n".join(out).strip() + "\n"


def figures(doc: dict) -> list[dict]:
    """Every figure the README block prints (headline entry descriptions, see :class:`Table`)."""
    out = []
    parts = doc.get("parts", {})
    if "smollm2" in parts:
        t, caption = smollm2_table(doc)
        out += t.figures + [f for _, f in caption]
    if "llama8b" in parts:
        out += llama8b_table(doc)[0].figures
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Print the README's engine tables from a bench_engine.json.")
    p.add_argument("json", type=Path, help="bench_engine.json (written by bench/bench_engine.py)")
    args = p.parse_args(argv)
    doc = json.loads(args.json.read_text())
    if doc.get("benchmark") != "bench_engine" or "parts" not in doc:
        p.error(f"{args.json} is not a bench_engine.json with parts (written by bench/bench_engine.py)")
    sys.stdout.write(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
