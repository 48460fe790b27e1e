"""A/B of two versions of the library on one machine: the working tree's ``src`` against another version's.

Per-lease differences between GPUs of one model (tens of microseconds on an 8B step, see docs/engine_step.md) are as
large as most levers left, so a change is judged against the previous code on the same machine, run alternately:
round ``i`` runs base then new when ``i`` is even, new then base when odd. Each run is a fresh process with
``PYTHONPATH`` set to that version's ``src`` (and this checkout's ``bench``), and a run that imported another version
than its arm's is rejected (its JSON records the folder it imported).

    git archive <rev> src | tar -x -C /tmp/ab_base      # the base version's package
    python3 bench/ab_libraries.py --base /tmp/ab_base/src --out DIR [--rounds 2] [--what engine,drafter]

``engine``: ``bench_engine.py --parts b`` (the 8B-shape plain decode and speculative step beside their floors);
``drafter``: ``bench_fused_drafter.py --no-sweep --no-ref --no-graph`` per ``--cases`` entry (``shape:weights``, the
fused drafter alone, decode, random head) with the ``--tunings`` (default: batch 1 and 16) on the ``--trees`` tree;
``--profile`` adds a phase profile of each version at the first case, batch 1, before the rounds. Every run's files
go to ``DIR/<what>[_<shape>_<weights>]_<version>_<round>/``; ``DIR/ab.json`` collects the figures per version and
their medians.
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
WHAT = ("engine", "drafter")


def _argv(what: str, case: str | None, args, out: str, profile: bool = False) -> list[str]:
    """The bench script's command line of one run (``case``: the drafter's ``shape:weights``)."""
    if what == "engine":
        return ["bench/bench_engine.py", "--parts", "b", "--trees-8b", args.trees, "--no-drafter-alone", "--out", out]
    shape, weights = case.split(":")
    cmd = ["bench/bench_fused_drafter.py", "--no-sweep", "--no-ref", "--no-graph", "--weights", weights,
           "--tune-case", f"{shape}:{args.trees}", "--out", out]
    return cmd + (["--profile"] if profile else ["--tunings", args.tunings])


def _src(args, version: str) -> Path:
    """The ``src`` folder an arm runs."""
    return Path(args.base).resolve() if version == "base" else ROOT / "src"


def _result(what: str, folder: Path) -> Path:
    """The JSON a run writes into its folder."""
    return folder / ("bench_engine.json" if what == "engine" else "fused_drafter.json")


def _folder(what: str, case: str | None, version: str, i: int | str) -> str:
    return "_".join([what, *(case.split(":") if case else []), version, str(i)])


def plan(args) -> list[tuple[str, str | None, str, int | str, list[str], dict]]:
    """``(what, case, version, round, argv, env)`` of every run, in the order they run (round ``"profile"``: the
    phase profiles before the rounds)."""
    runs = []

    def add(what, case, v, i, profile=False):
        src = _src(args, v)
        out = str(Path(args.out) / _folder(what, case, v, i))
        env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT / 'bench'}")
        runs.append((what, case, v, i, [sys.executable, *_argv(what, case, args, out, profile)], env))

    if args.profile and "drafter" in args.what:
        for v in ("base", "new"):
            add("drafter", args.cases[0], v, "profile", profile=True)
    for i in range(args.rounds):
        order = ("base", "new") if i % 2 == 0 else ("new", "base")
        for what in args.what:
            for case in (args.cases if what == "drafter" else [None]):
                for v in order:
                    add(what, case, v, i)
    return runs


def figures(what: str, folder: Path) -> dict:
    """The figures an A/B compares, read from a run's JSON (empty when the run wrote none)."""
    path = _result(what, folder)
    if not path.exists():
        return {}
    if what == "engine":
        part = json.loads(path.read_text())["parts"]["llama8b"]
        tree = part["trees"][0]
        return {"spec_step_ms": tree["step_ms"], "spec_floor_ms": tree["spec_floor_ms"],
                "plain_ms": part["plain"]["step_ms"], "plain_floor_ms": part["plain"]["floor_ms"]}
    got = {}
    for r in json.loads(path.read_text()).get("rows", []):
        if "fused_ms" in r:  # one figure per timed row: shape, weights, tree, batch and tuning name it
            key = f"{r['shape']}/{r['weights']}/{r['tree']}/b{r['batch']}/{r.get('tuning') or 'default'}"
            got[f"{key}/fused_ms"] = r["fused_ms"]
            got[f"{key}/floor_ms"] = r["floor_ms"]
    return got


def library_ran(what: str, folder: Path) -> str | None:
    """The ``eagle_triton`` folder a run imported, as its JSON records it (None when it wrote none): the engine's
    under ``versions``, the drafter's under ``meta``."""
    path = _result(what, folder)
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    return doc.get("versions" if what == "engine" else "meta", {}).get("library_src")


def _label(what: str, case: str | None, version: str, i: int | str) -> str:
    return f"{what}{f' {case}' if case else ''} {version} {'profile' if i == 'profile' else f'round {i}'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the base version's src folder (holding eagle_triton/)")
    ap.add_argument("--out", required=True, help="a new or empty folder")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--what", default="engine", help="comma-separated: engine, drafter")
    ap.add_argument("--trees", default="60/7/10", help="the tree (the engine's 8B step, the drafter's cases)")
    ap.add_argument("--cases", default="llama31-8b:bf16",
                    help="the drafter's cases: comma-separated shape:weights (bench_fused_drafter's shapes; bf16, fp8)")
    ap.add_argument("--tunings", default="0:0:0:0,0:0:0:0:0:16",
                    help="the drafter's --tunings per case (bench_fused_drafter's format; default batch 1 and 16)")
    ap.add_argument("--profile", action="store_true", help="the drafter: a phase profile of each version first")
    ap.add_argument("--timeout-s", type=float, default=600, help="the longest one run may take")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and stop")
    args = ap.parse_args(argv)
    args.what = [w for w in args.what.split(",") if w]
    args.cases = [c for c in args.cases.split(",") if c]
    if any(c.count(":") != 1 for c in args.cases) or not args.cases:
        ap.error(f"--cases takes shape:weights entries, got {args.cases}")
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
        for what, case, v, i, cmd, env in runs:
            print(f"{_label(what, case, v, i)}: PYTHONPATH={env['PYTHONPATH']} {' '.join(cmd)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {w: {"base": [], "new": []} for w in args.what}
    failed = 0
    for what, case, v, i, cmd, env in runs:
        folder = out / _folder(what, case, v, i)
        try:
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout_s)
            rc, log = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as exc:
            rc, log = 124, f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {args.timeout_s} s\n"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "run.log").write_text(log)
        got = figures(what, folder)
        want = str(_src(args, v).resolve() / "eagle_triton")
        ran = library_ran(what, folder)
        if got and ran != want:  # the run imported another version than its arm's
            print(f"{_label(what, case, v, i)}: ran the library in {ran}, not {want}", flush=True)
            got = {}
        failed |= rc != 0 or not got
        if i != "profile":
            results[what][v].append({"round": i, "rc": rc, **got})
        print(f"{_label(what, case, v, i)}: rc {rc} {got}", flush=True)
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
