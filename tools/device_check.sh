#!/usr/bin/env bash
# One prepared run on a lent GPU machine: the ODE tests on the accelerator
# and the pendulum benchmark there; with WORK_PRECISION=1 also the
# work-precision study on that machine's CPU, where diffrax is installed.
# Writes logs under $OUT (see benchmarks/results/device_h200.md).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import jax, scipy; print('jax', jax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1
timeout "${TEST_SECONDS:-240}" python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  tests/ode/test_solve_ivp.py tests/ode/test_odeint_errors.py tests/ode/test_no_hang.py > "$OUT/gpu_tests.txt" 2>&1
echo "tests exit $?" >> "$OUT/gpu_tests.txt"
timeout 150 python3 benchmarks/pendulum.py --quick --no-write > "$OUT/gpu_pendulum.txt" 2>&1
echo "pendulum exit $?" >> "$OUT/gpu_pendulum.txt"
if [ "${WORK_PRECISION:-0}" = 1 ]; then
  JAX_PLATFORMS=cpu timeout 150 python3 benchmarks/work_precision.py --quick --out "$OUT/wp" > "$OUT/cpu_work_precision.txt" 2>&1
  echo "work_precision exit $?" >> "$OUT/cpu_work_precision.txt"
fi
