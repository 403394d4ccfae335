"""The result of root and fixed_point, their default tolerances and failure text.

A solve ends with an int32 ``status`` from :mod:`odekit.status` (0 success,
negative failure). With ``throw=True`` :func:`raise_if_failed` raises
:class:`odekit.RootSolverError` naming the solver, the method, the reason,
the steps taken and the final residual (through
:func:`odekit.status.raise_if_failed`, so also under ``jit`` and ``vmap``).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from odekit import status as _status


class Result(NamedTuple):
    """Outcome of :func:`odekit.root` or :func:`odekit.fixed_point`.

    Attributes:
      x: the solution, a pytree like ``x0`` (for bisection, like ``lower``).
      success: scalar bool, True when ``status == 0``.
      num_steps: scalar int32, iterations taken.
      error: scalar, the final residual norm ``max|f(x) - x|`` (fixed point)
        or ``max|f(x)|`` (root) at the last point where ``f`` was evaluated;
        ``x`` itself is that point plus the final (converged) step, so its
        residual is usually smaller still.
      status: scalar int32, a code of :mod:`odekit.status` (0 or negative).
    """

    x: Any
    success: jax.Array
    num_steps: jax.Array
    error: jax.Array
    status: jax.Array

    @property
    def message(self) -> str:
        """The text of a concrete scalar ``status``."""
        return _status.message(int(self.status))


def default_tolerances(dtype: Any) -> tuple[float, float]:
    """Default ``(rtol, atol)``: both ``eps**0.75`` of ``dtype``.

    That is about 1.8e-12 in float64 and 6.4e-6 in float32: tight enough that
    implicit gradients agree with finite differences, loose enough to be
    reached despite rounding in ``f``.
    """
    eps = float(jnp.finfo(dtype).eps)
    return eps ** 0.75, eps ** 0.75


def describe_failure(solver: str, method: str, residual: str) -> Callable[..., str]:
    """``describe(status, num_steps, error) -> text`` for a failed solve.

    The arrays may carry batch axes (``vmap``); the text counts the failed
    members and gives the numbers of the first one.
    """
    def describe(status: np.ndarray, num_steps: np.ndarray, error: np.ndarray) -> str:
        status, num_steps, error = (np.ravel(v) for v in (status, num_steps, error))
        failed = np.flatnonzero(status < 0)
        first = int(failed[0]) if failed.size else 0
        where = "" if status.size <= 1 else (
            f" in {failed.size} of {status.size} batch members; the first failed member, "
            f"member {first}")
        return (f"odekit.{solver}(method={method!r}) failed{where}: "
                f"{_status.message(int(status[first]))} "
                f"(after {int(num_steps[first])} steps, residual {residual} = "
                f"{float(error[first]):.3e}). {_hint(solver, method, int(status[first]))}"
                "Pass throw=False to get the result with success=False instead.")
    return describe


def _hint(solver: str, method: str, code: int) -> str:
    """What to change after a failure, where there is a general answer."""
    if code == _status.NOT_A_ROOT:
        return ("x is where f changes sign, not a zero of f: choose a bracket that excludes "
                "the pole or jump (or, for a root steeper than the tolerance resolves, "
                "lower atol). ")
    if solver == "fixed_point" and code == _status.MAX_STEPS:
        if method == "anderson":
            return ("Raise max_steps, or try a longer memory (options={'history': 10}) or "
                    "loosen rtol/atol. ")
        return ("Raise max_steps, or pass method=\"anderson\" (Anderson acceleration, "
                "usually far fewer steps than plain iteration). ")
    return ""


def raise_if_failed(result: Result, solver: str, method: str, residual: str,
                    throw: bool) -> Result:
    """Raise for a failed ``result`` when ``throw``; otherwise return it unchanged.

    Args:
      result: the solver's result.
      solver: ``"root"`` or ``"fixed_point"``, for the message.
      method: the method name, for the message.
      residual: how the residual norm is written in the message.
      throw: whether to check at all.

    Returns:
      ``result``; under a trace its floating fields tied to the check.

    Raises:
      odekit.RootSolverError: when the solve failed (under ``jit`` it
        reaches the caller as described in :mod:`odekit.status`).
    """
    if not throw:
        return result
    return _status.raise_if_failed(result.status, result, (result.num_steps, result.error),
                                   describe_failure(solver, method, residual),
                                   _status.RootSolverError)
