"""Subcommands of ``eagle-triton``: every module here exposing ``register(subparsers)`` is one subcommand.

``register`` adds its parser with ``subparsers.add_parser(name, help=...)`` and sets ``func`` with
``parser.set_defaults(func=run)``; ``run(args) -> int`` is the exit code. Keep heavy imports inside ``run`` so
that ``eagle-triton --help`` stays fast.
"""
