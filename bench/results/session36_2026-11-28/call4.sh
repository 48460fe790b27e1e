# session 36 call 4: the hidden half early with RM on int32 keys (8B, batch 1), alternated
export PYTHONPATH=$PWD/src:$PWD/bench
A="0:0:0:0"
for w in bf16 fp8; do
python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights $w --name hq_$w --out $OUT --tunings "$A,$A+hidden_half_early=0,$A,$A+hidden_half_early=0,$A" > $OUT/hq_$w.log 2>&1
done
grep -h "^tuning" $OUT/*.log
