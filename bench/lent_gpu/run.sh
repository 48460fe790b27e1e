#!/usr/bin/env bash
# FOR THE PROJECT'S LENT-GPU SESSIONS ONLY. Anyone with a GPU of their own runs the wrapped scripts directly:
#   bash bench/gpu_check.sh [--out DIR] [part...]       GPU tests and benchmarks
#   bash scripts/train_smollm2.sh all                   training of the shipped SmolLM2 head
#
# The machine lent to this project's sessions (through the session's device tool) has constraints of its own, and
# this wrapper is the one place that handles them:
# - Python packages missing there travel as wheels in a carried, git-ignored folder; `wheels DIR` installs them into
#   /tmp/site, and every command run through this wrapper has /tmp/site on its PYTHONPATH.
# - A file larger than one call may carry (64 MiB; the SmolLM2 GGUF) travels in parts, one call each, made by
#   ../shared/tools/device_parts.sh FILE .parts/NAME (folders .parts/NAME/p0, p1, ..., the last with FILE.sha256).
#   A part travels with the tracked files (about 42 MB since the round-7 head, 2026-11-27): with PART_BYTES=20000000
#   the GGUF takes five parts, each call under the 64 MiB; 25 MB parts no longer fit.
#   `part DIR` copies this call's part to /tmp/parts; `join FILE` joins them into /tmp/smollm2/FILE and checks the
#   checksum. /tmp survives only while the machine stays warm between calls: make the calls back to back.
#   When /tmp/smollm2 holds the GGUF, the command gets EAGLE_TRITON_SMOLLM2 and TARGET pointing at it.
# - Only 8 files come back from $OUT (16 MiB each, 64 MiB in all, at most 2 folders deep). The command writes into
#   a scratch folder (its OUT); afterwards the scratch folder is packed into $OUT/results.tar.gz, split into
#   15 MiB parts results.tar.gz.part<N> when larger (join with `cat results.tar.gz.part* > results.tar.gz`), and
#   its summary.txt, if any, is copied beside it.
# - The device copy's .git is absent or stale (session 35 found a bench script recording an older HEAD): COMMIT=<sha>
#   in the environment is exported as EAGLE_TRITON_GIT_COMMIT, which every bench script's JSON records instead.
#
# usage: bash bench/lent_gpu/run.sh [step...] [-- command [args...]]
#   steps, run in order:  wheels DIR | part DIR | join FILE
#
# Examples (the device tool's `run`; the folders named must also be named in its `carry`):
#   bash bench/lent_gpu/run.sh -- bash bench/gpu_check.sh fused
#   bash bench/lent_gpu/run.sh wheels .carry/h5 part .parts/h5                    (carry .parts/h5/p0 .carry/h5)
#   bash bench/lent_gpu/run.sh part .parts/h5 join SmolLM2-135M-Instruct.Q4_1.gguf -- bash bench/gpu_check.sh
#                                                                                 (carry .parts/h5/p1)
#   then, machine still warm: bash bench/lent_gpu/run.sh -- bash bench/gpu_check.sh engine acceptance
#
# Training the shipped SmolLM2 head (2026-11-22, H100) went through this plumbing when it still lived inside
# scripts/train_smollm2.sh (commit 0dde3dc): call A fetched part 0 and the gguf wheel; call B fetched part 1, joined,
# and ran `data train1 export` with DATA_BUDGET=270 TRAIN1_BUDGET=170 (15 of 32 data batches, 970 steps); call C,
# machine still warm, ran `train2 export` with NO_DATA_EXPORT=1 TRAIN2_BUDGET=240 (decay to step 2196); then `ship`
# on the returned files. The same calls today:
#   A: bash bench/lent_gpu/run.sh wheels .carry/h5 part .parts/h5
#   B: bash bench/lent_gpu/run.sh part .parts/h5 join SmolLM2-135M-Instruct.Q4_1.gguf -- \
#        env DATA_BUDGET=270 TRAIN1_BUDGET=170 bash scripts/train_smollm2.sh data train1 export
#   C: bash bench/lent_gpu/run.sh -- env NO_DATA_EXPORT=1 TRAIN2_BUDGET=240 bash scripts/train_smollm2.sh train2 export
# A cold machine resumes from what `export` returned (unpacked into .carry/h5/state, carried): A and B's part and
# join steps, then `-- env STATE=.carry/h5/state bash scripts/train_smollm2.sh train2 export bench`.
set -uo pipefail
cd "$(dirname "$0")/../.."
SITE=/tmp/site PARTS=/tmp/parts MODELS=/tmp/smollm2
PART_MB=15

while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    --) break ;;
    wheels)
      dir=${1:?wheels needs a folder}; shift
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$dir"/*.whl || exit 1 ;;
    part)
      dir=${1:?part needs a folder}; shift
      mkdir -p "$PARTS"
      cp "$dir"/p*/* "$PARTS"/ 2>/dev/null || { echo "lent_gpu: no part under $dir/p*/ (carried?)" >&2; exit 1; }
      ls -la "$PARTS" ;;
    join)
      name=${1:?join needs a file name}; shift
      mkdir -p "$MODELS"
      cat "$PARTS/$name".part* > "$MODELS/$name" || exit 1
      echo "$(cat "$PARTS/$name.sha256")  $MODELS/$name" | sha256sum -c - || exit 1 ;;
    *) echo "lent_gpu: unknown step '$step' (steps: wheels DIR, part DIR, join FILE; then -- command)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || exit 0

[ -d "$SITE" ] && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE"
gguf=$(ls "$MODELS"/*.gguf 2>/dev/null | head -n 1)
if [ -n "$gguf" ]; then
  export EAGLE_TRITON_SMOLLM2="$gguf" TARGET="${TARGET:-$gguf}"
fi
export PYTHONUNBUFFERED=1
if [ -n "${COMMIT:-}" ]; then export EAGLE_TRITON_GIT_COMMIT=$COMMIT; fi
RESULTS=${OUT:?lent_gpu: OUT is not set (this wrapper is for the lent device, where OUT is the folder that comes back)}
SCRATCH=$(mktemp -d /tmp/lent_out.XXXX)

OUT="$SCRATCH" "$@"
rc=$?

cd "$SCRATCH" || exit 1
tar -czf "$RESULTS/results.tar.gz" .
size=$(stat -c %s "$RESULTS/results.tar.gz")
[ "$size" -le $((60 * 1024 * 1024)) ] || echo "lent_gpu: WARNING: $size bytes packed, over the 64 MiB that come back" >&2
if [ "$size" -gt $((PART_MB * 1024 * 1024)) ]; then
  split -b "${PART_MB}m" -d -a 1 "$RESULTS/results.tar.gz" "$RESULTS/results.tar.gz.part"
  rm "$RESULTS/results.tar.gz"
fi
[ -f summary.txt ] && cp summary.txt "$RESULTS/summary.txt"
cd / && rm -rf "$SCRATCH"
ls -la "$RESULTS"
exit $rc
