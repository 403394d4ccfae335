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

* n = 200: ``x = tanh(rho A x + b)`` for rho = 0.995 and 0.999 (see
  :func:`tanh_problem`; seed 0), as a root ``x - tanh(rho A x + b) = 0``
  for Newton (odekit and optimistix) and as a fixed point for Anderson
  (history 5 and 20) and plain iteration (odekit and optimistix), with the
  iteration counts of textbook Anderson (Walker & Ni 2011, Algorithm AA,
  least squares by ``numpy.linalg.lstsq``) as the literature's reference.
  Time per solve (interleaved medians), first call (trace + compile + run
  after ``jax.clear_caches()``, interleaved, median of 5) and iterations.

Times are per call of a jitted function (solve, or gradient of the sum of the
solutions), the best of several interleaved medians because the machine is
shared. ``OPENBLAS_NUM_THREADS`` defaults to 1 here (the value used is
written to the results): with two BLAS threads on a loaded 2-core machine
the LU of the n = 200 Newton step spins and its time becomes noise.

Targets from the issues: fixed_point no slower than 1.5x the
``lax.custom_root`` version for the solve and the gradient; vmapped Newton on
the cubics no slower than optimistix's vmapped Newton; Newton on the n = 200
problem no slower than optimistix's Newton, solve and first call (issue 32);
Anderson(5) within 1.2x of the textbook Anderson(5)'s steps and far fewer
than plain iteration's.

Run: ``python benchmarks/implicit.py``; writes ``benchmarks/results/implicit.md``
and ``benchmarks/results/implicit.png``.
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402

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


TANH_N = 200
TANH_SEED = 0
TANH_RHOS = (0.995, 0.999)
TANH_ROUNDS = 60
PLAIN_MAX_STEPS = 20000


def tanh_problem(n: int = TANH_N, seed: int = TANH_SEED) -> tuple[jax.Array, jax.Array]:
    """``(A, b)`` of ``x = tanh(rho A x + b)``.

    ``G`` (n x n) and then ``z`` (n) are standard normal draws from
    ``numpy.random.default_rng(seed)``; ``A = G G^T / |G G^T|_2`` is symmetric
    positive semidefinite with spectral norm 1 and ``b = 0.01 z``. Near the
    solution ``tanh' ~ 1``, so plain iteration contracts at a rate close to
    ``rho`` (thousands of steps) while Newton takes a handful.
    """
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n))
    a = g @ g.T
    a /= np.linalg.norm(a, 2)
    return jnp.asarray(a), jnp.asarray(0.01 * rng.standard_normal(n))


def textbook_anderson_steps(a: np.ndarray, b: np.ndarray, rho: float, history: int,
                            max_steps: int = 5000) -> int:
    """Steps of Walker & Ni's Algorithm AA (no safeguard, no restart) to odekit's test.

    The unconstrained difference form: ``gamma = argmin |r_k - dR gamma|``
    (``numpy.linalg.lstsq``), ``x+ = x_k + r_k - (dX + dR) gamma``, with the
    last ``history`` differences; stops at the first ``x`` with
    ``|r_i| <= atol + rtol |x_i|``, as odekit does.
    """
    a, b = np.asarray(a), np.asarray(b)
    x = np.zeros(len(b))
    r = np.tanh(rho * a @ x + b) - x
    dx, dr = [], []
    for k in range(max_steps):
        if np.all(np.abs(r) <= ATOL + RTOL * np.abs(x)):
            return k
        new = x + r
        if dx:
            gamma = np.linalg.lstsq(np.array(dr).T, r, rcond=None)[0]
            new = new - (np.array(dx).T + np.array(dr).T) @ gamma
        new_r = np.tanh(rho * a @ new + b) - new
        dx, dr = (dx + [new - x])[-history:], (dr + [new_r - r])[-history:]
        x, r = new, new_r
    return max_steps


def _tanh_contenders(a, b):
    """name -> function of rho returning ``(x, iterations)``, jitted by the caller."""
    x0 = jnp.zeros(TANH_N)

    def fmap(x, rho):
        return jnp.tanh(rho * (a @ x) + b)

    def froot(x, rho):
        return x - fmap(x, rho)

    def ours(solve):
        def fn(rho):
            res = solve(rho)
            return res.x, res.num_steps
        return fn

    makers = {
        "odekit.root newton": ours(lambda rho: odekit.root(froot, x0, rho)),
        "odekit.fixed_point anderson (history 5)": ours(
            lambda rho: odekit.fixed_point(fmap, x0, rho, method="anderson")),
        "odekit.fixed_point anderson (history 20)": ours(
            lambda rho: odekit.fixed_point(fmap, x0, rho, method="anderson",
                                           options={"history": 20})),
        "odekit.fixed_point iteration": ours(
            lambda rho: odekit.fixed_point(fmap, x0, rho, max_steps=PLAIN_MAX_STEPS)),
    }
    if optx is not None:
        newton = optx.Newton(rtol=RTOL, atol=ATOL)
        plain = optx.FixedPointIteration(rtol=RTOL, atol=ATOL)

        def theirs(solve):
            def fn(rho):
                sol = solve(rho)
                return sol.value, sol.stats["num_steps"]
            return fn
        makers["optimistix Newton"] = theirs(lambda rho: optx.root_find(froot, newton, x0, rho))
        makers["optimistix FixedPointIteration"] = theirs(
            lambda rho: optx.fixed_point(fmap, plain, x0, rho, max_steps=PLAIN_MAX_STEPS))
    return makers


def _interleaved_wall_and_cpu(fns, rounds):
    """Medians of wall and process CPU time of each function, calls interleaved.

    On a loaded machine the wall time of a few-millisecond call mostly
    measures the scheduler; the CPU time the process spent is the steadier
    measure of the work, and the two are reported side by side.
    """
    for fn in fns.values():
        harness.block(fn())
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            harness.block(fn())
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return ({name: float(np.median(v)) for name, v in wall.items()},
            {name: float(np.median(v)) for name, v in cpu.items()})


def _tanh_reference(a, b, rho):
    """The solution by NumPy Newton iterations (to rounding)."""
    a, b = np.asarray(a), np.asarray(b)
    x = np.zeros(len(b))
    for _ in range(30):
        t = np.tanh(rho * a @ x + b)
        jac = np.eye(len(b)) - (1 - t ** 2)[:, None] * rho * a
        x = x - np.linalg.solve(jac, x - t)
    return x


def tanh_section() -> tuple[str, dict]:
    """The n = 200 rows: a markdown section and the raw numbers for the targets."""
    a, b = tanh_problem()
    makers = _tanh_contenders(a, b)
    def fresh(fn):
        def make():
            jax.clear_caches()
            jitted = jax.jit(fn)
            return lambda: jitted(TANH_RHOS[0])
        return make
    first = harness.interleaved_first_calls({name: fresh(fn) for name, fn in makers.items()},
                                            repeats=5)
    jitted = {name: jax.jit(fn) for name, fn in makers.items()}
    lines, numbers = [], {"first": first}
    for rho in TANH_RHOS:
        times, cpu = _interleaved_wall_and_cpu(
            {name: (lambda fn=fn: fn(rho)) for name, fn in jitted.items()}, TANH_ROUNDS)
        ref = _tanh_reference(a, b, rho)
        for name, fn in jitted.items():
            x, steps = fn(rho)
            err = float(np.max(np.abs(np.asarray(x) - ref)))
            lines.append([rho, name, times[name] * 1e3, cpu[name] * 1e3, first[name],
                          int(steps), f"{err:.1e}"])
            numbers[rho, name] = (cpu[name], int(steps), times[name])
        for history in (5, 20):
            steps = textbook_anderson_steps(a, b, rho, history)
            lines.append([rho, f"textbook Anderson({history}), Walker & Ni, NumPy", "n/a", "n/a",
                          "n/a", steps, "-"])
            numbers[rho, f"textbook {history}"] = steps
    header = ["rho", "solver", "solve, wall (ms)", "solve, CPU (ms)", "first call (s)",
              "iterations", "max abs. error"]
    text = "\n\n".join([
        f"## n = {TANH_N}: x = tanh(rho A x + b)",
        "A = G G^T / |G G^T|_2, b = 0.01 z, G and z standard normal from "
        f"numpy.random.default_rng({TANH_SEED}); x0 = 0; Newton solves x - tanh(rho A x + b) "
        f"= 0. Solve: medians over {TANH_ROUNDS} rounds of interleaved jitted calls, wall "
        "time and the process's CPU time (the steadier on a loaded machine; the targets "
        "use it); first call: trace + compile + run "
        "after jax.clear_caches(), median of 5 interleaved; iterations as each solver "
        "reports them (optimistix counts the step that finds the converged point).",
        harness.markdown_table(header, lines)])
    return text, numbers


def _tanh_targets(numbers: dict) -> list[str]:
    lines = []
    ours, theirs = "odekit.root newton", "optimistix Newton"
    for rho in TANH_RHOS:
        if (rho, theirs) not in numbers:
            break
        ratio = numbers[rho, ours][0] / numbers[rho, theirs][0]
        lines.append(f"| n = 200 Newton solve (CPU) <= optimistix (rho {rho}) | "
                     f"{numbers[rho, ours][0] * 1e3:.2f} vs {numbers[rho, theirs][0] * 1e3:.2f} ms"
                     f" | {ratio:.2f} | {'yes' if ratio <= 1.0 else 'NO'} |")
    first = numbers["first"]
    if theirs in first:
        ratio = first[ours] / first[theirs]
        lines.append(f"| n = 200 Newton first call <= optimistix | {first[ours]:.2f} vs "
                     f"{first[theirs]:.2f} s | {ratio:.2f} | {'yes' if ratio <= 1.0 else 'NO'} |")
    for rho in TANH_RHOS:
        aa = numbers[rho, "odekit.fixed_point anderson (history 5)"][1]
        book = numbers[rho, "textbook 5"]
        plain = numbers[rho, "odekit.fixed_point iteration"][1]
        lines.append(f"| Anderson(5) steps <= 1.2x textbook AA(5), << plain iteration (rho {rho})"
                     f" | {aa} vs {book} (plain {plain}) | {aa / book:.2f} | "
                     f"{'yes' if aa <= 1.2 * book and 5 * aa < plain else 'NO'} |")
    return lines


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


def _targets(times, tanh_numbers=None):
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
    if tanh_numbers is not None:
        lines += _tanh_targets(tanh_numbers)
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
    tanh_text, tanh_numbers = tanh_section()
    text = "\n\n".join([
        "# Implicit solvers: odekit.root and odekit.fixed_point vs peers",
        harness.machine_description() + (f", optimistix {optx.__version__}" if optx else
                                          ", optimistix not installed")
        + f", OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}",
        f"Tolerances rtol = atol = {RTOL:.1e}; times are the best of {ROUNDS} interleaved "
        "medians of jitted calls (SciPy: plain calls); gradient = grad of the sum of the "
        "solutions.",
        _table(rows, times),
        tanh_text,
        "## Targets",
        _targets(times, tanh_numbers),
    ])
    path = harness.write_result("implicit", text)
    _plot(rows, times, os.path.join(harness.RESULTS_DIR, "implicit.png"))
    print(text)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
