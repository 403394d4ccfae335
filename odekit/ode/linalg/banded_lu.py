"""Banded LU with partial pivoting for ``W = shift * I - J``, J sparse with a
static pattern, written in lax (jit, vmap, grad, jvp; CPU and GPU).

Structure (trace time, NumPy/SciPy; :meth:`BandedLU.build`)
-----------------------------------------------------------
The unknowns are reordered by reverse Cuthill-McKee
(:func:`odekit.ode.linalg.ordering.reverse_cuthill_mckee`), ``A = W[p][:, p]``,
which has band widths ``(l, u)``. With a block size ``m >= max(l, u)`` and n
padded to ``N m`` (identity rows and columns), A is block tridiagonal with
m x m blocks::

    A = [[D_0, U_0,            ],
         [L_0, D_1, U_1,       ],
         [     L_1, D_2, U_2,  ],
         [          ...        ]]

stored as one (3, N, m, m) array ``[L, D, U]`` (``L[k]`` is block (k+1, k),
``U[k]`` block (k, k+1), ``L[N-1] = U[N-1] = 0``). Every structural entry and
every diagonal entry has a fixed position in it, computed once.

Factorisation (traced; :meth:`BandedLU.factor`)
-----------------------------------------------
Block LU with partial pivoting, the block analogue of LAPACK's ``gbtrf``
(Anderson et al., LAPACK Users' Guide, 3rd ed., 1999, section 4.3.1; Golub &
Van Loan, Matrix Computations, 4th ed., section 4.3.4): a row interchange
within the two-block-row panel moves a row of block row k+1 into block row k,
so U gains one extra super-diagonal block (fill-in), as gbtrf stores kl extra
super-diagonals. At block step k, with ``D~_k, U~_k`` the Schur-updated blocks
of block row k,

    P_k [D~_k; L_k] = [L11; L21] U11       (lax.linalg.lu of the 2m x m panel)
    [T; B] = P_k [[U~_k, 0], [D_{k+1}, U_{k+1}]]        (2m x 2m)
    [F12, F13] = L11^-1 T                  (row k of U: U11, F12, F13)
    [D~_{k+1}, U~_{k+1}] = B - L21 [F12, F13]           (Schur complement)

a ``lax.scan`` of N sequential steps, each O(m^3) dense work: O(n m^2) time
and O(n m) memory in all. The last step pairs D~_{N-1} with an identity block.

For fast solves each step also stores the step's elimination and back
substitution as dense matrices (triangular inverses, Du Croz & Higham 1992):

    [z~_k; z_{k+1}] = M_k [z_k; b_{k+1}],   M_k = [[L11^-1 P_top], [P_bot - L21 L11^-1 P_top]]
    x_k = U11^-1 z~_k - G_k [x_{k+1}; x_{k+2}],          G_k = U11^-1 [F12, F13]

so a solve (:meth:`BandedLU.solve`) is two batched products over all blocks
plus two scans of ONE small matrix-vector product per step each: O(n m) work,
2 N sequential steps.

Derivatives: jvp and vjp go through lax (``lax.linalg.lu`` has a jvp rule for
rectangular matrices; scan and gathers transpose), so ``jax.grad`` and
``jax.jvp`` of factor + solve agree with a dense solve's derivatives.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit.ode.linalg import ordering
from odekit.ode.linalg.sparsity import shifted_matvec, values_and_shift

# Default block size: the smallest block used whatever the band width. Larger
# blocks mean fewer sequential scan steps but ~20 m^3 flops per step, which
# XLA's CPU dots run at only a few GFlop/s at these sizes. Measured on an idle
# 2-core CPU (2026-12-07, jax 0.10.2, float64, band width 2 (the 1-D
# Brusselator), OPENBLAS_NUM_THREADS=1, interleaved medians of 31):
#   n = 2000: factor 1.64 / 1.54 / 1.56 ms, solve 0.16 / 0.19 / 0.32 ms at m = 2 / 4 / 8
#   n = 8000: factor 6.45 / 6.52 / 7.49 ms, solve 0.58 / 0.66 / 1.37 ms
# and whole solves (A/B in one process, 11 rounds) at n = 2000: bdf 144 / 156 / 222
# ms, rodas5p 180 / 166 / 202 ms; n = 8000: bdf 623 / 682 / 948, rodas5p 798 / 726 /
# 976 ms. Earlier, on a loaded machine and an older factorisation, m = 2 factored
# 4x slower than m = 4 to 8 (28 against 6-7 ms at n = 8000), and m = 16 / 32 were
# 2-7x slower than 8; at band width 8, m = 8 / 12 / 16 factored in 6 / 22 / 36 ms.
# So on CPU m = max(b, 4). On a GPU each scan step is a few kernel launches:
# pass a larger block_size.
MIN_BLOCK_SIZE = 4


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _small_matvec(a: jax.Array, v: jax.Array) -> jax.Array:
    """``a @ v`` for one small block, the solve scans' step: an elementwise
    product and a row sum, which XLA fuses into the loop body (a
    ``dot_general`` there is a library call on each of the N sequential
    steps: 178 -> 136 us a solve at n = 2000, m = 8, interleaved medians).
    Unrolling the scans (``unroll=4, 8``) was slower (171-273 us)."""
    return jnp.sum(a * v[None, :], axis=1)


def default_block_size(n: int, bandwidth: int) -> int:
    """The block size m for n unknowns of band width ``bandwidth = max(l, u)``:

    ``m0 = max(bandwidth, MIN_BLOCK_SIZE)``; the number of blocks is
    ``N = ceil(n / m0)`` and m is then shrunk to ``ceil(n / N)`` (same number
    of sequential steps, less identity padding) unless that falls below the
    band width; ``m = n`` (one dense block) when ``n <= m0``."""
    bandwidth = max(int(bandwidth), 1)
    m0 = max(bandwidth, MIN_BLOCK_SIZE)
    if n <= m0:
        return max(n, 1)
    blocks = -(-n // m0)
    m = -(-n // blocks)
    return m if m >= bandwidth else m0


class BandedFactors(NamedTuple):
    """The factors of :meth:`BandedLU.factor` (a pytree; N blocks of size m).

    ``forward``: (N, 2m, 2m) ``M_k`` of the forward elimination;
    ``inverse_u``: (N, m, m) ``U11^-1``; ``back``: (N, m, 2m) ``G_k``."""
    forward: jax.Array
    inverse_u: jax.Array
    back: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class BandedLU:
    """Static structure of a banded LU of ``W = shift * I - J`` (build once at
    trace time with :meth:`build`; then :meth:`factor` and :meth:`solve`).

    Attributes: ``n`` unknowns; ``permutation`` (n,) the RCM order (new i is
    old ``permutation[i]``) and ``inverse`` its inverse; ``lower, upper`` the
    band widths after it; ``block_size`` m and ``num_blocks`` N
    (``N m >= n``); ``entry_index`` (nnz,) the flat positions of the
    structural entries in the (3, N, m, m) block storage, ``diagonal_index``
    (n,) those of the diagonal, ``padding_index`` those of the padded
    diagonal; ``rows``, ``cols`` the pattern (for :meth:`matvec`)."""
    n: int
    rows: np.ndarray
    cols: np.ndarray
    permutation: np.ndarray
    inverse: np.ndarray
    lower: int
    upper: int
    block_size: int
    num_blocks: int
    entry_index: np.ndarray
    diagonal_index: np.ndarray
    padding_index: np.ndarray

    @classmethod
    def build(cls, n: int, rows, cols, block_size: int | None = None) -> "BandedLU":
        """The structure for the (n, n) pattern with entries at ``(rows, cols)``
        (NumPy int arrays of equal length; duplicates are summed; the
        diagonal need not be among them). ``block_size`` defaults to
        :func:`default_block_size`; it must be at least the band width after
        RCM. O(nnz log nnz + n) NumPy work."""
        n = int(n)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        cols = np.asarray(cols, dtype=np.int64).reshape(-1)
        permutation = ordering.reverse_cuthill_mckee(n, rows, cols)
        lower, upper = ordering.bandwidths(n, rows, cols, permutation)
        bandwidth = max(lower, upper)
        if block_size is None:
            m = default_block_size(n, bandwidth)
        else:
            m = int(block_size)
            if m < max(bandwidth, 1):
                raise ValueError(f"block_size={m} is smaller than the band width {bandwidth} "
                                 f"after reverse Cuthill-McKee ordering (lower {lower}, upper {upper})")
        num_blocks = -(-n // m)
        inverse = np.empty(n, dtype=np.int64)
        inverse[permutation] = np.arange(n, dtype=np.int64)

        def flat(i: np.ndarray, j: np.ndarray) -> np.ndarray:
            bi, bj = i // m, j // m
            kind = bj - bi + 1                       # 0: L (below), 1: D, 2: U (above)
            block = np.where(kind == 0, bj, bi)
            return ((kind * num_blocks + block) * m + i % m) * m + j % m

        entry_index = flat(inverse[rows], inverse[cols])
        diagonal = np.arange(n, dtype=np.int64)
        padding = np.arange(n, num_blocks * m, dtype=np.int64)
        index_dtype = np.int32 if 3 * num_blocks * m * m < 2**31 else np.int64
        return cls(n=n, rows=rows, cols=cols, permutation=permutation, inverse=inverse,
                   lower=lower, upper=upper, block_size=m, num_blocks=num_blocks,
                   entry_index=entry_index.astype(index_dtype),
                   diagonal_index=flat(diagonal, diagonal).astype(index_dtype),
                   padding_index=flat(padding, padding).astype(index_dtype))

    def describe(self) -> str:
        """A one-line summary of the structure."""
        return (f"banded LU: n={self.n}, bandwidth ({self.lower}, {self.upper}) after RCM, "
                f"block size m={self.block_size}, num_blocks={self.num_blocks}")

    def blocks(self, values: jax.Array, shift: jax.Array) -> jax.Array:
        """The (3, N, m, m) block storage ``[L, D, U]`` of ``A = (shift I - J)[p][:, p]``
        padded with identity rows and columns. O(n m) memory."""
        values, shift = values_and_shift(self.rows, values, shift)
        dtype = values.dtype
        m, num = self.block_size, self.num_blocks
        flat = jnp.zeros(3 * num * m * m, dtype)
        flat = flat.at[self.entry_index].add(-values)
        flat = flat.at[self.diagonal_index].add(jnp.broadcast_to(shift, (self.n,)))
        if self.padding_index.size:
            flat = flat.at[self.padding_index].set(jnp.ones(self.padding_index.shape, dtype))
        return flat.reshape(3, num, m, m)

    def factor(self, values: jax.Array, shift: jax.Array) -> BandedFactors:
        """Factor ``W = shift * I - J`` (J's structural values ``values``, (nnz,);
        ``shift`` a scalar, cast to values' dtype) by block LU with partial
        pivoting: N sequential steps of O(m^3), O(n m^2) time, O(n m) memory."""
        m = self.block_size
        sub, diag, sup = self.blocks(values, shift)
        dtype = diag.dtype
        eye = jnp.eye(m, dtype=dtype)
        zero = jnp.zeros((m, m), dtype)
        next_diag = jnp.concatenate([diag[1:], eye[None]], axis=0)
        next_sup = jnp.concatenate([sup[1:], zero[None]], axis=0)

        def step(carry, x):
            # only the sequential part: the panel LU and the Schur complement
            d, u = carry
            lk, dn, un = x
            panel = jnp.concatenate([d, lk], axis=0)                         # (2m, m)
            lu, _, perm = lax.linalg.lu(panel)
            slab = jnp.concatenate([jnp.concatenate([u, zero], axis=1),
                                    jnp.concatenate([dn, un], axis=1)], axis=0)[perm]
            f = lax.linalg.triangular_solve(lu[:m], slab[:m], left_side=True, lower=True,
                                            unit_diagonal=True)              # (m, 2m)
            schur = slab[m:] - _dot(lu[m:], f)
            return (schur[:, :m], schur[:, m:]), (lu, perm, f)

        _, (lu, perm, f) = lax.scan(step, (diag[0], sup[0]), (sub, next_diag, next_sup))
        # batched over all blocks (no sequential dependence): the solve's matrices
        num = self.num_blocks
        eyes = jnp.broadcast_to(eye, (num, m, m))
        l11 = lu[:, :m]
        inv_l = lax.linalg.triangular_solve(l11, eyes, left_side=True, lower=True,
                                            unit_diagonal=True)
        inverse_u = lax.linalg.triangular_solve(l11, eyes, left_side=True, lower=False)
        k21 = _dot(lu[:, m:], inv_l)
        back = _dot(inverse_u, f)
        # M_k = [[L11^-1 P_top], [P_bot - L21 L11^-1 P_top]]: P_top's row i is
        # e_perm[i], so L11^-1 P_top is L11^-1's columns scattered to perm[:m].
        blocks_k = jnp.arange(num)[:, None, None]
        rows_m = jnp.arange(m)[None, :, None]
        cols_top = perm[:, None, :m]
        top = jnp.zeros((num, m, 2 * m), dtype).at[blocks_k, rows_m, cols_top].set(inv_l)
        bottom = jnp.zeros((num, m, 2 * m), dtype).at[blocks_k, rows_m, cols_top].set(-k21)
        bottom = bottom.at[jnp.arange(num)[:, None], jnp.arange(m)[None, :], perm[:, m:]].set(1)
        forward = jnp.concatenate([top, bottom], axis=1)
        return BandedFactors(forward, inverse_u, back)

    def solve(self, factors: BandedFactors, b: jax.Array) -> jax.Array:
        """``W^-1 b`` for (n,) ``b`` (cast to the factors' dtype) from
        :meth:`factor`'s factors: O(n m) work, 2 N sequential steps of one
        small matrix-vector product each."""
        m, num = self.block_size, self.num_blocks
        forward, inverse_u, back = factors
        dtype = forward.dtype
        b = jnp.asarray(b)
        if b.shape != (self.n,):
            raise ValueError(f"b must have shape ({self.n},), got {b.shape}")
        b = b.astype(dtype)[self.permutation]
        b = jnp.concatenate([b, jnp.zeros((num * m - self.n,), dtype)]).reshape(num, m)
        b_next = jnp.concatenate([b[1:], jnp.zeros((1, m), dtype)], axis=0)
        known = jnp.einsum("kij,kj->ki", forward[:, :, m:], b_next,
                           precision=lax.Precision.HIGHEST)                # (N, 2m)

        def eliminate(z, x):
            coefficient, rhs = x
            out = _small_matvec(coefficient, z) + rhs
            return out[m:], out[:m]

        _, z = lax.scan(eliminate, b[0], (forward[:, :, :m], known))
        c = jnp.einsum("kij,kj->ki", inverse_u, z, precision=lax.Precision.HIGHEST)

        def substitute(x12, x):
            g, ck = x
            xk = ck - _small_matvec(g, x12)
            return jnp.concatenate([xk, x12[:m]]), xk

        _, x = lax.scan(substitute, jnp.zeros((2 * m,), dtype), (back, c), reverse=True)
        return x.reshape(num * m)[:self.n][self.inverse]

    def matvec(self, values: jax.Array, shift: jax.Array, v: jax.Array) -> jax.Array:
        """``W v = shift v - J v`` for (n,) v from the structural entries
        (O(nnz); no dense matrix)."""
        return shifted_matvec(self.n, self.rows, self.cols, values, shift, v)
