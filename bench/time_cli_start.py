"""How long a CLI call takes to start generating: from process start to the engine's first ``generate`` call.

Runs ``eagle-triton generate --prompt hi --max-new-tokens 8`` (or the arguments after ``--``) ``--runs`` times, each
in a fresh interpreter, after one untimed run that builds the default model's cache if needed, and prints (or
writes, with ``--out``) the seconds per run and the load average. Example::

    python bench/time_cli_start.py --runs 3 --out start.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run in the child: time from interpreter start (taken from the process start time) to EagleEngine.generate.
_CHILD = r"""
import os, sys, time
def _since_start():
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
import eagle_triton.engine.engine as E
_orig = E.EagleEngine.generate
def _timed(self, *a, **k):
    print(f"START_S {_since_start():.3f}", file=sys.stderr, flush=True)
    return _orig(self, *a, **k)
E.EagleEngine.generate = _timed
from eagle_triton.cli import main
sys.exit(main(sys.argv[1:]))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("cli_args", nargs="*", help="arguments for eagle-triton (after --)")
    args = p.parse_args(argv)
    cli = args.cli_args or ["generate", "--prompt", "hi", "--max-new-tokens", "8"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-c", _CHILD, *cli]
    subprocess.run(cmd, env=env, check=True, capture_output=True)  # builds the cache on first use
    times = []
    for _ in range(args.runs):
        res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        line = next(x for x in res.stderr.splitlines() if x.startswith("START_S "))
        times.append(float(line.split()[1]))
        print(f"started generating after {times[-1]:.2f} s", file=sys.stderr)
    result = {"command": ["eagle-triton", *cli], "seconds_to_generate": times, "best_s": min(times),
              "load_average": list(os.getloadavg()), "cpu_count": os.cpu_count(),
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
