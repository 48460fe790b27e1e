# session 41 call 3: FP8 256-deep chunks for fc/o/down (block_k_linear) and lm_head (block_k_vocab) alone, against
# the 128-deep default (the probe: down 74.2 -> 69.2 us, lm_head 81.1 -> 76.2 at one 8-warp program per SM), 8B
# 60/7/10 batch 1 alternated and profiled; then batch 4 and 16 and the other shapes, default against both
export PYTHONPATH=$PWD/src:$PWD/bench
nvidia-smi --query-gpu=name --format=csv,noheader
L=+block_k_linear=256; V=+block_k_vocab=256
timeout 200 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --profile --tune-case llama31-8b:60/7/10 --weights fp8 --name bk_fp8 --out $OUT --tunings "0:0:0:0$L,0:0:0:0$V,0:0:0:0$L$V,0:0:0:0,0:0:0:0$L$V,0:0:0:0$L,0:0:0:0$V" > $OUT/bk_fp8.log 2>&1
echo "bk rc=$?"; grep -h "^tuning\|rror" $OUT/bk_fp8.log | head -20
grep -h "per phase" $OUT/bk_fp8.log | sed 's/, s[2-7]\..*//' | cut -c1-400
timeout 150 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case llama31-8b:60/7/10 --weights fp8 --name bkb_fp8 --out $OUT --tunings "0:0:0:0:0:4,0:0:0:0:0:4$L$V,0:0:0:0:0:16,0:0:0:0:0:16$L$V,0:0:0:0:0:4,0:0:0:0:0:4$L$V,0:0:0:0:0:16,0:0:0:0:0:16$L$V" > $OUT/bkb_fp8.log 2>&1
echo "bkb rc=$?"; grep -h "^tuning\|rror" $OUT/bkb_fp8.log | head -20
for s in qwen3-8b llama33-70b llama32-1b; do
timeout 110 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph --tune-case $s:60/7/10 --weights fp8 --name bks_${s} --out $OUT --tunings "0:0:0:0,0:0:0:0$L$V,0:0:0:0,0:0:0:0$L$V" > $OUT/bks_$s.log 2>&1
echo "bks $s rc=$?"; grep -h "^tuning\|rror" $OUT/bks_$s.log | head -8
done
