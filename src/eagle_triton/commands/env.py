"""``eagle-triton env``: versions, GPU, Triton back end, interpreter mode, and what is missing."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("env", help="report versions, GPU, Triton back end and missing pieces")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..envinfo import collect_env, format_env

    env = collect_env()
    print(json.dumps(env, indent=2) if args.json else format_env(env))
    return 0
