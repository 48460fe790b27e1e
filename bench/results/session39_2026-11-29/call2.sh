# session 39 call 2: FP8's one-pass choices at the 8B shape (o/down only; all three at 64-wide gate/up tiles), then
# bf16's new default (o, gate/up and down in one pass) against none at the other three shapes, batch 16
export PYTHONPATH=$PWD/src:$PWD/bench
t=""; for r in 1 2; do
  for x in "" "+tail_one_pass=1+block_n_mlp=64" "+tail_one_pass=o/down" "+block_n_mlp=64" "+tail_one_pass=1"; do t+="0:0:0:0:0:16$x,"; done
  for x in "" "+tail_one_pass=1+block_n_mlp=64" "+tail_one_pass=o/down"; do t+="0:0:0:0:0:13$x,"; done
done
timeout 260 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights fp8 --name op_fp8 --out $OUT --tunings "${t%,}" > $OUT/op_fp8.log 2>&1
grep -h "^tuning\|rror" $OUT/op_fp8.log | head -20
for shape in qwen3-8b llama33-70b llama32-1b; do
  timeout 100 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case $shape:60/7/10 --weights bf16 --name op_bf16_$shape --out $OUT --tunings "0:0:0:0:0:16+tail_one_pass=0,0:0:0:0:0:16,0:0:0:0:0:16+tail_one_pass=0,0:0:0:0:0:16" > $OUT/op_bf16_$shape.log 2>&1
  grep -h "^tuning\|rror" $OUT/op_bf16_$shape.log | head -6
done
