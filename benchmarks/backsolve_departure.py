"""Benchmark: how far does backsolve's re-integrated y depart from the forward solution?

Question: the continuous ("backsolve") adjoint re-integrates y backwards and
fails with ``BACKSOLVE_UNSTABLE`` when, at some output time, its y departs
from the stored forward value by more than ``DEPARTURE_LIMIT`` times the
tolerance (per leaf ``max |y_back - y| / (atol + rtol max(max |y|, max
|y_from|))``, see :mod:`odekit.ode.adjoints.backsolve`). Where do well-behaved
problems sit, and where do the known failures of issue 14 sit, so that the
limit separates them? And how wrong is the gradient at a given departure?

Rows: every non-stiff problem of the registry (``odekit.testing.problems``:
PROBLEMS, and the DETEST set) with every explicit method at five tolerance
pairs, on the problem's output times and on the two-point span [t0, t_end];
the largest departure of each problem over all of those. Then the three
failures of issue 14: y' = [[-k, 1], [0, -10]] y on [0, 20] at rtol = 1e-10,
atol = 1e-14 (gradient w.r.t. k); the same with the matrix as the parameter
at the default tolerances; [[-1000, 999], [0, -1]] at T = 0.05. Between the
two, a sweep that ties the departure to the gradient's error: y' = [[-1, 1],
[0, -lam]] y, y0 = [1, 1] on [0, 20] (dopri5), d sum(y(20)) / dk at k = 1
against its closed form, for lam from 0.5 (the second mode decays slower
than the first) to 10 (the failure above). Last, the two DETEST problems
with large departures, where the gradient error decides whether a flag is
right: Van der Pol (E2; d sum(y(20)) / d(y0, mu) against the checkpoint
adjoint at rtol = atol = 1e-13, dopri8) and the decay chain (C1, with its
field scaled by a rate k; d (w . y(20)) / d(y0, k), w_i = cos i, against the
matrix exponential).

Run: ``python benchmarks/backsolve_departure.py`` (several minutes: one
compilation per row); writes ``benchmarks/results/backsolve_departure.md``
and ``.png``.
"""
from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from odekit.ode.adjoints import backsolve as ab  # noqa: E402
from odekit.ode.engine.loop import LoopConfig  # noqa: E402
from odekit.ode.methods import EXPLICIT_METHODS  # noqa: E402
from odekit.ode.engine.solve import SolveOptions  # noqa: E402
from odekit.testing.problems import DETEST, PROBLEMS  # noqa: E402

TOLERANCES = ((1e-3, 1e-6), (1e-6, 1e-9), (1.4e-8, 1.4e-8), (1e-10, 1e-12), (1e-12, 1e-14))
ODEINT_TOL = (1.4e-8, 1.4e-8)


@partial(jax.jit, static_argnums=(0, 1, 2))
def departure(func, method, tol, y0, t, args):
    """(departure, backward status, forward status) of the gradient of sum(y(t))."""
    options = SolveOptions(method, LoopConfig(*tol), single_kernel=True)
    sol = ab.solve(func, None, options, y0, t[0], t[-1], t, jnp.zeros((), t.dtype), *args)
    g = jax.tree.map(jnp.ones_like, sol.ys_eval)
    out = ab._adjoint_one_pass(func, options, sol.ys_eval, t, g, sol.h, *args)
    return out[4], out[3], sol.status


def registry_rows(problems, methods, tolerances):
    rows = []
    for p in problems:
        y0 = jax.tree.map(jnp.asarray, p.y0)
        args = tuple(jnp.asarray(a) for a in p.args)
        full = jnp.asarray(p.t)
        for grid, t in (("outputs", full), ("two-point", full[jnp.array([0, -1])])):
            for method in methods:
                for tol in tolerances:
                    d, status, fwd = map(np.asarray, departure(p.func, method, tol, y0, t, args))
                    rows.append((p.name, grid, method, tol, float(d), int(status), int(fwd)))
                    print(f"{p.name:22s} {grid:9s} {method:6s} {tol} {float(d):9.3g} {int(status)}",
                          flush=True)
    return rows


DETEST_METHODS = ("bosh3", "dopri5")


@partial(jax.jit, static_argnums=(0, 1, 2))
def _gradient(func, method, tol, y0, t, w, args):
    """Backsolve's gradient of w . y(t[-1]) w.r.t. (y0, args), flattened, the
    departure and the backward status."""
    options = SolveOptions(method, LoopConfig(*tol), single_kernel=True)
    sol = ab.solve(func, None, options, y0, t[0], t[-1], t, jnp.zeros((), t.dtype), *args)
    g = jnp.zeros_like(sol.ys_eval).at[-1].set(w)
    a0, _, args_bar, status, d = ab._adjoint_one_pass(func, options, sol.ys_eval, t, g, sol.h,
                                                       *args)
    return jnp.concatenate([a0] + [jnp.ravel(b) for b in args_bar]), d, status


def detest_gradient_rows():
    import scipy.linalg
    import odekit
    from odekit.testing.problems import get_problem
    t = jnp.array([0.0, 20.0])
    vdp = get_problem("detest_e2")
    vdp_y0, mu = jnp.asarray(vdp.y0), jnp.asarray(1.0)
    loss = lambda y0, mu: odekit.odeint(vdp.func, y0, t, mu, rtol=1e-13, atol=1e-13,
                                        method="dopri8",
                                        adjoint=odekit.Checkpoint(max_steps=100_000))[-1].sum()
    vdp_ref = np.concatenate([np.ravel(g) for g in jax.grad(loss, (0, 1))(vdp_y0, mu)])
    chain = get_problem("detest_c1")
    a = np.diag(-np.ones(10)) + np.diag(np.ones(9), -1)
    a[9, 9] = 0.0
    w, c1_y0 = np.cos(np.arange(10.0)), np.eye(10)[0]
    expm = scipy.linalg.expm(20.0 * a)
    c1_ref = np.concatenate([expm.T @ w, [w @ (20.0 * a @ expm @ c1_y0)]])
    cases = [("detest_e2 (Van der Pol)", vdp.func, vdp_y0, jnp.ones(2), (mu,), vdp_ref),
             ("detest_c1 (decay chain, rate k)", lambda y, t, k: k * chain.func(y, t),
              jnp.asarray(c1_y0), jnp.asarray(w), (jnp.asarray(1.0),), c1_ref)]
    rows = []
    for name, func, y0, weights, args, ref in cases:
        for method in DETEST_METHODS:
            for tol in TOLERANCES:
                grad, d, status = _gradient(func, method, tol, y0, t, weights, args)
                error = float(np.max(np.abs(np.asarray(grad) - ref)) / np.max(np.abs(ref)))
                rows.append((name, method, tol, float(d), error, int(status)))
                print(f"{name} {method} {tol} departure={float(d):9.3g} gradient error={error:9.3g}",
                      flush=True)
    return rows


def failure_rows():
    linear = lambda y, t, A: A @ y
    kinetic = lambda y, t, k: jnp.stack([-k * y[0] + y[1], -10.0 * y[1]])
    cases = [
        ("[[-k, 1], [0, -10]], k = 1, T = 20 (d/dk)", kinetic, jnp.asarray(1.0), 20.0, (1e-10, 1e-14)),
        ("[[-1, 1], [0, -10]], T = 20 (d/dA)", linear, jnp.array([[-1.0, 1.0], [0.0, -10.0]]), 20.0,
         ODEINT_TOL),
        ("[[-1000, 999], [0, -1]], T = 0.05 (d/dA)", linear,
         jnp.array([[-1000.0, 999.0], [0.0, -1.0]]), 0.05, ODEINT_TOL),
    ]
    rows = []
    for name, func, arg, end, tol in cases:
        d, status, fwd = map(np.asarray, departure(func, "dopri5", tol, jnp.ones(2),
                                                   jnp.array([0.0, end]), (arg,)))
        rows.append((name, float(d), int(status)))
        print(f"{name:45s} {float(d):9.3g} {int(status)}", flush=True)
    return rows


SWEEP_RATES = (0.5, 1.5, 2.0, 3.0, 5.0, 10.0)
SWEEP_TOLERANCES = ((1e-3, 1e-6), (1e-6, 1e-9), (1.4e-8, 1.4e-8), (1e-10, 1e-14))


def _sweep_truth(lam: float, end: float = 20.0) -> float:
    """d/dk of sum(y(end)) at k = 1 for y' = [[-k, 1], [0, -lam]] y, y0 = [1, 1]:
    sum = e^{-k T} (1 + 1/(lam - k)) + e^{-lam T} (1 - 1/(lam - k))."""
    k, d = 1.0, lam - 1.0
    return (-end * np.exp(-k * end) * (1 + 1 / d) + np.exp(-k * end) / d**2
            - np.exp(-lam * end) / d**2)


@partial(jax.jit, static_argnums=(0,))
def _sweep_one(tol, lam):
    kinetic = lambda y, t, k, lam: jnp.stack([-k * y[0] + y[1], -lam * y[1]])
    options = SolveOptions("dopri5", LoopConfig(*tol), single_kernel=True)
    t, k = jnp.array([0.0, 20.0]), jnp.asarray(1.0)
    sol = ab.solve(kinetic, None, options, jnp.ones(2), t[0], t[-1], t, jnp.zeros(()), k, lam)
    out = ab._adjoint_one_pass(kinetic, options, sol.ys_eval, t, jnp.ones_like(sol.ys_eval),
                               sol.h, k, lam)
    return out[2][0], out[4]


def sweep_rows():
    rows = []
    for tol in SWEEP_TOLERANCES:
        for lam in SWEEP_RATES:
            grad, d = map(float, _sweep_one(tol, jnp.asarray(lam)))
            error = abs(grad - _sweep_truth(lam)) / abs(_sweep_truth(lam))
            rows.append((tol, lam, d, error))
            print(f"sweep {tol} lam={lam:4} departure={d:9.3g} gradient error={error:9.3g}",
                  flush=True)
    return rows


def table(rows, failures, sweep, detest) -> str:
    lines = [f"`DEPARTURE_LIMIT` = {ab.DEPARTURE_LIMIT:g} (a departure above it fails with "
             "BACKSOLVE_UNSTABLE).", "",
             "Largest departure of each registry problem over the explicit methods "
             f"({', '.join(sorted(EXPLICIT_METHODS))}), the tolerances "
             f"(rtol, atol) in {', '.join(str(t) for t in TOLERANCES)}, and both grids "
             "(the problem's output times, the two-point span):", "",
             "| problem | set | largest departure | at (grid, method, rtol, atol) | "
             "median departure | solves flagged |", "| --- | --- | --- | --- | --- | --- |"]
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name and r[6] >= 0]
        worst = max(mine, key=lambda r: r[4])
        flagged = sum(r[4] > ab.DEPARTURE_LIMIT for r in mine)
        where = f"{worst[1]}, {worst[2]}, {worst[3][0]:g}, {worst[3][1]:g}"
        group = "PROBLEMS" if name in PROBLEMS else "DETEST"
        lines.append(f"| {name} | {group} | {worst[4]:.3g} | {where} | "
                     f"{np.median([r[4] for r in mine]):.3g} | {flagged} of {len(mine)} |")
    lines += ["", "Largest departure by method and tolerance (PROBLEMS, both grids):",
              "", "| method | " + " | ".join(f"{r:g}, {a:g}" for r, a in TOLERANCES) + " |",
              "| --- |" + " --- |" * len(TOLERANCES)]
    for method in sorted(EXPLICIT_METHODS):
        cells = [max((r[4] for r in rows if r[2] == method and r[3] == tol and r[0] in PROBLEMS),
                     default=np.nan) for tol in TOLERANCES]
        lines.append(f"| {method} | " + " | ".join(f"{c:.3g}" for c in cells) + " |")
    lines += ["", "The failures of issue 14 (dopri5, two-point span):", "",
              "| case | departure | status |", "| --- | --- | --- |"]
    lines += [f"| {name} | {d:.3g} | {s} |" for name, d, s in failures]
    lines += ["", "Sweep: y' = [[-1, 1], [0, -lam]] y on [0, 20], dopri5; departure / "
              "relative error of d sum(y(20)) / dk (closed form); **bold**: flagged:", "",
              "| lam | " + " | ".join(f"rtol {r:g}, atol {a:g}" for r, a in SWEEP_TOLERANCES)
              + " |", "| --- |" + " --- |" * len(SWEEP_TOLERANCES)]
    for lam in SWEEP_RATES:
        cells = []
        for tol in SWEEP_TOLERANCES:
            (_, _, d, error), = [r for r in sweep if r[0] == tol and r[1] == lam]
            cell = f"{d:.2g} / {error:.2g}"
            cells.append(f"**{cell}**" if d > ab.DEPARTURE_LIMIT else cell)
        lines.append(f"| {lam:g} | " + " | ".join(cells) + " |")
    lines += ["", "DETEST problems with large departures, two-point span [0, 20]: departure / "
              "relative error of backsolve's gradient; **bold**: flagged:", "",
              "| problem | method | " + " | ".join(f"{r:g}, {a:g}" for r, a in TOLERANCES) + " |",
              "| --- | --- |" + " --- |" * len(TOLERANCES)]
    for name in dict.fromkeys(r[0] for r in detest):
        for method in DETEST_METHODS:
            cells = []
            for tol in TOLERANCES:
                (_, _, _, d, error, status), = [r for r in detest if r[:3] == (name, method, tol)]
                cell = f"{d:.2g} / {error:.2g}"
                if status < 0 and status != -10:
                    cell = f"backward solve failed (status {status}), raises anyway"
                cells.append(f"**{cell}**" if d > ab.DEPARTURE_LIMIT else cell)
            lines.append(f"| {name} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows, failures, sweep, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, method in enumerate(sorted(EXPLICIT_METHODS)):
        mine = [r for r in rows if r[2] == method and r[6] >= 0]
        x = np.array([r[3][0] for r in mine]) * 1.15 ** (k - 1.5)
        ax.scatter(x, [max(r[4], 1e-3) for r in mine], s=10, alpha=0.6, label=f"registry, {method}")
    for tol in SWEEP_TOLERANCES:
        mine = [r for r in sweep if r[0] == tol]
        ax.scatter([tol[0]] * len(mine), [r[2] for r in mine], marker="^", s=18, color="gray",
                   label="sweep over lam" if tol == SWEEP_TOLERANCES[0] else None)
    for k, (name, d, _) in enumerate(failures):
        ax.scatter([1e-10 if k == 0 else 1.4e-8], [d], marker="x", s=70, color="red",
                   label="issue 14 failures" if k == 0 else None)
    ax.axhline(ab.DEPARTURE_LIMIT, color="black", linestyle="--", label="DEPARTURE_LIMIT")
    ax.set(xscale="log", yscale="log", xlabel="rtol",
           ylabel="largest departure / (atol + rtol |y|)",
           title="backsolve: re-integrated y vs forward solution")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-write", action="store_true", help="only print")
    parser.add_argument("--quick", action="store_true", help="two problems, dopri5 (implies --no-write)")
    cli = parser.parse_args()
    methods = sorted(EXPLICIT_METHODS)
    problems = [p for p in PROBLEMS.values() if not p.stiff] + list(DETEST.values())
    if cli.quick:
        problems, methods, cli.no_write = problems[:2], ["dopri5"], True
    rows = registry_rows(problems, methods, TOLERANCES)
    failures = failure_rows()
    sweep = sweep_rows()
    detest = detest_gradient_rows()
    text = ("# backsolve: departure of the re-integrated y from the forward solution\n\n"
            + table(rows, failures, sweep, detest))
    print(text)
    if not cli.no_write:
        base = os.path.join(harness.RESULTS_DIR, "backsolve_departure")
        with open(base + ".md", "w") as f:
            f.write(text)
        plot(rows, failures, sweep, base + ".png")


if __name__ == "__main__":
    main()
