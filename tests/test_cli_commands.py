"""The CLI's command list, its global options, and ``env`` without a GPU driver."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

from eagle_triton import cli, commands


def test_every_command_module_is_listed():
    modules = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    assert sorted(cli.COMMANDS) == modules
    parser = cli.build_parser()
    assert list(parser._subparsers._group_actions[0].choices) == list(cli.COMMANDS)


def test_a_broken_command_fails_loudly(monkeypatch):
    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name.endswith("commands.bench"):
            raise ImportError("cannot import name 'gone' from 'eagle_triton.engine'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ImportError, match="gone"):
        cli.build_parser()


def test_help_imports_no_model_libraries():
    code = ("import sys; from eagle_triton.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('transformers', 'matplotlib', 'gguf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_env_without_a_driver_says_so_plainly(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU driver is active here")
    from eagle_triton.envinfo import _triton_info

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    info = _triton_info()
    assert info["backend"] is None
    assert "active drivers" not in info["backend_error"] and "TRITON_INTERPRET=1" in info["backend_error"]


@pytest.mark.parametrize("argv", [["generate", "--top-k", "many"], ["bench", "--no-such-option"], ["nope"]])
def test_usage_errors_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "--help" in err[0], err


def test_a_closed_pipe_ends_quietly():
    """`eagle-triton ... | head`: the reader closing stdout is no error of ours (exit 141, nothing on stderr)."""
    import subprocess
    import sys

    code = """
import sys
from eagle_triton import cli

def closed_pipe(args):
    raise BrokenPipeError(32, "Broken pipe")

build = cli.build_parser

def parser_with_a_writer_whose_reader_left():
    parser = build()
    parser.set_defaults(func=closed_pipe, command="generate", debug=False)
    return parser

cli.build_parser = parser_with_a_writer_whose_reader_left
sys.exit(cli.main([]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 141, out.stderr
    assert out.stderr == ""
