# session 38 call 3: tail row tile on by default: FP8 A/B (batch 16 / 13, alternated), the sweep at the new default,
# then the GPU tests of two row tiles (8B fp32 trees against the reference with margins; small head schedules)
export PYTHONPATH=$PWD/src:$PWD/bench
t=""; for b in 16 13 16 13; do t+="0:0:0:0:0:$b+tail_row_tile=0,0:0:0:0:0:$b,"; done
timeout 120 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights fp8 --name tail_fp8 --out $OUT --tunings "${t%,}" > $OUT/tail_fp8.log 2>&1
grep -h "^tuning\|rror" $OUT/tail_fp8.log | head -12
timeout 285 python3 bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b,llama32-1b --trees 60/7/10 --weights bf16,fp8 --batches 1,16 --scenarios decode --no-ref --no-graph --out $OUT/sweep > $OUT/sweep.log 2>&1
grep -v "^compiled" $OUT/sweep.log | tail -20
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "two_row_tiles or two-row-tiles" > $OUT/gputest.log 2>&1
grep -h "tree differs\|tail\|passed\|failed\|SKIP" $OUT/gputest.log | tail -25
