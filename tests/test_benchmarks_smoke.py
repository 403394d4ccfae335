"""Smoke tests: the pendulum benchmark (the README's main job) and the
work-precision benchmark run in quick mode, print their tables with a number
in every measured cell, and write their markdown and PNG files (into a
temporary folder via ``--out``). They run in a subprocess so that their JAX
settings, caches and warnings stay out of the test session. The DAE
benchmark's inputs (its NumPy residuals for IDA, the consistent slopes) are
checked in CI; its quick run is a long test.

Whether a performance target is met is the benchmark's verdict, written in
its result file; a smoke test does not assert it either way (a check that
accepts both "yes" and "NO" cannot fail, and one that demands "yes" would fail
on a busy machine)."""
import importlib
import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import odekit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "pendulum.py")

HEADER = ["solver", "method", "rtol=atol", "forward (us)", "vs jax.ode", "first call (s)",
          "gradient (ms)", "vmap 64 (ms)", "steps", "nfev", "max abs error"]
# The quick mode measures the first tolerance only (1.4e-8; the full run adds
# 1e-6): each tolerance is the same code with another number, and each costs
# ~20 compilations.
QUICK_TOLERANCES = ("1.4e-08",)
ROWS = {(solver, tol) for solver in ("odekit.odeint", "jax.experimental.ode", "scipy odeint",
                                     "odekit.odeint, ODEKIT_SINGLE_KERNEL=0",
                                     "odekit.solve_ivp (t_eval)")
        for tol in QUICK_TOLERANCES}
# Columns that must hold a finite number for JAX rows; SciPy has only the
# forward time, steps, nfev and error.
JAX_NUMERIC = HEADER[3:]
SCIPY_NUMERIC = ["forward (us)", "vs jax.ode", "steps", "nfev", "max abs error"]
# The solve_ivp row is there for its first call: no gradient or vmap column.
IVP_NUMERIC = ["forward (us)", "vs jax.ode", "first call (s)", "steps", "nfev", "max abs error"]


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


def _check_written(tmp_path, name, stdout):
    """``name``.md holds the printed report; ``name``.png is a real image."""
    with open(tmp_path / f"{name}.md") as fh:
        assert fh.read().strip() == stdout.split("\nwrote ")[0].strip()
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_pendulum_benchmark_quick(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tables = _tables(proc.stdout)
    # results, targets, targets without the single kernel, solve_ivp's first call
    assert len(tables) == 4, proc.stdout

    header, *rows = tables[0]
    assert header == HEADER
    assert {(row[0], row[2]) for row in rows} == ROWS and len(rows) == len(ROWS)
    for row in rows:
        cells = dict(zip(header, row))
        numeric = {"scipy odeint": SCIPY_NUMERIC,
                   "odekit.solve_ivp (t_eval)": IVP_NUMERIC}.get(cells["solver"], JAX_NUMERIC)
        for column in numeric:
            assert _finite(cells[column]), (column, row)
        assert float(cells["forward (us)"]) > 0 and int(cells["nfev"]) > 0

    ivp_header, *ivp_rows = tables[3]
    assert ivp_header[:4] == ["rtol=atol", "solve_ivp (s)", "odeint (s)", "ratio"]
    assert len(ivp_rows) == len(QUICK_TOLERANCES) and all(_finite(row[3]) for row in ivp_rows)

    for ratio_header, *ratio_rows in tables[1:3]:
        assert ratio_header[0] == "quantity" and ratio_header[-2:] == ["target", "met"]
        quantities = {(row[0], row[1]) for row in ratio_rows}
        assert quantities == {(q, tol) for q in ("forward", "gradient", "first call", "vmap",
                                                 "error") for tol in QUICK_TOLERANCES}
        for row in ratio_rows:
            assert _finite(row[4]) and float(row[4]) > 0, row  # the measured ratio

    _check_written(tmp_path, "pendulum", proc.stdout)


# --------------------------------------------------------------------------
# benchmarks/work_precision.py

WP_SCRIPT = os.path.join(ROOT, "benchmarks", "work_precision.py")
WP_HEADER = ["solver", "method", "rtol", "max abs error", "time (ms)", "nfev", "steps"]
WP_PROBLEMS = ("pendulum", "lotka_volterra", "detest_d3")
WP_CURVES = {("odekit", m) for m in ("bosh3", "dopri5", "tsit5", "dopri8")} | {
    ("jax.experimental.ode", "dopri5"), ("scipy", "RK45"), ("scipy", "DOP853")}
if importlib.util.find_spec("diffrax") is not None:
    WP_CURVES |= {("diffrax", m) for m in ("Tsit5", "Dopri5", "Dopri8")}
WP_QUICK_RTOLS = {"1e-04", "1e-08"}


def _load_work_precision():
    spec = importlib.util.spec_from_file_location("work_precision", WP_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratios_at_equal_error():
    """Log-log interpolation along the other curve; a point more accurate than
    the whole curve is compared with its most accurate point, a less accurate
    one is left out."""
    ratios = _load_work_precision().ratios_at_equal_error
    curve = [(1e-2, 100.0), (1e-6, 10000.0)]  # cost = error^(-1/2)
    np.testing.assert_allclose(ratios([(1e-4, 500.0)], curve), [0.5])
    np.testing.assert_allclose(ratios([(1e-8, 5000.0)], curve), [0.5])
    assert ratios([(1e-1, 1.0)], curve) == [] and ratios([(1e-4, 1.0)], []) == []


def _check_wp_results(name, table):
    header, *rows = table
    assert header == WP_HEADER, name
    assert {(r[0], r[1], r[2]) for r in rows} == {
        (s, m, tol) for s, m in WP_CURVES for tol in WP_QUICK_RTOLS}, name
    assert len(rows) == len(WP_CURVES) * len(WP_QUICK_RTOLS), name
    for row in rows:
        cells = dict(zip(header, row))
        assert float(cells["max abs error"]) < 1.0 and float(cells["time (ms)"]) > 0, row
        counted = cells["solver"] == "scipy" or (cells["solver"] == "odekit"
                                                 and hasattr(odekit, "solve_ivp"))
        if counted:
            assert int(cells["nfev"]) > 0, row
        else:
            assert cells["nfev"] == "n/a", row


def _check_wp_targets(table):
    """One row per (problem, target) with the ratio measured where the curves overlap."""
    header, *rows = table
    assert header[:3] == ["problem", "odekit method", "target (at equal error)"]
    assert len(rows) == 4 * len(WP_PROBLEMS)
    for row in rows:
        cells = dict(zip(header, row))
        if "nfev" in cells["target (at equal error)"] and not hasattr(odekit, "solve_ivp"):
            assert cells["points"] == "0", row
            continue
        assert int(cells["points"]) > 0, row  # both quick tolerances overlap the other curve
        assert _finite(cells["worst ratio"]) and float(cells["worst ratio"]) > 0, row


@pytest.mark.long   # 30-40 s on CI's machine; the pendulum benchmark's smoke run stays in CI
def test_work_precision_benchmark_quick(tmp_path):
    proc = subprocess.run([sys.executable, WP_SCRIPT, "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tables = _tables(proc.stdout)
    assert len(tables) == len(WP_PROBLEMS) + 1, proc.stdout  # one per problem, targets
    for name, table in zip(WP_PROBLEMS, tables):
        assert f"## {name}" in proc.stdout
        _check_wp_results(name, table)
    _check_wp_targets(tables[-1])
    _check_written(tmp_path, "work_precision", proc.stdout)


# benchmarks/dae.py

DAE_SCRIPT = os.path.join(ROOT, "benchmarks", "dae.py")


def test_dae_benchmark_numpy_fields_and_slopes():
    """The NumPy residuals IDA gets equal odekit's fields, and the consistent
    y'(t0) it is given satisfies M y' = f and the algebraic equations'
    derivative (the cheap part of the benchmark, in this process)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        dae = importlib.import_module("dae")
    finally:
        sys.path.pop(0)
    dae.check_numpy_fields()
    if importlib.util.find_spec("pydiffsol") is not None:    # an anchor, not a dependency
        dae.check_diffsl_models()
    for name in dae.PROBLEM_NAMES:
        p = dae.DAE_PROBLEMS[name]
        slope = dae.consistent_slope(p)
        f0 = p.numpy_fun(p.t_span[0], np.asarray(p.y0), *p.args)
        np.testing.assert_allclose(p.mass_matrix @ slope, f0, atol=1e-14)


@pytest.mark.long       # about a minute: first calls and IDA's second a solve
def test_dae_benchmark_quick(tmp_path):
    proc = subprocess.run([sys.executable, DAE_SCRIPT, "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _tables(proc.stdout)[-1]
    header, body = rows[0], rows[1:]
    assert {r[header.index("solver")] for r in body} >= {"odekit rodas5p", "odekit bdf"}
    for row in body:
        if not row[header.index("solver")].startswith("odekit") and \
                row[header.index("time (ms)")].startswith("failed:"):
            continue            # an anchor's failure is a row of the table (diffsol)
        assert float(row[header.index("error / tol")]) < 10, row
        assert _finite(row[header.index("time (ms)")]), row
    assert os.path.exists(tmp_path / "dae.md")
