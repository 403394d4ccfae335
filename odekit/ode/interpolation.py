"""Dense output of an explicit Runge-Kutta step.

Every tableau carries a matrix ``dense`` (S, p) such that, inside a step of
size h from (t0, y0) with stages k_1..k_S,

    y(t0 + theta h) = y0 + h sum_i k_i P_i(theta),
    P_i(theta) = sum_{j=0}^{p-1} dense[i, j] theta^(j+1),      0 <= theta <= 1.

Methods whose interpolant needs more stages than the step (Dormand-Prince
8(5,3): three) list them as ``extra_c`` / ``extra_a``; :func:`extend_stages`
evaluates them only when an output actually falls inside the step.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from odekit.ode.rk_step import combine
from odekit.ode.tableaux import ButcherTableau

Pytree = Any


def extend_stages(func: Callable, tableau: ButcherTableau, t0: jax.Array, y0: Pytree,
                  h: jax.Array, stages: tuple) -> tuple:
    """Append the tableau's extra dense-output stages to ``stages``."""
    stages = list(stages)
    for c_i, a_row in zip(tableau.extra_c, tableau.extra_a):
        y_i = combine(y0, h, a_row[:len(stages)], tuple(stages))
        stages.append(func(y_i, t0 + float(c_i) * h))
    return tuple(stages)


def _polynomial(coefficients: np.ndarray, theta: jax.Array) -> jax.Array:
    """sum_j coefficients[j] theta^(j+1) by Horner's rule, unrolled (no dot:
    on the CPU a library matmul inside the step loop costs more than the step)."""
    acc = None
    for c in coefficients[::-1]:
        acc = float(c) if acc is None else acc * theta + float(c)
    return acc * theta


def dense_weights(tableau: ButcherTableau, theta: jax.Array) -> list:
    """[P_i(theta) for every stage i]; ``theta`` of any shape; None for P_i = 0."""
    return [None if not np.any(row) else _polynomial(row, theta) for row in tableau.dense]


def evaluate(tableau: ButcherTableau, y0: Pytree, h: jax.Array, stages: tuple,
             theta: jax.Array) -> Pytree:
    """y(t0 + theta h) for a (window,) vector ``theta``: leaves get a leading
    window axis. ``stages`` must already be extended."""
    weights = dense_weights(tableau, theta)
    used = [(w, k) for w, k in zip(weights, stages) if w is not None]

    def leaf(y_leaf, *k_leaves):
        real = y_leaf.dtype  # complex leaves: complex weights (strict promotion)
        expand = lambda w: w.astype(real).reshape(w.shape + (1,) * y_leaf.ndim)
        acc = sum(expand(w) * k[None] for (w, _), k in zip(used, k_leaves))
        return y_leaf[None] + h.astype(real) * acc

    return jax.tree.map(leaf, y0, *[k for _, k in used])
