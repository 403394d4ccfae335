"""Smoke test: the pendulum benchmark (the README's main job) runs and prints
its tables. It runs in a subprocess in quick mode so that its JAX settings,
caches and warnings stay out of the test session."""
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "pendulum.py")

HEADER = ["solver", "method", "rtol=atol", "forward (us)", "vs jax.ode", "first call (s)",
          "gradient (ms)", "vmap 64 (ms)", "steps", "nfev", "max abs error"]
ROWS = {(solver, tol) for solver in ("odekit.odeint", "jax.experimental.ode", "scipy odeint",
                                     "odekit.odeint, ODEKIT_SINGLE_KERNEL=0")
        for tol in ("1.4e-08", "1e-06")}
# Columns that must hold a finite number for JAX rows; SciPy has only the
# forward time, steps, nfev and error.
JAX_NUMERIC = HEADER[3:]
SCIPY_NUMERIC = ["forward (us)", "vs jax.ode", "steps", "nfev", "max abs error"]


def _tables(text):
    """Every markdown table in ``text`` as a list of rows of stripped cells."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif current:
            tables.append([row for row in current if set("".join(row)) != {"-"}])
            current = []
    return tables


def _finite(cell):
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def test_pendulum_benchmark_quick():
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--no-write"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tables = _tables(proc.stdout)
    assert len(tables) == 3, proc.stdout  # results, targets, targets without the single kernel

    header, *rows = tables[0]
    assert header == HEADER
    assert {(row[0], row[2]) for row in rows} == ROWS and len(rows) == len(ROWS)
    for row in rows:
        cells = dict(zip(header, row))
        numeric = SCIPY_NUMERIC if cells["solver"] == "scipy odeint" else JAX_NUMERIC
        for column in numeric:
            assert _finite(cells[column]), (column, row)
        assert float(cells["forward (us)"]) > 0 and int(cells["nfev"]) > 0

    for ratio_header, *ratio_rows in tables[1:]:
        assert ratio_header[0] == "quantity" and ratio_header[-2:] == ["target", "met"]
        quantities = {(row[0], row[1]) for row in ratio_rows}
        assert quantities == {(q, tol) for q in ("forward", "gradient", "first call", "vmap",
                                                 "error") for tol in ("1.4e-08", "1e-06")}
        for row in ratio_rows:
            assert _finite(row[4]) and row[-1] in ("yes", "NO"), row
