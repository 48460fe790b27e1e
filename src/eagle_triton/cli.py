"""``eagle-triton``: argparse with one subcommand per module listed in :data:`COMMANDS`.

Failures end as one line on stderr, ``eagle-triton <command>: error: <problem and fix>``, never a traceback
(``--debug`` shows it): exit 2 for bad input (:class:`UsageError`, ``ValueError`` and missing files), 1 for
anything unexpected, 130 for Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["COMMANDS", "DefaultsHelpFormatter", "UsageError", "build_parser", "main"]

# The subcommands, in the order ``--help`` lists them: modules of eagle_triton.commands exposing ``register``.
# An explicit list (not discovery): a command that fails to import breaks the CLI loudly instead of vanishing.
COMMANDS = ("generate", "bench", "train", "check", "env")


class UsageError(ValueError):
    """Bad input from the command line: reported as one ``error:`` line, exit 2."""


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already speaks of its default or there is
    none to show (``None``, a flag's ``False``)."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or any(default is x for x in (None, False, argparse.SUPPRESS)) \
                or not action.option_strings:
            return text
        if isinstance(default, (list, tuple)):
            default = ",".join(str(x) for x in default)
        return f"{text} (default: {default})"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line too (the usage itself is one ``--help`` away); subparsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="eagle-triton",
        description="EAGLE speculative decoding with Triton kernels.",
    )
    parser.add_argument("--version", action="version", version=f"eagle-triton {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback when a command fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.commands.{name}").register(sub)
    for p in sub.choices.values():  # also accepted after the command; SUPPRESS keeps a --debug given before it
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback when the command fails")
    return parser


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _is_bad_input(e: BaseException) -> bool:
    """Errors that describe the user's input (paths, values, models that do not fit), not a bug."""
    return isinstance(e, (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``argparse`` usage errors exit with 2)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as given (bench records it)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    prog = f"eagle-triton {args.command}"
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`eagle-triton generate | head`): not an error of ours. Point stdout at devnull so
        # the interpreter's final flush does not raise again, and exit like a process killed by SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as e:
        if args.debug:
            raise
        if _is_bad_input(e):
            print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
            return 2
        print(f"{prog}: error: {type(e).__name__}: {_one_line(e)} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
