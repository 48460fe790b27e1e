#!/usr/bin/env bash
# One script for the GPU: environment, GPU tests, every benchmark. Results land in $OUT (or bench/results/).
#
#   bash bench/gpu_check.sh [sections...]
#   sections: env tests fusedtest kernels engine acceptance fused        (default: all, in that order)
#             profile drafters  (not in the default: fused drafter phase breakdown + tunings; drafter parity)
# FUSED_ARGS=" " runs the full fused-drafter sweep instead of --quick; TUNINGS, FUSED_K, DRAFTERS pick variants.
#
# `engine` and `acceptance` need the SmolLM2 GGUF: on the lent device it travels in two parts, joined by
# `bash scripts/train_smollm2.sh fetch-part join` (see that script); EAGLE_TRITON_SMOLLM2 points the engine at it.
# Each section has a time limit (seconds, override with LIMIT_<SECTION>=...) so that a call fits the device's
# 10 minutes. Only 8 files come back from the device, so everything is packed into $OUT/gpu_results.tar.gz, with a
# short summary in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
[ -f /tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] && export EAGLE_TRITON_SMOLLM2=/tmp/smollm2
OUTDIR="${OUT:-bench/results}"
WORK="$(mktemp -d /tmp/gpu_check.XXXX)"
sections="${*:-env tests fusedtest kernels engine acceptance fused}"
summary="$WORK/summary.txt"
PY=python3
run() {  # name, default limit (s), command...
  local name=$1 limit=$2; shift 2
  local var="LIMIT_${name^^}"; limit=${!var:-$limit}
  echo "=== $name (limit ${limit}s): $*" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  tail -n 20 "$WORK/$name.log"
  echo "--- $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$summary"
}
for s in $sections; do
  case $s in
    env)        run env 60 $PY -m eagle_triton env --json ;;
    tests)      run tests 200 $PY -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops tests/engine ;;
    fusedtest)  run fusedtest 300 $PY -m pytest -q -m gpu -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py \
                  -k "${FUSED_K:-gpu}" ;;
    kernels)    run kernels 240 $PY bench/bench_kernels.py --out "$WORK" --budget-s 200 ;;
    engine)     run engine 180 $PY bench/bench_engine.py --num-prompts 20 --max-new-tokens 128 --time-budget 150 \
                  --out "$WORK" ;;
    acceptance) run acceptance 220 $PY bench/bench_acceptance.py --trees "${TREES:-60/7/10,32/5/6}" \
                  --datasets mtbench,humaneval --budget-s 90 --out "$WORK" ;;
    profile)    run profile 420 $PY bench/bench_fused_drafter.py --quick --no-sweep --profile \
                  --tunings "${TUNINGS:-512:4:3:1,256:8:3:1,128:4:3:2}" --out "$WORK" ;;
    drafters)   run drafters 240 $PY bench/check_drafters_gpu.py --backends "${DRAFTERS:-graph,triton}" --out "$WORK" ;;
    fused)      run fused 200 $PY bench/bench_fused_drafter.py ${FUSED_ARGS:---quick} --out "$WORK" ;;
    *) echo "unknown section $s" ;;
  esac
done
mkdir -p "$OUTDIR"
tar -czf "$OUTDIR/gpu_results.tar.gz" -C "$WORK" .
cp "$summary" "$OUTDIR/summary.txt"
cat "$summary"
