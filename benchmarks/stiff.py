"""Benchmark: how fast do odekit's stiff methods solve standard stiff
problems, against SciPy's implicit solvers?

Problems from the registry (odekit.testing.problems): Robertson's kinetics to
t = 1e5, Van der Pol with mu = 1000 on [0, 3000] and HIRES. Contenders, with
output at the problem's times and atol = rtol * ATOL_FACTOR:

* odekit ``solve_ivp(method="rodas5p")`` (Rosenbrock),
  ``method="kvaerno5"`` (ESDIRK, simplified Newton) and ``method="bdf"``
  (variable-order BDF/NDF), jitted (Jacobian by jax.jacfwd), and
  ``method="auto"`` (tsit5 until its stiffness verdict, then rodas5p from
  there);
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
vmapped batch of Robertson solves over k1 (rodas5p and bdf) against a SciPy
LSODA loop (``--batch``: that section alone).

Robertson x ngroups (``--robertson-groups``; block-diagonal copies of
Robertson, 3 states each, t to 1e10, rtol 1e-6, atol 1e-10: the problem of
benchmarks/large_stiff.py): odekit rodas5p, kvaerno5 and bdf against diffsol's
BDF (pydiffsol, when installed; dense and sparse LU), SciPy LSODA and BDF
(exact Jacobians) and diffrax Kvaerno5, warm calls interleaved (medians), the
error against SciPy Radau at rtol 1e-12, atol 1e-16, and each contender's
first call in a fresh process (a subprocess per contender and size).
``--lu-crossover`` times rodas5p and bdf on the same problems with the lax LU
in one kernel against LAPACK's LU kernel by kernel (the measurement behind
``odekit.ode.linalg.lu.LAX_MAX_SIZE``). Both sections replace their own part
of stiff.md and keep the rest; run them with ``OPENBLAS_NUM_THREADS=1``.

Run: ``python benchmarks/stiff.py`` (a few minutes on 2 cores) writes
stiff.md and stiff.png to ``--out`` (default benchmarks/results);
``--quick`` (rtol 1e-6 only, 3 repeats, batch of 32) is a smoke run.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.util
import json
import os
import statistics
import subprocess
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
            ("odekit", "bdf", odekit_run), ("odekit", "auto", odekit_run)]
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
    """A vmapped batch of Robertson solves over k1 (rodas5p and bdf, each member
    its own steps; bdf's Jacobians and factorisations made when some member
    needs one) against a SciPy LSODA loop (rtol 1e-6). Medians of interleaved
    calls; work counts summed over the members."""
    p, rtol = get_problem("robertson"), 1e-6
    k1s = jnp.asarray(np.linspace(0.02, 0.08, settings.batch))
    rest = tuple(jnp.asarray(a) for a in p.args[1:])

    def batched(method):
        def one(k1):
            sol = odekit.solve_ivp(lambda t, y, *k: p.func(y, t, *k), (p.t0, float(p.t[-1])),
                                   jnp.asarray(p.y0), t_eval=jnp.asarray(p.t), args=(k1, *rest),
                                   method=method, rtol=rtol, atol=rtol * ATOL_FACTOR)
            return sol.ys, sol.stats["num_steps"], sol.stats["njev"], sol.stats["nlu"]
        return jax.jit(jax.vmap(one))

    methods = ("rodas5p", "bdf")
    calls = {m: (lambda f: lambda: f(k1s))(batched(m)) for m in methods}
    work = {m: [int(np.sum(v)) for v in harness.block(calls[m]())[1:]] for m in methods}
    times = harness.interleaved_medians(calls, rounds=settings.repeats)
    fun, jac = NUMPY["robertson"]

    def lsoda_loop():
        for k1 in np.asarray(k1s):   # LSODA: SciPy's fastest on Robertson (see the first table)
            scipy.integrate.solve_ivp(fun, (p.t0, p.t[-1]), p.y0, method="LSODA", t_eval=p.t,
                                      rtol=rtol, atol=rtol * ATOL_FACTOR, args=(k1, *p.args[1:]),
                                      jac=jac)
    start = time.perf_counter()
    lsoda_loop()
    seconds = time.perf_counter() - start
    rows = [[f"odekit {m}, jit(vmap)", settings.batch, times[m] * 1e3, times[m] / times["rodas5p"],
             *work[m]] for m in methods]
    rows.append(["scipy LSODA, Python loop", settings.batch, seconds * 1e3,
                 seconds / times["rodas5p"], "n/a", "n/a", "n/a"])
    return harness.markdown_table(["solver", "members", "time (ms)", "time / odekit rodas5p",
                                   "steps (sum)", "njev (sum)", "nlu (sum)"], rows)


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


# --- Robertson x ngroups: small stiff systems ------------------------------

GROUPS = (1, 3, 10, 30)
CROSSOVER_GROUPS = (1, 2, 4, 10, 20, 30)     # n = 3, 6, 12, 30, 60, 90
GROUPS_REF_RTOL, GROUPS_REF_ATOL = 1e-12, 1e-16
GROUPS_SECTION = "## Robertson x ngroups"
CROSSOVER_SECTION = "## Crossover of the lax LU"
BATCH_SECTION = "## A batch of Robertson solves over k1 in [0.02, 0.08] at rtol 1e-6"


def _large_stiff():
    """benchmarks/large_stiff.py (its Robertson x ngroups problem and runners)."""
    import large_stiff
    return large_stiff


def _robertson_groups_jac(t, y, k1, k2, k3):
    """The exact block-diagonal Jacobian of Robertson x ngroups (dense), in
    large_stiff's convention (k2 multiplies y2^2, k3 y2 y3: the registry's
    k2 and k3 swapped; checked against jax.jacfwd by _check_groups_jac)."""
    n = y.shape[0]
    jac = np.zeros((n, n))
    for start in range(0, n, 3):
        jac[start:start + 3, start:start + 3] = _robertson_jac(t, y[start:start + 3], k1, k3, k2)
    return jac


def _check_groups_jac(p) -> None:
    y = p.y0 * 0.9 + 0.01
    np.testing.assert_allclose(
        _robertson_groups_jac(1.0, y, *p.args),
        jax.jacfwd(lambda v: p.jax_field(1.0, v, *p.args))(jnp.asarray(y)), rtol=1e-13)


def _groups_scipy(method: str) -> Callable:
    def build(p) -> Any:
        def call():
            sol = scipy.integrate.solve_ivp(p.numpy_field, (p.t0, p.t_out[-1]), p.y0,
                                            method=method, t_eval=p.t_out, rtol=p.rtol,
                                            atol=p.atol, args=p.args, jac=_robertson_groups_jac)
            if not sol.success:
                raise RuntimeError(sol.message)
            return sol
        return _large_stiff().Runner(call, lambda sol: sol.y.T,
                                     lambda sol: dict(nfev=sol.nfev, njev=sol.njev, nlu=sol.nlu))
    return build


def _groups_diffsol(matrix: str) -> Callable:
    def build(p) -> Any:
        import pydiffsol
        params = np.asarray(p.args, dtype=float)
        t_out = np.asarray(p.t_out, dtype=float)
        state = {}

        def call():
            if "ode" not in state:    # JIT-compiling the DiffSL model is part of the first call
                ode = pydiffsol.Ode(p.diffsl(), matrix_type=getattr(pydiffsol, matrix),
                                    linear_solver=pydiffsol.lu, ode_solver=pydiffsol.bdf)
                ode.rtol, ode.atol = p.rtol, p.atol
                state["ode"] = ode
            return state["ode"].solve_dense(params, t_out)

        def ys(sol):
            out = np.empty((len(p.t_out), p.n))
            out[:, p.diffsl_order] = np.asarray(sol.ys).T
            return out
        return _large_stiff().Runner(call, ys, lambda sol: {})
    return build


def groups_contenders() -> list[tuple[str, str, Callable]]:
    """(key, label, build(problem) -> large_stiff.Runner) for Robertson x ngroups."""
    ls = _large_stiff()
    rows = [(f"odekit-{m}", f"odekit {m}", ls.odekit_runner(m, None, None))
            for m in ("rodas5p", "kvaerno5", "bdf")]
    # jac_sparsity="auto": the 3 x 3 blocks found from the traced field, the
    # block-diagonal LU in lax (one CPU kernel up to 256 unknowns)
    rows += [(f"odekit-{m}-sparse", f"odekit {m}, jac_sparsity='auto'",
              ls.odekit_runner(m, "auto", None)) for m in ("rodas5p", "bdf")]
    if importlib.util.find_spec("pydiffsol") is not None:
        rows += [("diffsol-dense", "diffsol BDF (nalgebra dense LU)",
                  _groups_diffsol("nalgebra_dense")),
                 ("diffsol-sparse", "diffsol BDF (faer sparse LU)",
                  _groups_diffsol("faer_sparse"))]
    rows += [(f"scipy-{m}", f"SciPy {m}", _groups_scipy(m)) for m in ("LSODA", "BDF")]
    if importlib.util.find_spec("diffrax") is not None:
        rows.append(("diffrax-kvaerno5", "diffrax Kvaerno5", ls.diffrax_runner))
    return rows


@functools.lru_cache(maxsize=None)
def _one_group_reference() -> np.ndarray:
    one = _large_stiff().robertson(1)
    sol = scipy.integrate.solve_ivp(one.numpy_field, (one.t0, one.t_out[-1]), one.y0,
                                    method="Radau", t_eval=one.t_out, rtol=GROUPS_REF_RTOL,
                                    atol=GROUPS_REF_ATOL, args=one.args, jac=_robertson_groups_jac)
    if not sol.success:
        raise RuntimeError(sol.message)
    return sol.y.T


def groups_reference(p) -> np.ndarray:
    """(len(t_out), n): SciPy Radau at rtol 1e-12, atol 1e-16 with the exact
    Jacobian (the groups are copies: one group solved, tiled)."""
    return np.tile(_one_group_reference(), (1, p.size))


def first_call_child(key: str, groups: int) -> dict:
    """In a fresh process: build and run one contender once (trace, compile
    and run; diffsol: JIT of the model and the solve), after the imports."""
    p = _large_stiff().robertson(groups)
    build = {k: b for k, _, b in groups_contenders()}[key]
    start = time.perf_counter()
    harness.block(build(p).call())
    return dict(first=time.perf_counter() - start)


def _first_call_fresh(key: str, groups: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--first-call-child",
                              key, str(groups)], capture_output=True, text=True, check=True)
        samples.append(json.loads(out.stdout.strip().splitlines()[-1])["first"])
    return statistics.median(samples)


def groups_table(groups: tuple[int, ...], rounds: int, first_repeats: int,
                 log: Callable[[str], None]) -> tuple[str, list[dict]]:
    """Robertson x ngroups: all contenders, warm calls interleaved one by one
    (harness.interleaved_medians), errors against the Radau reference, first
    calls in fresh processes."""
    ls = _large_stiff()
    rows, records = [], []
    for g in groups:
        p = ls.robertson(g)
        ls.check_fields(p)
        _check_groups_jac(p)
        ref = groups_reference(p)
        calls, built = {}, {}
        for key, label, build in groups_contenders():
            log(f"robertson x {g}: {label}")
            runner = build(p)
            out = harness.block(runner.call())
            ys = runner.ys(out)
            error = np.abs(ys - ref)
            calls[key], built[key] = runner.call, (label, runner.work(out), error,
                                                   error / (p.atol + p.rtol * np.abs(ref)))
        log(f"robertson x {g}: {rounds} interleaved rounds")
        times = harness.interleaved_medians(calls, rounds=rounds)
        for key, (label, work, error, scaled) in built.items():
            log(f"robertson x {g}: first call of {label} in a fresh process")
            first = _first_call_fresh(key, g, first_repeats)
            record = dict(groups=g, n=p.n, key=key, label=label, time=times[key], first=first,
                          work=work, error=float(np.max(error)), scaled=float(np.max(scaled)))
            records.append(record)
        anchor = times.get("diffsol-dense")
        best = min(times.values())
        for r in [r for r in records if r["groups"] == g]:
            rows.append([g, r["n"], r["label"], r["time"] * 1e3,
                         "" if anchor is None else r["time"] / anchor, r["first"],
                         ", ".join(f"{k} {v}" for k, v in r["work"].items()),
                         f"{r['error']:.2e}", r["scaled"],
                         "best" if r["time"] == best else ""])
    header = ["groups", "n", "solver", "time (ms)", "vs diffsol (dense)", "first call, fresh "
              "process (s)", "work", "max abs error", "error / tol", ""]
    return harness.markdown_table(header, rows), records


def _odekit_groups_call(method: str, groups: int, lax_max: int) -> Callable[[], Any]:
    """A compiled odekit solve of Robertson x groups with ``lax_max`` as the
    lax-LU size limit while it is traced (0: LAPACK, kernel by kernel)."""
    from odekit.ode.linalg import lu
    saved = lu.LAX_MAX_SIZE
    lu.LAX_MAX_SIZE = lax_max
    try:
        problem = _large_stiff().robertson(groups)
        # a field of its own: odekit's inner jit caches are keyed by the field
        field = problem.jax_field
        problem = dataclasses.replace(problem, jax_field=lambda t, y, *args: field(t, y, *args))
        call = _large_stiff().odekit_runner(method, None, None)(problem).call
        harness.block(call())    # traced and compiled under lax_max
    finally:
        lu.LAX_MAX_SIZE = saved
    return call


def crossover_table(groups: tuple[int, ...], rounds: int,
                    log: Callable[[str], None]) -> str:
    """rodas5p and bdf with the lax LU in one kernel against LAPACK's LU
    (kernel by kernel), interleaved medians per size."""
    rows = []
    for g in groups:
        for method in ("rodas5p", "bdf"):
            log(f"crossover: {method}, {g} groups")
            try:
                lax_call = _odekit_groups_call(method, g, 10**6)
            except Exception as exc:  # noqa: BLE001 -- a failure is a result
                rows.append([3 * g, method, f"fails: {str(exc).splitlines()[0][:60]}", "", ""])
                log(f"  {rows[-1]}")
                continue
            times = harness.interleaved_medians(
                {"lax": lax_call, "lapack": _odekit_groups_call(method, g, 0)}, rounds=rounds)
            rows.append([3 * g, method, times["lax"] * 1e3, times["lapack"] * 1e3,
                         times["lax"] / times["lapack"]])
            log(f"  {rows[-1]}")
    return harness.markdown_table(["n", "method", "lax LU, one kernel (ms)",
                                   "LAPACK LU, kernel by kernel (ms)", "lax / LAPACK"], rows)


def phases_child(method: str, lapack: bool, gradient: bool) -> dict:
    """In a fresh process: trace, lower, compile and run of a jitted solve_ivp
    (or its checkpoint gradient in k1) of Robertson (one group) to 1e10,
    each phase timed on its own (jax.jit(...).trace / .lower / .compile)."""
    if lapack:
        from odekit.ode.linalg import lu
        lu.LAX_MAX_SIZE = 0
    p = _large_stiff().robertson(1)
    t_out = jnp.asarray(p.t_out)

    def solve(y0, args):
        return odekit.solve_ivp(p.jax_field, (p.t0, p.t_out[-1]), y0, t_eval=t_out, args=args,
                                method=method, rtol=p.rtol, atol=p.atol).ys

    fn = jax.jit(jax.grad(lambda y0, args: jnp.sum(solve(y0, args)[:, 1]), 1) if gradient
                 else solve)
    y0, args = jnp.asarray(p.y0), tuple(jnp.asarray(a) for a in p.args)
    times = [time.perf_counter()]
    traced = fn.trace(y0, args)
    times.append(time.perf_counter())
    lowered = traced.lower()
    times.append(time.perf_counter())
    compiled = lowered.compile()
    times.append(time.perf_counter())
    harness.block(compiled(y0, args))
    times.append(time.perf_counter())
    phases = np.diff(times)
    return dict(trace=phases[0], lower=phases[1], compile=phases[2], run=phases[3],
                total=times[-1] - times[0], hlo=len(compiled.as_text()))


def phases_table(repeats: int, log: Callable[[str], None]) -> str:
    rows = []
    for method in ("rodas5p", "kvaerno5", "bdf"):
        for gradient in (False, True):
            for lapack in (False, True):
                log(f"phases: {method} gradient={gradient} lapack={lapack}")
                samples = []
                for _ in range(repeats):
                    out = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--phases-child", method,
                         str(int(lapack)), str(int(gradient))],
                        capture_output=True, text=True, check=True)
                    samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
                med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
                rows.append([method, "checkpoint gradient" if gradient else "solve",
                             "LAPACK LU, kernel by kernel" if lapack else "lax LU, one kernel",
                             med["trace"], med["lower"], med["compile"], med["run"],
                             med["total"], int(med["hlo"])])
    return harness.markdown_table(["method", "program", "LU / loop", "trace (s)", "lower (s)",
                                   "compile (s)", "first run (s)", "total (s)",
                                   "compiled HLO (chars)"], rows)


def _replace_section(path: str, title: str, body: str) -> None:
    """Put ``title`` + ``body`` into the markdown file at ``path``, replacing
    the section of that title (up to the next section of the same level)
    and keeping everything else."""
    text = open(path).read() if os.path.exists(path) else ""
    section = f"{title}\n\n{body.strip()}\n"
    start = text.find(title + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(title))
        text = text[:start] + section + ("" if end < 0 else text[end:])
    with open(path, "w") as fh:
        fh.write(text)


def _section(path: str, title: str) -> str:
    """The section of ``title`` in the markdown file at ``path`` (title line
    included, up to the next section of the same level); "" if it has none."""
    text = open(path).read() if os.path.exists(path) else ""
    start = text.find(title + "\n")
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def _protocol(rounds: int | None) -> str:
    """The machine, thread setting and date (and the interleaving, given rounds)."""
    text = (f"{harness.machine_description()}; OPENBLAS_NUM_THREADS="
            f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; "
            f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}")
    if rounds is None:
        return text
    return (text + f"; medians of {rounds} interleaved rounds (one call of each contender "
            "per round) on a shared 2-core CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one tolerance, few repeats")
    parser.add_argument("--out", default=harness.RESULTS_DIR, help="results folder")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--robertson-groups", nargs="*", type=int, default=None,
                        help="only the Robertson x ngroups section (default sizes 1 3 10 30)")
    parser.add_argument("--lu-crossover", nargs="*", type=int, default=None,
                        help="only the lax-LU crossover section (groups; default 1 2 4 10 20 30)")
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (sections)")
    parser.add_argument("--first-repeats", type=int, default=1,
                        help="fresh processes per first-call median")
    parser.add_argument("--first-call-phases", action="store_true",
                        help="only the trace/lower/compile notes (stiff_first_call_notes.md)")
    parser.add_argument("--batch", action="store_true",
                        help="only the vmapped-batch section (rodas5p, bdf, LSODA loop)")
    parser.add_argument("--first-call-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--phases-child", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    log = lambda text: print(text, file=sys.stderr, flush=True)
    if options.phases_child:
        method, lapack, gradient = options.phases_child
        print(json.dumps(phases_child(method, lapack == "1", gradient == "1")))
        return
    if options.first_call_phases:
        table = phases_table(options.first_repeats, log)
        print(table)
        if not options.no_write:
            _replace_section(os.path.join(options.out, "stiff_first_call_notes.md"),
                             "## Phases of the first call", _protocol(None)
                             + f"; fresh process per row, median of {options.first_repeats}. "
                             "`python benchmarks/stiff.py --first-call-phases`.\n\n" + table)
        return
    if options.first_call_child:
        key, groups = options.first_call_child
        print(json.dumps(first_call_child(key, int(groups))))
        return
    if options.robertson_groups is not None or options.lu_crossover is not None:
        path = os.path.join(options.out, "stiff.md")
        if options.lu_crossover is not None:
            groups = tuple(options.lu_crossover) or CROSSOVER_GROUPS
            body = "\n\n".join([
                _protocol(options.rounds) + ". Robertson x ngroups to 1e10 (rtol 1e-6, atol "
                "1e-10), odekit with the Gaussian elimination in lax "
                "(odekit.ode.linalg.lu.eliminate) and the whole solve in one CPU kernel, "
                "against LAPACK's getrf/trsm, the loop kernel by kernel. "
                "`python benchmarks/stiff.py --lu-crossover`.",
                crossover_table(groups, options.rounds, log)])
            print(body)
            if not options.no_write:
                _replace_section(path, CROSSOVER_SECTION, body)
        if options.robertson_groups is not None:
            groups = tuple(options.robertson_groups) or GROUPS
            table, _ = groups_table(groups, options.rounds, options.first_repeats, log)
            body = "\n\n".join([
                _protocol(options.rounds) + ". Robertson x ngroups (identical block-diagonal "
                "copies, 3 states each) to t = 1e10 with output at 1, 1e5, 1e10; rtol 1e-6, atol "
                "1e-10 for every contender; error = max abs deviation from SciPy Radau at rtol "
                f"{GROUPS_REF_RTOL:g}, atol {GROUPS_REF_ATOL:g}; error / tol = max |e| / (atol + "
                "rtol |y|). SciPy gets the exact Jacobian; diffsol its DiffSL model (BDF, "
                "Jacobian by its JIT); odekit and diffrax are jitted, Jacobian by forward mode "
                "(dense; with jac_sparsity='auto' compressed over the 3 colors of the blocks, "
                "and the block-diagonal LU). "
                "first call = build + trace + compile + run in a fresh Python process "
                f"(median of {options.first_repeats}; imports not counted). "
                "`python benchmarks/stiff.py --robertson-groups` (this section only; the "
                "tables above are from the last full run).",
                table])
            print(body)
            if not options.no_write:
                _replace_section(path, GROUPS_SECTION, body)
        return
    settings = QUICK if options.quick else FULL
    if options.batch:
        body = (_protocol(settings.repeats) + ". `python benchmarks/stiff.py --batch` (this "
                "section only).\n\n" + batch_table(settings))
        print(body)
        if not options.no_write:
            _replace_section(os.path.join(options.out, "stiff.md"), BATCH_SECTION, body)
        return
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
        "# Stiff problems: odekit rodas5p, kvaerno5, bdf and auto against SciPy's implicit "
        "solvers "
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
        BATCH_SECTION,
        batch])
    print(text)
    if not options.no_write:
        os.makedirs(options.out, exist_ok=True)
        path = os.path.join(options.out, "stiff.md")
        # the sections measured by their own flags stay
        kept = [_section(path, title) for title in (GROUPS_SECTION, CROSSOVER_SECTION)]
        with open(path, "w") as fh:
            fh.write("\n\n".join([text.rstrip("\n"), *[k.strip() for k in kept if k]]) + "\n")
        plot(results, os.path.join(options.out, "stiff.png"))


if __name__ == "__main__":
    main()
