# session 36 call 1: per-program arrivals at batch 1 (bf16, fp8), the 256-row tile probe at batch 13/16
set -x
export PYTHONPATH=$PWD/src:$PWD/bench
BF="python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10"
$BF --weights bf16 --profile --profile-programs --name prog_bf16 --out $OUT > $OUT/prog_bf16.log 2>&1
$BF --weights fp8 --profile --profile-programs --name prog_fp8 --out $OUT > $OUT/prog_fp8.log 2>&1
export PYTHONPATH=$PWD/.carry/s36/src:$PWD/bench
timeout 240 python3 .carry/s36/bm_check.py > $OUT/bm_check.log 2>&1
N="+block_n=32+block_n_qkv=32+block_n_mlp=32+block_vocab=32"
for w in bf16 fp8; do
  $BF --weights $w --name b16_base_$w --out $OUT --tunings "0:0:0:0:0:16,0:0:0:0:0:13" > $OUT/b16_base_$w.log 2>&1
  BMCAP=256 $BF --weights $w --name b16_bm256_$w --out $OUT --tunings "0:0:0:0:0:16$N,0:0:0:0:0:13$N,0:0:0:0:0:16+block_n=32+block_n_qkv=32+block_n_mlp=32+block_vocab=64" > $OUT/b16_bm256_$w.log 2>&1
  $BF --weights $w --name b16_base2_$w --out $OUT --tunings "0:0:0:0:0:16" > $OUT/b16_base2_$w.log 2>&1
done
grep -h "tuning\|identical" $OUT/*.log
