"""Broyden's ("good") quasi-Newton method with a backtracking line search.

The Jacobian is evaluated once, at ``x0``, and inverted; afterwards the
inverse approximation ``H ~ J^{-1}`` gets the rank-one update that makes the
secant condition ``H y = s`` hold for the last step ``s = x+ - x`` and
residual change ``y = f(x+) - f(x)`` (Sherman-Morrison form of Broyden's
update ``B+ = B + (y - B s) s^T / (s^T s)``):

    H+ = H + (s - H y) (s^T H) / (s^T H y).

The step is ``d = -H f(x)``, safeguarded by the line search of
:mod:`odekit.root.linesearch`; an update with ``s^T H y = 0`` is skipped.
Converges superlinearly near a simple root with no further Jacobians.

References:
  Broyden (1965), Math. Comp. 19(92); Kelley (2003), Solving Nonlinear
  Equations with Newton's Method, chapter 4.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from odekit import status as _status
from odekit._tree import tree_ravel, tree_where
from odekit.custom.iteration import Iterate, Method, parse_options
from odekit.custom.linear_solve import augmented_solve, jacobian
from odekit.root.linesearch import first_fraction, try_step
from odekit.root.newton import checked_step


def _with_step(it: Iterate, inverse: jnp.ndarray) -> Iterate:
    value, unravel = tree_ravel(it.residual)
    step, singular = checked_step(value, -(inverse @ value))
    step = unravel(step)
    status = jnp.where(singular, _status.SINGULAR, it.status).astype(jnp.int32)
    return it._replace(step=step, status=status)


class _State(NamedTuple):
    inverse: jax.Array  # (n, n) approximation of J^{-1}
    lam: jax.Array      # the line search's next step fraction


def _init(fun, x0, options):
    jac, value, unravel = jacobian(fun, x0)
    inverse = augmented_solve(jac, jnp.eye(jac.shape[0], dtype=jac.dtype))
    residual = unravel(value)
    it = _with_step(Iterate(x0, residual, residual, jnp.int32(_status.SUCCESS)), inverse)
    return it, _State(inverse, first_fraction(it))


def _update(inverse, s, y):
    hy = inverse @ y
    denom = s @ hy
    scale = jnp.finfo(denom.dtype).eps * jnp.linalg.norm(s) * jnp.linalg.norm(hy)
    safe = jnp.where(jnp.abs(denom) > scale, denom, 1.0)
    updated = inverse + jnp.outer(s - hy, s @ inverse) / safe
    return jnp.where(jnp.abs(denom) > scale, updated, inverse)


def _step(fun, it, state, options):
    def evaluate(x):
        residual = fun(x)
        return Iterate(x, residual, residual, it.status)

    trial, kept, accepted, lam = try_step(evaluate, it, state.lam)
    s = tree_ravel(trial.x)[0] - tree_ravel(it.x)[0]
    y = tree_ravel(trial.residual)[0] - tree_ravel(it.residual)[0]
    inverse = jnp.where(accepted, _update(state.inverse, s, y), state.inverse)
    new = tree_where(accepted, _with_step(kept, inverse), kept)
    return new, _State(inverse, lam)


def _check(options, dtype):
    return parse_options(options, {}, "broyden")


BROYDEN = Method("broyden", _init, _step, _check)
