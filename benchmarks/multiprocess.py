"""Benchmark: the pendulum sweep of examples/ensemble.py over 1, 2 and 4 local processes.

Question: what does spreading one ``odekit.ensemble`` sweep over several
processes (``jax.distributed``, one CPU device each, Gloo collectives) cost
or gain on this machine, per call once compiled and from start to finish?

Each configuration runs ``examples/ensemble.py --quick --side N
[--processes P]`` as a fresh command, ``--runs`` times, and the medians over
those runs are reported of: the warm ``odekit.ensemble`` call (the example's
own median of 3 blocked calls, process 0), its first call (trace, compile,
run), and the wall time of the whole command (Python and JAX start-up,
``jax.distributed.initialize``, compilation, the timing repeats, the plot).
One process is run twice: as it is (one CPU device, so odekit's
single-kernel CPU loop) and with ``ODEKIT_SINGLE_KERNEL=0`` (the ordinary
loop, which is what every process runs once JAX sees several CPU devices).

Run: ``python benchmarks/multiprocess.py [--side N] [--runs R]``; writes
``benchmarks/results/multiprocess.md`` (``--no-write``: print only).
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT = os.path.join(ROOT, "benchmarks", "results", "multiprocess.md")
CONFIGS = [("1 process", 1, {}), ("1 process, ODEKIT_SINGLE_KERNEL=0", 1,
                                   {"ODEKIT_SINGLE_KERNEL": "0"}),
           ("2 processes", 2, {}), ("4 processes", 4, {})]


def run_once(side: int, processes: int, extra_env: dict[str, str]) -> dict[str, float]:
    """One run of the example; returns warm call (s), first call (s) and wall time (s)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(extra_env, JAX_PLATFORMS="cpu")
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, os.path.join(ROOT, "examples", "ensemble.py"), "--quick",
                   "--side", str(side), "--processes", str(processes), "--out", out]
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=900)
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    warm = re.search(r"odekit.ensemble: ([\d.]+) ms", proc.stdout)
    first = re.search(r"first call ([\d.]+) s", proc.stdout)
    return {"warm": float(warm.group(1)) / 1e3, "first": float(first.group(1)), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=64, help="grid side N, N^2 members")
    parser.add_argument("--runs", type=int, default=3, help="fresh runs per configuration")
    parser.add_argument("--no-write", action="store_true", help="print only")
    opts = parser.parse_args()
    rows, runs = [], {}
    for _ in range(opts.runs):   # configurations take turns, so load drifts hit each alike
        for name, processes, env in CONFIGS:
            runs.setdefault(name, []).append(run_once(opts.side, processes, env))
            print(name, runs[name][-1], file=sys.stderr, flush=True)
    n = opts.side ** 2
    for name, _, _ in CONFIGS:
        med = {k: statistics.median(r[k] for r in runs[name]) for k in ("warm", "first", "wall")}
        rows.append(f"| {name} | {1e3 * med['warm']:.0f} | {n / med['warm']:.3g} | "
                    f"{med['first']:.1f} | {med['wall']:.1f} |")
    load = os.getloadavg()
    text = "\n".join([
        "# One ensemble sweep over 1, 2 and 4 local processes (CPU)",
        "",
        f"{n} damped pendulums (`examples/ensemble.py`, dopri5, rtol = atol = 1e-8, "
        f"t in [0, 10]); {os.cpu_count()} CPU cores shared with other jobs (load average "
        f"{load[0]:.1f} at the end); {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}.",
        "",
        f"Command: `python benchmarks/multiprocess.py --side {opts.side} --runs {opts.runs}`, "
        f"which runs `python examples/ensemble.py --quick --side {opts.side} --processes P` "
        f"{opts.runs} times per row (rows taking turns) and reports medians over the runs. "
        "Warm call: the example's median of 3 blocked `odekit.ensemble` calls in process 0; "
        "first call: trace + compile + run; wall: the whole command (start-up, "
        "`jax.distributed.initialize`, compilation, repeats, plot).",
        "",
        "| configuration | warm call (ms) | pendulums/s | first call (s) | wall (s) |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])
    print(text)
    if not opts.no_write:
        with open(RESULT, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
