"""An electronic circuit as a differential-algebraic equation: the transistor
amplifier of the Bari test set, solved by bdf and rodas5p with a singular
mass matrix and checked against the test set's published reference.

Model (test set problem "transamp"; Rentrop, Roche & Steinebach 1989;
Hairer & Wanner, Solving ODEs II, 2nd ed., Sec. VII): Kirchhoff's current law
at the 8 nodes of a two-stage amplifier gives ``M y' = f(t, y)`` for the node
voltages y1..y8, where the capacitors C_k = k 1e-6 F (k = 1..5) make up M and
the resistors (R0 = 1000, R1..R9 = 9000 ohm) and the two transistors
(current beta (exp((y_b - y_e) / UF) - 1), beta = 1e-6, UF = 0.026 V,
alpha = 0.99 of it to the collector) make up f; Ub = 6 V supplies the
circuit and the input is Ue(t) = 0.1 sin(200 pi t) V, the output y8. M has
rank 5 and no zero row or column: the three capacitors between two nodes
leave one combination of each pair algebraic (f1 + f2 = f4 + f5 = f7 + f8 =
0, found from M's null space). The field, M, the consistent y0 = (0, 3, 3,
6, 3, 3, 6, 0) and the reference value at t = 0.2 (PSIDE at rtol 1e-14) are
in ``odekit.testing.DAE_PROBLEMS["transistor_amplifier"]``.

The transistors switch in sharp pulses: both methods take small steps around
each, large ones in between (the second panel). We print their work
(steps, Jacobians, LU factorizations), the time per solve, and the error at
t = 0.2 in units of the tolerance (with --quick, a shorter span: the two
methods' end values against each other).

Run: ``python examples/dae_circuit.py [--quick] [--out DIR]``; writes
dae_circuit.png.
"""
from __future__ import annotations

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np

import odekit
from odekit.testing import DAE_PROBLEMS, constraint_error

PROBLEM = DAE_PROBLEMS["transistor_amplifier"]
TOL = dict(rtol=PROBLEM.rtol, atol=PROBLEM.atol)        # 1e-6, 1e-6 (the test set's atol = rtol)
METHODS = ("bdf", "rodas5p")
MAX_STEPS = 20_000                                      # the record of accepted steps


def solve(method, t_end):
    """Every accepted step of the solve on [0, t_end]."""
    return odekit.solve_ivp(PROBLEM.fun, (0.0, t_end), jnp.asarray(PROBLEM.y0),
                            args=(jnp.asarray(PROBLEM.args[0]),), method=method,
                            mass_matrix=PROBLEM.mass_matrix, max_steps=MAX_STEPS, **TOL)


def _solver(method, t_end):
    return lambda: solve(method, t_end)


def scaled(difference, reference):
    """``max_i |difference_i| / (atol + rtol |reference_i|)``."""
    return float(np.max(np.abs(difference) / (TOL["atol"] + TOL["rtol"] * np.abs(reference))))


def main():
    opts = _common.parse_args(__doc__)
    t_end = 0.05 if opts.quick else PROBLEM.t_span[1]
    results = {}
    for method in METHODS:
        run = jax.jit(_solver(method, t_end))
        sol = run()
        n = int(sol.num_points)
        results[method] = dict(
            ts=np.asarray(sol.ts[:n]), ys=np.asarray(sol.ys[:n]), status=int(sol.status),
            stats={k: int(v) for k, v in sol.stats.items() if k != "order_counts"},
            time=_common.median_time(run, 1 if opts.quick else 5))
    ends = {m: r["ys"][-1] for m, r in results.items()}
    rows = []
    for method, r in results.items():
        s = r["stats"]
        constraint = constraint_error(PROBLEM, t_end, ends[method], **TOL)
        error = "-" if opts.quick else scaled(ends[method] - PROBLEM.reference, PROBLEM.reference)
        rows.append((method, r["status"], s["num_accepted"], s["num_rejected"], s["nfev"],
                     s["njev"], s["nlu"], r["time"] * 1e3, constraint, error))
    print(f"transistor amplifier (index-1 DAE, n = 8, rank M = 5) on [0, {t_end:g}], "
          f"rtol {TOL['rtol']:g}, atol {TOL['atol']:g}")
    _common.print_table(["method", "status", "steps", "rejected", "nfev", "njev", "nlu",
                         "time (ms)", "constraint (tol units)",
                         "error at 0.2 vs test set (tol units)"], rows)
    between = scaled(ends["bdf"] - ends["rodas5p"], ends["rodas5p"])
    print(f"end value at t = {t_end:g}, bdf vs rodas5p: {between:.2f} tolerance units")

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    styles = {"bdf": dict(color="C0", lw=1.2), "rodas5p": dict(color="C3", lw=1.0, ls="--")}
    fine = np.linspace(0.0, t_end, 4001)
    axes[0].plot(fine, 0.1 * np.sin(200 * np.pi * fine), color="0.5", lw=1, label="input Ue(t)")
    for method, r in results.items():
        s = r["stats"]
        axes[0].plot(r["ts"], r["ys"][:, 7], label=f"output y8, {method}: {s['num_accepted']} "
                     f"steps, {s['njev']} Jacobians, {s['nlu']} LUs", **styles[method])
        axes[1].semilogy(r["ts"][1:], np.diff(r["ts"]), ".", ms=2, color=styles[method]["color"],
                         label=method)
    axes[0].set(xlabel="t (s)", ylabel="voltage (V)",
                title=f"transistor amplifier, rtol {TOL['rtol']:g}: input and output")
    axes[0].set_ylim(top=3.0)                          # room for the legend above the pulses
    axes[0].legend(fontsize=8, loc="upper left")
    axes[1].set(xlabel="t (s)", ylabel="step size h (s)",
                title="small steps where the transistors switch")
    axes[1].legend(fontsize=8)
    _common.save_figure(fig, opts.out, "dae_circuit")
    worst = max(row[8] for row in rows)
    if any(r["status"] != 0 for r in results.values()) or worst > 1.0 or between > 100.0:
        raise SystemExit(f"check failed: statuses {[r['status'] for r in results.values()]}, "
                         f"constraint {worst:.2g}, bdf vs rodas5p {between:.2g}")


if __name__ == "__main__":
    main()
