# session 38 call 2: where the tail tile's outputs part from the launch without it
export PYTHONPATH=$PWD/src:$PWD/bench
timeout 400 python3 .carry/s38/diag.py small fp8 fp8lmw0 fp8skl0 2>&1 | tee $OUT/diag.log | grep -v Warning | tail -60
