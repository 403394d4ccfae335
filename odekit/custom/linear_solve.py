"""Linear solves for Newton steps and implicit gradients.

Two ways to solve ``A^T w = b`` where ``A = d fun / dx`` at ``x`` and
``fun`` maps a pytree to a pytree of the same structure:

* ``"dense"``: build ``A`` with ``jax.jacfwd`` (``n`` JVPs; ``n`` VJPs when
  ``fun`` contains a ``custom_vjp``, which has no forward mode) and solve by
  LU, ``O(n^3)``; the right choice for small systems.
* ``"gmres"``: matrix-free restarted GMRES (``jax.scipy.sparse.linalg``)
  on ``v -> A^T v``, one VJP per Krylov vector; for large systems. The final
  residual is checked against ``eps**0.75`` of the least precise leaf dtype,
  and an unconverged solve returns NaN rather than a plausible wrong answer.

``"auto"`` picks dense up to :data:`DENSE_MAX_SIZE` unknowns. Everything
here is differentiable, so gradients built on it can be differentiated again.

References:
  Saad & Schultz (1986), GMRES, SIAM J. Sci. Stat. Comput. 7(3).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.scipy.sparse.linalg import gmres

from odekit._tree import tree_ravel

LINEAR_SOLVERS = ("auto", "dense", "gmres")
DENSE_MAX_SIZE = 128
GMRES_RESTART = 20
_CHECK_FACTOR = 10.0  # allowed ratio of the final to the requested GMRES residual

PyTree = Any


def tree_size(x: PyTree) -> int:
    """Total number of elements in the leaves of ``x``."""
    return sum(int(jnp.size(leaf)) for leaf in jax.tree.leaves(x))


def dense_solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """Solve ``a @ x = b`` for an ``(n, n)`` matrix and an ``(n,)`` or ``(n, k)`` ``b``.

    A 1x1 system is a division, which is much cheaper than LU under ``vmap``.
    A singular ``a`` gives non-finite entries (LU with a zero pivot).
    """
    if a.shape == (1, 1):
        return b / a[0, 0]
    return jnp.linalg.solve(a, b)


def jacobian(fun: Callable[[PyTree], PyTree], x: PyTree) -> tuple[jax.Array, jax.Array, Callable]:
    """The Jacobian of ``fun`` at ``x`` as a matrix, with ``fun(x)``.

    Returns:
      ``(J, f, unravel)``: ``J`` of shape ``(n, n)`` with
      ``J[i, j] = d f_i / d x_j`` over the raveled leaves, ``f = fun(x)``
      raveled to ``(n,)``, and ``unravel`` mapping an ``(n,)`` vector back to
      the structure of ``x``.
    """
    flat, unravel = tree_ravel(x)

    def flat_fun(v):
        out = tree_ravel(fun(unravel(v)))[0]
        return out, out

    try:
        jac, value = jax.jacfwd(flat_fun, has_aux=True)(flat)
    except TypeError as error:
        # Forward mode is impossible through a custom_vjp inside ``fun`` (for
        # example an odekit.odeint solve in a shooting method): build J row
        # by row from VJPs instead, e_i^T J, one per unknown.
        if "custom_vjp" not in str(error):
            raise
        value, pullback = jax.vjp(lambda v: flat_fun(v)[0], flat)
        jac = jax.vmap(lambda row: pullback(row)[0])(jnp.eye(value.shape[0], dtype=value.dtype))
    return jac, value, unravel


def _dense_transpose_solve(fun: Callable, x: PyTree, b: PyTree) -> PyTree:
    jac, _, unravel = jacobian(fun, x)
    return unravel(dense_solve(jac.T, tree_ravel(b)[0]))


def _norm(x: PyTree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(x)))


def _gmres_transpose_solve(fun: Callable, x: PyTree, b: PyTree) -> PyTree:
    # GMRES runs on the raveled vector in the widest dtype of ``b``; the VJP
    # takes cotangents in the leaves' own dtypes, which ``unravel`` restores
    # (float32 leaves next to float64 ones).
    _, vjp = jax.vjp(fun, x)
    flat_b, unravel = tree_ravel(b)

    def matvec(v):
        return tree_ravel(vjp(unravel(v))[0])[0]

    tol = max(float(jnp.finfo(leaf.dtype).eps) for leaf in jax.tree.leaves(b)) ** 0.75
    tiny = float(jnp.finfo(flat_b.dtype).tiny)
    w, _ = gmres(matvec, flat_b, tol=tol, atol=tiny, restart=GMRES_RESTART,
                 solve_method="incremental")
    residual = flat_b - matvec(w)
    ok = _norm(residual) <= _CHECK_FACTOR * jnp.maximum(tol * _norm(flat_b), tiny)
    return unravel(jnp.where(ok, w, jnp.nan))


def choose(method: str, x: PyTree) -> str:
    """Resolve ``"auto"`` to ``"dense"`` or ``"gmres"`` by the size of ``x``."""
    if method not in LINEAR_SOLVERS:
        raise ValueError(f"linear_solver must be one of {LINEAR_SOLVERS}, got {method!r}.")
    if method == "auto":
        return "dense" if tree_size(x) <= DENSE_MAX_SIZE else "gmres"
    return method


def solve_transpose(fun: Callable[[PyTree], PyTree], x: PyTree, b: PyTree,
                    method: str = "auto") -> PyTree:
    """Solve ``(d fun / dx)^T w = b`` at ``x`` for ``w`` (a pytree like ``b``).

    Args:
      fun: a map from pytrees like ``x`` to pytrees like ``x``.
      x: the linearization point.
      b: the right-hand side, like ``fun(x)``.
      method: ``"auto"``, ``"dense"`` or ``"gmres"``.

    Returns:
      ``w``; NaN where the system is singular (dense) or GMRES did not reach
      its tolerance ``eps**0.75``.
    """
    if choose(method, x) == "dense":
        return _dense_transpose_solve(fun, x, b)
    return _gmres_transpose_solve(fun, x, b)
