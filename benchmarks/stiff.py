"""Benchmark: how fast do odekit's stiff methods solve standard stiff
problems, against SciPy's implicit solvers?

Problems from the registry (odekit.testing.problems): Robertson's kinetics to
t = 1e5, Van der Pol with mu = 1000 on [0, 3000] and HIRES. Contenders, with
output at the problem's times and atol = rtol * ATOL_FACTOR:

* odekit ``solve_ivp(method="rodas5p")`` (Rosenbrock) and
  ``method="kvaerno5"`` (ESDIRK, simplified Newton), jitted (Jacobian by
  jax.jacfwd), and ``method="auto"`` (tsit5 until its stiffness verdict,
  then rodas5p from there);
* SciPy ``solve_ivp`` Radau, BDF and LSODA with NumPy vector fields and their
  exact NumPy Jacobians (checked against jax.jacfwd at start-up);
* diffrax Kvaerno5 (PID controller) when diffrax is installed.

Per problem and rtol: time of warm calls (the smallest over rounds of
harness.median_time),
first-call time (trace + compile + run for odekit; SciPy's first call),
steps, nfev, njev, nlu, and the error: max abs deviation at the output times
from the registry reference (SciPy Radau at rtol 1e-10, atol 1e-14), also in
units of the tolerance (max |e| / (atol + rtol |y|)). Two more tables: the
gradient of Robertson's solution with respect to its three rate constants
(adjoint="checkpoint") against central differences of tight solves, and a
vmapped batch of Robertson solves over k1 against a SciPy LSODA loop.

Run: ``python benchmarks/stiff.py`` (a few minutes on 2 cores) writes
stiff.md and stiff.png to ``--out`` (default benchmarks/results);
``--quick`` (rtol 1e-6 only, 3 repeats, batch of 32) is a smoke run.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import sys
import time
from typing import Any, Callable, NamedTuple

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.integrate  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import odekit  # noqa: E402
from odekit.testing.problems import Problem, get_problem, reference_solution  # noqa: E402

PROBLEM_NAMES = ("robertson", "van_der_pol", "hires")
ATOL_FACTOR = 1e-4
SCIPY_METHODS = ("Radau", "BDF", "LSODA")
HEADER = ["problem", "solver", "method", "rtol", "time (ms)", "first call (s)", "steps",
          "nfev", "njev", "nlu", "max abs error", "error / tol"]


class Settings(NamedTuple):
    rtols: tuple[float, ...]
    rounds: int         # timing rounds over all calls; the smallest median is kept
    repeats: int        # timings per median
    first_calls: int    # fresh compilations per first-call median
    batch: int          # Robertson rate constants in the vmap table


FULL = Settings((1e-4, 1e-6, 1e-8), 3, 5, 3, 1000)
QUICK = Settings((1e-6,), 1, 3, 1, 32)


# NumPy vector fields and Jacobians for SciPy, the same as the registry's
# jax.numpy fields (checked by _check_numpy_fields).
def _robertson(t, y, k1, k2, k3):
    return np.array([-k1 * y[0] + k2 * y[1] * y[2],
                     k1 * y[0] - k2 * y[1] * y[2] - k3 * y[1] ** 2, k3 * y[1] ** 2])


def _robertson_jac(t, y, k1, k2, k3):
    return np.array([[-k1, k2 * y[2], k2 * y[1]],
                     [k1, -k2 * y[2] - 2 * k3 * y[1], -k2 * y[1]],
                     [0.0, 2 * k3 * y[1], 0.0]])


def _van_der_pol(t, y, mu):
    return np.array([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def _van_der_pol_jac(t, y, mu):
    return np.array([[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]])


_HIRES_LINEAR = np.array([
    [-1.71, 0.43, 8.32, 0, 0, 0, 0, 0], [1.71, -8.75, 0, 0, 0, 0, 0, 0],
    [0, 0, -10.03, 0.43, 0.035, 0, 0, 0], [0, 8.32, 1.71, -1.12, 0, 0, 0, 0],
    [0, 0, 0, 0, -1.745, 0.43, 0.43, 0], [0, 0, 0, 0.69, 1.71, -0.43, 0.69, 0],
    [0, 0, 0, 0, 0, 0, -1.81, 0], [0, 0, 0, 0, 0, 0, 1.81, 0]])
_HIRES_SOURCE = np.array([0.0007, 0, 0, 0, 0, 0, 0, 0])
_HIRES_REACTION = np.array([0, 0, 0, 0, 0, -1.0, 1.0, -1.0])   # where k y6 y8 enters


def _hires(t, y, k):
    return _HIRES_LINEAR @ y + _HIRES_SOURCE + _HIRES_REACTION * (k * y[5] * y[7])


def _hires_jac(t, y, k):
    jac = _HIRES_LINEAR.copy()
    jac[:, 5] += _HIRES_REACTION * k * y[7]
    jac[:, 7] += _HIRES_REACTION * k * y[5]
    return jac


NUMPY = {"robertson": (_robertson, _robertson_jac), "van_der_pol": (_van_der_pol, _van_der_pol_jac),
         "hires": (_hires, _hires_jac)}


def _check_numpy_fields(problems: list[Problem]) -> None:
    for p in problems:
        fun, jac = NUMPY[p.name]
        y = p.y0 + 0.1
        np.testing.assert_allclose(fun(0.3, y, *p.args), p.func(jnp.asarray(y), 0.3, *p.args),
                                   rtol=1e-13)
        np.testing.assert_allclose(jac(0.3, y, *p.args),
                                   jax.jacfwd(lambda v: p.func(v, 0.3, *p.args))(jnp.asarray(y)),
                                   rtol=1e-13)


class Run(NamedTuple):
    call: Callable[[], Any]                 # the timed call (compiled on first use)
    first: Callable[[], Callable[[], Any]]  # a fresh, uncompiled call (first-call time)
    ys: Callable[[Any], np.ndarray]         # (n, d) solution at the output times
    work: Callable[[Any], tuple]            # (steps, nfev, njev, nlu) from call()


def odekit_run(p: Problem, method: str, rtol: float) -> Run:
    def build():
        @jax.jit
        def solve(y0, args):
            sol = odekit.solve_ivp(lambda t, y, *a: p.func(y, t, *a), (p.t0, float(p.t[-1])), y0,
                                   t_eval=jnp.asarray(p.t), args=args, method=method, rtol=rtol,
                                   atol=rtol * ATOL_FACTOR, max_steps=100_000)
            return sol.ys, sol.stats
        y0, args = jnp.asarray(p.y0), tuple(jnp.asarray(a) for a in p.args)
        return lambda: solve(y0, args)

    stats = lambda out: tuple(int(out[1][k]) for k in ("num_steps", "nfev", "njev", "nlu"))
    return Run(build(), build, lambda out: np.asarray(out[0]), stats)


def scipy_run(p: Problem, method: str, rtol: float) -> Run:
    fun, jac = NUMPY[p.name]

    def call():
        sol = scipy.integrate.solve_ivp(fun, (p.t0, p.t[-1]), p.y0, method=method, t_eval=p.t,
                                        rtol=rtol, atol=rtol * ATOL_FACTOR, args=p.args, jac=jac)
        if not sol.success:
            raise RuntimeError(f"SciPy {method} failed on {p.name}: {sol.message}")
        return sol

    steps = lambda sol: ("n/a", int(sol.nfev), int(sol.njev), int(sol.nlu))
    return Run(call, lambda: call, lambda sol: sol.y.T, steps)


def diffrax_run(p: Problem, method: str, rtol: float) -> Run:
    import diffrax

    def build():
        term = diffrax.ODETerm(lambda t, y, args: p.func(y, t, *args))

        @jax.jit
        def solve(y0, args):
            sol = diffrax.diffeqsolve(
                term, getattr(diffrax, method)(), t0=p.t0, t1=float(p.t[-1]), dt0=None, y0=y0,
                args=args, saveat=diffrax.SaveAt(ts=jnp.asarray(p.t)), max_steps=100_000,
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=rtol * ATOL_FACTOR))
            return sol.ys, sol.stats["num_steps"]
        y0, args = jnp.asarray(p.y0), tuple(jnp.asarray(a) for a in p.args)
        return lambda: solve(y0, args)

    return Run(build(), build, lambda out: np.asarray(out[0]),
               lambda out: (int(out[1]), "n/a", "n/a", "n/a"))


def contenders() -> list[tuple[str, str, Callable[..., Run]]]:
    rows = [("odekit", "rodas5p", odekit_run), ("odekit", "kvaerno5", odekit_run),
            ("odekit", "auto", odekit_run)]
    rows += [("scipy", m, scipy_run) for m in SCIPY_METHODS]
    if importlib.util.find_spec("diffrax") is not None:
        rows.append(("diffrax", "Kvaerno5", diffrax_run))
    return rows


def measure(p: Problem, settings: Settings, log: Callable[[str], None]) -> list[dict]:
    """One dict per (contender, rtol). Everything is compiled and checked
    first; then the timing rounds go over all calls in turn, and each time is
    the smallest round's median (the machine is shared)."""
    ref = reference_solution(p)
    results, calls = [], []
    for solver, method, build in contenders():
        for rtol in settings.rtols:
            log(f"{p.name}: {solver} {method} rtol={rtol:g}")
            run = build(p, method, rtol)
            first = harness.first_call_time(run.first, repeats=settings.first_calls)
            out = harness.block(run.call())
            error = np.abs(run.ys(out) - ref)
            scaled = error / (rtol * ATOL_FACTOR + rtol * np.abs(ref))
            results.append(dict(problem=p.name, solver=solver, method=method, rtol=rtol,
                                time=np.inf, first=first, work=run.work(out),
                                error=float(np.max(error)), scaled=float(np.max(scaled))))
            calls.append(run.call)
    for r in range(settings.rounds):
        log(f"{p.name}: timing round {r + 1}/{settings.rounds}")
        for result, call in zip(results, calls):
            seconds = harness.median_time(call, repeats=settings.repeats)
            result["time"] = min(result["time"], seconds)
    return results


def results_table(results: list[dict]) -> str:
    rows = [[r["problem"], r["solver"], r["method"], f"{r['rtol']:.0e}", r["time"] * 1e3,
             r["first"], *r["work"], f"{r['error']:.2e}", r["scaled"]] for r in results]
    return harness.markdown_table(HEADER, rows)


def gradient_table(settings: Settings) -> str:
    """d(weighted sum of Robertson's y at its times)/d(k1, k2, k3) by the checkpoint
    adjoint, against central differences (relative step 1e-4) of rtol 1e-10 solves."""
    p = get_problem("robertson")
    weights = jnp.array([[1.0, 1e4, 1.0]])   # y2 is ~1e-5

    def loss(rates, rtol):
        sol = odekit.solve_ivp(lambda t, y, *k: p.func(y, t, *k), (p.t0, float(p.t[-1])),
                               jnp.asarray(p.y0), t_eval=jnp.asarray(p.t), args=tuple(rates),
                               method="rodas5p", rtol=rtol, atol=rtol * ATOL_FACTOR)
        return jnp.sum(sol.ys * weights)

    rates = jnp.asarray(p.args)
    tight = jax.jit(lambda r: loss(r, 1e-10))
    fd = np.array([(tight(rates * (1 + 1e-4 * e)) - tight(rates * (1 - 1e-4 * e)))
                   / (2e-4 * rates[i]) for i, e in enumerate(np.eye(3))])
    rows = []
    for rtol in settings.rtols:
        make = lambda: (lambda g: lambda: g(rates))(jax.jit(jax.grad(lambda r: loss(r, rtol))))
        first = harness.first_call_time(make, repeats=settings.first_calls)
        call = make()
        grad = np.asarray(harness.block(call()))
        rows.append([f"{rtol:.0e}", harness.median_time(call, repeats=settings.repeats) * 1e3,
                     first, " ".join(f"{g:.4g}" for g in grad),
                     float(np.max(np.abs(grad - fd) / np.abs(fd)))])
    return harness.markdown_table(["rtol", "gradient (ms)", "first call (s)", "d/d(k1, k2, k3)",
                                   "max rel. difference to central FD"], rows)


def batch_table(settings: Settings) -> str:
    """A vmapped batch of Robertson solves over k1 against a SciPy LSODA loop (rtol 1e-6)."""
    p, rtol = get_problem("robertson"), 1e-6
    k1s = np.linspace(0.02, 0.08, settings.batch)
    rest = tuple(jnp.asarray(a) for a in p.args[1:])

    @jax.jit
    def batch(k1s):
        def one(k1):
            return odekit.solve_ivp(lambda t, y, *k: p.func(y, t, *k), (p.t0, float(p.t[-1])),
                                    jnp.asarray(p.y0), t_eval=jnp.asarray(p.t), args=(k1, *rest),
                                    method="rodas5p", rtol=rtol, atol=rtol * ATOL_FACTOR).ys
        return jax.vmap(one)(k1s)

    ours = harness.median_time(lambda: batch(jnp.asarray(k1s)), repeats=settings.repeats)
    rows = [["odekit rodas5p, jit(vmap)", settings.batch, ours * 1e3, 1.0]]
    fun, jac = NUMPY["robertson"]
    start = time.perf_counter()
    for k1 in k1s:   # LSODA: SciPy's fastest on Robertson (see the first table)
        scipy.integrate.solve_ivp(fun, (p.t0, p.t[-1]), p.y0, method="LSODA", t_eval=p.t,
                                  rtol=rtol, atol=rtol * ATOL_FACTOR, args=(k1, *p.args[1:]),
                                  jac=jac)
    seconds = time.perf_counter() - start
    rows.append(["scipy LSODA, Python loop", settings.batch, seconds * 1e3, seconds / ours])
    return harness.markdown_table(["solver", "members", "time (ms)", "time / odekit"], rows)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PROBLEM_NAMES), figsize=(4.2 * len(PROBLEM_NAMES), 3.8))
    for ax, name in zip(axes, PROBLEM_NAMES):
        for k, (solver, method, _) in enumerate(contenders()):
            rows = [r for r in results if r["problem"] == name and r["method"] == method]
            ax.loglog([r["time"] * 1e3 for r in rows], [r["error"] for r in rows],
                      marker="o", ms=4, color=plt.get_cmap("tab10")(k),
                      linestyle="-" if solver == "odekit" else "--", label=f"{solver} {method}")
        ax.set(xlabel="time (ms)", ylabel="max abs error", title=name)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one tolerance, few repeats")
    parser.add_argument("--out", default=harness.RESULTS_DIR, help="results folder")
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args()
    settings = QUICK if options.quick else FULL
    log = lambda text: print(text, file=sys.stderr, flush=True)
    problems = [get_problem(name) for name in PROBLEM_NAMES]
    _check_numpy_fields(problems)
    start = time.perf_counter()
    results = [r for p in problems for r in measure(p, settings, log)]
    log("gradient")
    gradient = gradient_table(settings)
    log("batch")
    batch = batch_table(settings)
    versions = (f"scipy {scipy.__version__}, diffrax "
                + ("installed" if importlib.util.find_spec("diffrax") else "not installed"))
    text = "\n\n".join([
        "# Stiff problems: odekit rodas5p, kvaerno5 and auto against SciPy's implicit solvers "
        "(float64)",
        f"{harness.machine_description()}, {versions}; "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
        + (" (quick mode)" if options.quick else "")
        + f"; {time.perf_counter() - start:.0f} s in all.",
        f"atol = rtol * {ATOL_FACTOR:g}. SciPy gets NumPy vector fields and exact Jacobians. "
        "time = the smallest over timing rounds of the median of warm calls (odekit "
        "jitted); first call = trace, compile and run of a "
        "fresh function (SciPy: its first call). error = max abs deviation at the output times "
        "from SciPy Radau at rtol 1e-10, atol 1e-14; error / tol = max |e| / (atol + rtol |y|). "
        "SciPy's steps are not reported by solve_ivp (n/a).",
        results_table(results),
        "## Gradient of Robertson's solution with respect to (k1, k2, k3)",
        "loss = sum over the output times of y1 + 1e4 y2 + y3; jax.grad through "
        "adjoint=\"checkpoint\" (the default), against central differences (relative step "
        "1e-4) of rtol 1e-10 solves.",
        gradient,
        "## A batch of Robertson solves over k1 in [0.02, 0.08] at rtol 1e-6",
        batch])
    print(text)
    if not options.no_write:
        os.makedirs(options.out, exist_ok=True)
        with open(os.path.join(options.out, "stiff.md"), "w") as fh:
            fh.write(text + "\n")
        plot(results, os.path.join(options.out, "stiff.png"))


if __name__ == "__main__":
    main()
