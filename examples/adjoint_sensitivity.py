"""Sensitivity study of a seasonal SEIR epidemic: every adjoint, forward mode
and finite differences on 10 parameters, with agreement and timings.

Model (fractions of a population, time in days):
    beta(t) = beta0 (1 + a cos(2 pi t / 365))
    S' = mu - beta S I - mu S + w R        E' = beta S I - (sigma + mu) E
    I' = sigma E - (gamma + mu) I           R' = gamma I - (w + mu) R
Parameters theta (10,) = (beta0, a, sigma, gamma, w, mu, S0, E0, I0, R0).
Objective J(theta) = mean_k I(t_k) over n output days (the mean prevalence).
dJ/dtheta comes from jax.grad with adjoint="checkpoint", "backsolve" and
"interpolate", from jax.jacfwd with adjoint="forward", and from central
differences; the time-resolved sensitivities dI(t_k)/dtheta (n, 10) come
from jax.jacfwd and are plotted.

Run: ``python examples/adjoint_sensitivity.py [--quick] [--out DIR]``;
writes adjoint_sensitivity.png.
"""
from __future__ import annotations

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np

import odekit

NAMES = ("beta0", "a", "sigma", "gamma", "w", "mu", "S0", "E0", "I0", "R0")
THETA = np.array([0.5, 0.2, 1 / 5.2, 1 / 7.0, 1 / 180.0, 1 / (70 * 365.0),
                  0.99, 0.005, 0.005, 0.0])
ADJOINTS = ("checkpoint", "backsolve", "interpolate")
RTOL, ATOL = 1e-8, 1e-11
REFERENCE = 'grad, adjoint="checkpoint"'


def seir(t, y, beta0, a, sigma, gamma, w, mu):
    """The SEIR vector field: y = (S, E, I, R), shape (4,) -> (4,)."""
    s, e, i, r = y[0], y[1], y[2], y[3]
    infection = beta0 * (1.0 + a * jnp.cos(2.0 * jnp.pi * t / 365.0)) * s * i
    return jnp.stack([mu - infection - mu * s + w * r,
                      infection - (sigma + mu) * e,
                      sigma * e - (gamma + mu) * i,
                      gamma * i - (w + mu) * r])


def prevalence(theta, ts, adjoint):
    """I(t_k) for theta (10,) at output days ts (n,): shape (n,)."""
    sol = odekit.solve_ivp(seir, (0.0, ts[-1]), theta[6:], t_eval=ts, args=tuple(theta[:6]),
                           rtol=RTOL, atol=ATOL, adjoint=adjoint)
    return sol.ys[:, 2]


def objective(theta, ts, adjoint):
    """J(theta) = mean_k I(t_k), a scalar."""
    return jnp.mean(prevalence(theta, ts, adjoint))


def gradient_methods(ts):
    """Name -> function theta (10,) -> dJ/dtheta (10,), and the two shared jitted maps.

    Forward mode computes the whole (n, 10) Jacobian dI(t_k)/dtheta and
    averages it over k; finite differences average I(t_k) at theta +- h e_j.
    """
    methods = {f'grad, adjoint="{a}"': jax.jit(jax.grad(lambda th, a=a: objective(th, ts, a)))
               for a in ADJOINTS}
    sensitivities = jax.jit(jax.jacfwd(lambda th: prevalence(th, ts, "forward")))
    values = jax.jit(lambda th: prevalence(th, ts, "checkpoint"))
    methods['jacfwd, adjoint="forward"'] = lambda th: jnp.mean(sensitivities(th), axis=0)
    methods["central differences"] = lambda th: _common.central_differences(
        lambda x: np.mean(np.asarray(values(jnp.asarray(x)))), np.asarray(th))
    return methods, sensitivities, values


def compare(methods, repeats):
    """Gradient by every method, relative difference to finite differences, median time."""
    theta = jnp.asarray(THETA)
    results = {}
    for name, method in methods.items():
        try:
            results[name] = (np.asarray(method(theta)),
                             _common.median_time(lambda: method(theta), repeats))
        except odekit.status.ERRORS as error:
            print(f"{name} failed: {odekit.status.failure_message(error) or error}")
    fd = results["central differences"][0]
    rows = [(name, _common.relative_error(grad, fd) if grad is not fd else "(reference)",
             1e3 * seconds) for name, (grad, seconds) in results.items()]
    return results, rows


def plot(ts, sensitivities, trajectory, out_dir):
    """I(t) and the normalised sensitivities theta_j dI(t)/dtheta_j."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    axes[0].plot(ts, trajectory, color="k")
    axes[0].set(xlabel="day", ylabel="I(t)", title="Seasonal SEIR: infectious fraction")
    scaled = sensitivities * THETA[None, :]
    for j, name in enumerate(NAMES):
        if np.max(np.abs(scaled[:, j])) > 0:
            axes[1].plot(ts, scaled[:, j], lw=1.2, label=name)
    axes[1].set(xlabel="day", ylabel="theta_j dI(t)/dtheta_j",
                title='Time-resolved sensitivities (jax.jacfwd, adjoint="forward")')
    axes[1].legend(fontsize=7, ncol=2)
    return _common.save_figure(fig, out_dir, "adjoint_sensitivity")


def main():
    opts = _common.parse_args(__doc__)
    days, repeats = (120.0, 3) if opts.quick else (365.0, 7)
    ts = jnp.linspace(1.0, days, int(days))
    theta = jnp.asarray(THETA)
    methods, sensitivities, values = gradient_methods(ts)
    trajectory = np.asarray(values(theta))
    print(f"SEIR over {days:g} days, {len(NAMES)} parameters, J = mean I(t) = "
          f"{trajectory.mean():.6e}")
    results, rows = compare(methods, repeats)
    print("\ndJ/dtheta (checkpoint): " + ", ".join(
        f"{n} {g:.4g}" for n, g in zip(NAMES, results[REFERENCE][0])))
    print(f"\nAgreement with central differences and median time of {repeats} runs:")
    _common.print_table(["method", "rel. difference to FD", "time (ms)"], rows)
    sensitivities = np.asarray(sensitivities(theta))
    print(f"\ntime-resolved dI(t)/dtheta: shape {sensitivities.shape}")
    plot(np.asarray(ts), sensitivities, trajectory, opts.out)
    worst = max(row[1] for row in rows[:-1])
    if worst > 1e-4:
        raise SystemExit(f"sensitivities disagree with finite differences: {worst:.1e}")


if __name__ == "__main__":
    main()
