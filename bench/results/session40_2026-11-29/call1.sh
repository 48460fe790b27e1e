# session 40 call 1: the 8B fp32 two-row-tile tree tests with the one-pass tail default (not run since session 39
# made it the default), then batch 8 (80 rows) as 64 + 16 in one pass (block_m=64) against one 128-row tile, bf16
export PYTHONPATH=$PWD/src:$PWD/bench
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/fused/test_fused_drafter.py -k "two_row_tiles or two-row-tiles" > $OUT/tailtest.log 2>&1
echo "tailtest rc=$?"; tail -n 15 $OUT/tailtest.log
timeout 140 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights bf16 --name b8_bf16 --out $OUT --tunings "0:0:0:0:0:8,0:0:0:0:0:8+block_m=64,0:0:0:0:0:8,0:0:0:0:0:8+block_m=64" > $OUT/b8_bf16.log 2>&1
grep -h "^tuning\|rror" $OUT/b8_bf16.log | head -10
