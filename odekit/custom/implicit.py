"""The implicit-function-theorem gradient shared by every root and fixed point.

Let ``x*(theta)`` solve ``F(x*, theta) = 0`` (a fixed point ``x = f(x,
theta)`` is the root of ``F = f(x, theta) - x``). Differentiating the identity
gives ``dx*/dtheta = -(dF/dx)^{-1} dF/dtheta``, so for an output cotangent
``x_bar``

    theta_bar = w^T dF/dtheta   where   (dF/dx)^T w = -x_bar,

one transposed linear solve (dense or GMRES, :mod:`odekit.custom.linear_solve`)
and one VJP of ``F`` with respect to ``theta``. The forward iterations are
never differentiated. The forward rule calls the primal through this same
``custom_vjp``, so the saved ``x*`` carries its own dependence on ``theta``
and the backward rule, built from differentiable operations, can be
differentiated again: grad-of-grad works.

The start ``x0`` gets a zero cotangent (``x*`` does not depend on it). If
the solve did not succeed, every cotangent, the start's included, is NaN: an
implicit gradient at a point that is not a solution would be silently wrong.

References:
  Griewank & Walther (2008), Evaluating Derivatives, ch. 15;
  JAX custom-derivatives notebook, "Implicit function differentiation of
  iterative implementations".
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from odekit.custom.linear_solve import solve_transpose

PyTree = Any


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def implicit_solve(solve: Callable, residual: Callable, linear_solver: str,
                   x0: PyTree, params: PyTree) -> tuple[PyTree, jax.Array, Any]:
    """Run ``solve`` and attach the implicit gradient of its solution.

    Args:
      solve: ``solve(x0, params) -> (x, success, stats)``, the forward solver;
        ``x`` satisfies ``residual(x, params) = 0`` when ``success``.
      residual: ``residual(x, params) -> F``, a pytree like ``x``.
      linear_solver: ``"auto"``, ``"dense"`` or ``"gmres"`` for the backward
        solve.
      x0: starting point or bracket; it receives a zero cotangent (NaN when
        the solve failed).
      params: pytree of arrays ``theta`` that ``residual`` depends on.

    Returns:
      ``(x, success, stats)`` from ``solve``; only ``x`` has a gradient.
    """
    return solve(x0, params)


def _implicit_fwd(solve, residual, linear_solver, x0, params):
    out = implicit_solve(solve, residual, linear_solver, x0, params)
    x, success, _ = out
    return out, (x, success, params, x0)


def _nan_unless(ok: jax.Array, tree: PyTree) -> PyTree:
    def mask(g):
        if jnp.issubdtype(g.dtype, jnp.inexact):
            return jnp.where(ok, g, jnp.nan)
        return g
    return jax.tree.map(mask, tree)


def _start_cotangent(ok: jax.Array, x0: PyTree) -> PyTree:
    """Zero for every floating leaf of ``x0`` (a solution does not depend on
    where the search started), NaN if the solve failed (the returned point
    then does), ``None`` (a zero) for other leaves."""
    def leaf(v):
        if not jnp.issubdtype(v.dtype, jnp.inexact):
            return None
        return jnp.where(ok, jnp.zeros_like(v), jnp.nan)
    return jax.tree.map(leaf, x0)


def _implicit_bwd(solve, residual, linear_solver, saved, cotangents):
    x, success, params, x0 = saved
    x_bar = cotangents[0]
    neg_x_bar = jax.tree.map(jnp.negative, x_bar)
    w = solve_transpose(lambda y: residual(y, params), x, neg_x_bar, linear_solver)
    _, pullback = jax.vjp(lambda p: residual(x, p), params)
    (params_bar,) = pullback(w)
    return _start_cotangent(success, x0), _nan_unless(success, params_bar)


implicit_solve.defvjp(_implicit_fwd, _implicit_bwd)
