# session 38 call 4: the 8B fp32 two-row-tile tests call 3's time cut (32-row tail, FP8 16-row tail, two full tiles)
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 220 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "llama8b_two_row_tiles and (tail-32 or fp8 or full)" > $OUT/gputest4.log 2>&1
grep -h "identical False\|passed\|failed\|SKIP\|Error" $OUT/gputest4.log | tail -12
