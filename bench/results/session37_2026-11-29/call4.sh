# session 37 call 4: bf16 lm_head ranked by warps at 64-row tiles by default: GPU bit-identity test (batch 5 and 13,
# bf16 and FP8), then bf16 batch 4 / 6 A/B against the in-loop merge at other shapes, alternated
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 230 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "lm_ranked_by_warps" > $OUT/gputest.log 2>&1
tail -3 $OUT/gputest.log
for c in qwen3-8b:4 llama32-1b:4 llama31-8b:6; do
  s=${c%:*}; b=${c#*:}; B="0:0:0:0:0:$b"
  timeout 80 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case $s:60/7/10 --weights bf16 --name lmw64_bf16_${s}_b$b --out $OUT --tunings "$B,$B+lm_warp_rank=0,$B,$B+lm_warp_rank=0" > $OUT/lmw64_${s}.log 2>&1
done
grep -h "^tuning\|Error" $OUT/lmw64_*.log
