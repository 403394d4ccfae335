"""Linear solves with the Jacobian of a map: Newton steps and implicit derivatives.

For ``fun`` mapping a pytree to a pytree of the same structure and
``A = d fun / dx`` at ``x``:

* :func:`jacobian` builds ``A`` as a matrix from ``n`` JVPs
  (``jax.jacfwd``), or from ``n`` VJPs when ``fun`` calls a
  ``jax.custom_vjp`` function, which has no forward mode (an
  ``odekit.odeint`` inside a shooting method, for one). Which one is read
  from ``fun``'s jaxpr (:func:`has_forward_mode`), before any derivative is
  taken.
* :func:`solve_linearized` solves ``A w = b``. The solve is linear in ``b``
  and JAX transposes it, so reverse mode solves ``A^T v = c`` the same way:

  - ``"dense"``: ``A`` by :func:`jacobian`, then LU (``jnp.linalg.solve``),
    ``O(n^3)``; the right choice for small systems.
  - ``"gmres"``: matrix-free restarted GMRES (``jax.scipy.sparse.linalg``)
    inside ``jax.lax.custom_linear_solve``: on ``v -> A v`` (one JVP per
    Krylov vector) and, transposed, on ``v -> A^T v`` (one VJP each); for
    large systems. Each direction checks its final residual against
    ``eps**0.75`` of the least precise leaf dtype, and an unconverged solve
    returns NaN rather than a plausible wrong answer.

``"auto"`` picks dense up to :data:`DENSE_MAX_SIZE` unknowns. Everything
here is differentiable, so derivatives built on it can be differentiated
again.

References:
  Saad & Schultz (1986), GMRES, SIAM J. Sci. Stat. Comput. 7(3).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.extend.core
import jax.numpy as jnp
from jax.scipy.sparse.linalg import gmres

from odekit._tree import tree_ravel

LINEAR_SOLVERS = ("auto", "dense", "gmres")
DENSE_MAX_SIZE = 128
GMRES_RESTART = 20
_CHECK_FACTOR = 10.0  # allowed ratio of the final to the requested GMRES residual
_NO_FORWARD_MODE = ("custom_vjp_call", "custom_vjp_call_jaxpr")  # primitive names

PyTree = Any


def tree_size(x: PyTree) -> int:
    """Total number of elements in the leaves of ``x``."""
    return sum(int(jnp.size(leaf)) for leaf in jax.tree.leaves(x))


def dense_solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """Solve ``a @ x = b`` for an ``(n, n)`` matrix and an ``(n,)`` or ``(n, k)`` ``b``.

    A 1x1 system is a division, which is much cheaper than LU under ``vmap``.
    A singular ``a`` gives non-finite entries (LU with a zero pivot).
    float16 and bfloat16 systems are factored in float32 (LAPACK has no
    half-precision LU) and the solution cast back.
    """
    if a.shape == (1, 1):
        return b / a[0, 0]
    dtype = jnp.result_type(a, b)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.linalg.solve(a.astype(jnp.float32), b.astype(jnp.float32)).astype(dtype)
    return jnp.linalg.solve(a, b)


def augmented_solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """Solve ``a @ x = b`` by Gaussian elimination on the augmented matrix ``[a | b]``.

    LU with partial pivoting of the ``n x (n + k)`` matrix ``[a | b]`` makes
    the row interchanges and eliminations on ``b`` too, so its last ``k``
    columns are ``L^{-1} P^T b`` and one upper-triangular solve finishes
    (Golub & Van Loan (2013), Matrix Computations, 4th ed., section 3.2):
    the same pivots and rounding as :func:`dense_solve`, but no permutation
    vector is formed from the pivots (on CPU a while loop of ``n`` passes)
    and no transposed-solve rule is built, which makes it cheaper to run and
    about three times cheaper to compile. For solves that are never
    differentiated, such as Newton steps inside the forward iteration (the
    derivative comes from the implicit rule). ``b`` is ``(n,)`` or
    ``(n, k)``; a singular ``a`` gives non-finite entries, half precision
    is solved in float32, and a 1x1 system is a division.
    """
    if a.shape == (1, 1):
        return b / a[0, 0]
    dtype = jnp.result_type(a, b)
    work = dtype
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        work = jnp.dtype(jnp.float32)
    vector = b.ndim == 1
    rhs = (b[:, None] if vector else b).astype(work)
    n = a.shape[0]
    lu = jax.lax.linalg.lu(jnp.concatenate([a.astype(work), rhs], axis=1))[0]
    x = jax.lax.linalg.triangular_solve(lu[:, :n], lu[:, n:], left_side=True, lower=False)
    return (x[:, 0] if vector else x).astype(dtype)


def _calls_custom_vjp(jaxpr: jax.extend.core.Jaxpr) -> bool:
    """True when ``jaxpr``, or a jaxpr nested in it, calls a ``custom_vjp``."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _NO_FORWARD_MODE:
            return True
        if any(_calls_custom_vjp(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)):
            return True
    return False


def has_forward_mode(fun: Callable, *args: Any) -> bool:
    """Whether ``jax.jvp`` can go through ``fun(*args)``: False when it calls a
    ``jax.custom_vjp`` function, anywhere inside (found by tracing, at trace
    time; nothing runs)."""
    return not _calls_custom_vjp(jax.make_jaxpr(fun)(*args).jaxpr)


def jacobian(fun: Callable[[PyTree], PyTree], x: PyTree) -> tuple[jax.Array, jax.Array, Callable]:
    """The Jacobian of ``fun`` at ``x`` as a matrix, with ``fun(x)``.

    Built from JVPs (``jax.jacfwd``) when ``fun`` has forward mode, else row
    by row from VJPs, ``e_i^T J``, one per unknown.

    Returns:
      ``(J, f, unravel)``: ``J`` of shape ``(n, n)`` with
      ``J[i, j] = d f_i / d x_j`` over the raveled leaves, ``f = fun(x)``
      raveled to ``(n,)``, and ``unravel`` mapping an ``(n,)`` vector back to
      the structure of ``x``.
    """
    flat, unravel = tree_ravel(x)

    def flat_fun(v):
        return tree_ravel(fun(unravel(v)))[0]

    if has_forward_mode(flat_fun, flat):
        jac, value = jax.jacfwd(lambda v: (flat_fun(v),) * 2, has_aux=True)(flat)
    else:
        value, pullback = jax.vjp(flat_fun, flat)
        jac = jax.vmap(lambda row: pullback(row)[0])(jnp.eye(value.shape[0], dtype=value.dtype))
    return jac, value, unravel


def _norm(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.square(x)))


def _gmres(operator: Callable[[PyTree], PyTree], b: PyTree) -> PyTree:
    """Solve ``operator(w) = b`` by restarted GMRES; NaN unless it converged.

    GMRES runs on the raveled vector in the widest dtype of ``b``; the
    operator takes pytrees in the leaves' own dtypes, which ``unravel``
    restores (float32 leaves next to float64 ones). ``b`` is scaled to unit
    norm first: JAX's GMRES takes a residual below ``eps`` in absolute terms
    for zero, which would end the solve of a tiny ``b`` (a second-order
    tangent made of rounding errors, say) before its first step.
    """
    flat_b, unravel = tree_ravel(b)

    def matvec(v):
        return tree_ravel(operator(unravel(v)))[0]

    tol = max(float(jnp.finfo(leaf.dtype).eps) for leaf in jax.tree.leaves(b)) ** 0.75
    tiny = float(jnp.finfo(flat_b.dtype).tiny)
    norm_b = _norm(flat_b)
    scale = jnp.where(norm_b > 0, norm_b, jnp.ones_like(norm_b))
    unit_b = flat_b / scale
    w, _ = gmres(matvec, unit_b, tol=tol, atol=tiny, restart=GMRES_RESTART,
                 solve_method="incremental")
    ok = _norm(unit_b - matvec(w)) <= _CHECK_FACTOR * jnp.maximum(tol * _norm(unit_b), tiny)
    return unravel(jnp.where(ok, w * scale, jnp.nan))


def _dense_linear_solve(jac: jax.Array, b: jax.Array) -> jax.Array:
    """``jac^{-1} b``, whose transpose factors ``jac^T`` afresh: one LU and a
    plain triangular solve, cheaper than solving with the transposed LU of
    ``jac`` (which inverts the pivot permutation by a sort)."""
    return jax.lax.custom_linear_solve(
        lambda v: jac @ v, b, solve=lambda _, r: dense_solve(jac, r),
        transpose_solve=lambda _, r: dense_solve(jac.T, r))


def choose(method: str, x: PyTree) -> str:
    """Resolve ``"auto"`` to ``"dense"`` or ``"gmres"`` by the size of ``x``."""
    if method not in LINEAR_SOLVERS:
        raise ValueError(f"linear_solver must be one of {LINEAR_SOLVERS}, got {method!r}.")
    if method == "auto":
        return "dense" if tree_size(x) <= DENSE_MAX_SIZE else "gmres"
    return method


def solve_linearized(fun: Callable[[PyTree], PyTree], x: PyTree, b: PyTree,
                     method: str = "auto") -> PyTree:
    """Solve ``(d fun / dx) w = b`` at ``x`` for ``w`` (a pytree like ``x``).

    ``w`` is linear in ``b``: its transpose, which reverse mode uses, solves
    the transposed system by the same method. It is differentiable in ``x``
    and in values ``fun`` closes over.

    Args:
      fun: a map from pytrees like ``x`` to pytrees like ``x``.
      x: the linearization point.
      b: the right-hand side, like ``fun(x)``.
      method: ``"auto"``, ``"dense"`` or ``"gmres"``.

    Returns:
      ``w``; non-finite where the system is singular (dense) or NaN where
      GMRES did not reach its tolerance ``eps**0.75``.
    """
    if choose(method, x) == "dense":
        jac, _, unravel = jacobian(fun, x)
        return unravel(_dense_linear_solve(jac, tree_ravel(b)[0]))
    _, matvec = jax.linearize(fun, x)
    return jax.lax.custom_linear_solve(matvec, b, solve=_gmres, transpose_solve=_gmres)
