# session 39 call 4: the sweep at the new default (bf16: o, gate/up and down take the tail in one pass), then the
# Qwen3-8B and 70B batch-16 A/B that call 2's 100 s limit cut (a first launch there compiles for ~30 s)
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 290 python3 bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b,llama32-1b --trees 60/7/10 --weights bf16,fp8 --batches 1,16 --scenarios decode --no-ref --no-graph --out $OUT/sweep > $OUT/sweep.log 2>&1
grep -v "^compiled" $OUT/sweep.log | tail -20
for shape in qwen3-8b llama33-70b; do
  timeout 120 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case $shape:60/7/10 --weights bf16 --name op_bf16_$shape --out $OUT --tunings "0:0:0:0:0:16+tail_one_pass=0,0:0:0:0:0:16" > $OUT/op_bf16_$shape.log 2>&1
  grep -h "^tuning\|rror" $OUT/op_bf16_$shape.log | head -6
done
