"""``odekit.root``: solve ``f(x, *args) = 0`` with implicit gradients."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from odekit.root.bisection import BISECTION
from odekit.root.broyden import BROYDEN
from odekit.root.newton import NEWTON
from odekit.custom.problem import check_floating, pick_method, solve
from odekit.custom.result import Result

METHODS = {m.name: m for m in (NEWTON, BROYDEN, BISECTION)}


def _bracket(x0: Any) -> tuple[jax.Array, jax.Array]:
    """``x0 = (lower, upper)`` as two scalars of one dtype.

    The ends are promoted together as ``jnp`` would (``(jnp.float32(0),
    2.0)`` is float32); each end must be a single scalar, not a pytree.
    """
    if not isinstance(x0, (tuple, list)) or len(x0) != 2:
        raise ValueError("odekit.root(method='bisection') needs x0=(lower, upper), "
                         f"got {type(x0).__name__}.")
    if not all(jax.tree_util.treedef_is_leaf(jax.tree.structure(end)) for end in x0):
        raise ValueError("odekit.root(method='bisection'): lower and upper must be scalars, "
                         f"got {type(x0[0]).__name__} and {type(x0[1]).__name__}; bisection "
                         "solves one scalar equation (use jax.vmap for many).")
    lower, upper = check_floating("root", "x0=(lower, upper)", tuple(x0))
    if lower.shape != () or upper.shape != ():
        raise ValueError("odekit.root(method='bisection'): lower and upper must be scalars, "
                         f"got shapes {lower.shape} and {upper.shape}; use jax.vmap for many "
                         "scalar problems.")
    dtype = jnp.result_type(*x0)
    if not jnp.issubdtype(dtype, jnp.floating):   # two integer ends: the default float
        dtype = jnp.result_type(float)
    return lower.astype(dtype), upper.astype(dtype)


def root(f: Callable[..., Any], x0: Any, *args: Any, method: str = "newton",
         rtol: float | None = None, atol: float | None = None, max_steps: int = 256,
         throw: bool = True, options: Mapping[str, Any] | None = None,
         linear_solver: str = "auto") -> Result:
    """Find ``x`` with ``f(x, *args) = 0``.

    Derivatives of ``result.x`` with respect to ``*args`` and to arrays that
    ``f`` closes over come from the implicit function theorem
    (:mod:`odekit.custom.implicit`), never from the iterations, in forward
    mode (``jax.jvp``, ``jax.jacfwd``) and reverse mode alike; grad-of-grad,
    ``jax.hessian``, ``jit`` and ``vmap`` work.

    Args:
      f: ``f(x, *args) -> y`` with ``y`` of the structure, shapes and dtypes
        of ``x``.
      x0: starting point, any pytree of real floating arrays; for
        ``method="bisection"`` a bracket ``(lower, upper)`` of scalars.
      *args: arrays (or pytrees of arrays) passed to ``f``.
      method: ``"newton"`` (Jacobian by ``jax.jacfwd``, dense solve,
        backtracking line search), ``"broyden"`` (one Jacobian, then rank-one
        updates) or ``"bisection"``.
      rtol, atol: stop when the next step (the Newton or Broyden step, or
        half the bracket) satisfies ``|step_i| <= atol + rtol |x_i|``, and
        return ``x + step`` (the midpoint for bisection); None means
        ``eps**0.75`` of the least precise dtype among the leaves
        (1.8e-12 in float64, 6.4e-6 in float32).
      max_steps: iteration limit.
      throw: raise :class:`odekit.RootSolverError` on failure (under
        ``jit`` the error reaches the caller as ``JaxRuntimeError`` or
        ``ValueError`` carrying the message, see :mod:`odekit.status`); if
        False, return ``success=False`` and a negative ``status``.
      options: method options; these methods take none.
      linear_solver: ``"auto"``, ``"dense"`` or ``"gmres"``, the linear solve
        of the implicit derivative (transposed in reverse mode).

    Returns:
      :class:`~odekit.custom.result.Result` with ``x``, ``success``,
      ``num_steps``, ``error = max|f(x)|`` and ``status``. If the solve
      failed, derivatives of ``x`` are NaN (in both modes).

    Raises:
      ValueError, TypeError: for bad arguments, at trace time.
      odekit.RootSolverError: when ``throw`` and the solve fails.
    """
    spec = pick_method("root", METHODS, method)
    if spec is BISECTION:
        x0 = _bracket(x0)
        x_like = x0[0]
    else:
        x0 = x_like = check_floating("root", "x0", x0)
    return solve("root", spec, f, x0, x_like, args, fixed_point=False, rtol=rtol, atol=atol,
                 max_steps=max_steps, throw=throw, options=options, linear_solver=linear_solver)
