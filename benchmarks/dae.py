"""Benchmark: how fast and how accurately does odekit solve index-1 DAEs,
against SUNDIALS' IDA?

Problems (odekit.testing.dae_problems, the Bari IVP test set 2.4 with its
published reference values at the end time): the Chemical Akzo Nobel problem
(6 components, M = diag(1, 1, 1, 1, 1, 0), t in [0, 180]) and the transistor
amplifier (8 node voltages, M of rank 5 with no zero row, t in [0, 0.2]).

Contenders, at each rtol with ``atol = problem.atol * rtol / problem.rtol``:

* odekit ``solve_ivp(method="rodas5p" | "bdf", mass_matrix=M)``, jitted,
  dense Jacobian by forward mode, output at the end time;
* SUNDIALS IDA (variable-order BDF on the residual ``M y' - f(t, y) = 0``)
  through scikit-sundae when installed, dense linear solver, its
  difference-quotient Jacobian, a NumPy residual (checked against odekit's
  field at start-up), the consistent ``y'(t0)`` given (the same slope odekit
  starts bdf from: ``odekit.ode.linalg.mass_matrix.MassMatrix.slope``).

* diffsol's BDF through pydiffsol when installed: the problem as a DiffSL
  model (``M_i`` over ``dudt_i``, started at the same consistent slope;
  its right-hand side checked against odekit's field at start-up), dense
  nalgebra LU, Jacobian by its JIT; no work counts (pydiffsol reports none).

Per problem, rtol and contender: time of warm calls (medians of interleaved
rounds: every contender called once per round), first call (odekit: trace +
compile + run of a fresh jit; IDA: construction + solve), work counts, and
the error at the end time against the reference: max abs and in tolerance
units, max |y - ref| / (atol + rtol |ref|).

Run: ``OPENBLAS_NUM_THREADS=1 python benchmarks/dae.py`` writes
benchmarks/results/dae.md (``--quick``: rtol 1e-6 only, 3 rounds;
``--no-write``: print only).
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
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import odekit  # noqa: E402
from odekit.ode.linalg import mass_matrix as mass_matrices  # noqa: E402
from odekit.testing.dae_problems import DAE_PROBLEMS, DAEProblem  # noqa: E402

PROBLEM_NAMES = ("akzo_nobel", "transistor_amplifier")
RTOLS = (1e-5, 1e-6, 1e-7)
ODEKIT_METHODS = ("rodas5p", "bdf")


def check_numpy_fields() -> None:
    """The NumPy fields IDA gets (``DAEProblem.numpy_fun``: odekit's would charge IDA
    tens of microseconds of JAX dispatch per residual) equal the JAX fields."""
    for name in PROBLEM_NAMES:
        p = DAE_PROBLEMS[name]
        for t, y in ((p.t_span[0], p.y0), (p.t_span[1], p.reference), (0.0123, p.reference)):
            ours = np.asarray(p.fun(jnp.asarray(t), jnp.asarray(y), *map(jnp.asarray, p.args)))
            np.testing.assert_allclose(p.numpy_fun(t, np.asarray(y), *p.args), ours,
                                       rtol=1e-12, atol=1e-15)


def consistent_slope(p: DAEProblem) -> np.ndarray:
    """y'(t0) with ``M y' = f`` and the algebraic equations' derivative zero."""
    args = tuple(jnp.asarray(a) for a in p.args)
    t0, y0 = jnp.asarray(p.t_span[0]), jnp.asarray(p.y0)
    field = lambda t, y: p.fun(t, y, *args)
    mass = mass_matrices.from_argument(p.mass_matrix, y0.shape[0], "benchmarks/dae.py")
    f_t = jax.jvp(lambda t: field(t, y0), (t0,), (jnp.ones_like(t0),))[1]
    jac = jax.jacfwd(field, argnums=1)(t0, y0)
    return np.asarray(mass.slope(field(t0, y0), lambda v: jac @ v, f_t))


# --- contenders -----------------------------------------------------------------

class Run(NamedTuple):
    """``call()`` solves once; ``final(out)`` is y(t1); ``work(out)`` the counts;
    ``fresh()`` a new call whose first use pays what a first call pays."""
    call: Callable[[], Any]
    final: Callable[[Any], np.ndarray]
    work: Callable[[Any], dict]
    fresh: Callable[[], Callable[[], Any]]


def odekit_run(p: DAEProblem, method: str, rtol: float, atol: float) -> Run:
    args = tuple(jnp.asarray(a) for a in p.args)
    y0, t1 = jnp.asarray(p.y0), p.t_span[1]

    def build() -> Callable[[], Any]:
        @jax.jit
        def solve(y0, args):
            sol = odekit.solve_ivp(p.fun, p.t_span, y0, args=args, method=method, rtol=rtol,
                                   atol=atol, mass_matrix=p.mass_matrix, t_eval=jnp.array([t1]),
                                   max_steps=100_000)
            return sol.ys[-1], sol.stats, sol.status
        return lambda: solve(y0, args)

    def final(out):
        if int(out[2]) < 0:
            raise RuntimeError(f"odekit {method} failed on {p.name}: status {int(out[2])}")
        return np.asarray(out[0])

    work = lambda out: {k: int(out[1][k]) for k in ("num_steps", "nfev", "njev", "nlu")}
    return Run(build(), final, work, build)


def ida_run(p: DAEProblem, rtol: float, atol: float) -> Run:
    from sksundae.ida import IDA

    mass, field, params = p.mass_matrix, p.numpy_fun, np.asarray(p.args[0])
    yp0 = consistent_slope(p)
    algebraic = [i for i in range(mass.shape[0]) if not np.any(mass[i]) and not np.any(mass[:, i])]

    def residual(t, y, yp, res):
        res[:] = mass @ yp - field(t, y, params)

    def build() -> Callable[[], Any]:
        state = {}

        def call():
            if "solver" not in state:     # construction is part of the first call
                state["solver"] = IDA(residual, rtol=rtol, atol=atol, max_num_steps=1_000_000,
                                      algebraic_idx=algebraic or None)
            sol = state["solver"].solve(np.array(p.t_span), np.array(p.y0), yp0)
            if not sol.success:
                raise RuntimeError(f"IDA failed on {p.name}: {sol.message}")
            return sol
        return call

    return Run(build(), lambda sol: np.asarray(sol.y)[-1],
               lambda sol: {"num_steps": len(sol.t) - 1, "nfev": int(sol.nfev),
                            "njev": int(sol.njev), "nlu": "n/a"}, build)


def _diffsl(p: DAEProblem, slope: np.ndarray) -> str:
    """The problem as a DiffSL model (diffsol's input language): ``M_i`` holds
    the rows of ``M y'`` over ``dudt_i`` (started at the consistent slope),
    ``F_i`` the field, ``in_i`` the parameters in ``p.parameters``' order."""
    params = ", ".join(f"{name} = {float(value)!r}" for name, value in zip(p.parameters, p.args[0]))
    states = ", ".join(f"y{i + 1} = {float(v)!r}" for i, v in enumerate(p.y0))
    slopes = ", ".join(f"dy{i + 1} = {float(v)!r}" for i, v in enumerate(slope))
    mass = ",\n    ".join(" + ".join(f"({float(c)!r}) * dy{j + 1}" for j, c in enumerate(row) if c) or "0"
                          for row in p.mass_matrix)
    if p.name == "akzo_nobel":
        field = """
    -2.0 * r1 + r2 - r3 - r4,
    -0.5 * r1 - r4 - 0.5 * r5 + klA * (pCO2 / H - y2),
    r1 - r2 + r3,
    -r2 + r3 - 2.0 * r4,
    r2 - r3 + r5,
    Ks * y1 * y4 - y6,"""
        extra = """
r1 { k1 * y1 * y1 * y1 * y1 * sqrt(y2) }
r2 { k2 * y3 * y4 }
r3 { k2 / K * y1 * y5 }
r4 { k3 * y1 * y4 * y4 }
r5 { k4 * y6 * y6 * sqrt(y2) }"""
    else:
        field = """
    (y1 - Ue) / R0,
    y2 / R1 + (y2 - Ub) / R2 + (1.0 - alpha) * g23,
    y3 / R3 - g23,
    (y4 - Ub) / R4 + alpha * g23,
    y5 / R5 + (y5 - Ub) / R6 + (1.0 - alpha) * g56,
    y6 / R7 - g56,
    (y7 - Ub) / R8 + alpha * g56,
    y8 / R9,"""
        extra = """
Ue { 0.1 * sin(200.0 * 3.141592653589793 * t) }
g23 { beta * (exp((y2 - y3) / UF) - 1.0) }
g56 { beta * (exp((y5 - y6) / UF) - 1.0) }"""
    return (f"in_i {{ {params} }}\nu_i {{ {states} }}\ndudt_i {{ {slopes} }}\n"
            f"M_i {{\n    {mass},\n}}\n{extra}\nF_i {{{field}\n}}\n")


def diffsol_run(p: DAEProblem, rtol: float, atol: float) -> Run:
    import pydiffsol

    code, params = _diffsl(p, consistent_slope(p)), np.asarray(p.args[0], dtype=float)
    t_out = np.array([p.t_span[1]])

    def build() -> Callable[[], Any]:
        state = {}

        def call():
            if "ode" not in state:       # JIT-compiling the model is part of the first call
                ode = pydiffsol.Ode(code, matrix_type=pydiffsol.nalgebra_dense,
                                    linear_solver=pydiffsol.lu, ode_solver=pydiffsol.bdf)
                ode.rtol, ode.atol = rtol, atol
                state["ode"] = ode
            return state["ode"].solve_dense(params, t_out)
        return call

    return Run(build(), lambda sol: np.asarray(sol.ys)[:, -1],
               lambda sol: {"num_steps": "n/a", "nfev": "n/a", "njev": "n/a", "nlu": "n/a"}, build)


def check_diffsl_models() -> None:
    """diffsol's right-hand side of each DiffSL model equals odekit's field."""
    import pydiffsol
    for name in PROBLEM_NAMES:
        p = DAE_PROBLEMS[name]
        ode = pydiffsol.Ode(_diffsl(p, consistent_slope(p)), matrix_type=pydiffsol.nalgebra_dense)
        for t, y in ((p.t_span[0], p.y0), (0.0123, p.reference)):
            ours = np.asarray(p.fun(jnp.asarray(t), jnp.asarray(y), *map(jnp.asarray, p.args)))
            np.testing.assert_allclose(np.asarray(ode.rhs(np.asarray(p.args[0]), t, np.asarray(y))),
                                       ours, rtol=1e-12, atol=1e-15)


def contenders(p: DAEProblem, rtol: float, atol: float) -> dict[str, Run]:
    runs = {f"odekit {m}": odekit_run(p, m, rtol, atol) for m in ODEKIT_METHODS}
    if importlib.util.find_spec("sksundae") is not None:
        runs["IDA (scikit-sundae)"] = ida_run(p, rtol, atol)
    if importlib.util.find_spec("pydiffsol") is not None:
        runs["diffsol BDF (pydiffsol)"] = diffsol_run(p, rtol, atol)
    return runs


def measure(name: str, rtol: float, rounds: int, log: Callable[[str], None]) -> list[dict]:
    """One row per contender: timings of the ones that solved, the failure's
    message for one that did not (a failure is a result, not a crash)."""
    p = DAE_PROBLEMS[name]
    atol = p.atol * rtol / p.rtol
    runs, failed = contenders(p, rtol, atol), {}
    outs = {}
    for key, run in list(runs.items()):
        try:
            out = run.call()
            run.final(out)               # odekit's final() raises on a failed status
            outs[key] = out
        except Exception as error:  # noqa: BLE001 - the solver's failure is the row
            failed[key] = f"failed: {str(error).splitlines()[0][:120]}"
            del runs[key]
            log(f"{name} rtol={rtol:g} {key}: {failed[key]}")
    first = harness.interleaved_first_calls({k: r.fresh for k, r in runs.items()}, repeats=1)
    times = harness.interleaved_medians({k: r.call for k, r in runs.items()}, rounds=rounds)
    ida = times.get("IDA (scikit-sundae)")
    rows = []
    for key, run in runs.items():
        error = np.abs(run.final(outs[key]) - p.reference)
        rows.append(dict(problem=name, solver=key, rtol=rtol, atol=atol, time=times[key],
                         vs_ida=times[key] / ida if ida else None, first=first[key],
                         work=run.work(outs[key]), error=float(np.max(error)),
                         scaled=float(np.max(error / (atol + rtol * np.abs(p.reference))))))
        log(f"{name} rtol={rtol:g} {key}: {times[key] * 1e3:.3g} ms, error/tol "
            f"{rows[-1]['scaled']:.3g}")
    rows += [dict(problem=name, solver=key, rtol=rtol, atol=atol, failure=message)
             for key, message in failed.items()]
    return rows


HEADER = ["problem", "solver", "rtol", "atol", "time (ms)", "vs IDA", "first call (s)", "steps",
          "nfev", "njev", "nlu", "max abs error", "error / tol"]


def table(results: list[dict]) -> str:
    rows = [[r["problem"], r["solver"], f"{r['rtol']:.0e}", f"{r['atol']:.0e}", r["time"] * 1e3,
             "n/a" if r["vs_ida"] is None else r["vs_ida"], r["first"],
             *(r["work"][k] for k in ("num_steps", "nfev", "njev", "nlu")),
             f"{r['error']:.2e}", r["scaled"]] if "failure" not in r else
            [r["problem"], r["solver"], f"{r['rtol']:.0e}", f"{r['atol']:.0e}", r["failure"],
             *["-"] * (len(HEADER) - 5)] for r in results]
    return harness.markdown_table(HEADER, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="rtol 1e-6 only, 3 rounds")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved timing rounds")
    parser.add_argument("--out", default=harness.RESULTS_DIR, help="results folder")
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args()
    log = lambda text: print(text, file=sys.stderr, flush=True)
    check_numpy_fields()
    if importlib.util.find_spec("pydiffsol") is not None:
        check_diffsl_models()
    rtols, rounds = ((1e-6,), 3) if options.quick else (RTOLS, options.rounds)
    start = time.perf_counter()
    results = [r for name in PROBLEM_NAMES for rtol in rtols for r in measure(name, rtol, rounds, log)]
    have_ida = importlib.util.find_spec("sksundae") is not None
    text = "\n\n".join([
        "# Index-1 DAEs of the Bari test set: odekit rodas5p and bdf against SUNDIALS IDA "
        "and diffsol",
        f"{harness.machine_description()}; OPENBLAS_NUM_THREADS="
        f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; IDA "
        + ("through scikit-sundae" if have_ida else "not installed (no rows)")
        + ("; diffsol through pydiffsol" if importlib.util.find_spec("pydiffsol")
           else "; pydiffsol not installed (no diffsol rows)")
        + f"; {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
        + (" (quick mode)" if options.quick else "")
        + f"; {time.perf_counter() - start:.0f} s in all.",
        f"`python benchmarks/dae.py{' --quick' if options.quick else ''}`. time = median of "
        f"{rounds} interleaved rounds (each contender called once per round); first call = "
        "trace + compile + run of a fresh jit (odekit), construction + solve (IDA). atol = "
        "the problem's suggested atol scaled with rtol (Akzo Nobel 1e-4 rtol, transistor "
        "amplifier rtol). error = max abs deviation at the end time from the test set's "
        "published reference (PSIDE at tight tolerances); error / tol = max |e| / (atol + "
        "rtol |ref|). IDA: dense LU, difference-quotient Jacobian, NumPy residual, consistent "
        "y'(t0) given; its steps are its output points, njev its Jacobian evaluations. "
        "diffsol: first call = DiffSL JIT + solve.",
        table(results)])
    print(text)
    if not options.no_write:
        harness.write_result("dae", text, options.out)


if __name__ == "__main__":
    main()
