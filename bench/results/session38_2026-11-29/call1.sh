# session 38 call 1: tail row tile: GPU tests (same bits with and without; small head fp32 trees), then bf16 A/B
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 270 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "tail_row_tile or tail-row-tile" > $OUT/tailtest.log 2>&1
tail -15 $OUT/tailtest.log
t=""; for b in 16 13 16 13; do t+="0:0:0:0:0:$b,0:0:0:0:0:$b+tail_row_tile=1,"; done
t+="0:0:0:0:0:8,0:0:0:0:0:8+block_m=64+tail_row_tile=1"
timeout 230 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights bf16 --name tail_bf16 --out $OUT --tunings "$t" > $OUT/tail_bf16.log 2>&1
grep -h "^tuning\|Error\|rror" $OUT/tail_bf16.log | head -30
