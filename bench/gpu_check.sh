#!/usr/bin/env bash
# One call on the GPU machine: environment, GPU tests, every benchmark. Results land in $OUT (or bench/results/).
#
#   bash bench/gpu_check.sh [sections...]     sections: env tests kernels fused engine acceptance (default: all)
#
# The SmolLM2 target for `engine`/`acceptance` must be joined first under /tmp/smollm2 (see scripts/device_model.sh).
# Because only 8 files come back from the device, everything is written to a work folder and packed into
# $OUT/gpu_results.tar.gz plus a short summary in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUTDIR="${OUT:-bench/results}"
WORK="$(mktemp -d /tmp/gpu_check.XXXX)"
export EAGLE_TRITON_BENCH_OUT="$WORK"
sections="${*:-env tests kernels fused engine acceptance}"
summary="$WORK/summary.txt"
run() {  # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$WORK/$name.log"
  echo "--- $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$summary"
}
for s in $sections; do
  case $s in
    env)        run env 60 python -m eagle_triton env --json ;;
    tests)      run tests 420 python -m pytest -q -m gpu -x -p no:cacheprovider tests ;;
    kernels)    [ -f bench/bench_kernels.py ] && run kernels 400 python bench/bench_kernels.py --out "$WORK" ;;
    fused)      [ -f bench/bench_fused_drafter.py ] && run fused 400 python bench/bench_fused_drafter.py --out "$WORK" ;;
    engine)     [ -f bench/bench_engine.py ] && run engine 480 python bench/bench_engine.py --out "$WORK" ;;
    acceptance) [ -f bench/bench_acceptance.py ] && run acceptance 480 python bench/bench_acceptance.py --out "$WORK" ;;
    *) echo "unknown section $s" ;;
  esac
done
mkdir -p "$OUTDIR"
tar -czf "$OUTDIR/gpu_results.tar.gz" -C "$WORK" .
cp "$summary" "$OUTDIR/summary.txt"
cat "$summary"
