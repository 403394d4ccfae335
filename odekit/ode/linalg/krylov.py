"""Krylov solves of ``W = shift I - J`` on a sparse pattern, for systems whose
band is too wide for a banded LU (2-D and 3-D grids): ``linear_solver="krylov"``.

Nothing is factored but a preconditioner. A solve ``W x = b`` is restarted,
right-preconditioned GMRES (:mod:`odekit.ode.linalg.gmres`) with

* ``W v`` from J's (nnz,) values on the pattern (row gathers and products,
  O(n k) for rows of at most k entries): the same J the Rosenbrock and BDF
  steps compute by colored forward mode, so a product costs no evaluation of
  the field (a matrix-free ``jvp`` per product would cost one);
* a block-Jacobi preconditioner: W's entries inside diagonal blocks of
  :data:`PRECONDITIONER_BLOCK` consecutive unknowns (in the flat state's order,
  so that a grid point's species and its neighbours along the fastest axis
  share a block), factored as a block-diagonal LU
  (:mod:`odekit.ode.linalg.block_diagonal_lu`, blocks of at most 8 unknowns
  in lax). As CVODE's band-block preconditioners (Hindmarsh et al., "SUNDIALS",
  ACM TOMS 31(3), 2005, Sec. 5), it keeps the local couplings (reactions,
  the nearest neighbours) exactly and leaves the far ones to the iteration.

Accuracy. A Rosenbrock method's order conditions assume exact solves with W,
so the residual is driven to ``|b - W x| <= tol |b|`` with ``tol`` =
:func:`relative_tolerance` (1e-9 in float64, 100 eps in lower precision):
far below any local error a solve accepts at rtol >= 1e-8 (tested: the
order of rodas5p on a 2-D heat equation is that of the dense LU). BDF and
kvaerno5 solve inside Newton iterations, which would tolerate less; they
get the same tolerance. A solve that does not reach it within
``RESTART * MAX_CYCLES`` iterations returns NaN: the step is rejected and
retried with a smaller h, whose W is closer to a multiple of the identity
and easier for the iteration (never a silently inexact stage).

Derivatives go through :mod:`odekit.ode.linalg.factored_solve` (``W v`` by
the same products, the transposed solve by GMRES on ``W^T`` with the
transposed preconditioner). Cost per solve: iterations x (one product O(n k),
one preconditioner solve O(n m), O(n RESTART) orthogonalisation); memory
O(n RESTART) for the Krylov basis, O(n m) for the preconditioner's blocks.
No (n, n) array is formed.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from odekit.ode.linalg import gmres
from odekit.ode.linalg.block_diagonal_lu import BlockDiagonalFactors, BlockDiagonalLU
from odekit.ode.linalg.sparsity import Pattern, gathered_matvec, row_gather, values_and_shift

#: Consecutive unknowns per block of the block-Jacobi preconditioner (at most
#: odekit.ode.linalg.stacked_lu.MAX_BLOCK: the blocks are factored in lax).
PRECONDITIONER_BLOCK = 8
#: Krylov vectors per GMRES cycle, and cycles at most per solve.
RESTART = 30
MAX_CYCLES = 10


def relative_tolerance(dtype) -> float:
    """The residual GMRES must reach, relative to ``|b|``: 1e-9, or 100 eps
    of ``dtype`` where that is larger (float32: 1.2e-5)."""
    return max(1e-9, 100 * float(jnp.finfo(dtype).eps))


class KrylovFactors(NamedTuple):
    """What a solve needs (a pytree: a BDF step carries it between steps):
    J's ``values`` (nnz,), the ``shift``, and the preconditioner's factors."""
    values: jax.Array
    shift: jax.Array
    preconditioner: BlockDiagonalFactors


@dataclasses.dataclass(frozen=True, eq=False)
class KrylovSolver:
    """Static structure of the Krylov solves for a pattern (build once at
    trace time with :meth:`build`; then :meth:`factor` and :meth:`solve`).

    Attributes: ``n`` unknowns; ``rows``, ``cols`` the pattern (sorted by row,
    then column; J's values are given in this order); ``row_entries``,
    ``row_columns`` the (n, k) gathers of :meth:`matvec`; ``block_entries``
    the positions in the values of the entries inside the preconditioner's
    blocks; ``blocks`` their :class:`BlockDiagonalLU`; ``block_size`` m."""
    n: int
    rows: np.ndarray
    cols: np.ndarray
    row_entries: np.ndarray
    row_columns: np.ndarray
    block_entries: np.ndarray
    blocks: BlockDiagonalLU
    block_size: int

    in_lax = False    # GMRES's products and norms: the loop runs kernel by kernel
    iterative = True  # each solve is GMRES's nested loops (rodas5p rolls its stages)

    @classmethod
    def build(cls, n: int, rows, cols, block_size: int = PRECONDITIONER_BLOCK) -> "KrylovSolver":
        """The structure for the (n, n) pattern with entries at ``(rows,
        cols)`` (sorted by row then column, no duplicates). O(nnz + n k)."""
        n = int(n)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        cols = np.asarray(cols, dtype=np.int64).reshape(-1)
        keys = rows * n + cols
        if keys.size and np.any(np.diff(keys) <= 0):
            raise ValueError("the pattern's entries must be sorted by row, then column, "
                             "without duplicates")
        entries, columns = row_gather(Pattern(n=n, rows=rows, cols=cols))
        m = max(1, min(int(block_size), n))
        inside = np.flatnonzero(rows // m == cols // m)
        blocks = BlockDiagonalLU.build(n, rows[inside], cols[inside])
        return cls(n=n, rows=rows, cols=cols, row_entries=entries, row_columns=columns,
                   block_entries=inside, blocks=blocks, block_size=m)

    def describe(self) -> str:
        """A one-line summary of the structure."""
        return (f"GMRES({RESTART}), block-Jacobi preconditioner: n={self.n}, blocks of "
                f"{self.block_size} consecutive unknowns ({self.blocks.describe()})")

    def matvec(self, values: jax.Array, shift: jax.Array, v: jax.Array) -> jax.Array:
        """``W v = shift v - J v`` from J's (nnz,) values. O(n k)."""
        values, shift = values_and_shift(self.rows, values, shift)
        return gathered_matvec(self.row_entries, self.row_columns, values, shift, v)

    def factor(self, values: jax.Array, shift: jax.Array) -> KrylovFactors:
        """The preconditioner's factors (W's diagonal blocks), with J's values
        and the shift kept for the products. O(n m^2)."""
        values, shift = values_and_shift(self.rows, values, shift)
        return KrylovFactors(values, shift,
                             self.blocks.factor(values[self.block_entries], shift))

    def _gmres(self, matvec, precondition, b: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
        result = gmres.solve(matvec, precondition, b.astype(dtype), relative_tolerance(dtype),
                             RESTART, MAX_CYCLES)
        x = jnp.where(result.converged, result.x, jnp.full_like(result.x, jnp.nan))
        return x, result.iterations

    def solve_counted(self, factors: KrylovFactors, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(W^-1 b, iterations)`` for (n,) ``b``: the solution to
        :func:`relative_tolerance` (NaN where GMRES does not get there) and
        the GMRES iterations it took (int32, products with W)."""
        values, shift, blocks = factors
        return self._gmres(lambda v: self.matvec(values, shift, v),
                           lambda r: self.blocks.solve(blocks, r), b, values.dtype)

    def solve(self, factors: KrylovFactors, b: jax.Array) -> jax.Array:
        """``W^-1 b`` for (n,) ``b`` (:meth:`solve_counted` without the count)."""
        return self.solve_counted(factors, b)[0]

    def solve_transposed(self, factors: KrylovFactors, c: jax.Array) -> jax.Array:
        """``W^-T c`` (the plain transpose) by GMRES on ``W^T`` with the
        transposed preconditioner."""
        values, shift, blocks = factors
        dtype = values.dtype
        forward = lambda v: self.matvec(values, shift, v)
        precondition = lambda r: self.blocks.solve(blocks, r)
        zero = jnp.zeros((self.n,), dtype)
        transposed_matvec = jax.linear_transpose(forward, zero)
        transposed_precondition = jax.linear_transpose(precondition, zero)
        return self._gmres(lambda v: transposed_matvec(v)[0],
                           lambda r: transposed_precondition(r)[0], c, dtype)[0]
