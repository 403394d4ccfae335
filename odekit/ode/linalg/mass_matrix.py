"""A constant mass matrix M of a linearly implicit system ``M y' = f(t, y)``.

``solve_ivp(..., mass_matrix=M)`` turns the ODE ``y' = f`` into the system
``M y' = f(t, y)`` over the flattened state (n numbers): M is (n, n),
constant and possibly singular. A singular M makes a differential-algebraic
equation (DAE): with the singular value decomposition ``M = U S V^T`` and
``r = rank(M)``, the last ``m = n - r`` columns ``U_0`` of U span the left
null space (``U_0^T M = 0``) and those ``V_0`` of V the right null space
(``M V_0 = 0``). Then

    U_0^T f(t, y) = 0                  (m algebraic equations)
    y = y_d + V_0 z,  z in R^m          (m algebraic components)

For the common case of zero rows and columns (``M = diag(1, 1, 0)`` for
Robertson written with its conservation law), ``U_0`` and ``V_0`` pick the
zero rows (equations) and the zero columns (components). The DAE has
(differential) index 1 at ``y`` when ``G = U_0^T J V_0`` (m, m) is
nonsingular (``J = df/dy``): the algebraic components are then locally a
function of the differential ones (Hairer & Wanner, Solving ODEs II,
Sec. VI.1 and VII.1; Brenan, Campbell & Petzold, Sec. 2.2).

A :class:`MassMatrix` is static data: the matrix is a concrete NumPy array
(or, for a ``scipy.sparse`` M, its diagonal or its entries: no (n, n) array)
(held by the linear system a stiff step uses, :class:`odekit.ode.linalg.
linear_system.Dense`), equal and hashed by a digest of its bytes, so that it
may sit in a static argument of ``jax.jit``. It enters a step twice: in the
iteration matrix ``W = M / (h gamma) - J`` (:meth:`MassMatrix.shifted`) and
as ``M v`` on the stage terms that stand for ``h y'``
(:meth:`MassMatrix.times`).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class MassMatrix:
    """A concrete (n, n) mass matrix and its null spaces.

    Attributes:
      size: n.
      matrix: (n, n) float64 NumPy array M (read-only), or None for an M
        given as a ``scipy.sparse`` matrix (no (n, n) array is made).
      diagonal: (n,) M's diagonal when M is diagonal, else None.
      entries: ``(rows, cols, values)`` of a non-diagonal M given as a
        ``scipy.sparse`` matrix whose singular part is zero rows and zero
        columns (``coordinate_aligned``), else None.
      left_null: (n, m) ``U_0``, orthonormal columns with ``U_0^T M = 0``.
      right_null: (n, m) ``V_0``, orthonormal columns with ``M V_0 = 0``.
      key: digest of M's bytes (equality and hashing).
    """

    size: int
    matrix: np.ndarray | None
    diagonal: np.ndarray | None
    left_null: np.ndarray
    right_null: np.ndarray
    key: str
    entries: tuple | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MassMatrix) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def n(self) -> int:
        return self.size

    @property
    def num_algebraic(self) -> int:
        """m = n - rank(M): the number of algebraic equations (0 for an ODE)."""
        return int(self.left_null.shape[1])

    @property
    def coordinate_aligned(self) -> bool:
        """M's null spaces are spanned by unit vectors: its singular part is
        zero rows (the algebraic equations) and zero columns (the algebraic
        components), as a structured linear solver needs."""
        unit = lambda basis: bool(np.all(np.sum(basis != 0, axis=0) == 1))
        return unit(self.left_null) and unit(self.right_null)

    def coordinates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, cols, values)`` of M's nonzero entries (NumPy)."""
        if self.diagonal is not None:
            index = np.flatnonzero(self.diagonal)
            return index, index, self.diagonal[index]
        if self.entries is not None:
            return self.entries
        rows, cols = np.nonzero(self.matrix)
        return rows, cols, self.matrix[rows, cols]

    def array(self, dtype: Any) -> jax.Array:
        """M as an (n, n) array of ``dtype`` (real part only for a complex
        dtype: M is real). O(n^2): the dense paths only."""
        if self.matrix is not None:
            return jnp.asarray(self.matrix.astype(np.dtype(dtype)))
        if self.diagonal is not None:
            return jnp.diag(jnp.asarray(self.diagonal.astype(np.dtype(dtype))))
        rows, cols, values = self.entries
        return jnp.zeros((self.size, self.size), dtype).at[rows, cols].add(
            jnp.asarray(values.astype(np.dtype(dtype))))

    def times(self, v: jax.Array) -> jax.Array:
        """``M v`` for an (n,) ``v``, in v's dtype (O(nnz) for a sparse M)."""
        return self._product(v, transpose=False)

    def _product(self, v: jax.Array, transpose: bool) -> jax.Array:
        if self.diagonal is not None:
            return jnp.asarray(self.diagonal.astype(np.dtype(v.dtype))) * v
        if self.entries is not None:
            rows, cols, values = self.entries
            rows, cols = (cols, rows) if transpose else (rows, cols)
            weights = jnp.asarray(values.astype(np.dtype(v.dtype)))
            return jax.ops.segment_sum(weights * v[cols], rows, num_segments=self.size)
        matrix = self.array(v.dtype)
        return (matrix.T if transpose else matrix) @ v

    def shifted(self, shift: jax.Array, jac: jax.Array) -> jax.Array:
        """``shift M - J`` for a scalar ``shift`` and an (n, n) ``J``."""
        return shift * self.array(jac.dtype) - jac

    def pseudo_inverse_times(self, f: jax.Array) -> jax.Array:
        """``M^+ f`` (the pseudo-inverse; ``1 / M_ii`` on a nonzero diagonal
        entry; for a sparse M a structured solve, :meth:`_sparse_pseudo_inverse`)."""
        return self._pseudo_inverse(f, transpose=False)

    def transpose_times(self, v: jax.Array) -> jax.Array:
        """``M^T v`` for an (n,) ``v``, in v's dtype."""
        return self._product(v, transpose=True)

    def transpose_pseudo_inverse_times(self, g: jax.Array) -> jax.Array:
        """``(M^T)^+ g = (M^+)^T g``: the ``x`` in M's row space with ``M^T x =
        g`` for a ``g`` in the range of ``M^T`` (orthogonal to ``V_0``)."""
        return self._pseudo_inverse(g, transpose=True)

    def _pseudo_inverse(self, f: jax.Array, transpose: bool) -> jax.Array:
        if self.diagonal is not None:
            d = self.diagonal
            inverse = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0)
            return jnp.asarray(inverse.astype(np.dtype(f.dtype))) * f
        if self.entries is not None:
            return self._sparse_pseudo_inverse(f, transpose)
        inverse = np.linalg.pinv(self.matrix)
        return jnp.asarray((inverse.T if transpose else inverse).astype(np.dtype(f.dtype))) @ f

    def _sparse_pseudo_inverse(self, f: jax.Array, transpose: bool) -> jax.Array:
        """``M^+ f`` for a sparse, coordinate-aligned M (zero rows R, zero
        columns C, nonsingular elsewhere): ``x_C = 0`` and the rest solves
        ``M x = f`` off R. That is ``M_1 x = f`` with ``f_R`` zeroed and
        ``M_1 = M + sum_k e_{R_k} e_{C_k}^T`` (nonsingular), by the
        structured LU of M_1's pattern (:mod:`odekit.ode.linalg.linear_system`;
        O(n b^2) banded, no (n, n) array)."""
        from odekit.ode.linalg import linear_system, sparsity
        rows, cols, values = self.entries
        zero_rows = np.flatnonzero(np.any(self.left_null != 0, axis=1))
        zero_cols = np.flatnonzero(np.any(self.right_null != 0, axis=1))
        if transpose:
            rows, cols, zero_rows, zero_cols = cols, rows, zero_cols, zero_rows
        rows = np.concatenate([rows, zero_rows])
        cols = np.concatenate([cols, zero_cols])
        weights = jnp.asarray(np.concatenate([values, np.ones(zero_rows.size)])
                              .astype(np.dtype(f.dtype)))
        system = linear_system.structured(sparsity.from_coordinates(self.size, rows, cols))
        regular = lambda v: jax.ops.segment_sum(weights * v[cols], rows, num_segments=self.size)
        x = system.solve_linear_map(regular, f.at[zero_rows].set(0))
        return x.at[zero_cols].set(0)

    def for_adjoint(self, extra: int) -> "MassMatrix":
        """The mass matrix ``blockdiag(M^T, I_extra)`` of a continuous adjoint
        ``M^T lambda' = -J^T lambda`` integrated together with ``extra``
        quadratures (the parameters' cotangents). Its null spaces are M's,
        swapped (``U_0`` of ``M^T`` is ``V_0`` of M) and padded with zeros;
        a diagonal M gives a diagonal one (no (n + extra)^2 array)."""
        pad = lambda basis: np.concatenate([basis, np.zeros((extra, basis.shape[1]))])
        size = self.size + extra
        entries = None
        if self.diagonal is not None:
            diagonal = np.concatenate([self.diagonal, np.ones(extra)])
            matrix = None
        elif self.entries is not None:
            rows, cols, values = self.entries
            quadrature = np.arange(self.size, size)
            entries = tuple(_frozen(a) for a in (np.concatenate([cols, quadrature]),
                                                 np.concatenate([rows, quadrature]),
                                                 np.concatenate([values, np.ones(extra)])))
            diagonal = matrix = None
        else:
            diagonal = None
            matrix = np.zeros((size, size))
            matrix[:self.size, :self.size] = self.matrix.T
            matrix[self.size:, self.size:] = np.eye(extra)
            matrix.setflags(write=False)
        return MassMatrix(size, matrix, None if diagonal is None else _frozen(diagonal),
                          _frozen(pad(self.right_null)), _frozen(pad(self.left_null)),
                          f"adjoint:{extra}:{self.key}", entries)

    def slope(self, f0: jax.Array, jac_times: Callable[[jax.Array], jax.Array],
              f_t: jax.Array) -> jax.Array:
        """The consistent initial slope y'(t0) of ``M y' = f`` at a consistent
        y0, for an (n,) ``f0 = f(t0, y0)``, ``jac_times(v) = J v`` (``J =
        df/dy`` there) and (n,) ``f_t = df/dt``. With ``M^+`` the
        pseudo-inverse, ``y' = M^+ f0 + V_0 z'``: ``M^+ f0`` solves the
        differential equations (f0 lies in M's range where the algebraic
        equations hold) and the algebraic components' slope z' keeps them
        holding, ``d/dt U_0^T f = U_0^T (J y' + f_t) = 0``:

            z' = -(U_0^T J V_0)^-1 U_0^T (J M^+ f0 + f_t)

        (index 1: ``U_0^T J V_0`` nonsingular). ``M^-1 f0`` for a nonsingular M.
        m + 1 products with J and O(n m + m^3)."""
        dtype = f0.dtype
        differential = self.pseudo_inverse_times(f0)
        if self.num_algebraic == 0:
            return differential
        left = jnp.asarray(self.left_null.astype(np.dtype(dtype)))
        right = jnp.asarray(self.right_null.astype(np.dtype(dtype)))
        coupling = left.T @ jax.vmap(jac_times, in_axes=1, out_axes=1)(right)
        drift = left.T @ (jac_times(differential) + f_t)
        return differential - right @ jnp.linalg.solve(coupling, drift)


#: Largest n for which a non-diagonal sparse mass matrix is made dense.
DENSE_LIMIT = 4096


def from_argument(value: Any, n: int, who: str) -> MassMatrix:
    """Check a ``mass_matrix=`` argument and build its :class:`MassMatrix`.

    The matrix must be concrete (a NumPy array, a nested list, a JAX array
    that is not traced: it is structure, fixed when the solve is compiled, or
    a ``scipy.sparse`` matrix), real, finite and (n, n) for a state of n
    numbers (the flattened ``y0``). A diagonal M keeps its diagonal (O(n),
    what a structured linear solver takes); a sparse diagonal M never becomes
    an (n, n) array. A non-diagonal sparse M is made dense up to n =
    ``DENSE_LIMIT``.

    Raises:
      TypeError: a traced or non-numeric matrix.
      ValueError: a wrong shape, non-finite entries, or a non-diagonal sparse
        M above ``DENSE_LIMIT``.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{who}: mass_matrix must be concrete (a NumPy array or an untraced JAX array): "
            "it is part of the compiled solve's structure (its null space decides which "
            "equations are algebraic). Got a traced value: build M outside jax.jit / vmap / "
            "grad, or close over a NumPy array.")
    if type(value).__module__.startswith("scipy.sparse"):
        return _from_sparse(value, n, who)
    try:
        matrix = np.asarray(value)
    except Exception as error:  # noqa: BLE001 - any conversion failure is the user's type
        raise TypeError(f"{who}: mass_matrix must be an (n, n) array, got {value!r}.") from error
    _check_numeric(matrix.dtype, matrix.shape, n, who)
    matrix = matrix.astype(np.float64)
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{who}: mass_matrix has non-finite (nan or inf) entries.")
    diagonal = np.diagonal(matrix).copy()
    is_diagonal = np.count_nonzero(matrix) == np.count_nonzero(diagonal)
    left, right = null_spaces(matrix)
    matrix.setflags(write=False)
    digest = hashlib.sha1(matrix.tobytes()).hexdigest()
    return MassMatrix(n, matrix, _frozen(diagonal) if is_diagonal else None, left, right,
                      f"{n}:{digest}")


def _check_numeric(dtype: np.dtype, shape: tuple, n: int, who: str) -> None:
    if dtype.kind not in "biuf":
        raise TypeError(f"{who}: mass_matrix must be a real numeric (n, n) array, got dtype "
                        f"{dtype}.")
    if tuple(shape) != (n, n):
        raise ValueError(f"{who}: mass_matrix must have shape ({n}, {n}) for a state of {n} "
                         f"numbers (the flattened y0), got shape {tuple(shape)}.")


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _from_sparse(value: Any, n: int, who: str) -> MassMatrix:
    """A ``scipy.sparse`` M: its diagonal when it is diagonal (no (n, n)
    array), else dense up to ``DENSE_LIMIT``."""
    coo = value.tocoo()
    _check_numeric(coo.dtype, coo.shape, n, who)
    data = np.asarray(coo.data, np.float64)
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{who}: mass_matrix has non-finite (nan or inf) entries.")
    off = (coo.row != coo.col) & (data != 0)
    if np.any(off):
        aligned = _coordinate_aligned_sparse(coo.tocsr(), n)
        if aligned is not None:
            return aligned
        if n > DENSE_LIMIT:
            raise ValueError(
                f"{who}: this sparse mass_matrix is singular in a direction that is not a "
                "zero row and a zero column (its null space mixes components); such an M is "
                f"taken up to n = {DENSE_LIMIT} (made dense, for the dense linear algebra), "
                f"and this one has n = {n}. Write the algebraic equations as zero rows of M "
                "and the algebraic components as its zero columns.")
        return from_argument(value.toarray(), n, who)
    diagonal = np.zeros(n)
    np.add.at(diagonal, coo.row, data)
    algebraic = np.flatnonzero(diagonal == 0)
    null = np.zeros((n, algebraic.size))
    null[algebraic, np.arange(algebraic.size)] = 1.0
    digest = hashlib.sha1(b"diagonal" + diagonal.tobytes()).hexdigest()
    return MassMatrix(n, None, _frozen(diagonal), _frozen(null), _frozen(null.copy()),
                      f"{n}:d:{digest}")


def _coordinate_aligned_sparse(csr: Any, n: int) -> MassMatrix | None:
    """The :class:`MassMatrix` of a non-diagonal sparse M whose singular part
    is its zero rows and zero columns (as many of each, the rest nonsingular
    by SciPy's sparse LU), kept as its entries; None for any other M."""
    import scipy.sparse
    import scipy.sparse.linalg
    csr = scipy.sparse.csr_array(csr)
    csr.eliminate_zeros()
    csr.sum_duplicates()
    zero_rows = np.flatnonzero(np.diff(csr.indptr) == 0)
    zero_cols = np.setdiff1d(np.arange(n), csr.indices)
    if zero_rows.size != zero_cols.size:
        return None
    keep_rows = np.setdiff1d(np.arange(n), zero_rows)
    keep_cols = np.setdiff1d(np.arange(n), zero_cols)
    block = csr[keep_rows][:, keep_cols].tocsc()
    if block.shape[0]:
        try:
            factors = scipy.sparse.linalg.splu(block)
        except RuntimeError:          # exactly singular
            return None
        pivots = np.abs(np.concatenate([factors.U.diagonal()]))
        if not np.all(pivots > n * np.finfo(float).eps * np.max(np.abs(block.data))):
            return None
    coo = csr.tocoo()
    left = np.zeros((n, zero_rows.size))
    left[zero_rows, np.arange(zero_rows.size)] = 1.0
    right = np.zeros((n, zero_cols.size))
    right[zero_cols, np.arange(zero_cols.size)] = 1.0
    rows, cols = coo.row.astype(np.int64), coo.col.astype(np.int64)
    values = np.asarray(coo.data, np.float64)
    digest = hashlib.sha1(b"entries" + rows.tobytes() + cols.tobytes()
                          + values.tobytes()).hexdigest()
    return MassMatrix(n, None, None, _frozen(left), _frozen(right), f"{n}:e:{digest}",
                      (_frozen(rows), _frozen(cols), _frozen(values)))


def null_spaces(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(U_0, V_0)``, (n, m) orthonormal bases of M's left and right null
    spaces, by the SVD with NumPy's rank rule (singular values below
    ``n eps sigma_max`` count as zero). Rows and columns that are exactly
    zero give unit vectors (no rotation by the SVD): a diagonal M's
    algebraic components are components of y."""
    n = matrix.shape[0]
    zero_rows = np.flatnonzero(~np.any(matrix != 0, axis=1))
    zero_cols = np.flatnonzero(~np.any(matrix != 0, axis=0))
    rank = np.linalg.matrix_rank(matrix) if n else 0
    m = n - rank
    if len(zero_rows) == m and len(zero_cols) == m:
        eye = np.eye(n)
        return eye[:, zero_rows], eye[:, zero_cols]
    u, _, vt = np.linalg.svd(matrix)
    return u[:, rank:], vt[rank:].T
