#!/usr/bin/env bash
# The test command: lint (ruff, rule sets E, F, I, UP, B from pyproject.toml), then the whole suite, kernels under
# Triton's interpreter when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check src tests bench
exec python -m pytest -q -n "${PYTEST_WORKERS:-2}" --durations=15 "$@"
