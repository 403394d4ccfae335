"""solve_ivp's options for the stiff methods' linear algebra: ``jac_sparsity``,
``linear_solver`` and SciPy's ``lband`` / ``uband``, turned at trace time
into the :mod:`odekit.ode.linalg.linear_system` the steps use.

    jac_sparsity=None, linear_solver="auto"   dense Jacobian and LU (the default)
    jac_sparsity=S                            S: (n, n) pattern of df/dy (array-like
                                              of bools / 0-1, or scipy.sparse)
    jac_sparsity="auto"                       the pattern found from the traced fun
                                              (odekit.ode.jacobian_sparsity)
    lband=l, uband=u                          the band pattern -l <= j - i <= u
    linear_solver="banded" | "block_diagonal" | "krylov" | "dense" | "auto"

For a pytree state the pattern is over the flattened state
(``jax.flatten_util.ravel_pytree`` order). A linear solver other than
"dense" without a pattern finds the pattern automatically.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from odekit._tree import tree_ravel

Pytree = Any


def jacobian_sparsity(fun: Callable, t: Any, y: Any, *args: Any) -> Any:
    """The (n, n) boolean ``scipy.sparse.csr_array`` pattern of
    ``d fun(t, y, *args) / d y``, found from the traced ``fun`` (SciPy's
    argument order; ready for ``solve_ivp(..., jac_sparsity=...)``).

    ``t`` is taken as unknown, so the pattern holds at every time; ``args`` at
    their given values. It never misses a nonzero: see
    :func:`odekit.ode.linalg.sparsity_detection.jacobian_sparsity` for the
    rules. (SciPy is imported on the first call, not with odekit.)"""
    from odekit.ode.linalg.sparsity_detection import ivp_jacobian_sparsity
    return ivp_jacobian_sparsity(fun, t, y, *args)


def band_pattern(n: int, lower: int, upper: int) -> Any:
    """The :class:`~odekit.ode.linalg.sparsity.Pattern` of a band matrix:
    ``J[i, j]`` may be nonzero for ``-lower <= j - i <= upper`` (SciPy's
    lband / uband)."""
    import scipy.sparse

    from odekit.ode.linalg import sparsity
    offsets = range(-int(lower), int(upper) + 1)
    band = scipy.sparse.diags_array([np.ones(n - abs(k)) for k in offsets],
                                    offsets=list(offsets), shape=(n, n), format="csr")
    return sparsity.as_pattern(band, n)


def system_for(fun: Callable, t0: jax.Array, y0: Pytree, args: tuple, method: str,
               jac_sparsity: Any, linear_solver: str, lband: Any, uband: Any, who: str,
               mass: Any = None) -> tuple[Any, bool]:
    """``(system, check)``: the linear system the stiff steps use (None for the
    default dense one) and whether the pattern is the user's (then the solve
    checks it against the true Jacobian at its start). With a ``mass``
    (:class:`~odekit.ode.linalg.mass_matrix.MassMatrix`) the pattern also
    holds M's entries (``W = M / (h gamma) - J``) and the system carries M.
    SciPy (scipy.sparse, csgraph) is imported here, only when a structure
    is asked for."""
    from odekit.ode.linalg import linear_system, sparsity
    if linear_solver not in linear_system.SOLVERS:
        raise ValueError(f"{who}: linear_solver must be one of {linear_system.SOLVERS}, got "
                         f"{linear_solver!r}.")
    banded = lband is not None or uband is not None
    if banded and jac_sparsity is not None:
        raise ValueError(f"{who}: give either jac_sparsity or lband/uband, not both.")
    if jac_sparsity is None and not banded and linear_solver in ("auto", "dense"):
        return None, False
    flat_y0, _ = tree_ravel(y0)
    n = int(flat_y0.shape[0])
    if n == 0:
        # an empty state: no Jacobian, nothing to structure (the dense path's
        # empty solve); a pattern given must be (0, 0) all the same
        if jac_sparsity is not None and not isinstance(jac_sparsity, str):
            try:
                sparsity.as_pattern(jac_sparsity, n)
            except ValueError as error:
                raise ValueError(f"{who}: {error}") from None
        return None, False
    if banded:
        lower, upper = (_band(v, name, n, who) for v, name in ((lband, "lband"), (uband, "uband")))
        pattern, check = band_pattern(n, lower, upper), True
    elif jac_sparsity is None or (isinstance(jac_sparsity, str) and jac_sparsity == "auto"):
        pattern, check = detect(fun, t0, y0, args), False
    elif isinstance(jac_sparsity, str):
        raise ValueError(f"{who}: jac_sparsity must be an (n, n) pattern (array-like or "
                         f"scipy.sparse) or 'auto', got {jac_sparsity!r}.")
    else:
        try:
            pattern = sparsity.as_pattern(jac_sparsity, n)
        except ValueError as error:
            raise ValueError(f"{who}: {error}") from None
        check = True
    if mass is None:
        return linear_system.structured(pattern, linear_solver), check
    rows, cols, _ = mass.coordinates()
    pattern = sparsity.from_coordinates(n, np.concatenate([pattern.rows, rows]),
                                        np.concatenate([pattern.cols, cols]))
    return linear_system.structured(pattern, linear_solver).with_mass(mass), check


def detect(fun: Callable, t0: jax.Array, y0: Pytree, args: tuple) -> Any:
    """The :class:`~odekit.ode.linalg.sparsity.Pattern` of d fun(t, y, *args)
    / dy over the flattened state, from the traced ``fun`` (never misses a
    nonzero)."""
    from odekit.ode.linalg import sparsity
    flat_y0, unravel = tree_ravel(y0)

    def flat_fun(t, v, *a):
        return tree_ravel(fun(t, unravel(v), *a))[0]

    # t is taken as unknown (the pattern holds at every time), args at their values
    found = jacobian_sparsity(flat_fun, t0, flat_y0, *args)
    return sparsity.as_pattern(found, int(flat_y0.shape[0]))


def _band(value: Any, name: str, n: int, who: str) -> int:
    if value is None:
        return 0
    if isinstance(value, (bool, np.bool_)) or int(value) != value or not 0 <= int(value):
        raise ValueError(f"{who}: {name} must be a non-negative integer, got {value!r}.")
    return min(int(value), max(n - 1, 0))
