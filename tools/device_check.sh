#!/usr/bin/env bash
# One prepared run on a lent GPU machine, in one go (issue 33, item 3):
#   1. the million-pendulum ensemble: examples/ensemble.py --side 1024
#      (1,048,576 members in one odekit.ensemble call; warm time, first
#      call, and a plain jit(vmap) beside it);
#   2. the large stiff benchmark in quick mode: benchmarks/large_stiff.py --quick;
#   3. the pendulum benchmark in quick mode: benchmarks/pendulum.py --quick;
#   4. the ODE tests on the accelerator;
#   with WORK_PRECISION=1 also the work-precision study on that machine's
#   CPU, where diffrax is installed.
# Logs (and the figures/tables the scripts write) go under $OUT: env.txt,
# gpu_ensemble.txt (+ ensemble/), gpu_large_stiff.txt (+ large_stiff/),
# gpu_pendulum.txt, gpu_tests.txt, each ending in "<step> exit <code>" (124:
# stopped by its time limit). Each step has its own limit and the whole
# script stops starting steps at TOTAL_SECONDS (default 520 s, under the
# 10-minute limit of one device command); see benchmarks/results/device_h200.md.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOTAL=${TOTAL_SECONDS:-520}
START=$SECONDS

# step NAME LIMIT LOG COMMAND...: run COMMAND with at most LIMIT seconds (less
# if the total budget has less left), stdout+stderr to LOG, then its exit code.
step() {
  local name=$1 limit=$2 log=$3; shift 3
  local left=$(( TOTAL - (SECONDS - START) ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then
    echo "$name skipped: the script's ${TOTAL} s were spent" >> "$log"
    return
  fi
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1
  echo "$name exit $? (limit ${limit} s, at $(( SECONDS - START )) s)" >> "$log"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import jax, scipy; print('jax', jax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1

step ensemble "${ENSEMBLE_SECONDS:-150}" "$OUT/gpu_ensemble.txt" \
  python3 examples/ensemble.py --quick --side "${ENSEMBLE_SIDE:-1024}" --out "$OUT/ensemble"
step large_stiff "${LARGE_STIFF_SECONDS:-150}" "$OUT/gpu_large_stiff.txt" \
  python3 benchmarks/large_stiff.py --quick --out "$OUT/large_stiff"
step pendulum "${PENDULUM_SECONDS:-60}" "$OUT/gpu_pendulum.txt" \
  python3 benchmarks/pendulum.py --quick --no-write
step tests "${TEST_SECONDS:-150}" "$OUT/gpu_tests.txt" \
  python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  tests/ode/test_solve_ivp.py tests/ode/test_odeint_errors.py tests/ode/test_no_hang.py
if [ "${WORK_PRECISION:-0}" = 1 ]; then
  JAX_PLATFORMS=cpu step work_precision 150 "$OUT/cpu_work_precision.txt" \
    python3 benchmarks/work_precision.py --quick --out "$OUT/wp"
fi
echo "device_check done in $(( SECONDS - START )) s" >> "$OUT/env.txt"
