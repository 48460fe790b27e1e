"""A/B of two versions of the library on one machine: the working tree's ``src`` against another version's.

Per-lease differences between GPUs of one model (tens of microseconds on an 8B step, see docs/engine_step.md) are as
large as most levers left, so a change is judged against the previous code on the same machine, run alternately:
round ``i`` runs base then new when ``i`` is even, new then base when odd. Each run is a fresh process with
``PYTHONPATH`` set to that version's ``src`` (and this checkout's ``bench``).

    git archive <rev> src | tar -x -C /tmp/ab_base      # the base version's package
    python3 bench/ab_libraries.py --base /tmp/ab_base/src --out DIR [--rounds 2] [--what engine,drafter]

``engine``: ``bench_engine.py --parts b`` (the 8B-shape plain decode and speculative step beside their floors);
``drafter``: ``bench_fused_drafter.py --quick --no-sweep --profile`` (the fused drafter at 8B, 60/7/10). Every run's
files go to ``DIR/<what>_<version>_<round>/``; ``DIR/ab.json`` collects the figures per version and their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHAT = {
    "engine": lambda a, out: ["bench/bench_engine.py", "--parts", "b", "--trees-8b", a.trees, "--no-drafter-alone",
                              "--out", out],
    "drafter": lambda a, out: ["bench/bench_fused_drafter.py", "--quick", "--no-sweep", "--profile", "--no-ref",
                               "--no-graph", "--out", out],
}


def plan(args) -> list[tuple[str, str, int, list[str], dict]]:
    """``(what, version, round, argv, env)`` of every run, in the order they run."""
    runs = []
    for i in range(args.rounds):
        order = ("base", "new") if i % 2 == 0 else ("new", "base")
        for what in args.what:
            for v in order:
                src = Path(args.base).resolve() if v == "base" else ROOT / "src"
                out = str(Path(args.out) / f"{what}_{v}_{i}")
                env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT / 'bench'}")
                runs.append((what, v, i, [sys.executable, *WHAT[what](args, out)], env))
    return runs


def figures(what: str, folder: Path) -> dict:
    """The figures an A/B compares, read from a run's JSON (empty when the run wrote none)."""
    if what == "engine":
        path = folder / "bench_engine.json"
        if not path.exists():
            return {}
        part = json.loads(path.read_text())["parts"]["llama8b"]
        tree = part["trees"][0]
        return {"spec_step_ms": tree["step_ms"], "spec_floor_ms": tree["spec_floor_ms"],
                "plain_ms": part["plain"]["step_ms"], "plain_floor_ms": part["plain"]["floor_ms"]}
    path = folder / "fused_drafter.json"
    if not path.exists():
        return {}
    rows = [r for r in json.loads(path.read_text()).get("rows", []) if "fused_ms" in r]
    return {"fused_ms": rows[0]["fused_ms"], "floor_ms": rows[0]["floor_ms"]} if rows else {}


def library_ran(what: str, folder: Path) -> str | None:
    """The ``eagle_triton`` folder a run imported, as its JSON records it (None when it wrote none)."""
    path = folder / ("bench_engine.json" if what == "engine" else "fused_drafter.json")
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    return (doc.get("versions", {}) if what == "engine" else doc).get("library_src")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the base version's src folder (holding eagle_triton/)")
    ap.add_argument("--out", required=True, help="a new or empty folder")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--what", default="engine", help="comma-separated: engine, drafter")
    ap.add_argument("--trees", default="60/7/10", help="the engine's 8B tree")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and stop")
    args = ap.parse_args(argv)
    args.what = [w for w in args.what.split(",") if w]
    unknown = sorted(set(args.what) - set(WHAT))
    if unknown or not args.what:
        ap.error(f"--what takes {sorted(WHAT)}, got {args.what}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not (Path(args.base) / "eagle_triton" / "__init__.py").is_file():
        ap.error(f"--base {args.base} holds no eagle_triton package (give the src folder of a version)")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {out} is not empty; name a new or empty folder")
    runs = plan(args)
    if args.dry_run:
        for what, v, i, cmd, env in runs:
            print(f"{what} {v} round {i}: PYTHONPATH={env['PYTHONPATH']} {' '.join(cmd)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {w: {"base": [], "new": []} for w in args.what}
    failed = 0
    for what, v, i, cmd, env in runs:
        folder = out / f"{what}_{v}_{i}"
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "run.log").write_text(r.stdout + r.stderr)
        got = figures(what, folder)
        want = str((Path(args.base) if v == "base" else ROOT / "src").resolve() / "eagle_triton")
        ran = library_ran(what, folder)
        if got and ran != want:  # the run imported another version than its arm's
            print(f"{what} {v} round {i}: ran the library in {ran}, not {want}", flush=True)
            got = {}
        failed |= r.returncode != 0 or not got
        results[what][v].append({"round": i, "rc": r.returncode, **got})
        print(f"{what} {v} round {i}: rc {r.returncode} {got}", flush=True)
    summary = {"base": str(Path(args.base).resolve()), "rounds": args.rounds, "results": results, "medians": {}}
    for what, by_version in results.items():
        med = {}
        for v, rows in by_version.items():
            keys = {k for row in rows for k in row if k not in ("round", "rc")}
            med[v] = {k: statistics.median(row[k] for row in rows if k in row) for k in sorted(keys)}
        summary["medians"][what] = med
        print(f"{what} medians: {json.dumps(med)}")
    (out / "ab.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
