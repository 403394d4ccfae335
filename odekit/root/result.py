"""The result type, status codes and loud failure shared by root and fixed_point.

A solve ends with an integer ``status``; :data:`MESSAGES` holds its text. With
``throw=True`` a failed status raises ``RuntimeError`` naming the solver, the
method, the reason, the steps taken and the final residual:

* outside any trace the concrete status is checked in Python;
* under ``jit`` the check is a ``lax.cond`` whose failing branch calls a
  ``jax.pure_callback`` that raises (the error reaches the caller as a
  ``JaxRuntimeError`` containing the message); the callback's token is tied
  into every output so it is never removed as dead code;
* under ``vmap`` a ``custom_vmap`` rule turns the batch axis into an
  ordinary axis and reduces it with ``any()``, so the cond stays a cond and
  the callback runs at most once per call instead of once per member.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

SUCCESS = 0
MAX_STEPS = 1
NONFINITE = 2
SINGULAR = 3
BAD_BRACKET = 4
NO_PROGRESS = 5

MESSAGES = {
    SUCCESS: "converged",
    MAX_STEPS: "did not converge within max_steps",
    NONFINITE: "non-finite (nan or inf) iterate or residual",
    SINGULAR: "singular Jacobian: the linear system for the step could not be solved",
    BAD_BRACKET: ("f(lower) and f(upper) have the same sign, so (lower, upper) does not "
                  "bracket a root"),
    NO_PROGRESS: "the line search could not reduce |f(x)| along the step",
}


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
      status: scalar int32, a key of ``odekit.root.result.MESSAGES``.
    """

    x: Any
    success: jax.Array
    num_steps: jax.Array
    error: jax.Array
    status: jax.Array

    @property
    def message(self) -> str:
        """The text of a concrete scalar ``status``."""
        return MESSAGES[int(self.status)]


def default_tolerances(dtype: Any) -> tuple[float, float]:
    """Default ``(rtol, atol)``: both ``eps**0.75`` of ``dtype``.

    That is about 1.8e-12 in float64 and 6.4e-6 in float32: tight enough that
    implicit gradients agree with finite differences, loose enough to be
    reached despite rounding in ``f``.
    """
    eps = float(jnp.finfo(dtype).eps)
    return eps ** 0.75, eps ** 0.75


def failure_message(solver: str, method: str, residual: str, status: Any, num_steps: Any,
                    error: Any) -> str:
    """The text raised for a failed solve; arrays (a ``vmap`` batch) name the first failure."""
    status, num_steps, error = (np.ravel(np.asarray(v)) for v in (status, num_steps, error))
    failed = np.flatnonzero(status != SUCCESS)
    first = int(failed[0]) if failed.size else 0
    where = "" if status.size <= 1 else (
        f" in {failed.size} of {status.size} batch members; the first failed member")
    return (f"odekit.{solver}(method={method!r}) failed{where}: "
            f"{MESSAGES.get(int(status[first]), 'unknown failure')} "
            f"(after {int(num_steps[first])} steps, residual {residual} = "
            f"{float(error[first]):.3e}). Pass throw=False to get the result with "
            "success=False instead.")


def _make_check(solver: str, method: str, residual: str):
    """A ``custom_vmap`` function ``(status, steps, error) -> token`` that raises on failure."""

    def callback(status, steps, error):
        raise RuntimeError(failure_message(solver, method, residual, status, steps, error))

    def raise_now(operands):
        return jax.pure_callback(callback, jax.ShapeDtypeStruct((), jnp.bool_), *operands,
                                 vmap_method="broadcast_all")

    @custom_vmap
    def check(status, steps, error):
        failed = jnp.max(status) != SUCCESS   # codes are >= 0; one reduction kernel
        return lax.cond(failed, raise_now, lambda _: jnp.bool_(True), (status, steps, error))

    @check.def_vmap
    def check_batched(axis_size, in_batched, *operands):
        # The batch axis becomes an ordinary axis: one any() and one cond per call.
        full = [v if batched else jnp.broadcast_to(v, (axis_size,) + jnp.shape(v))
                for v, batched in zip(operands, in_batched)]
        return check(*full), False

    return check


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
      ``result``, under a trace with every field tied to the check's token.

    Raises:
      RuntimeError: when the solve failed, immediately if the status is
        concrete; under ``jit`` as a ``JaxRuntimeError`` at run time.
    """
    if not throw:
        return result
    status, steps, error = (lax.stop_gradient(v) for v in
                            (result.status, result.num_steps, result.error))
    if not isinstance(status, jax.core.Tracer):
        if int(status) != SUCCESS:
            raise RuntimeError(failure_message(solver, method, residual, status, steps, error))
        return result
    token = _make_check(solver, method, residual)(status, steps, error)
    nan_x = jax.tree.map(lambda v: jnp.where(token, v, jnp.nan), result.x)
    return Result(nan_x, result.success & token, jnp.where(token, result.num_steps, -1),
                  jnp.where(token, result.error, jnp.nan), jnp.where(token, result.status, -1))

