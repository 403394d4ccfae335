"""The damped pendulum: trajectories, phase portrait, adaptive steps, and the
gradient of the final energy by the adjoint, checked by finite differences.

Model: theta'' = -b theta' - g sin(theta), as y = (theta, omega) with
y' = (omega, -b omega - g sin(theta)), y(0) = (theta0, 0), t in [0, T].
Final energy E(T) = omega(T)^2 / 2 + g (1 - cos theta(T)) (per unit mass and
length). We print dE/d(b, g, theta0) from ``jax.grad`` through
``odekit.solve_ivp`` (checkpoint adjoint) next to central differences.

Run: ``python examples/pendulum.py [--quick] [--out DIR]``; writes pendulum.png.
"""
from __future__ import annotations

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np

import odekit

B, G, T_END = 0.25, 9.8, 10.0
RTOL, ATOL = 1e-10, 1e-12


def pendulum(t, y, b, g):
    """y = (theta, omega) -> y' = (omega, -b omega - g sin theta); shapes (2,) -> (2,)."""
    theta, omega = y[0], y[1]
    return jnp.stack([omega, -b * omega - g * jnp.sin(theta)])


def trajectory(theta0, ts, b=B, g=G):
    """The solution at ``ts`` (n,) from y(0) = (theta0, 0): shape (n, 2)."""
    y0 = jnp.stack([theta0, jnp.zeros_like(theta0)])
    return odekit.solve_ivp(pendulum, (0.0, T_END), y0, t_eval=ts, args=(b, g),
                            rtol=RTOL, atol=ATOL).ys


def final_energy(params):
    """E(T) for params = (b, g, theta0), shape (3,) -> ()."""
    b, g, theta0 = params[0], params[1], params[2]
    y = trajectory(theta0, jnp.array([T_END]), b, g)[-1]
    return 0.5 * y[1] ** 2 + g * (1.0 - jnp.cos(y[0]))


def step_sizes(theta0):
    """Accepted step times and sizes of an adaptive tsit5 solve from (theta0, 0)."""
    sol = odekit.solve_ivp(pendulum, (0.0, T_END), jnp.array([theta0, 0.0]), args=(B, G),
                           rtol=1e-6, atol=1e-9)
    ts = np.asarray(sol.ts)[: int(sol.num_points)]
    return ts[1:], np.diff(ts), sol.stats


def check_energy_gradient(theta0):
    """Print dE(T)/d(b, g, theta0) by the adjoint and by central differences."""
    params = np.array([B, G, theta0])
    adjoint = np.asarray(jax.jit(jax.grad(final_energy))(jnp.asarray(params)))
    energy = jax.jit(final_energy)
    fd = _common.central_differences(lambda p: energy(jnp.asarray(p)), params, rel_step=1e-5)
    print(f"\nFinal energy E({T_END:g}) = {float(energy(jnp.asarray(params))):.6f} "
          f"from theta0 = {theta0:g}")
    rows = [(name, float(a), float(f), abs(a - f) / abs(f))
            for name, a, f in zip(("b", "g", "theta0"), adjoint, fd)]
    _common.print_table(["parameter", 'dE/dp, adjoint="checkpoint"', "finite diff.",
                         "rel. difference"], rows)
    return max(row[3] for row in rows)


def plot(ts, theta0s, trajectories, steps, out_dir):
    """Angle vs time, phase portrait, and step size vs time."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for theta0, ys in zip(theta0s, trajectories):
        axes[0].plot(ts, ys[:, 0], lw=1, label=f"theta0 = {theta0:.2f}")
        axes[1].plot(ys[:, 0], ys[:, 1], lw=1)
    axes[0].set(xlabel="t", ylabel="theta", title="Damped pendulum, b = 0.25, g = 9.8")
    axes[0].legend(fontsize=7)
    axes[1].set(xlabel="theta", ylabel="omega", title="Phase portrait")
    t_steps, h, stats = steps
    axes[2].semilogy(t_steps, h, ".-", ms=3)
    axes[2].set(xlabel="t", ylabel="step size h",
                title=f"tsit5 steps, rtol 1e-6 ({stats['num_accepted']} accepted, "
                      f"{stats['num_rejected']} rejected)")
    return _common.save_figure(fig, out_dir, "pendulum")


def main():
    opts = _common.parse_args(__doc__)
    n_angles = 5 if opts.quick else 12
    theta0s = jnp.linspace(0.3, jnp.pi - 0.05, n_angles)
    ts = jnp.linspace(0.0, T_END, 201 if opts.quick else 1001)
    trajectories = odekit.ensemble(lambda th: trajectory(th, ts), theta0s)
    print(f"{n_angles} pendulums solved with odekit.ensemble on {jax.device_count()} device(s); "
          f"theta(T) range [{float(trajectories[:, -1, 0].min()):.4f}, "
          f"{float(trajectories[:, -1, 0].max()):.4f}]")
    steps = step_sizes(float(theta0s[-1]))
    stats = {k: int(v) for k, v in steps[2].items()}
    print(f"adaptive solve from theta0 = {float(theta0s[-1]):.3f}: {stats}; "
          f"step size from {steps[1].min():.3g} to {steps[1].max():.3g}")
    worst = check_energy_gradient(float(theta0s[-1]))
    print(f"largest relative difference adjoint vs finite differences: {worst:.2e}")
    plot(np.asarray(ts), np.asarray(theta0s), np.asarray(trajectories), steps, opts.out)
    if worst > 1e-5:
        raise SystemExit(f"gradient check failed: {worst:.2e} > 1e-5")


if __name__ == "__main__":
    main()
