# session 39 call 3: call 2's Qwen3-8B and 70B batch-16 launches with tail_one_pass stopped (no output for ~50 s):
# each product alone, one process each, with a time limit
export PYTHONPATH=$PWD/src:$PWD/bench
for a in "qwen3-8b 0" "qwen3-8b o" "qwen3-8b down" "qwen3-8b gate_up" "llama33-70b o"; do
  echo "== $a"; timeout 60 python3 .carry/s39/probe.py $a 2>&1 | grep -v Warn | tail -6; echo "rc $?"
done 2>&1 | tee $OUT/probe.log
