"""``eagle-triton check``: the integration check (kernels, drafters and engine against their references)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="run the integration check: kernels, drafters, engine vs references")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"  # must be set before any kernel is defined: hence the subprocess
    proc = subprocess.run([sys.executable, "-m", "eagle_triton.selfcheck"], env=env, capture_output=True, text=True)
    try:
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        print(proc.stdout + proc.stderr, file=sys.stderr)
        print("eagle-triton check: the check process failed to report", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        mode = "GPU" if torch.cuda.is_available() else "CPU, Triton interpreter"
        print(f"eagle-triton integration check ({mode})")
        for r in results:
            print(f"  {'PASS' if r['ok'] else 'FAIL'}  {r['check']:<48} {r['seconds']:>6.2f}s"
                  + ("" if r["ok"] else f"\n        {r['error']}"))
        failed = sum(not r["ok"] for r in results)
        print(f"{len(results) - failed} passed, {failed} failed")
    return 0 if all(r["ok"] for r in results) else 1
