"""Dense LU factorisation and solves, and a full-precision matrix product.

An implicit step factors one (n, n) iteration matrix ``M`` (a Rosenbrock
method's ``I / (h gamma) - J``, an ESDIRK method's ``I - h gamma J``) once
and solves with it for every stage:

    P M = L U                  (LAPACK getrf: partial pivoting, L unit lower)
    M^-1 b = U^-1 L^-1 (P b)   (a row permutation, then two triangular solves)

The permutation is computed once per factorisation, not per solve.
:data:`dot` is ``jnp.matmul`` at ``Precision.HIGHEST`` (no TF32 for float32 on
GPUs: the stages it combines carry the solution).
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

# Full-precision products (no TF32 for float32 on GPUs: the stages carry the solution).
dot = partial(jnp.matmul, precision=lax.Precision.HIGHEST)


def lu_solver(matrix: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """``b -> matrix^-1 b`` for (n,) ``b`` by ONE LU factorisation with partial
    pivoting (LAPACK getrf; the row permutation is computed once, not per solve).

    A half-precision matrix (float16, bfloat16: no LU kernel takes them) is
    factored and solved in float32, the solutions cast back."""
    dtype = matrix.dtype
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        lu, _, permutation = lax.linalg.lu(matrix.astype(jnp.float32))
        return lambda b: solve_factored(lu, permutation, b.astype(jnp.float32)).astype(dtype)
    lu, _, permutation = lax.linalg.lu(matrix)
    return partial(solve_factored, lu, permutation)


def solve_factored(lu: jax.Array, permutation: jax.Array, b: jax.Array) -> jax.Array:
    """``matrix^-1 b`` for (n,) ``b`` from ``lax.linalg.lu(matrix)``'s factors:
    permute, then the unit lower and the upper triangular solves."""
    x = b[permutation][:, None]
    x = lax.linalg.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
    return lax.linalg.triangular_solve(lu, x, left_side=True, lower=False)[:, 0]
