# session 36 call 5: lm_head keys ranked by warps after the loop at 128-row tiles (batch 8 and 16), alternated
export PYTHONPATH=$PWD/src:$PWD/bench
B="0:0:0:0:0:16"; C="0:0:0:0:0:8"
for w in bf16 fp8; do
python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights $w --name lmw_$w --out $OUT --tunings "$B,$B+lm_warp_rank=1,$B,$B+lm_warp_rank=1,$C,$C+lm_warp_rank=1,$C" > $OUT/lmw_$w.log 2>&1
done
grep -h "^tuning" $OUT/*.log
