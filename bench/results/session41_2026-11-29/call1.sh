# session 41 call 1: do two programs per SM (4 warps each) hide the FP8 product loop's latency? The probe's products
# at 1 x 8, 2 x 4, 2 x 8 and 1 x 4 (programs per SM x warps), bf16 and FP8, then the fused drafter at 264 programs
# of 4 warps against the default (8B, 60/7/10, batch 1)
export PYTHONPATH=$PWD/src:$PWD/bench
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 bench/probes/fp8_convert.py --out $OUT/probe --modes bf16,fp8-bits --shapes gate,lm_head,bal,down \
  --configs 128:4:8,128:4:4:2,128:4:8:2,128:4:4,256:4:8,256:4:4:2,64:4:4:2 > $OUT/probe.log 2>&1
echo "probe rc=$?"; cat $OUT/probe.log | grep -v "^$" | tail -60
for wt in fp8 bf16; do
timeout 150 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights $wt --name pps_$wt --out $OUT --tunings "0:0:0:0,0:4:0:2,0:0:0:0,0:4:0:2" > $OUT/pps_$wt.log 2>&1
echo "pps $wt rc=$?"; grep -h "^tuning\|rror" $OUT/pps_$wt.log | head -10
done
