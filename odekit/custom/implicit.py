"""The implicit-function-theorem derivative shared by every root and fixed point.

Let ``x*(theta)`` solve ``F(x*, theta) = 0`` (a fixed point ``x = f(x,
theta)`` is the root of ``F = f(x, theta) - x``). Differentiating the identity
gives the tangent of the solution for a parameter tangent ``theta_dot``:

    x_dot = -(dF/dx)^{-1} (dF/dtheta theta_dot),

one JVP of ``F`` in ``theta`` and one linear solve (dense or GMRES,
:mod:`odekit.custom.linear_solve`). The rule is a ``custom_jvp``, so
``jax.jvp`` and ``jax.jacfwd`` use it as it stands, and reverse mode is its
transpose, which JAX derives: ``theta_bar = w^T dF/dtheta`` with
``(dF/dx)^T w = -x_bar``, the transposed solve by the same method. The
forward iterations are never differentiated. The rule calls the primal
through this same ``custom_jvp``, so ``x*`` carries its own dependence on
``theta`` and the tangent, built from differentiable operations, can be
differentiated again: ``jax.hessian`` and grad-of-grad work.

The start ``x0`` gets a zero tangent (``x*`` does not depend on it). If the
solve did not succeed, every derivative is NaN, in both modes: the rule adds
``NaN`` times the sum of all input tangents, whose transpose is a NaN
cotangent for every floating input, the start's included. An implicit
derivative at a point that is not a solution would be silently wrong.

References:
  Griewank & Walther (2008), Evaluating Derivatives, ch. 15;
  Blondel et al. (2022), Efficient and modular implicit differentiation,
  NeurIPS.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from odekit._sealed_jvp import sealed_jvp
from odekit._tree import widest_dtype
from odekit.custom.linear_solve import solve_linearized

PyTree = Any


@functools.partial(sealed_jvp, nondiff_argnums=(0, 1, 2))
def implicit_solve(solve: Callable, residual: Callable, linear_solver: str,
                   x0: PyTree, params: PyTree) -> tuple[PyTree, jax.Array, Any]:
    """Run ``solve`` and attach the implicit derivative of its solution.

    Args:
      solve: ``solve(x0, params) -> (x, success, stats)``, the forward solver;
        ``x`` satisfies ``residual(x, params) = 0`` when ``success``.
      residual: ``residual(x, params) -> F``, a pytree like ``x``.
      linear_solver: ``"auto"``, ``"dense"`` or ``"gmres"`` for the linear
        solve of the derivative.
      x0: starting point or bracket; its tangent does not reach ``x`` (NaN
        when the solve failed).
      params: pytree of arrays ``theta`` that ``residual`` depends on.

    Returns:
      ``(x, success, stats)`` from ``solve``; only ``x`` has a derivative.
    """
    return solve(x0, params)


def _zero_tangent(v: jax.Array) -> jax.Array:
    """A zero tangent for the output ``v``: ``float0`` for integers and booleans."""
    if jnp.issubdtype(v.dtype, jnp.inexact):
        return jnp.zeros_like(v)
    return np.zeros(jnp.shape(v), dtype=jax.dtypes.float0)


def _poison(success: jax.Array, x_dot: PyTree, inputs_dot: PyTree) -> PyTree:
    """``x_dot`` plus ``where(success, 0, NaN)`` times the sum of every floating
    input tangent: unchanged after a successful solve, NaN after a failed one,
    and (transposed) a NaN cotangent for every floating input."""
    leaves = [jnp.asarray(t) for t in jax.tree.leaves(inputs_dot)
              if jnp.issubdtype(jnp.result_type(t), jnp.inexact)]
    if not leaves:
        return x_dot
    dtype = widest_dtype(leaves)
    total = sum(jnp.sum(t).astype(dtype) for t in leaves)
    drift = jnp.where(success, jnp.zeros((), dtype), jnp.nan) * total
    return jax.tree.map(lambda d: d + drift.astype(d.dtype), x_dot)


@implicit_solve.defjvp
def _implicit_jvp(solve, residual, linear_solver, primals, tangents):
    x0, params = primals
    out = implicit_solve(solve, residual, linear_solver, x0, params)
    x, success, stats = out
    _, f_dot = jax.jvp(lambda p: residual(x, p), (params,), (tangents[1],))
    neg_f_dot = jax.tree.map(jnp.negative, f_dot)
    x_dot = solve_linearized(lambda y: residual(y, params), x, neg_f_dot, linear_solver)
    x_dot = _poison(success, x_dot, tangents)
    return out, (x_dot, *jax.tree.map(_zero_tangent, (success, stats)))
