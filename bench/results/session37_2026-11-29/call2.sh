# session 37 call 2: lm_head ranked by warps by default with FP8 weights at 128-row tiles: GPU tests, then FP8 A/B
# at the other published shapes (batch 16) and at 64-row tiles (8B batch 4, 5), alternated
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "lm_ranked_by_warps or (gpu and fp8)" > $OUT/gputest.log 2>&1
tail -3 $OUT/gputest.log
B="0:0:0:0:0:16"
for shape in qwen3-8b llama33-70b llama32-1b; do
  timeout 150 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case $shape:60/7/10 --weights fp8 --name lmw16_$shape --out $OUT --tunings "$B,$B+lm_warp_rank=0,$B,$B+lm_warp_rank=0" > $OUT/lmw16_$shape.log 2>&1
done
C="0:0:0:0:0:4"; D="0:0:0:0:0:5"
timeout 150 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights fp8 --name lmw64_fp8 --out $OUT --tunings "$C,$C+lm_warp_rank=1,$D,$D+lm_warp_rank=1,$C,$C+lm_warp_rank=1,$D,$D+lm_warp_rank=1" > $OUT/lmw64_fp8.log 2>&1
grep -h "^tuning\|Error" $OUT/lmw*.log
