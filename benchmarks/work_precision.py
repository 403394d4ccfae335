"""Benchmark: for a given accuracy, how much time and how many function
evaluations does each method need?

Work-precision diagrams on three non-stiff problems from the registry
(odekit.testing.problems): the damped pendulum of benchmarks/pendulum.py,
Lotka-Volterra, and the two-body orbit DETEST D3 (eccentricity 0.5, about
three revolutions on 0 <= t <= 20). For each rtol of a sweep (atol = rtol *
ATOL_FACTOR; 1e-3 to 1e-10, and to 1e-11 for the curves odekit is compared
with) every contender solves the problem with output at the problem's times:

* odekit bosh3, dopri5, tsit5, dopri8 through ``odekit.solve_ivp`` (nfev and
  steps from its statistics);
* ``jax.experimental.ode.odeint`` (dopri5; nfev counted with a
  ``jax.debug.callback`` in a separate, untimed run; full mode only);
* SciPy ``solve_ivp`` RK45 and DOP853 with a NumPy vector field (nfev from
  the result);
* diffrax Tsit5, Dopri5, Dopri8 (PID controller) when diffrax is installed.

error = max abs deviation at the output times from the registry reference
(exact for D3, else SciPy DOP853 at rtol = atol = 1e-13); time = median of
repeated jitted, warm calls blocked until ready (harness.median_time), the
smallest over interleaved rounds (SciPy: plain calls). The summary checks the
targets: tsit5 and dopri8 on or below SciPy's curves in nfev (tsit5 against
RK45, dopri8 against DOP853: the same orders) and below
jax.experimental.ode's in time, both at equal error (log-log interpolation
along the other curve).

Run: ``python benchmarks/work_precision.py`` (a few minutes on 2 cores)
writes work_precision.md and work_precision.png to ``--out`` (default
benchmarks/results); ``--quick`` (two tolerances, one round of three
repeats, no nfev count for jax.experimental.ode) is the smoke test's mode.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.integrate  # noqa: E402
from jax.experimental import ode as jax_ode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import odekit  # noqa: E402
from odekit.testing.problems import Problem, get_problem, reference_solution  # noqa: E402

PROBLEM_NAMES = ("pendulum", "lotka_volterra", "detest_d3")
ODEKIT_METHODS = ("bosh3", "dopri5", "tsit5", "dopri8")
DIFFRAX_METHODS = ("Tsit5", "Dopri5", "Dopri8")
ATOL_FACTOR = 1e-3
ODEKIT, JAX_ODE, SCIPY, DIFFRAX = "odekit", "jax.experimental.ode", "scipy", "diffrax"
HEADER = ["solver", "method", "rtol", "max abs error", "time (ms)", "nfev", "steps"]
NFEV_SLACK = 1.1  # "on" SciPy's nfev curve: within 10%


class Settings(NamedTuple):
    rtols: tuple[float, ...]            # odekit's and diffrax's sweep
    reference_rtols: tuple[float, ...]  # jax.experimental.ode's and SciPy's
    rounds: int           # timing rounds over all calls; the smallest median is kept
    repeats: int          # timings per median
    min_time: float       # seconds per timing (calls are repeated to reach it)
    count_jax_nfev: bool  # count jax.experimental.ode's evaluations (slow callbacks)


# The curves odekit is compared with go a decade further: at the same rtol
# tsit5 and dopri8 are often a little more accurate than RK45 and DOP853, so
# odekit's tightest point would otherwise lie beyond the other curve's end,
# where only a bound (its last point) is known.
FULL = Settings(tuple(10.0 ** -k for k in range(3, 11)), tuple(10.0 ** -k for k in range(3, 12)),
                3, 7, 0.02, True)
QUICK = Settings((1e-4, 1e-8), (1e-4, 1e-8), 1, 3, 0.0, False)
REFERENCE_SOLVERS = (JAX_ODE, SCIPY)


# NumPy vector fields f(t, y, *args) for SciPy, the same as the registry's
# jax.numpy ones (checked at start-up by _check_numpy_fields).
def _pendulum(t, y, b, g):
    return np.array([y[1], -b * y[1] - g * np.sin(y[0])])


def _lotka_volterra(t, y, a, b, c, d):
    return np.array([a * y[0] - b * y[0] * y[1], d * y[0] * y[1] - c * y[1]])


def _two_body(t, y, mu):
    r3 = (y[0] ** 2 + y[1] ** 2) ** 1.5
    return np.array([y[2], y[3], -mu * y[0] / r3, -mu * y[1] / r3])


NUMPY_FIELDS = {"pendulum": _pendulum, "lotka_volterra": _lotka_volterra, "detest_d3": _two_body}


def _check_numpy_fields(problems: list[Problem]) -> None:
    for p in problems:
        y = p.y0 + 0.1
        np.testing.assert_allclose(NUMPY_FIELDS[p.name](0.3, y, *p.args),
                                   p.func(jnp.asarray(y), 0.3, *p.args), rtol=1e-13)


class Run(NamedTuple):
    """One contender on one problem at one tolerance."""

    call: Callable[[], Any]                # the timed call (compiled on first use)
    ys: Callable[[Any], np.ndarray]        # (n, d) solution at the output times from call()
    work: Callable[[Any], tuple[Any, Any]]  # (nfev, steps) from call(); "n/a" if unknown


def _odekit_solve(fun, t_span, y0, ts, method, rtol, atol):
    """(ys, nfev, steps) from odekit.solve_ivp; fun(t, y)."""
    sol = odekit.solve_ivp(fun, t_span, y0, t_eval=ts, method=method, rtol=rtol, atol=atol,
                           max_steps=1_000_000)
    return sol.ys, sol.stats["nfev"], sol.stats["num_steps"]


def _jax_args(p: Problem) -> tuple:
    return jnp.asarray(p.y0), tuple(jnp.asarray(a) for a in p.args)


def _count(value: Any) -> Any:
    return "n/a" if value is None else int(value)


def odekit_run(p: Problem, method: str, rtol: float, atol: float, settings: Settings) -> Run:
    ts = jnp.asarray(p.t)

    @jax.jit
    def solve(y0, args):
        return _odekit_solve(lambda t, y: p.func(y, t, *args), (p.t0, float(p.t[-1])), y0, ts,
                             method, rtol, atol)

    y0, args = _jax_args(p)
    return Run(lambda: solve(y0, args), lambda out: np.asarray(out[0]),
               lambda out: (_count(out[1]), _count(out[2])))


def jax_ode_run(p: Problem, method: str, rtol: float, atol: float, settings: Settings) -> Run:
    solve = jax.jit(lambda y0, args: jax_ode.odeint(p.func, y0, jnp.asarray(p.t), *args,
                                                    rtol=rtol, atol=atol))
    y0, args = _jax_args(p)

    def work(_):
        if not settings.count_jax_nfev:
            return "n/a", "n/a"
        count = [0]

        def bump():
            count[0] += 1

        def counted(y, t, *a):
            jax.debug.callback(bump)
            return p.func(y, t, *a)

        jax.block_until_ready(jax.jit(lambda y0, args: jax_ode.odeint(
            counted, y0, jnp.asarray(p.t), *args, rtol=rtol, atol=atol))(y0, args))
        jax.effects_barrier()
        return count[0], (count[0] - 2) // 6  # 2 for the first step, 6 per attempted step

    return Run(lambda: solve(y0, args), np.asarray, work)


def scipy_run(p: Problem, method: str, rtol: float, atol: float, settings: Settings) -> Run:
    def call():
        return scipy.integrate.solve_ivp(NUMPY_FIELDS[p.name], (p.t0, p.t[-1]), p.y0,
                                         method=method, t_eval=p.t, rtol=rtol, atol=atol,
                                         args=p.args)

    return Run(call, lambda sol: sol.y.T, lambda sol: (int(sol.nfev), "n/a"))


def diffrax_run(p: Problem, method: str, rtol: float, atol: float, settings: Settings) -> Run:
    import diffrax

    term = diffrax.ODETerm(lambda t, y, args: p.func(y, t, *args))

    @jax.jit
    def solve(y0, args):
        sol = diffrax.diffeqsolve(
            term, getattr(diffrax, method)(), t0=p.t0, t1=float(p.t[-1]), dt0=None, y0=y0,
            args=args, saveat=diffrax.SaveAt(ts=jnp.asarray(p.t)),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol), max_steps=100_000)
        return sol.ys, sol.stats["num_steps"]

    y0, args = _jax_args(p)
    return Run(lambda: solve(y0, args), lambda out: np.asarray(out[0]),
               lambda out: ("n/a", int(out[1])))


def contenders() -> list[tuple[str, str, Callable[..., Run]]]:
    """(solver, method, run builder) for every curve."""
    rows = [(ODEKIT, m, odekit_run) for m in ODEKIT_METHODS]
    rows += [(JAX_ODE, "dopri5", jax_ode_run), (SCIPY, "RK45", scipy_run),
             (SCIPY, "DOP853", scipy_run)]
    if importlib.util.find_spec("diffrax") is not None:
        rows += [(DIFFRAX, m, diffrax_run) for m in DIFFRAX_METHODS]
    return rows


def measure(p: Problem, settings: Settings, log: Callable[[str], None]) -> list[dict]:
    """One dict per (contender, rtol): solver, method, rtol, error, time, nfev, steps.

    Everything is compiled, checked and counted first; then the timing rounds
    go over all calls in turn and each time is the smallest round's median,
    because the machine is shared.
    """
    ref = reference_solution(p)
    results, calls = [], []
    for solver, method, build in contenders():
        log(f"{p.name}: {solver} {method}")
        rtols = settings.reference_rtols if solver in REFERENCE_SOLVERS else settings.rtols
        for rtol in rtols:
            run = build(p, method, rtol, rtol * ATOL_FACTOR, settings)
            out = harness.block(run.call())
            nfev, steps = run.work(out)
            results.append({"solver": solver, "method": method, "rtol": rtol, "time": np.inf,
                            "error": float(np.max(np.abs(run.ys(out) - ref))),
                            "nfev": nfev, "steps": steps})
            calls.append(run.call)
    for r in range(settings.rounds):
        log(f"{p.name}: timing round {r + 1}/{settings.rounds}")
        for result, call in zip(results, calls):
            seconds = harness.median_time(call, repeats=settings.repeats,
                                          min_time=settings.min_time)
            result["time"] = min(result["time"], seconds)
    return results


def results_table(results: list[dict]) -> str:
    rows = [[r["solver"], r["method"], f"{r['rtol']:.0e}", f"{r['error']:.2e}",
             r["time"] * 1e3, r["nfev"], r["steps"]] for r in results]
    return harness.markdown_table(HEADER, rows)


def _curve(results: list[dict], solver: str, method: str, cost: str) -> list[tuple[float, float]]:
    """(error, cost) points of one contender where both are known and error > 0."""
    return [(r["error"], float(r[cost])) for r in results
            if r["solver"] == solver and r["method"] == method
            and r[cost] != "n/a" and r["error"] > 0]


def ratios_at_equal_error(points: list, curve: list) -> list[float]:
    """cost / (the curve's cost at the same error), one per comparable point.

    The curve is interpolated linearly in log-log. A point more accurate than
    every curve point is compared with the curve's most accurate point (the
    curve's cost at that error can only be higher, so the ratio is an upper
    bound); points less accurate than the whole curve are not compared.
    """
    if not curve:
        return []
    errors, costs = (np.log(np.array(v)) for v in zip(*sorted(curve)))
    out = []
    for error, cost in points:
        if np.log(error) <= errors[-1]:
            reference = np.interp(np.log(error), errors, costs, left=costs[0])
            out.append(cost / float(np.exp(reference)))
    return out


TARGETS = (  # (odekit method, what, other solver, other method, cost, allowed ratio)
    ("tsit5", "nfev on or below SciPy RK45", SCIPY, "RK45", "nfev", NFEV_SLACK),
    ("dopri8", "nfev on or below SciPy DOP853", SCIPY, "DOP853", "nfev", NFEV_SLACK),
    ("tsit5", "time below jax.experimental.ode", JAX_ODE, "dopri5", "time", 1.0),
    ("dopri8", "time below jax.experimental.ode", JAX_ODE, "dopri5", "time", 1.0),
)


def summary_table(all_results: dict[str, list[dict]]) -> str:
    header = ["problem", "odekit method", "target (at equal error)", "points", "median ratio",
              "worst ratio", "allowed", "met"]
    rows = []
    for name, results in all_results.items():
        for method, what, solver, other, cost, allowed in TARGETS:
            ratios = ratios_at_equal_error(_curve(results, ODEKIT, method, cost),
                                           _curve(results, solver, other, cost))
            if not ratios:
                rows.append([name, method, what, 0, "n/a", "n/a", f"<= {allowed:g}", "n/a"])
                continue
            worst = max(ratios)
            rows.append([name, method, what, len(ratios), f"{statistics.median(ratios):.2f}",
                         f"{worst:.2f}", f"<= {allowed:g}", "yes" if worst <= allowed else "NO"])
    return harness.markdown_table(header, rows)


def plot(all_results: dict[str, list[dict]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(len(all_results), 2, figsize=(11, 3.6 * len(all_results)),
                             squeeze=False)
    for row, (name, results) in zip(axes, all_results.items()):
        for k, (solver, method, _) in enumerate(contenders()):
            style = dict(color=plt.get_cmap("tab10")(k), marker="o" if solver == ODEKIT else "s",
                         linestyle="-" if solver == ODEKIT else "--", ms=3)
            for ax, cost, scale in ((row[0], "time", 1e3), (row[1], "nfev", 1.0)):
                curve = _curve(results, solver, method, cost)
                if curve:
                    errors, costs = zip(*curve)
                    ax.loglog(np.array(costs) * scale, errors, label=f"{solver} {method}", **style)
        row[0].set(xlabel="time (ms)", ylabel="max abs error", title=f"{name}: error vs time")
        row[1].set(xlabel="function evaluations", title=f"{name}: error vs nfev")
        for ax in row:
            ax.grid(True, which="major", alpha=0.3)
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no overlaps
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(all_results: dict[str, list[dict]], settings: Settings, quick: bool,
           elapsed: float) -> str:
    versions = (f"scipy {scipy.__version__}, "
                + ("diffrax installed" if importlib.util.find_spec("diffrax")
                   else "diffrax not installed"))
    front = ("odekit.solve_ivp" if hasattr(odekit, "solve_ivp")
             else "odekit.odeint (odekit.solve_ivp missing: no odekit nfev/steps)")
    parts = ["# Work-precision: time and function evaluations for a given accuracy (float64)",
             f"{harness.machine_description()}, {versions}; "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
             + (" (quick mode)" if quick else ""),
             f"atol = rtol * {ATOL_FACTOR:g} (jax.experimental.ode and SciPy to rtol = "
             f"{min(settings.reference_rtols):.0e}, a decade beyond odekit where the full sweep "
             "runs, so that odekit's points are compared inside their curves); odekit rows through {front}. error = max abs "
             "deviation at the output times from the registry reference (exact for detest_d3, "
             "else SciPy DOP853 at rtol = atol = 1e-13); time = the smallest of "
             f"{settings.rounds} interleaved medians of {settings.repeats} jitted, warm, "
             "blocked calls (SciPy: plain calls with a NumPy vector field); nfev and steps "
             "as reported by each solver (jax.experimental.ode: counted with a callback in a "
             "separate run, steps derived from nfev); n/a: not available."]
    for name, results in all_results.items():
        parts += [f"## {name}", results_table(results)]
    parts += ["## Targets",
              "Ratio = odekit cost / the other curve's cost at the same error (log-log "
              "interpolation; see `ratios_at_equal_error`). nfev targets allow "
              f"{NFEV_SLACK:g}x (\"on\" the curve); time targets need < 1 (\"below\").",
              summary_table(all_results), f"Benchmark wall time: {elapsed:.0f} s."]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="two tolerances, three repeats, no jax.experimental.ode nfev count")
    parser.add_argument("--out", default=harness.RESULTS_DIR,
                        help="folder for work_precision.md and .png (default benchmarks/results)")
    opts = parser.parse_args(argv)
    settings = QUICK if opts.quick else FULL
    start = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr,
                            flush=True)
    problems = [get_problem(name) for name in PROBLEM_NAMES]
    _check_numpy_fields(problems)
    all_results = {p.name: measure(p, settings, log) for p in problems}
    text = report(all_results, settings, opts.quick, time.perf_counter() - start)
    print(text)
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "work_precision.md"), "w") as fh:
        fh.write(text.rstrip() + "\n")
    plot(all_results, os.path.join(opts.out, "work_precision.png"))
    print(f"\nwrote work_precision.md and work_precision.png to {opts.out}")
    return text


if __name__ == "__main__":
    main()
