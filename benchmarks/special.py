"""How accurate and how fast are odekit's logistic functions against JAX and SciPy?

Prints (and writes to benchmarks/results/special.md) the worst error in ulps
against a 200-bit mpmath reference of the values and first derivatives of
odekit.special, the JAX counterpart (jax.scipy.special where it exists,
jax.nn otherwise) and scipy.special, in float32 and float64, then the jitted
time per million evaluations of odekit vs JAX. Draws special.png: the error of
each implementation along x.

    python benchmarks/special.py
"""
from __future__ import annotations

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mpmath  # noqa: E402
import numpy as np  # noqa: E402
import scipy.special as sps  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import RESULTS_DIR, interleaved_medians, machine_description, markdown_table, write_result  # noqa: E402

from odekit import special  # noqa: E402
from odekit.testing.special_domains import accuracy_grid  # noqa: E402

mpmath.mp.prec = 200
N = 1500  # points per grid part
ROUNDS = 200  # alternating timed calls per function


def _mp_expit(x):
    return 1 / (1 + mpmath.exp(-x))


# name -> (JAX name, JAX function, SciPy function, mpmath value, mpmath derivative)
CASES = {
    "expit": ("jax.scipy.special.expit", jax.scipy.special.expit, sps.expit,
              _mp_expit, lambda x: _mp_expit(x) * _mp_expit(-x)),
    "logit": ("jax.scipy.special.logit", jax.scipy.special.logit, sps.logit,
              lambda p: mpmath.log(p / (1 - p)), lambda p: 1 / (p * (1 - p))),
    "log_expit": ("jax.nn.log_sigmoid", jax.nn.log_sigmoid, sps.log_expit,
                  lambda x: -mpmath.log1p(mpmath.exp(-x)), lambda x: _mp_expit(-x)),
    "softplus": ("jax.nn.softplus", jax.nn.softplus, sps.softplus,
                 lambda x: mpmath.log1p(mpmath.exp(x)), _mp_expit),
}


def grid(name: str, dtype) -> np.ndarray:
    """The issue's accuracy domain: both tails on a log scale plus a dense middle."""
    return accuracy_grid(name, dtype, N, N)


def reference(fun, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mpmath values as float64 pairs hi + lo."""
    refs = [fun(mpmath.mpf(float(v))) for v in x]
    hi = np.array([float(r) for r in refs])
    lo = np.array([float(r - h) for r, h in zip(refs, hi)])
    return hi, lo


def ulps(got, hi, lo, dtype) -> np.ndarray:
    got = np.asarray(got, np.float64)
    spacing = np.spacing(np.abs((hi + lo).astype(dtype))).astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs((got - hi) - lo) / spacing
    return np.where(np.isnan(got) | np.isinf(got), np.inf, err)


def accuracy(name: str, dtype) -> tuple[list, dict]:
    jax_name, jax_fun, scipy_fun, mp_value, mp_slope = CASES[name]
    x = grid(name, dtype)
    hi, lo = reference(mp_value, x)
    dhi, dlo = reference(mp_slope, x)
    ours = getattr(special, name)
    xj = jnp.asarray(x)
    errors = {
        "odekit": ulps(jax.jit(ours)(xj), hi, lo, dtype),
        "jax": ulps(jax.jit(jax_fun)(xj), hi, lo, dtype),
        "scipy": ulps(scipy_fun(x), hi, lo, dtype),
    }
    d_ours = ulps(jax.jit(jax.vmap(jax.grad(ours)))(xj), dhi, dlo, dtype)
    d_jax = ulps(jax.jit(jax.vmap(jax.grad(jax_fun)))(xj), dhi, dlo, dtype)
    row = [name, np.dtype(dtype).name, errors["odekit"].max(), errors["jax"].max(),
           errors["scipy"].max(), d_ours.max(), d_jax.max()]
    return [float(v) if isinstance(v, np.floating) else v for v in row], dict(x=x, **errors)


def timing(name: str, dtype) -> list:
    jax_name, jax_fun = CASES[name][:2]
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 1_000_000) if name == "logit" else rng.uniform(-40, 40, 1_000_000)
    x = jnp.asarray(x.astype(dtype))
    ours, theirs = jax.jit(getattr(special, name)), jax.jit(jax_fun)
    times = interleaved_medians({"odekit": lambda: ours(x), "jax": lambda: theirs(x)}, ROUNDS)
    a, b = 1e3 * times["odekit"], 1e3 * times["jax"]
    return [name, np.dtype(dtype).name, jax_name, a, b, a / b]


def plot(curves: dict, path: str) -> None:
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharey=True)
    for col, name in enumerate(CASES):
        for row, dtype in enumerate(("float32", "float64")):
            ax = axes[row, col]
            data = curves[(name, dtype)]
            order = np.argsort(data["x"])
            xs = data["x"][order]
            xplot = xs if name == "logit" else np.sign(xs) * np.log10(1 + np.abs(xs))
            for label in ("jax", "scipy", "odekit"):
                ax.plot(xplot, np.clip(data[label][order], 1e-3, 1e5), ".", ms=1.5, label=label)
            ax.axhline(2, color="k", lw=0.8, ls="--")
            ax.set_yscale("log")
            ax.set_title(f"{name} {dtype}")
            ax.set_xlabel("p" if name == "logit" else "sign(x) log10(1 + |x|)")
    axes[0, 0].set_ylabel("error (ulp)")
    axes[1, 0].set_ylabel("error (ulp)")
    axes[0, 0].legend(markerscale=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    acc_rows, curves, time_rows = [], {}, []
    for name in CASES:
        for dtype in (np.float32, np.float64):
            row, data = accuracy(name, dtype)
            acc_rows.append(row)
            curves[(name, np.dtype(dtype).name)] = data
            time_rows.append(timing(name, dtype))
    acc = markdown_table(["function", "dtype", "odekit ulp", "JAX ulp", "scipy ulp",
                          "odekit d/dx ulp", "JAX d/dx ulp"], acc_rows)
    tim = markdown_table(["function", "dtype", "JAX counterpart", "odekit ms / 1e6",
                          "JAX ms / 1e6", "ratio"], time_rows)
    text = (f"# Logistic functions: worst error vs 200-bit mpmath, and speed\n\n{machine_description()}\n\n"
            "Worst error in ulps over the contract's domain (inf: nan/inf/0 where the truth is finite "
            "and normal). Contract: values <= 2 ulp, first derivatives <= 4 ulp.\n\n"
            f"{acc}\n\nJitted time per million evaluations (median of {ROUNDS} calls alternating one by one; "
            f"target ratio <= 1.5):\n\n{tim}\n")
    print(text)
    write_result("special", text)
    plot(curves, os.path.join(RESULTS_DIR, "special.png"))


if __name__ == "__main__":
    main()
