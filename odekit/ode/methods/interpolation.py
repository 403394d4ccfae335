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

import functools
from typing import Any, Callable

import jax
import numpy as np
from jax import lax

from odekit import _lax as ops
from odekit.ode.methods.explicit_tableaux import ButcherTableau
from odekit.ode.methods.rk_step import combine

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
        c = ops.cast(float(c), theta)
        acc = c if acc is None else lax.add(lax.mul(acc, theta), c)
    return lax.mul(acc, theta)


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
        dtype = y_leaf.dtype  # complex leaves: complex weights (strict promotion)
        shape = np.shape(theta) + y_leaf.shape
        state_axes = tuple(range(np.ndim(theta), len(shape)))
        window = lambda w: lax.broadcast_in_dim(lax.convert_element_type(w, dtype), shape,
                                                tuple(range(np.ndim(theta))))
        along = lambda v: lax.broadcast_in_dim(v, shape, state_axes)
        terms = [lax.mul(window(w), along(k)) for (w, _), k in zip(used, k_leaves)]
        acc = functools.reduce(lax.add, terms)
        return lax.add(along(y_leaf), lax.mul(ops.cast(h, y_leaf), acc))

    return jax.tree.map(leaf, y0, *[k for _, k in used])
