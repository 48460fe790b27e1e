# session 37 call 3: the sweep at the new default (FP8: lm_head ranked by warps at every row tile), then bf16 at
# 64-row tiles (8B batch 4, 5) with lm_warp_rank=1 against the default, alternated
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 330 python3 bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b,llama32-1b --trees 60/7/10 --weights bf16,fp8 --batches 1,16 --scenarios decode --no-ref --no-graph --out $OUT/sweep > $OUT/sweep.log 2>&1
grep -v "^compiled" $OUT/sweep.log | tail -20
C="0:0:0:0:0:4"; D="0:0:0:0:0:5"
timeout 120 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights bf16 --name lmw64_bf16 --out $OUT --tunings "$C,$C+lm_warp_rank=1,$D,$D+lm_warp_rank=1,$C,$C+lm_warp_rank=1" > $OUT/lmw64_bf16.log 2>&1
grep -h "^tuning\|Error" $OUT/lmw64_bf16.log
