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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class MassMatrix:
    """A concrete (n, n) mass matrix and its null spaces.

    Attributes:
      matrix: (n, n) float64 NumPy array M (read-only).
      left_null: (n, m) ``U_0``, orthonormal columns with ``U_0^T M = 0``.
      right_null: (n, m) ``V_0``, orthonormal columns with ``M V_0 = 0``.
      key: digest of M's bytes (equality and hashing).
    """

    matrix: np.ndarray
    left_null: np.ndarray
    right_null: np.ndarray
    key: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MassMatrix) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def num_algebraic(self) -> int:
        """m = n - rank(M): the number of algebraic equations (0 for an ODE)."""
        return int(self.left_null.shape[1])

    def array(self, dtype: Any) -> jax.Array:
        """M as an (n, n) array of ``dtype`` (real part only for a complex dtype: M is real)."""
        return jnp.asarray(self.matrix.astype(np.dtype(dtype)))

    def times(self, v: jax.Array) -> jax.Array:
        """``M v`` for an (n,) ``v``, in v's dtype."""
        return self.array(v.dtype) @ v

    def shifted(self, shift: jax.Array, jac: jax.Array) -> jax.Array:
        """``shift M - J`` for a scalar ``shift`` and an (n, n) ``J``."""
        return shift * self.array(jac.dtype) - jac

    def slope(self, f0: jax.Array, jac: jax.Array, f_t: jax.Array) -> jax.Array:
        """The consistent initial slope y'(t0) of ``M y' = f`` at a consistent
        y0, for an (n,) ``f0 = f(t0, y0)``, (n, n) ``J = df/dy`` and (n,) ``f_t
        = df/dt`` there. With ``M^+`` the pseudo-inverse, ``y' = M^+ f0 + V_0
        z'``: ``M^+ f0`` solves the differential equations (f0 lies in M's range
        where the algebraic equations hold) and the algebraic components'
        slope z' keeps them holding, ``d/dt U_0^T f = U_0^T (J y' + f_t) = 0``:

            z' = -(U_0^T J V_0)^-1 U_0^T (J M^+ f0 + f_t)

        (index 1: ``U_0^T J V_0`` nonsingular). ``M^-1 f0`` for a nonsingular M.
        O(n^2 + n m^2)."""
        dtype = f0.dtype
        pinv = jnp.asarray(np.linalg.pinv(self.matrix).astype(np.dtype(dtype)))
        differential = pinv @ f0
        if self.num_algebraic == 0:
            return differential
        left = jnp.asarray(self.left_null.astype(np.dtype(dtype)))
        right = jnp.asarray(self.right_null.astype(np.dtype(dtype)))
        coupling = left.T @ jac @ right
        drift = left.T @ (jac @ differential + f_t)
        return differential - right @ jnp.linalg.solve(coupling, drift)


def from_argument(value: Any, n: int, who: str) -> MassMatrix:
    """Check a ``mass_matrix=`` argument and build its :class:`MassMatrix`.

    The matrix must be concrete (a NumPy array, a nested list, or a JAX array
    that is not traced: it is structure, fixed when the solve is compiled),
    real, finite and (n, n) for a state of n numbers (the flattened ``y0``).

    Raises:
      TypeError: a traced or non-numeric matrix.
      ValueError: a wrong shape or non-finite entries.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{who}: mass_matrix must be concrete (a NumPy array or an untraced JAX array): "
            "it is part of the compiled solve's structure (its null space decides which "
            "equations are algebraic). Got a traced value: build M outside jax.jit / vmap / "
            "grad, or close over a NumPy array.")
    try:
        matrix = np.asarray(value)
    except Exception as error:  # noqa: BLE001 - any conversion failure is the user's type
        raise TypeError(f"{who}: mass_matrix must be an (n, n) array, got {value!r}.") from error
    if matrix.dtype.kind not in "biuf":
        raise TypeError(f"{who}: mass_matrix must be a real numeric (n, n) array, got dtype "
                        f"{matrix.dtype}.")
    if matrix.shape != (n, n):
        raise ValueError(f"{who}: mass_matrix must have shape ({n}, {n}) for a state of {n} "
                         f"numbers (the flattened y0), got shape {matrix.shape}.")
    matrix = matrix.astype(np.float64)
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{who}: mass_matrix has non-finite (nan or inf) entries.")
    left, right = null_spaces(matrix)
    matrix.setflags(write=False)
    digest = hashlib.sha1(matrix.tobytes()).hexdigest()
    return MassMatrix(matrix, left, right, f"{n}:{digest}")


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
