#!/usr/bin/env bash
# The test command: the whole suite, kernels under Triton's interpreter when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q -n "${PYTEST_WORKERS:-2}" --durations=15 "$@"
