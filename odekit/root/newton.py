"""Newton's method with a backtracking line search.

At ``x`` the full step solves ``J(x) d = -f(x)`` with the Jacobian
``J = jax.jacfwd(f)`` (one batched JVP that also returns ``f(x)``) and
Gaussian elimination with partial pivoting on ``[J | -f(x)]``
(:func:`~odekit.custom.linear_solve.augmented_solve`); the line search
(:mod:`odekit.root.linesearch`) then accepts ``x + lam d`` for the first
of ``lam = 1, 1/2, ...`` that decreases ``|f|^2`` enough, one trial per
step. Converges quadratically near a simple root. A non-finite step from
a finite ``f(x)`` is reported as a singular Jacobian, except at an exact
root (``f(x) = 0``), where the step is zero.

References:
  Dennis & Schnabel (1996), Numerical Methods for Unconstrained Optimization
  and Nonlinear Equations, algorithm 6.5.1.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jax import lax

from odekit import _lax as ops
from odekit import status as _status
from odekit.custom.iteration import Iterate, Method, parse_options
from odekit.custom.linear_solve import augmented_solve, jacobian, tree_size
from odekit.root.linesearch import first_fraction, try_step


def checked_step(value: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The step, zero where ``f(x) = 0`` exactly, and the singular-Jacobian test.

    At an exact root ``x`` is a root even if ``J(x)`` is singular (a double
    root such as ``x**2`` at 0), where the solve would give ``0/0``; the loop
    then sees a zero step and reports convergence, not a singular Jacobian.

    Args:
      value: ``f(x)`` raveled, ``(n,)``.
      step: the solve's step ``-J^{-1} f(x)`` (or Broyden's), ``(n,)``.

    Returns:
      ``(step, singular)``: the step (zero at an exact root) and whether a
      finite ``f(x)`` that is not exactly zero gave a non-finite step. The
      three facts (some ``f_i`` non-finite, some ``f_i != 0``, some
      ``step_i`` non-finite) are bits OR-reduced together: one kernel where
      three separate reductions each cost compile time in every solve.
    """
    def bit(flag, value):
        return jnp.where(flag, jnp.int32(value), jnp.int32(0))
    bits = (bit(~ops.is_finite(value), 4) | bit(value != 0, 2) | bit(~ops.is_finite(step), 1))
    found = lax.reduce(bits, jnp.int32(0), lax.bitwise_or, tuple(range(bits.ndim)))
    exact = (found & 2) == 0
    singular = ((found & 4) == 0) & ~exact & ((found & 1) != 0)
    return jnp.where(exact, jnp.zeros_like(step), step), singular


def _point(fun: Callable, x: Any) -> Iterate:
    """``f``, ``J`` and the full Newton step at ``x``."""
    jac, value, unravel = jacobian(fun, x)
    step, singular = checked_step(value, augmented_solve(jac, -value))
    status = jnp.where(singular, _status.SINGULAR, _status.SUCCESS).astype(jnp.int32)
    return Iterate(x, unravel(value), unravel(step), status)


def _lazy(x0: Any) -> bool:
    """Whether the start is evaluated by the loop's first pass: for more than
    one unknown, where the Jacobian and LU compiled a second time outside the
    loop cost a third of the first call. A scalar problem's solve is a
    division, and there an extra pass of the loop would cost more (under
    ``vmap``) than the duplicate compiles."""
    return tree_size(x0) > 1


def _init(fun, x0, options):
    """At ``x0``, or, when :func:`_lazy`, a placeholder at ``x0`` (zero
    residual and step) that the loop's uncounted first pass replaces by the
    evaluation of ``x0`` itself (``x0 + lam * 0``), kept whatever its merit."""
    if not _lazy(x0):
        it = _point(fun, x0)
        return it, (first_fraction(it), None)
    zeros = jax.tree.map(jnp.zeros_like, x0)
    it = Iterate(x0, zeros, zeros, jnp.int32(_status.SUCCESS))
    return it, (first_fraction(it), jnp.array(True))


def _step(fun, it, state, options):
    lam, first = state
    _, kept, _, lam = try_step(lambda x: _point(fun, x), it, lam, force=first)
    return kept, (lam, None if first is None else jnp.zeros_like(first))


def _check(options, dtype):
    return parse_options(options, {}, "newton")


NEWTON = Method("newton", _init, _step, _check, lazy_init=_lazy)
