# session 34, call 3: the tree-phase tests on the GPU, 1B batch-16 profiles, and base / new / var (new with SEL's
# old top-K loop) alternated at the 1B shape
set -u
R=$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT/c3
PYTHONPATH=$R/src python3 -m pytest -q -p no:cacheprovider -rs tests/fused/test_fused_tree_phase.py > $OUT/c3/tree_phase_tests.log 2>&1
tail -2 $OUT/c3/tree_phase_tests.log
b() { # version tag tunings [extra]
  local v=$1 tag=$2 tun=$3; shift 3
  local src=$R/src; [ $v = base ] && src=$R/.carry/ab_base/src; [ $v = var ] && src=$R/.carry/ab_var/src
  PYTHONPATH=$src:$R/bench timeout 150 python3 bench/bench_fused_drafter.py --no-sweep --no-ref --no-graph \
    --weights bf16 --tune-case llama32-1b:60/7/10 --tunings "$tun" --name "${tag}_$v" --out $OUT/c3 "$@" \
    > $OUT/c3/${tag}_$v.log 2>&1
  grep -E "^tuning" $OUT/c3/${tag}_$v.log | sed "s/^/$tag $v: /"
}
for v in base new; do b $v prof16 "0:0:0:0:0:16" --profile; done
for r in 0 1; do
  if [ $r = 0 ]; then order="base new var"; else order="var new base"; fi
  for v in $order; do b $v ab1b_$r "0:0:0:0,0:0:0:0:0:16"; done
done
