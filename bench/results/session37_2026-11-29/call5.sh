# session 37 call 5: FP8 batch 16 with warps-ranked lm_head keys: vocabulary tiles 64 / 256 wide against 128, alternated
export PYTHONPATH=$PWD/src:$PWD/bench
B="0:0:0:0:0:16"
timeout 170 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights fp8 --name bv16_fp8 --out $OUT --tunings "$B,$B+block_vocab=64,$B+block_vocab=256,$B,$B+block_vocab=64,$B+block_vocab=256" > $OUT/bv16_fp8.log 2>&1
grep -h "^tuning\|Error\|failures" $OUT/bv16_fp8.log
