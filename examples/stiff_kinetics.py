"""Stiff chemical kinetics: Robertson's reactions solved by method="auto",
with the sensitivities of every species to every rate constant.

Model (Robertson 1966, the standard stiff test problem):
    A -> B (k1),   B + B -> C + B (k2),   B + C -> A + C (k3)
    y1' = -k1 y1 + k3 y2 y3
    y2' =  k1 y1 - k2 y2^2 - k3 y2 y3
    y3' =  k2 y2^2
with k = (0.04, 3e7, 1e4) and y(0) = (1, 0, 0); y1 + y2 + y3 = 1 for all t.
The fast reactions make it stiff after a short transient: an explicit method
is held at its stability limit (steps of ~1e-3) for the whole span.
``solve_ivp(method="auto")`` starts with tsit5, whose stiffness verdict hands
the rest of the span to the L-stable Rosenbrock method rodas5p in mid-course.
We compare with SciPy's Radau at tight tolerances, check mass conservation,
and take the normalized sensitivities d y_i / d log k_j at every output time
by ``jax.jacfwd`` with ``adjoint="forward"``, checked against central
differences; ``jax.grad`` of a scalar goes through the default checkpoint
adjoint.

Run: ``python examples/stiff_kinetics.py [--quick] [--out DIR]``; writes
stiff_kinetics.png.
"""
from __future__ import annotations

import time

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

import odekit

RATES = np.array([0.04, 3e7, 1e4])
Y0 = jnp.array([1.0, 0.0, 0.0])
TOL = dict(rtol=1e-6, atol=1e-10)
# Derivatives are checked against central differences of solves at tight
# tolerances: at rtol 1e-6 a difference quotient of two solves is dominated
# by their discretisation error (the steps change with the parameters).
TIGHT = dict(rtol=1e-10, atol=1e-14)
SPECIES = ("y1 (A)", "y2 (B) x 1e4", "y3 (C)")


def robertson(t, y, k):
    """The reaction rates y' (3,) for rate constants k (3,)."""
    return jnp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
                      k[1] * y[1] ** 2])


def solve(log_k, t_end, t_eval=None, method="auto", adjoint="checkpoint", tol=TOL):
    """Robertson's solution for rate constants exp(log_k)."""
    return odekit.solve_ivp(robertson, (0.0, t_end), Y0, t_eval=t_eval,
                            args=(jnp.exp(log_k),), method=method, adjoint=adjoint,
                            max_steps=50_000, **tol)


def radau(t_eval, t_end):
    """SciPy Radau at rtol 1e-10, atol 1e-14 (the reference), (n, 3)."""
    rates = jnp.asarray(RATES)
    jitted = jax.jit(robertson)
    jacobian = jax.jit(jax.jacfwd(robertson, argnums=1))
    field = lambda t, y: np.asarray(jitted(t, jnp.asarray(y), rates))
    jac = lambda t, y: np.asarray(jacobian(t, jnp.asarray(y), rates))
    sol = scipy.integrate.solve_ivp(field, (0.0, t_end), np.asarray(Y0), method="Radau",
                                    t_eval=np.asarray(t_eval), rtol=1e-10, atol=1e-14, jac=jac)
    return sol.y.T


def main():
    opts = _common.parse_args(__doc__)
    t_end = 1e5 if opts.quick else 1e9
    ts = jnp.geomspace(1e-5, t_end, 40 if opts.quick else 120)
    log_k = jnp.log(jnp.asarray(RATES))

    values = jax.jit(lambda lk: solve(lk, t_end, ts).ys)
    ys = np.asarray(values(log_k))
    steps = jax.jit(lambda lk: solve(lk, t_end))(log_k)          # every accepted step
    alone = jax.jit(lambda lk: solve(lk, t_end, method="rodas5p"))(log_k)
    n, n_alone = int(steps.num_points), int(alone.num_points)
    stats = {k: int(v) for k, v in steps.stats.items()}
    reference = radau(ts, t_end)
    error = np.max(np.abs(ys - reference))
    mass = np.max(np.abs(ys.sum(axis=1) - 1.0))
    runtime = _common.median_time(lambda: values(log_k), 3 if opts.quick else 11)
    print(f"Robertson to t = {t_end:g}, method='auto', rtol {TOL['rtol']:g}, "
          f"atol {TOL['atol']:g}: {runtime * 1e3:.1f} ms")
    print(f"steps: {stats['num_steps']} attempted, {stats['njev']} of them rodas5p's "
          f"(Jacobians: njev {stats['njev']}, LU: nlu {stats['nlu']}); rodas5p over the "
          f"whole span: {int(alone.stats['num_steps'])} steps")
    print(f"max abs error against SciPy Radau (rtol 1e-10): {error:.1e}; "
          f"mass conservation |y1 + y2 + y3 - 1| <= {mass:.1e}")

    # d y_i(t) / d log k_j at every output time: (n, 3, 3)
    start = time.perf_counter()
    forward = jax.jit(jax.jacfwd(lambda lk: solve(lk, t_end, ts, adjoint="forward",
                                                  tol=TIGHT).ys))
    sens = np.asarray(forward(log_k))
    first = time.perf_counter() - start
    tight = jax.jit(lambda lk: solve(lk, t_end, ts, tol=TIGHT).ys)
    fd = _common.central_differences(lambda lk: tight(jnp.asarray(lk)), np.asarray(log_k),
                                     rel_step=1e-5)
    scale = np.abs(fd).max(axis=0, keepdims=True)        # per species and rate constant
    fd_error = float(np.max(np.abs(sens - fd) / scale))
    # jax.grad of a scalar (the peak of the intermediate B) by the checkpoint adjoint
    peak = jax.jit(lambda lk: jnp.max(solve(lk, t_end, ts, tol=TIGHT).ys[:, 1]))
    grad = np.asarray(jax.jit(jax.grad(peak))(log_k))
    grad_fd = _common.central_differences(lambda lk: peak(jnp.asarray(lk)), np.asarray(log_k),
                                          rel_step=1e-5)
    print(f"\nsensitivities d y_i / d log k_j at {ts.shape[0]} times by jax.jacfwd "
          f"(adjoint='forward', rtol {TIGHT['rtol']:g}; first call {first:.1f} s), checked "
          f"against central differences of solves at the same tolerance")
    _common.print_table(["check", "largest relative difference"],
                        [("jacfwd vs central differences (per species and k_j)", fd_error),
                         ("grad of max y2 (checkpoint) vs central differences",
                          _common.relative_error(grad, grad_fd))])
    print(f"d max(y2) / d log k = {np.array2string(grad, precision=4)}")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    scales = np.array([1.0, 1e4, 1.0])
    for i in range(3):
        axes[0].plot(ts, ys[:, i] * scales[i], color=f"C{i}", label=SPECIES[i])
        axes[0].plot(ts, reference[:, i] * scales[i], "k:", lw=1)
    axes[0].set(xscale="log", xlabel="t", ylabel="concentration",
                title="Robertson: odekit auto (lines), SciPy Radau (dotted)")
    axes[0].legend(fontsize=8)
    for sol, count, label in ((steps, n, "auto (tsit5, then rodas5p)"),
                              (alone, n_alone, "rodas5p alone")):
        t_steps = np.asarray(sol.ts[:count])
        axes[1].loglog(t_steps[1:], np.diff(t_steps), ".", ms=3, label=label)
    axes[1].set(xlabel="t", ylabel="step size h",
                title="tsit5 held at its stability limit until the switch")
    axes[1].legend(fontsize=8)
    for j, name in enumerate(("k1", "k2", "k3")):
        axes[2].plot(ts, sens[:, 1, j] * 1e4, color=f"C{j}", label=f"d y2 / d log {name} x 1e4")
        axes[2].plot(ts, fd[:, 1, j] * 1e4, "k:", lw=1)
    axes[2].set(xscale="log", xlabel="t", ylabel="sensitivity",
                title="jax.jacfwd (lines), central differences (dotted)")
    axes[2].legend(fontsize=8)
    _common.save_figure(fig, opts.out, "stiff_kinetics")
    if error > 1e-4 or mass > 1e-10 or fd_error > 1e-4:
        raise SystemExit(f"check failed: error {error:.1e}, mass {mass:.1e}, fd {fd_error:.1e}")


if __name__ == "__main__":
    main()
