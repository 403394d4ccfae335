"""Benchmark: how fast are odekit.root and odekit.fixed_point, solve and gradient?

Question: on small problems, does odekit's generality (pytrees, loud failure,
closure conversion, one implicit rule) cost time against a hand-written
``lax.custom_root`` fixed point, SciPy, and optimistix (if installed)?

Problems (float64, all at the odekit default tolerance eps**0.75 ~ 1.8e-12):

* 100 independent cubics ``x**3 = a``, ``a = linspace(1, 8, 100)``, from
  ``x0 = 1``: vmapped scalar Newton, and one 100-unknown Newton problem;
  ``scipy.optimize.root`` (hybr, analytic Jacobian) on the 100-unknown form.
* a coupled 2-D system (the ``scipy.optimize.root`` documentation example,
  with two parameters), Newton and Broyden.
* the Newton square-root map ``x = (x + a / x) / 2`` for 100 values
  ``a = linspace(1, 100, 100)`` from ``x0 = a``, vmapped: ``odekit.fixed_point``
  against a fixed point built on ``jax.lax.custom_root``.

Times are per call of a jitted function (solve, or gradient of the sum of the
solutions), the best of several interleaved medians because the machine is
shared. Targets from the issue: fixed_point no slower than 1.5x the
``lax.custom_root`` version for the solve and the gradient; vmapped Newton on
the cubics no slower than optimistix's vmapped Newton.

Run: ``python benchmarks/implicit.py``; writes ``benchmarks/results/implicit.md``
and ``benchmarks/results/implicit.png``.
"""
from __future__ import annotations

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402
from jax import lax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import odekit  # noqa: E402
from odekit.custom.result import default_tolerances  # noqa: E402

try:
    import optimistix as optx
except ImportError:  # optional comparison only
    optx = None

RTOL, ATOL = default_tolerances(jnp.float64)
ROUNDS = 15
CUBIC_A = jnp.linspace(1.0, 8.0, 100)
SQRT_A = jnp.linspace(1.0, 100.0, 100)
COUPLED_P = jnp.array([0.5, 1.0])


def cubic(x, a):
    return x ** 3 - a


def coupled(x, p):
    return jnp.stack([x[0] + p[0] * (x[0] - x[1]) ** 3 - p[1],
                      p[0] * (x[1] - x[0]) ** 3 + x[1]])


def sqrt_map(x, a):
    return 0.5 * (x + a / x)


def custom_root_sqrt(a):
    """The same fixed point on jax.lax.custom_root, same stopping test as odekit."""
    def residual(x):
        return sqrt_map(x, a) - x

    def solve(g, x0):
        def cond(carry):
            x, r = carry
            return jnp.abs(r) > ATOL + RTOL * jnp.abs(x)

        def body(carry):
            x, r = carry
            x = x + r
            return x, g(x)
        return lax.while_loop(cond, body, (x0, g(x0)))[0]
    return lax.custom_root(residual, a, solve, lambda g, y: y / g(1.0))


def _contenders():
    """name -> (problem, solve fn of the parameters, gradient fn or None, reference)."""
    cbrt = np.cbrt(np.asarray(CUBIC_A))
    coupled_ref = scipy.optimize.root(lambda x: np.asarray(coupled(x, COUPLED_P)), [0.0, 0.0],
                                      tol=1e-14).x
    sqrt_ref = np.sqrt(np.asarray(SQRT_A))

    def vmapped(one):
        return jax.jit(jax.vmap(one)), jax.jit(jax.grad(lambda a: jnp.sum(jax.vmap(one)(a))))

    def summed(solve):
        return jax.jit(solve), jax.jit(jax.grad(lambda p: jnp.sum(solve(p))))

    rows = {
        ("100 cubics", "odekit.root newton, vmapped scalar"): (
            *vmapped(lambda a: odekit.root(cubic, 1.0, a).x), CUBIC_A, cbrt),
        ("100 cubics", "odekit.root newton, 100 unknowns"): (
            *summed(lambda a: odekit.root(cubic, jnp.ones(100), a).x), CUBIC_A, cbrt),
        ("100 cubics", "scipy.optimize.root hybr, 100 unknowns"): (
            lambda a: scipy.optimize.root(lambda x: x ** 3 - a, np.ones(100),
                                          jac=lambda x: np.diag(3 * x ** 2), tol=1e-12).x,
            None, np.asarray(CUBIC_A), cbrt),
        ("coupled 2-D", "odekit.root newton"): (
            *summed(lambda p: odekit.root(coupled, jnp.zeros(2), p).x), COUPLED_P, coupled_ref),
        ("coupled 2-D", "odekit.root broyden"): (
            *summed(lambda p: odekit.root(coupled, jnp.zeros(2), p, method="broyden").x),
            COUPLED_P, coupled_ref),
        ("coupled 2-D", "scipy.optimize.root hybr"): (
            lambda p: scipy.optimize.root(lambda x: np.asarray(coupled(x, p)), np.zeros(2),
                                          tol=1e-12).x, None, np.asarray(COUPLED_P), coupled_ref),
        ("sqrt map, 100 values", "odekit.fixed_point iteration, vmapped"): (
            *vmapped(lambda a: odekit.fixed_point(sqrt_map, a, a).x), SQRT_A, sqrt_ref),
        ("sqrt map, 100 values", "lax.custom_root fixed point, vmapped"): (
            *vmapped(custom_root_sqrt), SQRT_A, sqrt_ref),
    }
    if optx is not None:
        newton = optx.Newton(rtol=RTOL, atol=ATOL)
        rows[("100 cubics", "optimistix Newton, vmapped scalar")] = (
            *vmapped(lambda a: optx.root_find(cubic, newton, 1.0, a).value), CUBIC_A, cbrt)
        rows[("coupled 2-D", "optimistix Newton")] = (
            *summed(lambda p: optx.root_find(coupled, newton, jnp.zeros(2), p).value),
            COUPLED_P, coupled_ref)
        fixed = optx.FixedPointIteration(rtol=RTOL, atol=ATOL)
        rows[("sqrt map, 100 values", "optimistix FixedPointIteration, vmapped")] = (
            *vmapped(lambda a: optx.fixed_point(sqrt_map, fixed, a, a).value), SQRT_A, sqrt_ref)
    problems = list(dict.fromkeys(problem for problem, _ in rows))
    return dict(sorted(rows.items(), key=lambda item: problems.index(item[0][0])))


def _measure(rows):
    """Best of ROUNDS interleaved short medians, in seconds, per (row, 'solve'/'grad').

    The machine is shared, so the minimum over rounds estimates each solver's
    own cost better than one long median disturbed by other processes.
    """
    times = {}
    for _ in range(ROUNDS):
        for key, (solve, grad, arg, _) in rows.items():
            for kind, fn in (("solve", solve), ("grad", grad)):
                if fn is None:
                    continue
                t = harness.median_time(lambda fn=fn: fn(arg), repeats=5, min_time=0.01)
                times[key, kind] = min(times.get((key, kind), np.inf), t)
    return times


def _table(rows, times):
    header = ["problem", "solver", "solve (us)", "gradient (us)", "max rel. error"]
    lines = []
    for key, (solve, grad, arg, ref) in rows.items():
        err = float(np.max(np.abs(np.asarray(solve(arg)) - ref) / np.abs(ref)))
        grad_us = times[key, "grad"] * 1e6 if grad is not None else "n/a"
        lines.append([key[0], key[1], times[key, "solve"] * 1e6, grad_us, f"{err:.1e}"])
    return harness.markdown_table(header, lines)


def _targets(times):
    fp = ("sqrt map, 100 values", "odekit.fixed_point iteration, vmapped")
    cr = ("sqrt map, 100 values", "lax.custom_root fixed point, vmapped")
    lines = ["| target | measured | ratio | met |", "|---|---|---|---|"]
    for kind in ("solve", "grad"):
        ratio = times[fp, kind] / times[cr, kind]
        lines.append(f"| fixed_point {kind} <= 1.5x lax.custom_root | "
                     f"{times[fp, kind] * 1e6:.1f} vs {times[cr, kind] * 1e6:.1f} us | "
                     f"{ratio:.2f} | {'yes' if ratio <= 1.5 else 'NO'} |")
    ours = ("100 cubics", "odekit.root newton, vmapped scalar")
    theirs = ("100 cubics", "optimistix Newton, vmapped scalar")
    if (theirs, "solve") in times:
        ratio = times[ours, "solve"] / times[theirs, "solve"]
        lines.append(f"| vmapped Newton on 100 cubics <= optimistix | "
                     f"{times[ours, 'solve'] * 1e6:.1f} vs {times[theirs, 'solve'] * 1e6:.1f} us"
                     f" | {ratio:.2f} | {'yes' if ratio <= 1.0 else 'NO'} |")
    else:
        lines.append("| vmapped Newton on 100 cubics <= optimistix | optimistix not installed "
                     "| - | - |")
    return "\n".join(lines)


def _plot(rows, times, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(rows)
    y = np.arange(len(keys))
    solve = [times[k, "solve"] * 1e6 for k in keys]
    grad = [times.get((k, "grad"), np.nan) * 1e6 for k in keys]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(keys) + 1.5))
    ax.barh(y - 0.2, solve, height=0.4, label="solve")
    ax.barh(y + 0.2, grad, height=0.4, label="gradient")
    ax.set_yticks(y, [f"{p}: {s}" for p, s in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("time per call (us, log scale)")
    ax.set_title("odekit.root / fixed_point vs peers (jitted, float64)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    rows = _contenders()
    times = _measure(rows)
    text = "\n\n".join([
        "# Implicit solvers: odekit.root and odekit.fixed_point vs peers",
        harness.machine_description() + (f", optimistix {optx.__version__}" if optx else
                                          ", optimistix not installed"),
        f"Tolerances rtol = atol = {RTOL:.1e}; times are the best of {ROUNDS} interleaved "
        "medians of jitted calls (SciPy: plain calls); gradient = grad of the sum of the "
        "solutions.",
        _table(rows, times),
        "## Targets",
        _targets(times),
    ])
    path = harness.write_result("implicit", text)
    _plot(rows, times, os.path.join(harness.RESULTS_DIR, "implicit.png"))
    print(text)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
