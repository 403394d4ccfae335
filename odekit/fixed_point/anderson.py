"""Anderson acceleration (type II) with restarts as the safeguard.

From the last ``m`` iterates ``x_i`` and residuals ``r_i = f(x_i) - x_i``
it solves the small constrained least-squares problem

    min_alpha |sum_i alpha_i r_i|^2   s.t.  sum_i alpha_i = 1

(normal equations on the Gram matrix scaled to unit diagonal, with the
scale-free Tikhonov term ``lam sum_i alpha_i^2 |r_i|^2``, default
``lam = 0.01 sqrt(eps)``) and proposes ``x+ = sum_i alpha_i (x_i + beta r_i)``.
Safeguard: the proposal is accepted only when its residual is finite and no
larger than the current one; otherwise the damped plain step ``x + beta r``
is taken and the history restarts from it. The history lives in fixed-size buffers with a
mask, so shapes are static under ``jit`` and ``vmap``.

References:
  Anderson (1965), J. ACM 12(4); Walker & Ni (2011), SIAM J. Numer. Anal.
  49(4); Zhang, O'Donoghue & Boyd (2020), SIAM J. Optim. 30(4) (safeguarded
  Anderson acceleration).
"""
from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from odekit._tree import tree_add, tree_all_finite, tree_sum_squares, tree_where, widest_dtype
from odekit.custom.iteration import Iterate, Method, parse_options
from odekit.custom.linear_solve import dense_solve
from odekit.fixed_point.iteration import check_damping, point

PyTree = Any


class History(NamedTuple):
    points: PyTree     # like x, each leaf with a leading axis of length m
    residuals: PyTree  # like x, each leaf with a leading axis of length m
    used: jax.Array    # (m,) bool, which slots hold a pair
    slot: jax.Array    # int32, the slot the next pair goes to


def _write(history: History, it: Iterate, slot: jax.Array, used: jax.Array) -> History:
    def put(buffer, leaf):
        return buffer.at[slot].set(leaf)
    m = used.shape[0]
    return History(jax.tree.map(put, history.points, it.x),
                   jax.tree.map(put, history.residuals, it.residual),
                   used.at[slot].set(True), (slot + 1) % m)


def _restart(history: History, it: Iterate) -> History:
    return _write(history, it, jnp.int32(0), jnp.zeros_like(history.used))


def _gram(residuals: PyTree, m: int) -> jax.Array:
    """``G[i, j] = <r_i, r_j>`` summed over the leaves, in the widest dtype."""
    dtype = widest_dtype(residuals)
    flat = [leaf.reshape(m, -1) for leaf in jax.tree.leaves(residuals)]
    return sum((r @ r.T).astype(dtype) for r in flat)


def _proposal(history: History, damping: float, regularization: float) -> PyTree:
    used = history.used
    m = used.shape[0]
    gram = _gram(history.residuals, m)
    norms = jnp.sqrt(jnp.diagonal(gram))
    norms = jnp.where(used & (norms > 0), norms, 1.0)
    pair = used[:, None] & used[None, :]
    scaled = jnp.where(pair, gram / (norms[:, None] * norms[None, :]), 0.0)
    system = scaled + jnp.diag(jnp.where(used, regularization, 1.0))
    weights = dense_solve(system, used.astype(gram.dtype) / norms) / norms
    weights = weights / jnp.sum(weights)

    def mix(points, residuals):
        return jnp.tensordot(weights.astype(points.dtype), points + damping * residuals, axes=1)
    return jax.tree.map(mix, history.points, history.residuals)


def _init(fun, x0, options):
    it = point(fun, x0)
    m = options["history"]
    empty = jax.tree.map(lambda leaf: jnp.zeros((m,) + leaf.shape, leaf.dtype), x0)
    history = History(empty, empty, jnp.zeros(m, bool), jnp.int32(0))
    return it, _restart(history, it)


def _step(fun, it, history, options):
    damping = options["damping"]
    candidate = point(fun, _proposal(history, damping, options["regularization"]))
    accept = (tree_all_finite(candidate.x, candidate.residual)
              & (tree_sum_squares(candidate.residual) <= tree_sum_squares(it.residual)))
    new = lax.cond(accept, lambda: candidate,
                   lambda: point(fun, tree_add(it.x, it.residual, damping)))
    pushed = _write(history, new, history.slot, history.used)
    return new, tree_where(accept, pushed, _restart(history, new))


def _check(options, dtype):
    regularization = 1e-2 * float(jnp.finfo(dtype).eps) ** 0.5
    defaults = {"history": 5, "damping": 1.0, "regularization": regularization}
    options = parse_options(options, defaults, "anderson")
    history, lam = options["history"], options["regularization"]
    if isinstance(history, bool) or not isinstance(history, numbers.Integral) or history < 1:
        raise ValueError(f"method 'anderson': history must be a positive int, got {history!r}.")
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not lam >= 0:
        raise ValueError(f"method 'anderson': regularization must be a float >= 0, got {lam!r}.")
    options["history"], options["regularization"] = int(history), float(lam)
    return check_damping(options, "anderson")


ANDERSON = Method("anderson", _init, _step, _check)
