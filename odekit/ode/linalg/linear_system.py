"""How a stiff step gets its Jacobian and solves with its iteration matrix.

Every implicit step needs, at its start, the Jacobian ``J = df/dy`` (and, for
a Rosenbrock method, ``f_t = df/dt``), one factorisation of

    W = shift I - J          (shift = 1 / (h gamma))

and many solves ``W^-1 b``. A :class:`LinearSystem` says how:

* :class:`Dense` (the default): J as an (n, n) array by forward mode over the
  n unit directions (or the user's ``jac``), LAPACK's LU with partial
  pivoting. O(n^2) memory, O(n^3) per factorisation.
* :class:`Structured`: a static nonzero pattern of J (``jac_sparsity``, or
  found from the traced field), J's nonzeros by compressed forward mode (one
  jvp per color of the column coloring, :mod:`odekit.ode.linalg.sparsity`)
  and a structured LU chosen from the pattern at trace time
  (:func:`odekit.ode.linalg.ordering.choose`): block-diagonal (independent
  small components: a batched LU), banded (after a reverse Cuthill-McKee
  ordering: O(n b^2) time, O(n b) memory), or dense (a wide pattern: the
  colored Jacobian scattered into an (n, n) array). No (n, n) array exists
  on the block-diagonal and banded paths. ``linear_solver="krylov"`` asks
  instead for preconditioned GMRES (:mod:`odekit.ode.linalg.krylov`: no
  factorisation of W, for 2-D and 3-D grids whose band is wide).

The step asks the field it is given for its system (:func:`of`): the bound
vector field carries it as its ``linear_system`` attribute (see
:func:`odekit.ode.linalg.jacobian.bind`), as it carries a user Jacobian.
Systems are static (hashable, compared by their structure), so they may sit
in a static argument of ``jax.jit``.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit.ode.linalg import factored_solve, jacobian
from odekit.ode.linalg.lu import factor, lu_solver, solve_factored, uses_lax


def _sparsity():
    """:mod:`odekit.ode.linalg.sparsity`, imported on first use (it needs
    scipy.sparse, which ``import odekit`` does not load)."""
    from odekit.ode.linalg import sparsity
    return sparsity

#: ``linear_solver=`` values of solve_ivp.
SOLVERS = ("auto", "dense", "banded", "block_diagonal", "krylov")


@dataclasses.dataclass(frozen=True)
class Dense:
    """J as an (n, n) array, W by one dense LU (:func:`odekit.ode.linalg.lu.factor`:
    lax elimination for small n, LAPACK getrf above). With a ``mass``
    (:class:`odekit.ode.linalg.mass_matrix.MassMatrix`) W is ``shift M - J``."""

    name: str = "dense"
    mass: Any = None
    iterative = False       # solves by a factorisation (see Structured.iterative)

    def jacobian(self, func: Callable, field: Callable, y: jax.Array, t: jax.Array
                 ) -> jax.Array:
        """The (n, n) J of the flat ``field(v, t)`` at (n,) ``y`` (``func``'s
        own Jacobian when it carries one)."""
        return jacobian.of(func, field, y, t)

    def jacobian_with_time_derivative(self, func: Callable, field: Callable, y: jax.Array,
                                      t: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(J, f_t)`` by one vectorised jvp over n + 1 directions."""
        return jacobian.with_time_derivative(field, y, t, getattr(func, "jacobian", None))

    def factor(self, jac: jax.Array, shift: jax.Array) -> Callable[[jax.Array], jax.Array]:
        """``b -> (shift I - J)^-1 b`` (``(shift M - J)^-1 b`` with a mass matrix)."""
        if self.mass is not None:
            return lu_solver(self.mass.shifted(shift, jac))
        n = jac.shape[0]
        return lu_solver(shift * jnp.eye(n, dtype=jac.dtype) - jac)

    def factor_counted(self, jac: jax.Array, shift: jax.Array
                       ) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
        """``b -> ((shift I - J)^-1 b, 0)``: :meth:`factor` with the
        iterations of each solve (none: an LU)."""
        solve = self.factor(jac, shift)
        return lambda b: (solve(b), jnp.zeros((), jnp.int32))

    def solve_with_count(self, factors: Any, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(W^-1 b, 0)`` from a dense LU's ``(lu, permutation)`` (no
        derivative: a multistep method's carried factors)."""
        return solve_factored(*factors, b), jnp.zeros((), jnp.int32)

    def mass_times(self, v: jax.Array) -> jax.Array:
        """``M v`` for an (n,) ``v`` (``v`` itself without a mass matrix)."""
        return v if self.mass is None else self.mass.times(v)

    def jacobian_times(self, jac: jax.Array, v: jax.Array) -> jax.Array:
        """``J v`` for the (n, n) ``jac``."""
        return jac @ v

    def solve_linear_map(self, linear: Callable, b: jax.Array) -> jax.Array:
        """``x`` with ``linear(x) = b`` for a linear map of (n,) vectors (its
        matrix by forward mode, then LU), linear in ``b``; a singular or
        non-finite matrix is replaced by the identity (the caller discards
        such a solution)."""
        matrix = jacobian.forward(linear, b)
        lu, permutation = factor(matrix)
        # the check reads the factors, never b: the solve stays linear in b
        # (reverse mode transposes it)
        good = jnp.all(jnp.isfinite(lu)) & jnp.all(jnp.diagonal(lu) != 0)
        n = b.shape[0]
        lu = jnp.where(good, lu, jnp.eye(n, dtype=lu.dtype))
        permutation = jnp.where(good, permutation, jnp.arange(n, dtype=permutation.dtype))
        return solve_factored(lu, permutation, b)

    def describe(self, n: int) -> str:
        return f"dense LU, n={n}"

    def factors_in_lax(self, n: int) -> bool:
        """Whether W is factored and solved in lax operations (no library
        call, so a loop holding them can be one CPU kernel): n <=
        :data:`odekit.ode.linalg.lu.LAX_MAX_SIZE`."""
        return uses_lax(n)


DENSE = Dense()


@dataclasses.dataclass(frozen=True, eq=False)
class Structured:
    """J's nonzeros on a static pattern and a structured LU of W.

    Attributes:
      pattern: J's structural nonzeros plus the diagonal
        (:class:`odekit.ode.linalg.sparsity.Pattern`, nnz entries).
      coloring: the column coloring of ``pattern`` (``num_colors`` jvps per J).
      solver: ``"block_diagonal"``, ``"banded"``, ``"krylov"`` or ``"dense"``.
      lu: the structured factorisation (:class:`BandedLU`,
        :class:`BlockDiagonalLU`), the GMRES solver (:class:`KrylovSolver`),
        or None for ``"dense"``.
      key: a digest of (n, pattern, solver, M): equality and hashing.
      diagonal_positions: (n,) the index of J[i, i] in ``values``.
      mass: a mass matrix (``W = shift M - J``) whose entries lie in the
        pattern and whose singular part is zero rows and columns, or None.
      mass_positions, mass_values: M's nonzero entries and their indices
        in ``values``.
      row_entries, row_columns: (n, k) positions in ``values`` and columns
        of each row's entries (:func:`odekit.ode.linalg.sparsity.row_gather`)
        for :meth:`matvec`, or None where the longest row holds more than
        four times the mean (a segment sum then).
      dense_source: for the ``"dense"`` solver with n <=
        :data:`odekit.ode.linalg.lu.LAX_MAX_SIZE`, (n * n,) the index in
        ``values`` of each entry of J (nnz for a structural zero), so that J
        is gathered (no scatter); None otherwise.

    J is carried as its ``values`` (nnz,), ``values[k] = J[rows[k], cols[k]]``.
    """

    pattern: Any            # odekit.ode.linalg.sparsity.Pattern
    coloring: Any           # odekit.ode.linalg.sparsity.Coloring
    solver: str
    lu: Any
    key: str
    diagonal_positions: np.ndarray = None   # (n,) where J[i, i] sits in values
    mass: Any = None        # a MassMatrix (diagonal or coordinate-aligned), or None
    mass_positions: np.ndarray = None       # where M's entries sit in values
    mass_values: np.ndarray = None          # M's entries there
    dense_source: np.ndarray = None         # small "dense": J's entries gathered from values
    row_entries: np.ndarray = None          # (n, k): row i's entry positions (matvec)
    row_columns: np.ndarray = None          # (n, k): their columns

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Structured) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def name(self) -> str:
        return self.solver

    @property
    def iterative(self) -> bool:
        """Whether a solve is an iteration (GMRES) rather than substitutions
        with factors: each solve is then a large program of nested loops,
        which a step should not copy once per stage."""
        return bool(getattr(self.lu, "iterative", False))

    def _user_values(self, func: Callable, y: jax.Array, t: jax.Array) -> jax.Array:
        matrix = jnp.asarray(func.jacobian(y, t)).astype(y.dtype)
        return matrix[self.pattern.rows, self.pattern.cols]

    def jacobian(self, func: Callable, field: Callable, y: jax.Array, t: jax.Array
                 ) -> jax.Array:
        """J's (nnz,) values by one vectorised jvp over the colors."""
        if getattr(func, "jacobian", None) is not None:
            return self._user_values(func, y, t)
        return _sparsity().compressed_jacobian(field, y, t, self.pattern, self.coloring, False)

    def jacobian_with_time_derivative(self, func: Callable, field: Callable, y: jax.Array,
                                      t: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(values, f_t)`` by one vectorised jvp over the colors and time."""
        if getattr(func, "jacobian", None) is not None:
            f_t = jax.jvp(lambda s: field(y, s), (t,), (jnp.ones_like(t),))[1]
            return self._user_values(func, y, t), f_t
        return _sparsity().compressed_jacobian(field, y, t, self.pattern, self.coloring, True)

    def factor(self, values: jax.Array, shift: jax.Array) -> Callable[[jax.Array], jax.Array]:
        """``b -> (shift I - J)^-1 b`` for J given by its ``values``
        (``(shift M - J)^-1 b`` with a diagonal mass matrix)."""
        solve = self.factor_counted(values, shift)
        return lambda b: solve(b)[0]

    def factor_counted(self, values: jax.Array, shift: jax.Array
                       ) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
        """``b -> ((shift I - J)^-1 b, iterations)``: :meth:`factor` with
        the GMRES iterations of each solve (int32; 0 for an LU)."""
        return self._factor(self.with_mass_folded(values, shift), shift)

    def solve_with_count(self, factors: Any, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(W^-1 b, iterations)`` from the structured solver's own factors
        (``lu.factor``, or a dense LU's ``(lu, permutation)`` for the
        ``"dense"`` solver; no derivative: a multistep method's carried
        factors)."""
        if self.lu is None:
            return solve_factored(*factors, b), jnp.zeros((), jnp.int32)
        counted = getattr(self.lu, "solve_counted", None)
        if counted is not None:
            return counted(factors, b)
        return self.lu.solve(factors, b), jnp.zeros((), jnp.int32)

    def with_mass_folded(self, values: jax.Array, shift: jax.Array) -> jax.Array:
        """J's values with M folded in: ``shift M - J = shift I - (J + shift
        (I - M))``, so ``shift`` added on the diagonal and ``-shift M_ij`` at
        M's entries (the values themselves without a mass matrix). O(nnz(M) + n)."""
        if self.mass is None:
            return values
        shift = shift.astype(values.dtype)
        mass = jnp.asarray(self.mass_values.astype(np.dtype(values.dtype)))
        return (values.at[self.diagonal_positions].add(shift)
                .at[self.mass_positions].add(-shift * mass))

    def jacobian_times(self, values: jax.Array, v: jax.Array) -> jax.Array:
        """``J v`` from J's (nnz,) values. O(nnz)."""
        return jax.ops.segment_sum(values * v[self.pattern.cols], self.pattern.rows,
                                   num_segments=self.pattern.n)

    def with_mass(self, mass: Any) -> "Structured":
        """This system for ``M y' = f`` with the mass matrix ``mass``
        (:class:`odekit.ode.linalg.mass_matrix.MassMatrix`): diagonal, or
        with its singular part in zero rows and columns
        (``coordinate_aligned``) and its entries inside the pattern (see
        :func:`odekit.ode.linear_options.system_for`)."""
        if mass.diagonal is None and not mass.coordinate_aligned:
            raise ValueError("a structured linear solver takes a mass matrix whose singular "
                             "part is zero rows and zero columns")
        rows, cols, values = mass.coordinates()
        n = self.pattern.n
        keys = self.pattern.rows * n + self.pattern.cols
        wanted = np.asarray(rows, np.int64) * n + np.asarray(cols, np.int64)
        positions = np.minimum(np.searchsorted(keys, wanted), max(keys.size - 1, 0))
        if keys.size == 0 and wanted.size or np.any(keys[positions] != wanted):
            raise ValueError("the mass matrix has entries outside the Jacobian's pattern")
        return dataclasses.replace(self, mass=mass, mass_positions=positions,
                                   mass_values=np.asarray(values, np.float64),
                                   key=f"{self.key}:{mass.key}")

    def _factor(self, values: jax.Array, shift: jax.Array
                ) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
        """``b -> ((shift I - J)^-1 b, iterations)``; derivatives by the
        solve's own rule (:mod:`odekit.ode.linalg.factored_solve`: the
        structured LU is not differentiated; ``dW v`` comes from the values'
        tangents)."""
        zero = jnp.zeros((), jnp.int32)
        if self.lu is None:
            solve = lu_solver(shift * jnp.eye(self.pattern.n, dtype=values.dtype)
                              - self.dense(values))
            return lambda b: (solve(b), zero)
        dtype = values.dtype
        work = jnp.float32 if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32 \
            else dtype
        values, shift = values.astype(work), shift.astype(work)
        factors = self.lu.factor(lax.stop_gradient(values), lax.stop_gradient(shift))
        matvec = lambda v: self.matvec(values, shift, v)
        if self.iterative:   # GMRES is not linear in r: its transpose is its own solve
            def solve(b):
                x, iterations = factored_solve.solve(
                    matvec, lambda r: self.lu.solve_counted(factors, r), b.astype(work),
                    lambda c: (self.lu.solve_transposed(factors, c), zero), has_aux=True)
                return x.astype(dtype), iterations
            return solve
        with_factors = lambda r: self.lu.solve(factors, r)
        return lambda b: (factored_solve.solve(matvec, with_factors, b.astype(work)).astype(dtype),
                          zero)

    def matvec(self, values: jax.Array, shift: jax.Array, v: jax.Array) -> jax.Array:
        """``(shift I - J) v`` from J's (nnz,) values: row gathers (no scatter)
        when the rows hold similar numbers of entries, else a segment sum.
        O(n k) or O(nnz)."""
        if self.row_entries is not None:
            return _sparsity().gathered_matvec(self.row_entries, self.row_columns, values, shift, v)
        return _sparsity().shifted_matvec(self.pattern.n, self.pattern.rows, self.pattern.cols,
                                          values, shift, v)

    def mass_times(self, v: jax.Array) -> jax.Array:
        """``M v`` for an (n,) ``v`` (``v`` itself without a mass matrix). O(n)."""
        return v if self.mass is None else self.mass.times(v)

    def dense(self, values: jax.Array) -> jax.Array:
        """J as an (n, n) array (the ``"dense"`` solver only): gathered from
        the values for small n, scattered into zeros above."""
        n = self.pattern.n
        if self.dense_source is not None:
            padded = jnp.concatenate([values, jnp.zeros((1,), values.dtype)])
            return padded[self.dense_source].reshape(n, n)
        return jnp.zeros((n, n), values.dtype).at[self.pattern.rows, self.pattern.cols].set(values)

    def factors_in_lax(self, n: int) -> bool:
        """Whether W is factored and solved in lax operations only (no
        library call, so a loop holding them can be one CPU kernel): a small
        ``"dense"`` system, or blocks of at most
        :data:`odekit.ode.linalg.stacked_lu.MAX_BLOCK` unknowns."""
        if self.lu is None:
            return uses_lax(n)
        return bool(getattr(self.lu, "in_lax", False))

    def solve_linear_map(self, linear: Callable, b: jax.Array) -> jax.Array:
        """``x`` with ``linear(x) = b``, for a linear map whose matrix has the
        pattern (``I - c J`` for a stage): its values by colored forward
        mode, then the structured LU of ``0 I - (-M)``, linear in ``b``;
        non-finite values give the identity (the caller discards such a
        solution)."""
        values = _sparsity().compressed_jacobian(lambda v, _: linear(v), b, jnp.zeros((), b.real.dtype),
                                              self.pattern, self.coloring, False)
        # non-finite values: the identity (0 - (-0) + 1 I). The check reads
        # the values, never b: the solve stays linear in b (reverse mode
        # transposes it)
        good = jnp.all(jnp.isfinite(values))
        values = jnp.where(good, -values, jnp.zeros_like(values))
        # the map's matrix already holds M: no mass folded in here
        return self._factor(values, jnp.where(good, 0.0, 1.0).astype(b.dtype))(b)[0]

    def describe(self, n: int) -> str:
        lu = "dense LU" if self.lu is None else self.lu.describe()
        return (f"{self.solver}: n={n}, {len(self.pattern.rows)} nonzeros, "
                f"{self.coloring.num_colors} colors; {lu}")


def structured(pattern: Any, solver: str = "auto") -> Structured:
    """The structured system of a :class:`~odekit.ode.linalg.sparsity.Pattern`
    (the diagonal is added), its coloring and LU chosen at trace time (NumPy,
    SciPy)."""
    from odekit.ode.linalg import ordering
    from odekit.ode.linalg.banded_lu import BandedLU
    from odekit.ode.linalg.block_diagonal_lu import BlockDiagonalLU
    from odekit.ode.linalg.krylov import KrylovSolver
    sparsity = _sparsity()
    if solver not in SOLVERS:
        raise ValueError(f"linear_solver must be one of {SOLVERS}, got {solver!r}.")
    pattern = sparsity.with_diagonal(pattern)
    n, rows, cols = pattern.n, pattern.rows, pattern.cols
    choice = ordering.choose(n, rows, cols) if solver == "auto" else solver
    lu = {"banded": BandedLU, "block_diagonal": BlockDiagonalLU, "krylov": KrylovSolver}.get(choice)
    if lu is not None:
        lu = lu.build(n, rows, cols)
    digest = hashlib.sha1(np.asarray(rows, np.int64).tobytes()
                          + np.asarray(cols, np.int64).tobytes()).hexdigest()
    on_diagonal = np.flatnonzero(rows == cols)
    diagonal_positions = on_diagonal[np.argsort(rows[on_diagonal], kind="stable")]
    dense_source = None
    if lu is None and uses_lax(n):
        dense_source = np.full(n * n, rows.size, dtype=np.int32)
        dense_source[rows * n + cols] = np.arange(rows.size)
    row_entries, row_columns = sparsity.row_gather(pattern)
    if row_entries.size > 4 * max(pattern.nnz, n):
        row_entries = row_columns = None
    return Structured(pattern, sparsity.color_columns(pattern), choice, lu,
                      f"{choice}:{n}:{digest}", diagonal_positions, dense_source=dense_source,
                      row_entries=row_entries, row_columns=row_columns)


def of(func: Callable) -> Dense | Structured:
    """The linear system a bound field carries (:data:`DENSE` if none)."""
    return getattr(func, "linear_system", None) or DENSE
