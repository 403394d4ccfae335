"""Restarted GMRES with right preconditioning, in lax.

Solves ``A x = b`` for an (n,) ``b`` given ``v -> A v`` and a preconditioner
``r -> P^-1 r``. Right preconditioning (Saad, "Iterative Methods for Sparse
Linear Systems", 2nd ed., 2003, Alg. 9.5; Saad & Schultz 1986): the Krylov
space is built for ``A P^-1`` and ``x = x0 + P^-1 V y``, so the residual the
iteration minimises, and the one the stopping test reads, is the true
``b - A x`` (not a preconditioned one).

One cycle of at most ``restart`` iterations:

    r = b - A x,  beta = |r|,  v_0 = r / beta,  g = beta e_0
    for j = 0, 1, ...:
        w = A P^-1 v_j
        h = V^H w (rows <= j), w -= V h, twice (classical Gram-Schmidt with
            one reorthogonalisation: "twice is enough", Giraud et al. 2005)
        v_{j+1} = w / |w|
        the Hessenberg column (h, |w|) is rotated by the accumulated Givens
        rotations (kept as one unitary matrix Q^H: a small matrix product,
        no sequential loop over the rotations), a new rotation zeroes its
        subdiagonal, and |g_{j+1}| is the least-squares residual
    stop when |g_{j+1}| <= tol |b| or j + 1 = restart; then R y = g (upper
    triangular) and x += P^-1 V y.

Cycles repeat from the new x (its residual recomputed) until ``|b - A x| <=
tol |b|`` or ``max_cycles`` cycles. A lucky breakdown (``|w| = 0``: the
space holds the solution) ends the cycle with a zero residual estimate.

Cost per iteration: one product with A, one preconditioner application,
O(n restart) for the orthogonalisation, O(restart^2) for the rotation.
Memory O(n restart). Complex systems use Hermitian products and complex
rotations (``c`` complex, ``s`` real, since the subdiagonal ``|w|`` is real).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Result(NamedTuple):
    """``x``; ``iterations`` (int32) products with A in the Krylov steps
    (the residual checks not counted); ``converged``: ``|b - A x| <= tol |b|``
    at the end."""
    x: jax.Array
    iterations: jax.Array
    converged: jax.Array


def _norm(v: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.abs(v) ** 2))


def solve(matvec: Callable[[jax.Array], jax.Array], precondition: Callable[[jax.Array], jax.Array],
          b: jax.Array, tol: float, restart: int, max_cycles: int) -> Result:
    """``x`` with ``|b - A x| <= tol |b|`` by restarted, right-preconditioned GMRES.

    Args:
      matvec: ``v -> A v``, (n,) -> (n,).
      precondition: ``r -> P^-1 r``, (n,) -> (n,), linear.
      b: (n,) right-hand side.
      tol: relative tolerance on the residual's 2-norm.
      restart: Krylov vectors per cycle (the memory is ``(restart + 1) n``).
      max_cycles: cycles at most (so at most ``restart * max_cycles`` iterations).

    Returns:
      A :class:`Result` (x from zero as the first guess).

    The iteration runs on ``b / max|b|`` (A is linear; x is scaled back), so
    that no norm overflows for a huge right-hand side (an overflowed ``|b|``
    made the target infinite: x = 0 passed for converged). A non-finite
    ``b`` or a non-finite x is never converged.
    """
    n, dtype = b.shape[0], b.dtype
    real = jnp.finfo(dtype).dtype
    if n == 0:
        return Result(b, jnp.zeros((), jnp.int32), jnp.bool_(True))
    size = jnp.max(jnp.abs(b))
    finite = jnp.isfinite(size)
    scale = jnp.where(finite & (size > 0), size, jnp.ones((), real)).astype(dtype)
    b_given, b = b, b / scale
    k = int(restart)
    target = jnp.asarray(tol, real) * _norm(b)
    rows = jnp.arange(k + 1, dtype=jnp.int32)

    def cycle(x: jax.Array, r: jax.Array, beta: jax.Array) -> tuple[jax.Array, jax.Array]:
        basis = jnp.zeros((k + 1, n), dtype).at[0].set(r / beta.astype(dtype))
        rotations = jnp.eye(k + 1, dtype=dtype)      # Q^H: all rotations so far
        triangle = jnp.zeros((k + 1, k), dtype)       # R (rotated Hessenberg), by columns
        g = jnp.zeros(k + 1, dtype).at[0].set(beta.astype(dtype))

        def going(state):
            j, _, _, _, g = state
            return (j < k) & (jnp.abs(g[jnp.minimum(j, k)]) > target)

        def step(state):
            j, basis, rotations, triangle, g = state
            w = matvec(precondition(basis[j]))
            kept = (rows <= j).astype(dtype)
            h = kept * (jnp.conj(basis) @ w)
            w = w - h @ basis
            again = kept * (jnp.conj(basis) @ w)
            w = w - again @ basis
            h = h + again
            length = _norm(w)
            fine = length > jnp.finfo(real).tiny
            basis = basis.at[j + 1].set(jnp.where(fine, w / jnp.where(fine, length, 1).astype(dtype),
                                                  jnp.zeros_like(w)))
            column = rotations @ h.at[j + 1].set(length.astype(dtype))
            a, below = column[j], jnp.abs(column[j + 1])
            radius = jnp.sqrt(jnp.abs(a) ** 2 + below ** 2)
            safe = jnp.where(radius > 0, radius, 1)
            c = jnp.where(radius > 0, a / safe.astype(dtype), jnp.ones((), dtype))
            s = jnp.where(radius > 0, below / safe, jnp.zeros((), real)).astype(dtype)
            # G = [[conj(c), s], [-s, c]] on rows j, j + 1
            def rotate(m):
                top, bottom = m[j], m[j + 1]
                return m.at[j].set(jnp.conj(c) * top + s * bottom).at[j + 1].set(-s * top + c * bottom)
            rotations, g = rotate(rotations), rotate(g)
            column = rotate(column)
            triangle = triangle.at[:, j].set(jnp.where(rows <= j, column, 0))
            return j + 1, basis, rotations, triangle, g

        j, basis, _, triangle, g = lax.while_loop(going, step, (jnp.zeros((), jnp.int32), basis, rotations, triangle, g))
        # R y = g on the first j rows; the unused rows solve to 0 (unit diagonal, zero g)
        square = triangle[:k]
        used = jnp.arange(k, dtype=jnp.int32) < j
        square = jnp.where(used[:, None] & used[None, :], square,
                           jnp.eye(k, dtype=dtype))
        y = lax.linalg.triangular_solve(square, jnp.where(used, g[:k], 0)[:, None], left_side=True,
                                        lower=False)[:, 0]
        return x + precondition(y @ basis[:k]), j

    def unfinished(state):
        _, _, beta, _, cycles = state
        return (beta > target) & (cycles < max_cycles)

    def restarted(state):
        x, r, beta, iterations, cycles = state
        x, j = cycle(x, r, beta)
        r = b - matvec(x)
        return x, r, _norm(r), iterations + j, cycles + 1

    x0 = jnp.zeros_like(b)
    x, _, beta, iterations, _ = lax.while_loop(
        unfinished, restarted, (x0, b, _norm(b), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)))
    x = x * scale
    converged = (beta <= target) & finite & jnp.all(jnp.isfinite(x))
    return Result(jnp.where(finite, x, b_given), iterations, converged)
