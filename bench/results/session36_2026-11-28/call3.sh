# session 36 call 3: the GPU tests of 16-bit trees (RM on int32 keys), then the sweep of the defaults
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 250 python3 -m pytest -q -p no:cacheprovider -rs -s tests/fused/test_fused_drafter.py -k "gpu and (bf16 or graph)" > $OUT/gputest.log 2>&1
tail -3 $OUT/gputest.log
timeout 300 python3 bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b,llama32-1b --trees 60/7/10 --weights bf16,fp8 --batches 1,16 --scenarios decode --no-ref --no-graph --out $OUT/sweep > $OUT/sweep.log 2>&1
grep -v "^compiled" $OUT/sweep.log | tail -20
