"""Anderson acceleration (type II) of memory ``m``, with a nonmonotone safeguard.

From the last ``m + 1`` iterates ``x_i`` and residuals ``r_i = f(x_i) - x_i``
(``m`` differences, Walker & Ni's ``Anderson(m)``; fewer after a restart) it
solves the small constrained least-squares problem

    min_alpha |sum_i alpha_i r_i|^2   s.t.  sum_i alpha_i = 1

(normal equations on the Gram matrix scaled to unit diagonal, with the
scale-free Tikhonov term ``lam sum_i alpha_i^2 |r_i|^2``, default
``lam = 0.01 sqrt(eps)``, solved by Gaussian elimination on the augmented
matrix, :func:`~odekit.custom.linear_solve.augmented_solve`) and proposes
``x+ = sum_i alpha_i (x_i + beta r_i)``, Walker & Ni's mixing with
``beta`` the damping. Without safeguard rejections this is their Algorithm
AA: on ``x = tanh(rho A x + b)`` with 200 unknowns it takes their steps to
the step (tests/fixed_point/test_anderson.py), and on a linear problem no
windowed Anderson takes fewer steps than unrestarted GMRES (De Sterck, He
& Krzysik, arXiv:2109.14181). The Gram matrix and the solve are in at
least float32 (LAPACK has no float16 or bfloat16), and the proposal is
cast back to each leaf's dtype.

Safeguard (nonmonotone, in the manner of Grippo, Lampariello & Lucidi): the
proposal is accepted when its residual is finite and no larger (2-norm)
than the largest residual in the history; otherwise the damped plain step
``x + beta r`` is taken and the history restarts from it. The bound never
grows between restarts, yet the residual may rise for a step or two, which
it does on a contraction whose Jacobian is far from normal (unknowns on
different scales) even when every step is good: a test against the
current residual alone rejects those steps, and each restart turns the
method back into plain iteration. The history lives in fixed-size buffers
with a mask, so shapes are static under ``jit`` and ``vmap``.

References:
  Anderson (1965), J. ACM 12(4); Walker & Ni (2011), SIAM J. Numer. Anal.
  49(4); Grippo, Lampariello & Lucidi (1986), SIAM J. Numer. Anal. 23(4)
  (nonmonotone acceptance); Zhang, O'Donoghue & Boyd (2020), SIAM J. Optim.
  30(4) (safeguarded Anderson acceleration).
"""
from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit._tree import tree_add, tree_all_finite, tree_where, widest_dtype
from odekit.custom.iteration import Iterate, Method, parse_options
from odekit.custom.linear_solve import augmented_solve
from odekit.fixed_point.iteration import check_damping, point

PyTree = Any


class History(NamedTuple):
    points: PyTree     # like x, each leaf with a leading axis of length m + 1
    residuals: PyTree  # like x, each leaf with a leading axis of length m + 1
    used: jax.Array    # (m + 1,) bool, which slots hold a pair
    slot: jax.Array    # int32, the slot the next pair goes to


def _write(history: History, it: Iterate, slot: jax.Array, used: jax.Array) -> History:
    def put(buffer, leaf):
        return buffer.at[slot].set(leaf)
    size = used.shape[0]
    return History(jax.tree.map(put, history.points, it.x),
                   jax.tree.map(put, history.residuals, it.residual),
                   used.at[slot].set(True), (slot + 1) % size)


def _restart(history: History, it: Iterate) -> History:
    return _write(history, it, jnp.int32(0), jnp.zeros_like(history.used))


def _solve_dtype(tree: PyTree) -> np.dtype:
    """The widest leaf dtype, but at least float32: the small solve's dtype."""
    return np.promote_types(widest_dtype(tree), np.float32)


def _sum_squares(tree: PyTree, dtype: np.dtype) -> jax.Array:
    """``sum x_i**2`` over every leaf, computed in ``dtype`` (no float16 overflow)."""
    return sum(jnp.sum(jnp.square(leaf.astype(dtype))) for leaf in jax.tree.leaves(tree))


def _gram(residuals: PyTree, size: int, dtype: np.dtype) -> jax.Array:
    """``G[i, j] = <r_i, r_j>`` summed over the leaves, in ``dtype``."""
    flat = [leaf.reshape(size, -1).astype(dtype) for leaf in jax.tree.leaves(residuals)]
    return sum(r @ r.T for r in flat)


def _proposal(history: History, damping: float,
              regularization: float) -> tuple[PyTree, jax.Array]:
    """The Anderson point ``sum_i alpha_i (x_i + beta r_i)`` and ``max_i |r_i|^2``
    over the history (the safeguard's bound)."""
    used = history.used
    size = used.shape[0]
    dtype = _solve_dtype(history.residuals)
    gram = _gram(history.residuals, size, dtype)
    squares = jnp.diagonal(gram)
    norms = jnp.sqrt(squares)
    norms = jnp.where(used & (norms > 0), norms, 1.0)
    pair = used[:, None] & used[None, :]
    scaled = jnp.where(pair, gram / (norms[:, None] * norms[None, :]), 0.0)
    system = scaled + jnp.diag(jnp.where(used, regularization, 1.0))
    weights = augmented_solve(system, used.astype(dtype) / norms) / norms
    weights = weights / jnp.sum(weights)

    def mix(points, residuals):
        moved = (points + damping * residuals).astype(dtype)
        return jnp.tensordot(weights, moved, axes=1).astype(points.dtype)
    bound = jnp.max(jnp.where(used, squares, 0.0))
    return jax.tree.map(mix, history.points, history.residuals), bound


def _init(fun, x0, options):
    it = point(fun, x0)
    size = options["history"] + 1
    empty = jax.tree.map(lambda leaf: jnp.zeros((size,) + leaf.shape, leaf.dtype), x0)
    history = History(empty, empty, jnp.zeros(size, bool), jnp.int32(0))
    return it, _restart(history, it)


def _step(fun, it, history, options):
    damping = options["damping"]
    proposal, bound = _proposal(history, damping, options["regularization"])
    candidate = point(fun, proposal)
    accept = (tree_all_finite(candidate.x, candidate.residual)
              & (_sum_squares(candidate.residual, bound.dtype) <= bound))
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
