# session 41 call 2: where the 264-program, 4-warp FP8 drafter loses its time: phase profiles of the default and
# of 0:4:0:2 (8B, 60/7/10, batch 1, FP8), and the same at 256-deep chunks (the probe's best two-per-SM config)
export PYTHONPATH=$PWD/src:$PWD/bench
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --profile --tune-case llama31-8b:60/7/10 --weights fp8 --name prof_fp8 --out $OUT --tunings "0:4:0:2,256:4:0:2" > $OUT/prof_fp8.log 2>&1
echo "prof rc=$?"; grep -v "^\s*$" $OUT/prof_fp8.log | tail -70
