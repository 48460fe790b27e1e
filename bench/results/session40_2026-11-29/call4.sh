# session 40 call 4: the drafter sweep at the current defaults, 60/5/10, batch 2, 4 and 8, four head shapes, bf16 and FP8

export PYTHONPATH=$PWD/src:$PWD/bench
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 bench/bench_fused_drafter.py --shapes llama31-8b,qwen3-8b,llama33-70b,llama32-1b --trees 60/5/10 --weights bf16,fp8 --batches 2,4,8 --scenarios decode --no-ref --no-graph --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep rc=$?"; grep -v "^ *$" $OUT/sweep.log | tail -n 30
