"""``eagle-triton``: argparse with subcommands discovered from the modules of :mod:`eagle_triton.commands`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

__all__ = ["build_parser", "discover_commands", "main"]


def discover_commands() -> list:
    """Modules of :mod:`eagle_triton.commands` that expose ``register``, in name order. A module that fails to
    import is reported on stderr and skipped, so one broken command does not take the others down."""
    from . import commands

    found = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        except Exception as e:  # a broken optional command must not break the CLI
            print(f"eagle-triton: skipping command module {info.name!r}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if callable(getattr(mod, "register", None)):
            found.append(mod)
    return found


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="eagle-triton",
        description="EAGLE speculative decoding with Triton kernels.",
    )
    parser.add_argument("--version", action="version", version=f"eagle-triton {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in discover_commands():
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``argparse`` usage errors exit with 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
