"""Newton's method with a backtracking line search.

At ``x`` the full step solves ``J(x) d = -f(x)`` with the Jacobian
``J = jax.jacfwd(f)`` (one batched JVP that also returns ``f(x)``) and a
dense LU solve; the line search (:mod:`odekit.root.linesearch`) then accepts
``x + lam d`` for the first of ``lam = 1, 1/2, ...`` that decreases
``|f|^2`` enough, one trial per step. Converges quadratically near a simple
root. A non-finite step from a finite ``f(x)`` is reported as a singular
Jacobian, except at an exact root (``f(x) = 0``), where the step is zero.

References:
  Dennis & Schnabel (1996), Numerical Methods for Unconstrained Optimization
  and Nonlinear Equations, algorithm 6.5.1.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from odekit import status as _status
from odekit._tree import tree_all_finite
from odekit.custom.iteration import Iterate, Method, parse_options
from odekit.custom.linear_solve import dense_solve, jacobian
from odekit.root.linesearch import first_fraction, try_step


def exact_root_step(value: jax.Array, step: jax.Array) -> jax.Array:
    """``step``, or zeros where ``f(x) = 0`` exactly.

    ``x`` is then a root even if ``J(x)`` is singular (a double root such as
    ``x**2`` at 0), where the solve would give ``0/0``; the loop sees a zero
    step and reports convergence instead of a singular Jacobian.
    """
    return jnp.where(jnp.all(value == 0), jnp.zeros_like(step), step)


def _point(fun: Callable, x: Any) -> Iterate:
    """``f``, ``J`` and the full Newton step at ``x``."""
    jac, value, unravel = jacobian(fun, x)
    step = unravel(exact_root_step(value, dense_solve(jac, -value)))
    residual = unravel(value)
    singular = tree_all_finite(residual) & ~tree_all_finite(step)
    status = jnp.where(singular, _status.SINGULAR, _status.SUCCESS).astype(jnp.int32)
    return Iterate(x, residual, step, status)


def _init(fun, x0, options):
    it = _point(fun, x0)
    return it, first_fraction(it)


def _step(fun, it, lam, options):
    _, kept, _, lam = try_step(lambda x: _point(fun, x), it, lam)
    return kept, lam


def _check(options, dtype):
    return parse_options(options, {}, "newton")


NEWTON = Method("newton", _init, _step, _check)
