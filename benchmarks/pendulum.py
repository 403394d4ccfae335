"""Benchmark: is odekit.odeint a faster drop-in for jax.experimental.ode.odeint?

Question: on the historical JAX pendulum benchmark, how do odekit.odeint's
forward solve, first call (trace + compile), adjoint gradient and vmapped
batch compare with jax.experimental.ode.odeint (same method, dopri5, same
tolerance, same run), and what do they cost in steps, function evaluations
and accuracy? scipy.integrate.odeint (LSODA) and, when installed, diffrax
(Dopri5, PID controller) are measured alongside as points of reference.

Problem (float64): ``theta'' = -b theta' - g sin(theta)`` as the first-order
system below, ``y0 = [pi - 0.1, 0]``, ``ts = linspace(0, 10, 101)``,
``b = 0.25``, ``g = 9.8``, at ``rtol = atol = 1.4e-8`` (the odeint default)
and ``1e-6``. The error is the largest absolute deviation at ``ts`` from
``scipy.integrate.solve_ivp`` (DOP853, ``rtol = atol = 1e-13``).

Timings are of jitted calls blocked until ready (SciPy: plain calls): each
is the smallest of ``ROUNDS`` interleaved medians (harness.median_time),
because the machine is shared; first calls are medians over fresh
``jax.jit`` wrappers after ``jax.clear_caches()``, the contenders taking
turns after an untimed warm-up round (harness.interleaved_first_calls). Targets from issue 2
(odekit dopri5 / jax.experimental.ode): forward <= 0.5, gradient <= 0.5,
first call <= 1.0, vmap batch <= 0.5, error not worse.

Run: ``python benchmarks/pendulum.py`` (a few minutes on 2 cores); writes
``benchmarks/results/pendulum.md`` and ``benchmarks/results/pendulum.png``.
``--quick`` (few repeats, batch of 64, rtol = atol = 1.4e-8 only, no diffrax or
extra methods) is the smoke test's mode; ``--out DIR`` writes the two files
there instead; ``--no-write`` only prints.
"""
from __future__ import annotations

import argparse
import datetime
import math
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
from jax.experimental import ode as jax_ode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import odekit  # noqa: E402
from odekit.ode.engine import single_kernel  # noqa: E402

try:
    import diffrax
except ImportError:  # optional comparison only
    diffrax = None

TOLERANCES = (1.4e-8, 1e-6)
B, G = 0.25, 9.8
Y0 = np.array([np.pi - 0.1, 0.0])
TS = np.linspace(0.0, 10.0, 101)
EXTRA_METHODS = ("tsit5", "bosh3", "dopri8")
ODEKIT, JAX_ODE, SCIPY, DIFFRAX = ("odekit.odeint", "jax.experimental.ode",
                                   "scipy odeint", "diffrax")
ODEKIT_NO_KERNEL = "odekit.odeint, ODEKIT_SINGLE_KERNEL=0"
ODEKIT_IVP = "odekit.solve_ivp (t_eval)"
QUANTITIES = ("forward", "gradient", "first call", "vmap", "error")
TARGETS = {"forward": 0.5, "gradient": 0.5, "first call": 1.0, "vmap": 0.5, "error": 1.0}
HEADER = ["solver", "method", "rtol=atol", "forward (us)", "vs jax.ode", "first call (s)",
          "gradient (ms)", "vmap {batch} (ms)", "steps", "nfev", "max abs error"]


class Settings(NamedTuple):
    rounds: int          # interleaved timing rounds; the minimum median is kept
    repeats: int         # timings per median
    min_time: float      # seconds per timing (calls are repeated to reach it)
    first_repeats: int   # fresh jits per first-call median (contenders take turns)
    first_warmup: bool   # an untimed first round (see harness.interleaved_first_calls)
    batch: int           # initial angles in the vmap batch
    extras: bool         # extra odekit methods and diffrax
    tolerances: tuple = TOLERANCES   # rtol = atol values measured


FULL = Settings(rounds=7, repeats=7, min_time=0.05, first_repeats=7, first_warmup=True,
                batch=1024, extras=True)
QUICK = Settings(rounds=1, repeats=3, min_time=0.0, first_repeats=1, first_warmup=False,
                 batch=64, extras=False, tolerances=TOLERANCES[:1])


def pend(y, t, b, g):
    theta, omega = y
    return jnp.stack([omega, -b * omega - g * jnp.sin(theta)])


def pend_numpy(y, t, b, g):
    theta, omega = y
    return np.array([omega, -b * omega - g * np.sin(theta)])


class Contender(NamedTuple):
    """One row: ``solve(y0, b, g) -> ys`` and ``stats() -> (steps, nfev)``."""

    solver: str
    method: str
    tol: float
    solve: Callable
    jittable: bool       # JAX code: first call, gradient and vmap apply
    full_columns: bool   # also measure gradient and vmap
    stats: Callable[[], tuple[Any, Any]]
    single_kernel: bool = True  # False: traced with ODEKIT_SINGLE_KERNEL=0 (odekit.ode.engine.single_kernel)


class _SingleKernelSwitch:
    """ODEKIT_SINGLE_KERNEL set to the row's choice while tracing (the switch
    is read at trace time)."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.previous = os.environ.get(single_kernel.ENV_SWITCH)
        os.environ[single_kernel.ENV_SWITCH] = "1" if self.on else "0"

    def __exit__(self, *exc):
        if self.previous is None:
            os.environ.pop(single_kernel.ENV_SWITCH, None)
        else:
            os.environ[single_kernel.ENV_SWITCH] = self.previous


def _traced_with_switch(row: "Contender", fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` after a first (tracing, compiling) call under the row's switch."""
    with _SingleKernelSwitch(row.single_kernel):
        harness.block(fn())
    return fn


def pend_ivp(t, y, b, g):
    """The pendulum in solve_ivp's argument order."""
    return pend(y, t, b, g)


def _odekit_ivp(tol: float) -> Contender:
    """solve_ivp on the same problem and output times, for its first-call cost."""
    def solve(y0, b, g):
        return odekit.solve_ivp(pend_ivp, (TS[0], TS[-1]), y0, t_eval=TS, args=(b, g),
                                method="dopri5", rtol=tol, atol=tol).ys

    contender = _odekit("dopri5", tol, False)
    return contender._replace(solver=ODEKIT_IVP, solve=solve)


def _odekit(method: str, tol: float, full: bool) -> Contender:
    def solve(y0, b, g):
        return odekit.odeint(pend, y0, TS, b, g, rtol=tol, atol=tol, method=method)

    def stats():
        # odeint has no statistics; solve_ivp on the same problem reports them.
        sol = odekit.solve_ivp(lambda t, y, b, g: pend(y, t, b, g), (TS[0], TS[-1]), Y0,
                               t_eval=TS, args=(B, G), rtol=tol, atol=tol, method=method,
                               max_steps=100_000)
        return int(sol.stats["num_steps"]), int(sol.stats["nfev"])

    return Contender(ODEKIT, method, tol, solve, True, full, stats)


def _jax_ode(tol: float) -> Contender:
    def solve(y0, b, g):
        return jax_ode.odeint(pend, y0, TS, b, g, rtol=tol, atol=tol)

    def stats():
        # Count evaluations with a callback in a separate, untimed run; its
        # dopri5 spends 2 on the initial step and 6 per attempted step.
        count = [0]

        def bump():
            count[0] += 1

        def counted(y, t, b, g):
            jax.debug.callback(bump)
            return pend(y, t, b, g)

        jax.block_until_ready(jax.jit(lambda y0, b, g: jax_ode.odeint(
            counted, y0, TS, b, g, rtol=tol, atol=tol))(Y0, B, G))
        jax.effects_barrier()
        return (count[0] - 2) // 6, count[0]

    return Contender(JAX_ODE, "dopri5", tol, solve, True, True, stats)


def _scipy(tol: float) -> Contender:
    def solve(y0, b, g):
        return scipy.integrate.odeint(pend_numpy, y0, TS, args=(b, g), rtol=tol, atol=tol)

    def stats():
        _, info = scipy.integrate.odeint(pend_numpy, Y0, TS, args=(B, G), rtol=tol, atol=tol,
                                         full_output=True)
        return int(info["nst"][-1]), int(info["nfe"][-1])

    return Contender(SCIPY, "lsoda", tol, solve, False, False, stats)


def _diffrax(tol: float) -> Contender:
    term = diffrax.ODETerm(lambda t, y, args: pend(y, t, *args))

    def solution(y0, b, g):
        return diffrax.diffeqsolve(
            term, diffrax.Dopri5(), t0=TS[0], t1=TS[-1], dt0=None, y0=y0, args=(b, g),
            saveat=diffrax.SaveAt(ts=TS),
            stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol), max_steps=4096)

    def stats():
        sol = jax.jit(solution)(Y0, B, G)
        return int(sol.stats["num_steps"]), "n/a"

    return Contender(DIFFRAX, "dopri5", tol, lambda y0, b, g: solution(y0, b, g).ys,
                     True, True, stats)


def contenders(settings: Settings) -> list[Contender]:
    rows = []
    for tol in settings.tolerances:
        rows += [_odekit("dopri5", tol, True), _jax_ode(tol), _scipy(tol),
                 _odekit("dopri5", tol, True)._replace(solver=ODEKIT_NO_KERNEL, single_kernel=False),
                 _odekit_ivp(tol)]
        if settings.extras:
            rows += [_odekit(method, tol, False) for method in EXTRA_METHODS]
            if diffrax is not None:
                rows.append(_diffrax(tol))
    return rows


def reference() -> np.ndarray:
    sol = scipy.integrate.solve_ivp(lambda t, y: pend_numpy(y, t, B, G), (TS[0], TS[-1]), Y0,
                                    method="DOP853", t_eval=TS, rtol=1e-13, atol=1e-13)
    return sol.y.T


def _first_call_maker(row: Contender) -> Callable[[], Callable[[], Any]]:
    def make():
        jax.clear_caches()
        fn = jax.jit(row.solve)

        def first():
            with _SingleKernelSwitch(row.single_kernel):
                return fn(Y0, B, G)
        return first
    return make


def _callables(row: Contender, batch: int) -> dict[str, Callable[[], Any]]:
    """The zero-argument calls to time, one per measured quantity."""
    if not row.jittable:
        return {"forward": lambda: row.solve(Y0, B, G)}
    y0, b, g = jnp.asarray(Y0), jnp.asarray(B), jnp.asarray(G)
    forward = jax.jit(row.solve)
    calls = {"forward": lambda: forward(y0, b, g)}
    if row.full_columns:
        grad = jax.jit(jax.grad(lambda *a: row.solve(*a).sum(), argnums=(0, 1, 2)))
        theta0 = jnp.linspace(0.1, jnp.pi - 0.1, batch)
        y0s = jnp.stack([theta0, jnp.zeros_like(theta0)], axis=-1)
        batched = jax.jit(jax.vmap(lambda y: row.solve(y, b, g)))
        calls["gradient"] = lambda: grad(y0, b, g)
        calls["vmap"] = lambda: batched(y0s)
    return calls


def measure(rows: list[Contender], settings: Settings, ref: np.ndarray,
            log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every quantity of every row (seconds, counts, errors) in one run."""
    results = [{} for _ in rows]
    log("first calls (trace + compile) ...")
    makers = {i: _first_call_maker(row) for i, row in enumerate(rows) if row.jittable}
    firsts = harness.interleaved_first_calls(makers, settings.first_repeats,
                                             warmup=settings.first_warmup)
    for i, seconds in firsts.items():
        results[i]["first call"] = seconds
    log("compiling, errors and statistics ...")
    calls = []
    for row, res in zip(rows, results):
        calls.append({k: _traced_with_switch(row, fn)
                      for k, fn in _callables(row, settings.batch).items()})
        ys = np.asarray(harness.block(calls[-1]["forward"]()))
        res["error"] = float(np.max(np.abs(ys - ref)))
        res["steps"], res["nfev"] = row.stats()
        for fn in calls[-1].values():
            harness.block(fn())  # compile before the timed rounds
    for r in range(settings.rounds):
        log(f"timing round {r + 1}/{settings.rounds} ...")
        for res, row_calls in zip(results, calls):
            for kind, fn in row_calls.items():
                t = harness.median_time(fn, repeats=settings.repeats, min_time=settings.min_time)
                res[kind] = min(res.get(kind, math.inf), t)
    return results


def _tolerances(rows: list[Contender]) -> list[float]:
    """The tolerances measured, in the order of ``rows``."""
    return list(dict.fromkeys(row.tol for row in rows))


def _jax_index(rows: list[Contender], tol: float) -> int:
    return next(i for i, row in enumerate(rows) if row.solver == JAX_ODE and row.tol == tol)


def _odekit_index(rows: list[Contender], tol: float, solver: str = ODEKIT) -> int:
    return next(i for i, row in enumerate(rows)
                if row.solver == solver and row.method == "dopri5" and row.tol == tol)


def results_table(rows, results, settings: Settings) -> str:
    header = [h.format(batch=settings.batch) for h in HEADER]
    lines = []
    for row, res in zip(rows, results):
        base = results[_jax_index(rows, row.tol)]["forward"]
        scaled = lambda key, unit: res[key] * unit if key in res else (
            "n/a" if not row.jittable else "-")
        lines.append([row.solver, row.method, f"{row.tol:g}", res["forward"] * 1e6,
                      f"{res['forward'] / base:.2f}", scaled("first call", 1.0),
                      scaled("gradient", 1e3), scaled("vmap", 1e3), res["steps"], res["nfev"],
                      f"{res['error']:.1e}"])
    return harness.markdown_table(header, lines)


def ratios(rows, results, solver: str = ODEKIT
           ) -> dict[tuple[str, float], tuple[float, float, float]]:
    """(quantity, tol) -> (odekit dopri5, jax.experimental.ode, ratio)."""
    out = {}
    for tol in _tolerances(rows):
        ours, theirs = results[_odekit_index(rows, tol, solver)], results[_jax_index(rows, tol)]
        for q in QUANTITIES:
            out[q, tol] = (ours[q], theirs[q], ours[q] / theirs[q])
    return out


def ratio_table(ratio: dict) -> str:
    units = {"forward": (1e6, "us"), "gradient": (1e3, "ms"), "first call": (1.0, "s"),
             "vmap": (1e3, "ms"), "error": (1.0, "")}
    lines = ["| quantity | rtol=atol | odekit dopri5 | jax.experimental.ode | ratio | target | met |",
             "|---|---|---|---|---|---|---|"]
    for (q, tol), (ours, theirs, r) in ratio.items():
        scale, unit = units[q]
        fmt = (lambda v: f"{v:.1e}") if q == "error" else (lambda v: f"{v * scale:.3g} {unit}")
        target = "not worse (<= 1)" if q == "error" else f"<= {TARGETS[q]:g}"
        lines.append(f"| {q} | {tol:g} | {fmt(ours)} | {fmt(theirs)} | {r:.2f} | {target} | "
                     f"{'yes' if r <= TARGETS[q] else 'NO'} |")
    return "\n".join(lines)


def ivp_first_call_table(rows: list, results: list) -> str:
    lines = ["| rtol=atol | solve_ivp (s) | odeint (s) | ratio | met |", "|---|---|---|---|---|"]
    for tol in _tolerances(rows):
        ivp = results[_odekit_index(rows, tol, ODEKIT_IVP)]["first call"]
        ode = results[_odekit_index(rows, tol, ODEKIT)]["first call"]
        lines.append(f"| {tol:g} | {ivp:.3g} | {ode:.3g} | {ivp / ode:.2f} | "
                     f"{'yes' if ivp / ode <= 1.2 else 'NO'} |")
    return "\n".join(lines)


def plot(ratio: dict, batch: int, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(QUANTITIES))
    tolerances = list(dict.fromkeys(tol for _, tol in ratio))
    width = 0.8 / len(tolerances)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, tol in enumerate(tolerances):
        values = [ratio[q, tol][2] for q in QUANTITIES]
        bars = ax.bar(x + (k - (len(tolerances) - 1) / 2) * width, values, width,
                      label=f"rtol=atol={tol:g}")
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
    for i, q in enumerate(QUANTITIES):
        ax.hlines(TARGETS[q], i - 0.45, i + 0.45, colors="k", linestyles="--",
                  label="target" if i == 0 else None)
    labels = [f"vmap {batch}" if q == "vmap" else q for q in QUANTITIES]
    ax.set_xticks(x, labels)
    ax.set_yscale("log")
    ax.set_ylabel("odekit / jax.experimental.ode (log scale)")
    ax.set_title("Pendulum, dopri5, float64: odekit.odeint vs jax.experimental.ode")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="few repeats, batch of 64, the first tolerance only, no diffrax "
                             "or extra methods")
    parser.add_argument("--no-write", action="store_true", help="print only; write no files")
    parser.add_argument("--out", default=harness.RESULTS_DIR,
                        help="folder for pendulum.md and .png (default benchmarks/results)")
    opts = parser.parse_args(argv)
    settings = QUICK if opts.quick else FULL
    start = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr,
                            flush=True)

    rows = contenders(settings)
    results = measure(rows, settings, reference(), log)
    ratio = ratios(rows, results)
    elapsed = time.perf_counter() - start
    versions = (f"scipy {scipy.__version__}, "
                + (f"diffrax {diffrax.__version__}" if diffrax else "diffrax not installed"))
    text = "\n\n".join([
        "# Pendulum: odekit.odeint vs jax.experimental.ode.odeint (float64)",
        f"{harness.machine_description()}, {versions}; "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
        + (" (quick mode)" if opts.quick else ""),
        "Times are the smallest of {r} interleaved medians of jitted, blocked calls (SciPy: "
        "plain calls); first call = trace + compile + run of a fresh `jax.jit` after "
        "`jax.clear_caches()`, median of {f} rounds in which the contenders take turns{w}; "
        "gradient = `jax.grad` of `ys.sum()` w.r.t. (y0, b, g); "
        "vmap = one batch of {n} initial angles in [0.1, pi - 0.1]; steps are attempted "
        "steps (jax.experimental.ode's derived from its counted nfev); error = max abs "
        "deviation from solve_ivp DOP853 at rtol = atol = 1e-13. n/a: not applicable, "
        "-: not measured.".format(
            r=settings.rounds, n=settings.batch, f=settings.first_repeats,
            w=", after an untimed warm-up round" if settings.first_warmup else ""),
        results_table(rows, results, settings),
        "## Targets (odekit dopri5 / jax.experimental.ode, same run)",
        ratio_table(ratio),
        "## For reference: odekit without the single-kernel loop (`ODEKIT_SINGLE_KERNEL=0`, "
        "odekit.ode.engine.single_kernel), same run",
        ratio_table(ratios(rows, results, ODEKIT_NO_KERNEL)),
        "## solve_ivp's first call against odeint's (same run; target <= 1.2)",
        ivp_first_call_table(rows, results),
        f"Benchmark wall time: {elapsed:.0f} s.",
    ])
    print(text)
    if not opts.no_write:
        path = harness.write_result("pendulum", text, opts.out)
        plot(ratio, settings.batch, os.path.join(opts.out, "pendulum.png"))
        print(f"\nwrote {path} and pendulum.png")
    return text


if __name__ == "__main__":
    main()
