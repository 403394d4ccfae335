"""Steady state of a metabolic pathway with end-product inhibition, and its
sensitivities through the implicit function theorem.

Model (concentrations x = (x1, x2, x3), Michaelis-Menten enzymes, the end
product x3 inhibiting the supply):
    v0 = v_in / (1 + (x3 / K_i)^2),  v1 = V1 x1 / (K1 + x1),  v2 = V2 x2 / (K2 + x2)
    x1' = v0 - v1,   x2' = v1 - v2,   x3' = v2 - k_deg x3
Parameters theta (7,) = (v_in, K_i, V1, K1, V2, K2, k_deg); at the defaults
the steady state is exactly x* = (1/6, 1/2, 1) (flux 1/2).
odekit.root (Newton) solves f(x*, theta) = 0; jax.jacrev of it gives
dx*/dtheta = -(df/dx)^-1 df/dtheta (implicit gradient, no unrolling). We
check it against central differences of the root and against
jax.jacfwd of a long ODE solve x(T) (T = 100, adjoint="forward"), which
relaxes to x*.

Run: ``python examples/steady_state.py [--quick] [--out DIR]``; writes steady_state.png.
"""
from __future__ import annotations

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np

import odekit

NAMES = ("v_in", "K_i", "V1", "K1", "V2", "K2", "k_deg")
THETA = np.array([1.0, 1.0, 2.0, 0.5, 1.5, 1.0, 0.5])
EXACT = np.array([1.0 / 6.0, 0.5, 1.0])
X_GUESS = jnp.array([1.0, 1.0, 1.0])
# Long enough to relax to ~1e-11 of x* (the tolerance: near x* the explicit
# steps sit at their stability limit and y stays within it).
T_RELAX = 100.0


def pathway(x, theta):
    """The rates f(x, theta) = x', shapes (3,), (7,) -> (3,)."""
    v_in, k_i, v1max, k1, v2max, k2, k_deg = (theta[j] for j in range(7))
    v0 = v_in / (1.0 + (x[2] / k_i) ** 2)
    v1 = v1max * x[0] / (k1 + x[0])
    v2 = v2max * x[1] / (k2 + x[1])
    return jnp.stack([v0 - v1, v1 - v2, v2 - k_deg * x[2]])


def steady_state(theta):
    """x*(theta) (3,) with f(x*, theta) = 0, by Newton from X_GUESS."""
    return odekit.root(pathway, X_GUESS, theta).x


def relaxed_state(theta, ts):
    """The ODE solution x(t) from X_GUESS at ts (n,): shape (n, 3)."""
    return odekit.solve_ivp(lambda t, x, th: pathway(x, th), (0.0, ts[-1]), X_GUESS,
                            t_eval=ts, args=(theta,), rtol=1e-10, atol=1e-12,
                            adjoint="forward").ys


def sensitivities(theta):
    """dx*/dtheta (3, 7) three ways: implicit (jacrev of root), FD of root, long ODE solve."""
    implicit = np.asarray(jax.jit(jax.jacrev(steady_state))(theta))
    root = jax.jit(steady_state)
    fd = _common.central_differences(lambda th: root(jnp.asarray(th)), np.asarray(theta))
    final = jax.jit(jax.jacfwd(lambda th: relaxed_state(th, jnp.array([T_RELAX]))[-1]))
    return {"implicit (jax.jacrev of odekit.root)": implicit,
            "central differences of odekit.root": fd,
            f"jax.jacfwd of the ODE solve to t = {T_RELAX:g}": np.asarray(final(theta))}


def report(x_star, x_ode, results):
    """Print the steady state and the sensitivity table."""
    print(f"steady state x* = {np.array2string(x_star, precision=12)} "
          f"(exact {np.array2string(EXACT, precision=12)}, "
          f"error {np.max(np.abs(x_star - EXACT)):.1e})")
    print(f"ODE solve to t = {T_RELAX:g}: x = {np.array2string(x_ode, precision=12)} "
          f"(differs from x* by {np.max(np.abs(x_ode - x_star)):.1e})")
    implicit = results["implicit (jax.jacrev of odekit.root)"]
    print("\ndx*/dtheta (implicit gradient), rows x1, x2, x3:")
    _common.print_table(["x", *NAMES], [(f"x{i + 1}", *map(float, row))
                                        for i, row in enumerate(implicit)])
    print()
    _common.print_table(["sensitivities by", "rel. difference to implicit"],
                        [(name, _common.relative_error(jac, implicit) if jac is not implicit
                          else "(reference)") for name, jac in results.items()])


def plot(ts, trajectory, x_star, results, out_dir):
    """Relaxation to x*, and dx*/dtheta by the three methods."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i in range(3):
        axes[0].plot(ts, trajectory[:, i], color=f"C{i}", label=f"x{i + 1}(t)")
        axes[0].axhline(x_star[i], color=f"C{i}", ls=":", lw=1)
    axes[0].set(xscale="log", xlabel="t", ylabel="concentration",
                title="ODE relaxes to the root x* (dotted)")
    axes[0].legend()
    names = list(results)
    for i in range(3):  # bars: implicit; markers: the two checks
        x = np.arange(7) + (i - 1) * 0.27
        axes[1].bar(x, results[names[0]][i], 0.27, color=f"C{i}", label=f"x{i + 1}*")
        for name, marker in zip(names[1:], ("o", "x")):
            axes[1].plot(x, results[name][i], marker, color="k", ms=6, mfc="none",
                         label=name if i == 0 else None)
    axes[1].set_xticks(np.arange(7), NAMES)
    axes[1].set(ylabel="dx*/dtheta_j", title="Sensitivities: implicit gradient (bars) and checks")
    axes[1].legend(fontsize=8)
    return _common.save_figure(fig, out_dir, "steady_state")


def main():
    opts = _common.parse_args(__doc__)
    theta = jnp.asarray(THETA)
    x_star = np.asarray(jax.jit(steady_state)(theta))
    ts = jnp.geomspace(1e-2, T_RELAX, 60 if opts.quick else 400)
    trajectory = np.asarray(jax.jit(relaxed_state)(theta, ts))
    results = sensitivities(theta)
    report(x_star, trajectory[-1], results)
    plot(np.asarray(ts), trajectory, x_star, results, opts.out)
    implicit = results["implicit (jax.jacrev of odekit.root)"]
    worst = max(_common.relative_error(jac, implicit) for jac in results.values())
    if worst > 1e-6 or np.max(np.abs(x_star - EXACT)) > 1e-10:
        raise SystemExit(f"steady-state check failed: {worst:.1e}")


if __name__ == "__main__":
    main()
