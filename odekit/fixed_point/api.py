"""``odekit.fixed_point``: solve ``x = f(x, *args)`` with implicit gradients."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from odekit.fixed_point.anderson import ANDERSON
from odekit.fixed_point.iteration import ITERATION
from odekit.custom.problem import check_floating, pick_method, solve
from odekit.custom.result import Result

METHODS = {m.name: m for m in (ITERATION, ANDERSON)}


def fixed_point(f: Callable[..., Any], x0: Any, *args: Any, method: str = "iteration",
                rtol: float | None = None, atol: float | None = None, max_steps: int = 1024,
                throw: bool = True, options: Mapping[str, Any] | None = None,
                linear_solver: str = "auto") -> Result:
    """Find ``x`` with ``x = f(x, *args)``.

    The fixed point is differentiated as the root of ``f(x, *args) - x`` by
    the implicit function theorem (:mod:`odekit.custom.implicit`): derivatives
    reach ``*args`` and arrays closed over by ``f``, never through the
    iterations, in forward mode (``jax.jvp``, ``jax.jacfwd``) and reverse mode
    alike; grad-of-grad, ``jax.hessian``, ``jit`` and ``vmap`` work.

    Args:
      f: ``f(x, *args) -> x'`` with the structure, shapes and dtypes of ``x``.
      x0: starting point, any pytree of real floating arrays.
      *args: arrays (or pytrees of arrays) passed to ``f``.
      method: ``"iteration"`` (``x+ = x + damping (f(x) - x)``) or
        ``"anderson"`` (Anderson acceleration of memory ``history``, with a
        nonmonotone safeguard; see :mod:`odekit.fixed_point.anderson`).
      rtol, atol: stop at the first evaluated ``x`` with
        ``|f(x)_i - x_i| <= atol + rtol |x_i|`` and return ``f(x)``; None
        means ``eps**0.75`` of the least precise dtype among the
        leaves (1.8e-12 in float64, 6.4e-6 in float32).
      max_steps: iteration limit. Plain iteration on a contraction of rate
        ``L`` needs about ``ln(|f(x0) - x0| / tol) / -ln(L)`` steps: about
        520 for ``L = 0.95`` in float64 from an O(1) error, so the default
        1024 fits rates up to about 0.97; Anderson needs far fewer.
      throw: raise :class:`odekit.RootSolverError` on failure (under
        ``jit`` the error reaches the caller as ``JaxRuntimeError`` or
        ``ValueError`` carrying the message, see :mod:`odekit.status`); if
        False, return ``success=False`` and a negative ``status``.
      options: ``{"damping": 1.0}`` for iteration; ``{"history": 5,
        "damping": 1.0, "regularization": 0.01 sqrt(eps)}`` for anderson,
        where ``history`` is the memory ``m`` (each proposal combines the
        last ``m + 1`` iterates, Walker & Ni's ``Anderson(m)``).
      linear_solver: ``"auto"``, ``"dense"`` or ``"gmres"``, the linear solve
        of the implicit derivative (transposed in reverse mode).

    Returns:
      :class:`~odekit.custom.result.Result` with ``x``, ``success``,
      ``num_steps``, ``error = max|f(x) - x|`` and ``status``. If the solve
      failed, derivatives of ``x`` are NaN (in both modes).

    Raises:
      ValueError, TypeError: for bad arguments, at trace time.
      odekit.RootSolverError: when ``throw`` and the solve fails.
    """
    spec = pick_method("fixed_point", METHODS, method)
    x0 = check_floating("fixed_point", "x0", x0)
    return solve("fixed_point", spec, f, x0, x0, args, fixed_point=True, rtol=rtol, atol=atol,
                 max_steps=max_steps, throw=throw, options=options, linear_solver=linear_solver)
