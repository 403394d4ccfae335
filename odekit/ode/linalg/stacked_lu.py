"""LU factorisation and solves of a stack of small matrices in lax
operations: ``P_i A_i = L_i U_i`` for every ``A_i`` of a (K, c, c) stack.

The block-diagonal solver (:mod:`odekit.ode.linalg.block_diagonal_lu`)
factors many independent c x c blocks (Robertson's mechanism repeated K
times: K blocks of 3 x 3). LAPACK's batched getrf and trsm are library calls,
a kernel each on XLA's CPU backend, and a loop holding them cannot be
compiled as one kernel (:mod:`odekit.ode.engine.single_kernel`). For small
c the elimination is written here with the column loop unrolled at trace
time (c - 1 steps) and every block handled at once by elementwise
operations on the whole stack:

step k:   p_i = the first row r >= k of largest |A_i[r, k]|   (partial pivoting,
          rows k and p_i swap)                                 LAPACK's choice)
          l_i = A_i[k+1:, k] / A_i[k, k]
          A_i[k+1:, k+1:] -= l_i A_i[k, k+1:]

(Golub & Van Loan (2013), Matrix Computations, 4th ed., algorithm 3.4.1.)
The per-block pivot row is gathered (``take_along_axis``) and the swap
written with one-hot masks (no scatter, no reduction over the stack), so the
code is elementwise math, static slices, gathers and reductions over c
numbers: it jits, vmaps, differentiates (the pivots are integers, the rest
arithmetic), runs on GPUs and inside the one-kernel CPU loop. Cost O(K c^3) for the factorisation (about 1.5 times
getrf's flops: the masks work on whole rows), O(K c^2) per solve, O(K c^2)
memory, and O(c) operations in the program (the unrolled steps), so it is
meant for c up to :data:`MAX_BLOCK`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

#: Largest block factored here rather than by LAPACK's batched getrf: the
#: unrolled program grows as c, the masked work as c^3 (about 1.5x getrf's).
MAX_BLOCK = 8


def factor(stack: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(lu, permutation)`` of partial-pivoting LU for each matrix of a stack.

    Args:
      stack: (K, r, c) with r >= c (square blocks; tall panels as LAPACK's
        getrf takes them), a float or complex dtype of at least 32 bits.

    Returns:
      ``lu`` (K, r, c): unit lower L below the diagonal and U on and above it
      (as ``lax.linalg.lu``); ``permutation`` (K, r) int32 with
      ``stack[i][permutation[i]] = L_i U_i`` (``lax.linalg.lu``'s third
      output). A singular block gives a zero pivot and non-finite solutions,
      as LAPACK's.
    """
    k_blocks, r, c = stack.shape
    rows = lax.broadcasted_iota(jnp.int32, (1, r), 1)              # (1, r)
    cols = lax.broadcasted_iota(jnp.int32, (1, c), 1)              # (1, c)
    permutation = jnp.broadcast_to(rows, (k_blocks, r))
    a = stack
    zero = jnp.zeros((), a.dtype)
    for k in range(min(r - 1, c)):
        size = jnp.abs(a[:, :, k])                                   # (K, r)
        size = jnp.where(rows >= k, size, -jnp.ones((), size.dtype))
        largest = jnp.max(size, axis=1, keepdims=True)
        pivot = jnp.min(jnp.where(size == largest, rows, r), axis=1, keepdims=True)  # (K, 1)
        at_pivot = rows == pivot                                     # (K, r) one-hot
        at_k = rows == k                                             # (1, r)
        row_k = a[:, k:k + 1, :]                                     # (K, 1, c)
        row_p = jnp.take_along_axis(a, pivot[:, :, None], axis=1)    # (K, 1, c)
        a = jnp.where(at_k[:, :, None], row_p, jnp.where(at_pivot[:, :, None], row_k, a))
        perm_k = permutation[:, k:k + 1]
        perm_p = jnp.take_along_axis(permutation, pivot, axis=1)
        permutation = jnp.where(at_k, perm_p, jnp.where(at_pivot, perm_k, permutation))
        below = rows > k                                             # (1, r) rows below k
        multipliers = jnp.where(below, a[:, :, k] / a[:, k:k + 1, k], zero)   # (K, r)
        right = jnp.where(cols > k, row_p[:, 0, :], zero)            # U's row k, right of k
        a = a - multipliers[:, :, None] * right[:, None, :]
        a = jnp.where(below[:, :, None] & (cols == k)[:, None, :], multipliers[:, :, None], a)
    return a, permutation


def unit_lower_solve(lu: jax.Array, b: jax.Array) -> jax.Array:
    """``L_i^-1 b_i`` for the unit lower L in ``lu`` (K, c, c) (below its
    diagonal) and ``b`` (K, c) or (K, c, q): forward substitution unrolled
    over the c columns. O(K c^2 q)."""
    c = lu.shape[-1]
    rows = lax.broadcasted_iota(jnp.int32, (1, c), 1)
    zero = jnp.zeros((), lu.dtype)
    extra = (None,) * (b.ndim - 2)
    for k in range(c - 1):
        column = jnp.where(rows > k, lu[:, :, k], zero)[(...,) + extra]
        b = b - column * b[:, k:k + 1]
    return b


def solve(lu: jax.Array, permutation: jax.Array, b: jax.Array) -> jax.Array:
    """``x_i = A_i^-1 b_i`` for (K, c) ``b`` from :func:`factor`'s output:
    the rows permuted, then forward substitution with the unit lower L and
    back substitution with U (Golub & Van Loan, algorithms 3.1.3-3.1.4),
    unrolled over the c columns. O(K c^2); linear in ``b``."""
    c = lu.shape[-1]
    index = lax.broadcasted_iota(jnp.int32, (1, c), 1)
    zero = jnp.zeros((), lu.dtype)
    x = unit_lower_solve(lu, jnp.take_along_axis(b.astype(lu.dtype), permutation, axis=1))
    for k in reversed(range(c)):
        x_k = x[:, k:k + 1] / lu[:, k, k:k + 1]
        x = jnp.where(index == k, x_k, x)
        if k:
            x = x - jnp.where(index < k, lu[:, :, k], zero) * x_k
    return x
