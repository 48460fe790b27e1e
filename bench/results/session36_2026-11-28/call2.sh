# session 36 call 2: RM on int32 keys, lm_head by ranges, the residual early: A/B at 8B batch 1 (bf16, fp8), then
# batch 16 and the GPU bit-identity test
export PYTHONPATH=$PWD/src:$PWD/bench
BF="python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10"
A="0:0:0:0"
ALL1="$A+rm_select=1+lm_ranges=1+res_early=1"
ALL2="$A+rm_select=2+lm_ranges=1+res_early=1"
T="$A,$A+res_early=1,$A+lm_ranges=1,$A+rm_select=1,$A+rm_select=2,$ALL1,$ALL2,$A,$A+res_early=1,$A+lm_ranges=1,$A+rm_select=1,$A+rm_select=2,$ALL1,$ALL2,$A"
for w in bf16 fp8; do
  $BF --weights $w --name opts_$w --out $OUT --tunings "$T" > $OUT/opts_$w.log 2>&1
done
B="0:0:0:0:0:16"
$BF --weights bf16 --name opts16_bf16 --out $OUT --tunings "$B,$B+lm_ranges=1,$B+rm_select=1,$B+rm_select=2,$B,$B+lm_ranges=1,$B+rm_select=1,$B+rm_select=2" > $OUT/opts16_bf16.log 2>&1
$BF --weights bf16 --name prof_all1 --out $OUT --profile --tunings "$ALL1" > $OUT/prof_all1.log 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "session_36 and gpu" > $OUT/gputest.log 2>&1
grep -h "^tuning\|passed\|failed\|Error" $OUT/*.log
