"""Fit the four Lotka-Volterra parameters to noisy data with SciPy's L-BFGS-B
on odekit gradients, from several starting guesses, some of which break the
model.

Model: prey x and predators y,
    x' = alpha x - beta x y,      y' = delta x y - gamma y,
with (x, y)(0) = (10, 5) known. Data: the true solution at 40 times in
(0, 20] times log-normal noise (sigma 0.1, seed 0). We fit
p = log(alpha, beta, gamma, delta) (so the rates stay positive) by least
squares on the log data:
    L(p) = mean_k |log z(t_k; p) - log z_obs_k|^2,   z = (x, y).
Its gradient comes from jax.value_and_grad through odekit.solve_ivp. A guess
for which the solve fails (overflow, step limit: sol.success False, with
throw=False nothing is raised) gets a huge loss, so L-BFGS-B's line search backs
off instead of the fit crashing. (An infinite L would end L-BFGS-B at the
first failure with a false "convergence", so we return a large finite
FAILED_LOSS and a zero gradient.)

Run: ``python examples/fit_parameters.py [--quick] [--out DIR]``; writes fit_parameters.png.
"""
from __future__ import annotations

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

import odekit

NAMES = ("alpha", "beta", "gamma", "delta")
TRUE = np.array([1.0, 0.1, 1.5, 0.075])
Y0 = jnp.array([10.0, 5.0])
T_END, N_OBS, NOISE, SEED = 20.0, 41, 0.1, 0
# The loss of a failed solve: finite and far above any real loss. SciPy's
# L-BFGS-B stops at the first infinite value and reports convergence
# ("RELATIVE REDUCTION OF F <= FACTR*EPSMCH": from guess 0 it stopped after 2
# iterations at loss 0.40), while on a large finite value its line search
# shrinks the step and goes on.
FAILED_LOSS = 1e6
# Starting guesses (alpha, beta, gamma, delta). From guesses 0 and 2 the line
# search tries rates for which the solve fails; guess 2 (prey growth 40x too
# fast) also sits in a different basin of the loss.
STARTS = np.array([[0.7, 0.2, 1.0, 0.1],
                   [2.0, 0.05, 3.0, 0.2],
                   [40.0, 0.001, 0.05, 0.0005],
                   [0.3, 1.0, 5.0, 0.01]])


def lotka_volterra(t, z, alpha, beta, gamma, delta):
    """z = (x, y), shape (2,) -> z' (2,)."""
    x, y = z[0], z[1]
    return jnp.stack([alpha * x - beta * x * y, delta * x * y - gamma * y])


def simulate(params, ts):
    """The solution at ts (n,) for params (4,), without raising: an IVPSolution."""
    return odekit.solve_ivp(lotka_volterra, (0.0, T_END), Y0, t_eval=ts, args=tuple(params),
                            rtol=1e-8, atol=1e-8, max_steps=2000, throw=False)


def synthetic_data(ts):
    """True solution times exp(NOISE * N(0, 1)) noise from a fixed seed: shape (n, 2)."""
    clean = np.asarray(simulate(jnp.asarray(TRUE), ts).ys)
    noise = np.random.default_rng(SEED).normal(0.0, NOISE, clean.shape)
    return clean * np.exp(noise)


def make_objective(ts, data):
    """f(log_params (4,)) -> (L, dL/dlog_params) for SciPy; FAILED_LOSS, 0 where the solve fails."""
    log_data = jnp.log(jnp.asarray(data))

    def loss(log_params):
        sol = simulate(jnp.exp(log_params), ts)
        residual = jnp.log(jnp.abs(sol.ys)) - log_data
        return jnp.mean(residual ** 2), sol.status

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    failures = []

    def objective(log_params):
        (value, status), grad = value_and_grad(jnp.asarray(log_params))
        if int(status) < 0 or not np.isfinite(float(value)):
            failures.append((np.exp(log_params), odekit.status.message(int(status))))
            return FAILED_LOSS, np.zeros(4)
        return float(value), np.asarray(grad, dtype=np.float64)

    return objective, failures


def fit_from(start, objective, failures, max_iter):
    """One L-BFGS-B fit from ``start`` (4,); returns a summary dict."""
    failures.clear()
    result = scipy.optimize.minimize(objective, np.log(start), jac=True, method="L-BFGS-B",
                                     options={"maxiter": max_iter})
    return {"start": start, "params": np.exp(result.x), "loss": float(result.fun),
            "nit": int(result.nit), "nfev": int(result.nfev), "failed_solves": len(failures),
            "message": str(result.message),
            "failures": list(failures)}


def report(fits):
    """Print recovered vs true parameters for every start (fits: guess index -> summary)."""
    header = ["start", *NAMES, "loss", "iterations", "evaluations", "failed solves"]
    rows = [("true", *TRUE, "", "", "", "")]
    for i, fit in fits.items():
        rows.append((f"guess {i}", *fit["start"], "", "", "", ""))
        rows.append((f"fit {i}", *fit["params"], fit["loss"], fit["nit"], fit["nfev"],
                     fit["failed_solves"]))
    _common.print_table(header, rows)
    for i, fit in fits.items():
        print(f"fit {i}: {fit['message']}")
        for params, reason in fit["failures"]:
            print(f"  survived a failed solve at {np.array2string(params, precision=3)}: {reason}")
    best = min(fits.values(), key=lambda f: f["loss"])
    errors = np.abs(best["params"] - TRUE) / TRUE
    print("best fit: relative parameter errors " + ", ".join(
        f"{n} {e:.1%}" for n, e in zip(NAMES, errors)))
    return best


def plot(ts, data, best, out_dir):
    """Data, true model and the best fit."""
    fine = jnp.linspace(0.0, T_END, 400)
    true_curve = np.asarray(simulate(jnp.asarray(TRUE), fine).ys)
    fit_curve = np.asarray(simulate(jnp.asarray(best["params"]), fine).ys)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for j, (name, color) in enumerate((("prey x", "C0"), ("predators y", "C3"))):
        ax.plot(ts, data[:, j], "o", color=color, ms=4, label=f"{name}, data")
        ax.plot(fine, true_curve[:, j], ":", color=color, lw=1, label=f"{name}, true")
        ax.plot(fine, fit_curve[:, j], "-", color=color, lw=1.5, label=f"{name}, fit")
    ax.set(xlabel="t", ylabel="population",
           title="Lotka-Volterra fit: L-BFGS-B on odekit gradients")
    ax.legend(fontsize=8, ncol=3)
    return _common.save_figure(fig, out_dir, "fit_parameters")


def main():
    opts = _common.parse_args(__doc__)
    ts = jnp.linspace(0.0, T_END, N_OBS)[1:]
    data = synthetic_data(ts)
    objective, failures = make_objective(ts, data)
    chosen = [0, 2] if opts.quick else list(range(len(STARTS)))
    for i in chosen:
        value, _ = objective(np.log(STARTS[i]))
        print(f"guess {i} {STARTS[i]}: initial loss {value:.4g}")
    print(f"a failed solve counts as loss {FAILED_LOSS:g} with zero gradient")
    fits = {i: fit_from(STARTS[i], objective, failures, 100 if opts.quick else 300)
            for i in chosen}
    best = report(fits)
    plot(np.asarray(ts), data, best, opts.out)


if __name__ == "__main__":
    main()
