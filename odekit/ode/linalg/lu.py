"""Dense LU factorisation and solves, and a full-precision matrix product.

An implicit step factors one (n, n) iteration matrix ``M`` (a Rosenbrock
method's ``I / (h gamma) - J``, an ESDIRK method's ``I - h gamma J``) once
and solves with it for every stage:

    P M = L U                  (partial pivoting, L unit lower)
    M^-1 b = U^-1 L^-1 (P b)   (a row permutation, then two triangular solves)

The permutation is computed once per factorisation, not per solve.

Two implementations, chosen by size (:func:`factor`, :func:`solve_factored`):

* ``n > LAX_MAX_SIZE``: LAPACK (``lax.linalg.lu``: getrf; ``triangular_solve``:
  trsm). On XLA's CPU backend each is a custom call, a kernel of its own,
  and a loop holding one cannot be compiled as one kernel
  (:mod:`odekit.ode.engine.single_kernel`).
* ``n <= LAX_MAX_SIZE``: Gaussian elimination with partial pivoting written
  in elementwise lax operations and ``fori_loop`` (:func:`eliminate`,
  :func:`substitute`; Golub & Van Loan (2013), Matrix Computations, 4th
  ed., algorithms 3.4.1 (outer-product LU with partial pivoting), 3.1.3 and
  3.1.4 (column-oriented forward and back substitution)). Same pivots as
  getrf (the first row of largest modulus), rounding of the same order;
  no library call, so the stiff methods' whole loop compiles into one CPU
  kernel, and it also beats the LAPACK call kernel by kernel for tiny n.

:func:`dot` is a full-precision matrix product (elementwise for small ones).
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from odekit.ode.linalg import factored_solve

#: Largest ``a.size * b.shape[-1]`` (the multiply-adds) :func:`dot` computes
#: as an elementwise product and a sum rather than a ``dot_general``.
SMALL_DOT = 1 << 14


def _pairwise_sum(terms: jax.Array, axis: int) -> jax.Array:
    """``terms`` summed over ``axis`` by pairwise halving (static slices and
    adds, ceil(log2 s) levels; no reduction op)."""
    while terms.shape[axis] > 1:
        half = terms.shape[axis] // 2
        head = lax.slice_in_dim(terms, 0, half, axis=axis)
        tail = lax.slice_in_dim(terms, half, 2 * half, axis=axis)
        rest = lax.slice_in_dim(terms, 2 * half, terms.shape[axis], axis=axis)
        terms = jnp.concatenate([head + tail, rest], axis=axis) if rest.shape[axis] else head + tail
    return jnp.squeeze(terms, axis=axis)


def dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` in full precision (``a``: (s,) or (k, s); ``b``: (s,) or (s, n)).

    Small products (at most :data:`SMALL_DOT` multiply-adds: the stage and
    history combinations of a step) are an elementwise product summed over
    s by pairwise halving (:func:`_pairwise_sum`), not a ``dot_general`` nor
    a ``reduce``: XLA's CPU backend hands a ``dot_general``, and under
    ``vmap`` any reduction of 4096 numbers or more, to a library kernel
    (Eigen, YNNPACK) that the single-kernel emitter cannot compile
    (:mod:`odekit.ode.engine.single_kernel`; "Fusion kind not implemented on
    CPU"), and for a few hundred numbers the call costs more than the
    arithmetic. Larger ones are ``jnp.matmul`` at ``Precision.HIGHEST`` (no
    TF32 for float32 on GPUs: the stages carry the solution)."""
    small = (a.ndim == 1 and b.ndim == 1 and a.size <= SMALL_DOT) or (
        a.ndim in (1, 2) and b.ndim == 2 and a.size * b.shape[1] <= SMALL_DOT)
    if small and a.shape[-1] == 0:
        return jnp.zeros(a.shape[:-1] + b.shape[1:], jnp.result_type(a, b))
    if a.ndim == 1 and b.ndim == 1 and a.size <= SMALL_DOT:
        return _pairwise_sum(a * b, axis=0)
    if small:
        terms = a[..., :, None] * (b if a.ndim == 1 else b[None])
        return _pairwise_sum(terms, axis=-2 + terms.ndim)
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)

#: Largest n factored by :func:`eliminate` (and the stiff loop compiled as
#: one CPU kernel) instead of LAPACK. Measured in
#: ``benchmarks/results/stiff.md``, "Crossover of the lax LU" (Robertson x
#: ngroups to 1e10, interleaved medians of 21, OPENBLAS_NUM_THREADS=1, a
#: loaded 2-core CPU, 2026-12-06, two runs): lax / LAPACK time for rodas5p
#: (one LU per step) 0.19-0.20 at n = 3, 0.25-0.30 at 12, 0.88-1.56 at 30,
#: 1.5-2.0 at 60 (crossover between n = 24 and 35); for bdf (LU reused
#: across steps) 0.10, 0.10-0.13, 0.23, 0.39-0.43 and 1.10 at n = 90
#: (crossover near 85). 32 sits at rodas5p's crossover, where bdf still
#: gains 4x.
LAX_MAX_SIZE = 32


def _work_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32 for half precision (no LU kernel takes float16 / bfloat16)."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)


def eliminate(matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(lu, pivots)`` of Gaussian elimination with partial pivoting in lax
    operations (no library call): ``P matrix = L U`` with ``P`` the row swaps
    ``k <-> pivots[k]`` made in turn for k = 0, ..., n - 1 (LAPACK's ``ipiv``,
    0-based; ``lax.linalg.lu``'s second output).

    Step k (a ``fori_loop`` over n - 1 steps): the pivot is the first row
    p >= k of largest ``|a[p, k]|``; rows k and p swap; the multipliers
    ``l = a[k+1:, k] / a[k, k]`` replace that column and the trailing block
    takes the rank-one update ``a[k+1:, k+1:] -= l a[k, k+1:]``. Everything
    is written on the whole (n, n) array with index masks (no gather,
    scatter or matrix reduction, which XLA's CPU backend hands to library
    kernels that the single-kernel emitter cannot compile). ``lu`` holds the
    unit lower L below the diagonal and U on and above it, as
    ``lax.linalg.lu`` returns them.

    Args:
      matrix: (n, n), a float or complex dtype of at least 32 bits.

    Returns:
      ``lu`` (n, n) and ``pivots`` (n,) int32. A singular matrix gives a
      zero pivot and non-finite solutions, as LAPACK's.

    Cost: n - 1 rank-one updates computed on the whole array (~n^3 flops
    against getrf's 2 n^3 / 3: the masks trade flops for one kernel), O(n^2)
    memory; differentiable (the pivots are integers, the rest arithmetic).
    """
    n = matrix.shape[0]
    index = lax.iota(jnp.int32, n)
    if n == 0:                     # an empty state: nothing to eliminate
        return matrix, index
    zero = jnp.zeros((), matrix.dtype)

    def step(k, carry):
        a, pivots = carry
        column = lax.dynamic_slice_in_dim(a, k, 1, axis=1)[:, 0]
        size = jnp.where(index >= k, jnp.abs(column), -jnp.ones((), jnp.abs(column).dtype))
        p = jnp.min(jnp.where(size == jnp.max(size), index, n))
        row_k = lax.dynamic_slice_in_dim(a, k, 1, axis=0)
        row_p = lax.dynamic_slice_in_dim(a, p, 1, axis=0)
        a = jnp.where((index == k)[:, None], row_p, jnp.where((index == p)[:, None], row_k, a))
        pivots = jnp.where(index == k, p, pivots)
        below = (index > k)[:, None]
        pivot_row = jnp.where(index > k, row_p[0], zero)        # U's row k, right of k
        column = lax.dynamic_slice_in_dim(a, k, 1, axis=1)       # the swapped column k
        multipliers = jnp.where(below, column / lax.dynamic_slice(a, (k, k), (1, 1)), zero)
        a = jnp.where(below & (index == k)[None, :], multipliers,
                      a - multipliers * pivot_row[None, :])
        return a, pivots

    return lax.fori_loop(0, n - 1, step, (matrix, index))


#: Largest n whose transposed substitution (:func:`substitute_transposed`,
#: reverse mode's) is written out step by step rather than as ``fori_loop``
#: passes: straight code that XLA fuses, instead of about 3 n loop
#: iterations of a few kernels each (reverse mode runs kernel by kernel).
#: The forward substitution keeps its ``fori_loop`` passes (native loops
#: inside the one-kernel CPU loop, where the primal solves run).
UNROLL_MAX = 8


def substitute(lu: jax.Array, pivots: jax.Array, b: jax.Array) -> jax.Array:
    """``matrix^-1 b`` for (n,) ``b`` from :func:`eliminate`'s factors, in
    lax operations, as LAPACK's getrs: the row swaps ``k <-> pivots[k]`` in
    turn (laswp), forward substitution with the unit lower L column by
    column, back substitution with U (three ``fori_loop`` passes of about n
    steps, each O(1) or O(n) on the whole vector: no gather, no reduction).
    Cost O(n^2); linear in ``b``."""
    n = lu.shape[0]
    index = lax.iota(jnp.int32, n)
    zero = jnp.zeros((), lu.dtype)

    def swap(k, x):
        p = lax.dynamic_slice_in_dim(pivots, k, 1)[0]
        at_k, at_p = lax.dynamic_slice_in_dim(x, k, 1), lax.dynamic_slice_in_dim(x, p, 1)
        return jnp.where(index == k, at_p, jnp.where(index == p, at_k, x))

    def forward(k, x):
        column = lax.dynamic_slice_in_dim(lu, k, 1, axis=1)[:, 0]
        return x - jnp.where(index > k, column, zero) * lax.dynamic_slice_in_dim(x, k, 1)

    def backward(j, x):
        k = n - 1 - j
        column = lax.dynamic_slice_in_dim(lu, k, 1, axis=1)[:, 0]
        x_k = lax.dynamic_slice_in_dim(x, k, 1) / lax.dynamic_slice_in_dim(column, k, 1)
        x = jnp.where(index == k, x_k, x)
        return x - jnp.where(index < k, column, zero) * x_k

    return _passes(((swap, n - 1), (forward, n - 1), (backward, n)), b, unroll=False)


def substitute_transposed(lu: jax.Array, pivots: jax.Array, c: jax.Array) -> jax.Array:
    """``matrix^-T c`` for (n,) ``c`` from :func:`eliminate`'s factors (the
    plain transpose, also for complex matrices: reverse mode's): with ``P
    matrix = L U``, ``matrix^T = U^T L^T P``, so forward substitution with
    the lower ``U^T`` (U's rows), back substitution with the unit upper
    ``L^T`` (L's rows), then the swaps ``k <-> pivots[k]`` undone in reverse
    order. O(n^2); linear in ``c``; unrolled for n <= :data:`UNROLL_MAX`."""
    n = lu.shape[0]
    index = lax.iota(jnp.int32, n)
    zero = jnp.zeros((), lu.dtype)

    def upper(k, x):              # U^T y = c, column k of U^T is row k of U
        row = lax.dynamic_slice_in_dim(lu, k, 1, axis=0)[0]
        x_k = lax.dynamic_slice_in_dim(x, k, 1) / lax.dynamic_slice_in_dim(row, k, 1)
        x = jnp.where(index == k, x_k, x)
        return x - jnp.where(index > k, row, zero) * x_k

    def lower(j, x):              # L^T z = y from the last row up
        k = n - 1 - j
        row = lax.dynamic_slice_in_dim(lu, k, 1, axis=0)[0]
        return x - jnp.where(index < k, row, zero) * lax.dynamic_slice_in_dim(x, k, 1)

    def unswap(j, x):             # the swaps in reverse order
        k = n - 2 - j
        p = lax.dynamic_slice_in_dim(pivots, k, 1)[0]
        at_k, at_p = lax.dynamic_slice_in_dim(x, k, 1), lax.dynamic_slice_in_dim(x, p, 1)
        return jnp.where(index == k, at_p, jnp.where(index == p, at_k, x))

    return _passes(((upper, n), (lower, n - 1), (unswap, n - 1)), c.astype(lu.dtype),
                   unroll=n <= UNROLL_MAX)


def _passes(passes: tuple, x: jax.Array, unroll: bool) -> jax.Array:
    """``x`` through the ``(body, count)`` passes in turn, each ``body(k, x)``
    for k = 0 .. count - 1: written out when ``unroll`` (straight code that
    XLA fuses), else a ``fori_loop`` each."""
    for body, count in passes:
        if count <= 0:             # an empty state: no step
            continue
        if unroll:
            for k in range(count):
                x = body(k, x)
        else:
            x = lax.fori_loop(0, count, body, x)
    return x


def solve_factored_transposed(lu: jax.Array, permutation: jax.Array, c: jax.Array
                              ) -> jax.Array:
    """``matrix^-T c`` from :func:`factor`'s factors (the plain transpose):
    :func:`substitute_transposed` for the lax elimination; for LAPACK's
    ``matrix[permutation] = L U``, ``U^-T`` then ``L^-T`` (trsm) and the rows
    put back. O(n^2); linear in ``c``."""
    if uses_lax(lu.shape[0]):
        return substitute_transposed(lu, permutation, c)
    x = lax.linalg.triangular_solve(lu, c[:, None], left_side=True, lower=False,
                                    transpose_a=True)
    x = lax.linalg.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True,
                                    transpose_a=True)[:, 0]
    return jnp.zeros_like(x).at[permutation].set(x)


def uses_lax(n: int) -> bool:
    """Whether an (n, n) system is factored in lax (:func:`eliminate`) rather
    than by LAPACK: ``n <= LAX_MAX_SIZE``."""
    return n <= LAX_MAX_SIZE


def factor(matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The LU factors of an (n, n) ``matrix`` as a pair of arrays for
    :func:`solve_factored`: :func:`eliminate`'s ``(lu, pivots)`` when
    :func:`uses_lax` (n), else LAPACK getrf's ``(lu, permutation)``
    (``matrix[permutation] = L U``). O(n^3). Half precision is not
    converted here (see :func:`lu_solver`)."""
    if uses_lax(matrix.shape[0]):
        return eliminate(matrix)
    lu, _, permutation = lax.linalg.lu(matrix)
    return lu, permutation


def lu_solver(matrix: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """``b -> matrix^-1 b`` for (n,) ``b`` by ONE LU factorisation with partial
    pivoting (:func:`factor`: the row permutation is computed once, not per
    solve); O(n^3) once, O(n^2) per solve. Derivatives do not go through the
    factorisation (:mod:`odekit.ode.linalg.factored_solve`: ``dx = M^-1 (db
    - dM x)``, reverse mode by the transposed solve).

    A half-precision matrix (float16, bfloat16: no LU kernel takes them) is
    factored and solved in float32, the solutions cast back."""
    dtype = matrix.dtype
    work = _work_dtype(dtype)
    matrix = matrix.astype(work)
    lu, permutation = factor(lax.stop_gradient(matrix))
    matvec = lambda v: dot(v, matrix.T)          # M v, elementwise for small n
    with_factors = partial(solve_factored, lu, permutation)
    transposed = partial(solve_factored_transposed, lu, permutation)
    if work == dtype:
        return lambda b: factored_solve.solve(matvec, with_factors, b, transposed)
    return lambda b: factored_solve.solve(matvec, with_factors, b.astype(work),
                                          transposed).astype(dtype)


def solve_factored(lu: jax.Array, permutation: jax.Array, b: jax.Array) -> jax.Array:
    """``matrix^-1 b`` for (n,) ``b`` from :func:`factor`'s factors (either
    implementation, chosen by the same size rule: ``permutation`` is then
    :func:`eliminate`'s pivots): permute, then the unit lower and the upper
    triangular solves. O(n^2)."""
    if uses_lax(lu.shape[0]):
        return substitute(lu, permutation, b)
    x = b[permutation][:, None]
    x = lax.linalg.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
    return lax.linalg.triangular_solve(lu, x, left_side=True, lower=False)[:, 0]
