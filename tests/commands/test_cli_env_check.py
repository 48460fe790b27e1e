"""`eagle-triton env` and `eagle-triton check`."""

import json

from eagle_triton.cli import main


def test_env_json(capsys):
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["packages"]["torch"] and "interpreter" in env["triton"] and "problems" in env
    assert env["triton"]["interpreter"] is True or env["gpu"]["available"]


def test_env_text(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "Triton interpreter:" in out and "GPU:" in out


def test_integration_check(capsys):
    assert main(["check", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 5 and all(r["ok"] for r in results), results
