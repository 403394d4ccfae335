"""One table of solver status codes, one exception hierarchy, one way to raise.

Every odekit solver ends with an int32 ``status``: ``0`` is success, ``1`` a
terminal event (also a success), negative codes are failures. With
``throw=True`` a failure raises a subclass of :class:`SolverError` through
:func:`raise_if_failed`:

* a concrete status is checked in Python and raises the error itself;
* a traced status (under ``jit``, ``vmap``, ``grad``) is checked by a
  ``lax.cond`` whose failing branch runs a ``jax.pure_callback`` that raises.
  A ``custom_vmap`` rule turns a batch axis into an ordinary axis and reduces
  it, so the cond stays a cond and the callback runs at most once per call
  and sees the whole batch. The check's token is tied into the returned
  value so it is never removed as dead code.

What the caller catches from a compiled check (jax 0.10.2, CPU, measured in
``tests/test_status.py``): the exception raised inside the callback does not
cross XLA, and its class depends on JAX's dispatch path. Calls through the
Python path (the call that compiles a jitted function, later calls of a
function that has never succeeded, eager ``vmap``/``grad``) raise
``jax.errors.JaxRuntimeError`` (a ``RuntimeError``); calls through the C++
fast path, which a jitted function takes once it has succeeded, raise
``ValueError``. Both carry odekit's message (and the callback's traceback)
in ``str(exception)``; catch ``(SolverError, jax.errors.JaxRuntimeError,
ValueError)`` to cover every path.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

SUCCESS = 0
TERMINATED = 1        # a terminal event stopped an ODE solve (counts as success)
MAX_STEPS = -1        # step/iteration limit reached
STEP_UNDERFLOW = -2   # ODE step size underflowed (t + h == t or h below rounding of t)
NONFINITE = -3        # nan/inf state, derivative, iterate or residual
STIFF = -4            # ODE: problem detected as stiff for an explicit method
BAD_TIMES = -5        # ODE: output times not strictly monotonic (seen at run time under jit)
STALLED = -6          # ODE: the state stopped changing though its derivative is not zero
SINGULAR = -7         # root: singular Jacobian
BAD_BRACKET = -8      # root bisection: bracket has no sign change
NO_PROGRESS = -9      # root: line search could not reduce |f|

MESSAGES: dict[int, str] = {
    SUCCESS: "success",
    TERMINATED: "a terminal event occurred",
    MAX_STEPS: "the maximum number of steps was reached",
    STEP_UNDERFLOW: "the step size underflowed (the problem may be stiff or singular there)",
    NONFINITE: "non-finite (nan or inf) state, derivative, iterate or residual",
    STIFF: ("the problem appears to be stiff: the step size has been limited by the "
            "method's stability for many steps, so an explicit method would crawl and "
            "accumulate rounding"),
    BAD_TIMES: "the output times t are not strictly monotonic",
    STALLED: ("the state stopped changing although its derivative is not zero (the "
              "tolerance is below the precision of the dtype)"),
    SINGULAR: "singular Jacobian: the linear system for the step could not be solved",
    BAD_BRACKET: ("f(lower) and f(upper) have the same sign, so (lower, upper) does not "
                  "bracket a root"),
    NO_PROGRESS: "the line search could not reduce |f(x)| along the step",
}


def message(code: int) -> str:
    """The human text of a status ``code`` (``"status <code>"`` if unknown)."""
    return MESSAGES.get(int(code), f"status {code}")


class SolverError(RuntimeError):
    """Base class of every odekit solver failure."""


class ODESolverError(SolverError):
    """Raised when an ODE solve stops before reaching its final time."""


class RootSolverError(SolverError):
    """Raised when ``odekit.root`` or ``odekit.fixed_point`` fails."""


Describe = Callable[..., str]


def _is_traced(tree: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def _make_check(describe: Describe, error: type[SolverError]) -> Callable[..., jax.Array]:
    """A ``custom_vmap`` function ``(status, *fields) -> True`` that raises on failure."""

    def callback(status: np.ndarray, *fields: np.ndarray) -> np.ndarray:
        raise error(describe(np.asarray(status), *map(np.asarray, fields)))

    def raise_now(operands: tuple) -> jax.Array:
        return jax.pure_callback(callback, jax.ShapeDtypeStruct((), jnp.bool_), *operands,
                                 vmap_method="broadcast_all")

    @custom_vmap
    def check(status: jax.Array, *fields: jax.Array) -> jax.Array:
        failed = jnp.any(status < 0)
        return lax.cond(failed, raise_now, lambda _: jnp.bool_(True), (status, *fields))

    @check.def_vmap
    def check_batched(axis_size: int, in_batched: list, *operands: Any) -> tuple:
        # The batch axis becomes an ordinary leading axis: one any() and one
        # cond per call, and the callback sees every member.
        def full(v: jax.Array, batched: bool) -> jax.Array:
            return v if batched else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
        return check(*jax.tree.map(full, list(operands), list(in_batched))), False

    return check


def _tie(token: jax.Array, value: Any) -> Any:
    """``value`` with its array leaves selected by ``token`` (True whenever
    the call returns), so the compiler cannot drop the check.

    Every numeric leaf is tied (integer and boolean ones too, so a value
    without floating leaves is still guarded); ``float0`` leaves (symbolic
    zero cotangents) and non-arrays pass through. The unused branch is zeros,
    not NaN: a NaN constant would trip ``jax_debug_nans`` when executed
    eagerly (``jax.disable_jit``).
    """
    def tie(v: Any) -> Any:
        if not hasattr(v, "dtype") or v.dtype == jax.dtypes.float0:
            return v
        return jnp.where(token, v, jnp.zeros_like(v))
    return jax.tree.map(tie, value)


def raise_if_failed(status: jax.Array, value: Any, fields: tuple, describe: Describe,
                    error: type[SolverError]) -> Any:
    """Raise ``error(describe(...))`` if any ``status < 0``; else return ``value``.

    Args:
      status: int32 array, a scalar (or batched under ``vmap``).
      value: pytree returned unchanged; under a trace every array leaf
        (every inexact one in particular) is tied to the check's token so
        the check is not dead code.
      fields: tuple of arrays of the same batch shape as ``status``, passed
        to ``describe``.
      describe: ``describe(status, *fields) -> str`` on NumPy arrays, which
        have leading batch axes when the call is batched (one per ``vmap``).
        Called only when some status is negative.
      error: the :class:`SolverError` subclass to raise.

    Returns:
      ``value``.

    Raises:
      SolverError: ``error`` itself when ``status`` is concrete; under a
        trace the error raised at run time reaches the caller as
        ``jax.errors.JaxRuntimeError`` or ``ValueError`` (see the module
        docstring), its text in ``str(exception)``.
    """
    operands = (status, *fields)
    if not _is_traced(operands):
        status = np.asarray(status)
        if np.any(status < 0):
            raise error(describe(status, *map(np.asarray, fields)))
        return value
    operands = jax.tree.map(lax.stop_gradient, operands)
    token = _make_check(describe, error)(*operands)
    return _tie(token, value)
