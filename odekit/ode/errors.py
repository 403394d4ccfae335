"""Solver status codes, their messages, and raising them from compiled code.

A solve returns a :class:`SolveInfo` instead of raising, so that the loop
stays a pure function. :func:`raise_if_failed` turns a failure into an
exception: directly in Python when the status is concrete, and through a
``jax.pure_callback`` inside a ``lax.cond`` when it is traced (under ``jit``,
``vmap``, ``grad``). The callback's result is tied into the returned value so
that it cannot be removed as dead code; under ``vmap`` it runs once per batch
(``vmap_method="broadcast_all"``) and fails if any member failed.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

SUCCESS = 0
TERMINATED = 1          # a terminal event stopped the solve (solve_ivp)
MAX_STEPS = -1
STEP_UNDERFLOW = -2
NONFINITE = -3
STIFF = -4
BAD_TIMES = -5      # output times not strictly increasing (seen only at run time under jit)

MESSAGES = {
    SUCCESS: "the solver reached the end of the interval",
    TERMINATED: "a terminal event occurred",
    MAX_STEPS: "the maximum number of steps was reached before the next output time",
    STEP_UNDERFLOW: "the step size underflowed (the problem may be stiff or singular there)",
    NONFINITE: "the state or its derivative became non-finite (nan or inf)",
    STIFF: ("the problem appears to be stiff: the step size has been limited by the "
            "method's stability for many steps, so an explicit method would crawl and "
            "accumulate rounding"),
    BAD_TIMES: "the output times t are not strictly increasing",
}


HINTS = {
    MAX_STEPS: "Raise the step limit (mxstep for odeint), or loosen rtol/atol.",
    STEP_UNDERFLOW: "Look for a singularity of func near that time, or use a stiff method.",
    NONFINITE: ("Check func for nan/inf near that time (division by zero, log or sqrt of "
                "negative numbers, overflow), or a solution that blows up there."),
    STIFF: ("Use a stiff (implicit) solver for this problem, such as "
            "scipy.integrate.solve_ivp(method='Radau'); odeint's methods are all explicit."),
    BAD_TIMES: "Pass strictly increasing times, e.g. jnp.linspace(t0, t1, n).",
}


class ODESolverError(RuntimeError):
    """Raised when an ODE solve stops before reaching its final time."""


class SolveInfo(NamedTuple):
    """Status and statistics of one solve (scalars, or batched under vmap)."""

    status: jax.Array        # int32, see the constants above
    t: jax.Array             # time reached
    t_target: jax.Array      # first output time not reached (inf if none)
    num_steps: jax.Array     # attempted steps
    num_accepted: jax.Array  # accepted steps
    nfev: jax.Array          # evaluations of the vector field


def failure_message(solver: str, hint: str, status: Any, t: Any, t_target: Any,
                    num_steps: Any, num_accepted: Any) -> str:
    """Human-readable text for the first failed member of a (batched) solve."""
    status = np.atleast_1d(np.asarray(status))
    index = int(np.argmax(status < 0))
    pick = lambda v: np.atleast_1d(np.asarray(v)).reshape(-1)[index] if np.size(v) > 1 else np.asarray(v).reshape(-1)[0]
    code = int(status.reshape(-1)[index])
    where = f" (batch member {index} of {status.size})" if status.size > 1 else ""
    text = (f"{solver} failed{where}: {MESSAGES.get(code, f'status {code}')}. "
            f"Stopped at t={float(pick(t)):.6g} before the output time t={float(pick(t_target)):.6g} "
            f"after {int(pick(num_steps))} attempted steps ({int(pick(num_accepted))} accepted).")
    hint = " ".join(h for h in (HINTS.get(code, ""), hint) if h)
    return text + (f" {hint}" if hint else "")


def _is_traced(tree: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def raise_if_failed(info: SolveInfo, value: Any, solver: str, hint: str = "") -> Any:
    """Raise :class:`ODESolverError` if ``info.status < 0``; else return ``value``.

    Under a trace the check is compiled in and ``value`` (a pytree) is returned
    tied to the check's result; otherwise it is a plain Python check.
    """
    fields = (info.status, info.t, info.t_target, info.num_steps, info.num_accepted)
    if not _is_traced(fields):
        if np.any(np.asarray(info.status) < 0):
            raise ODESolverError(failure_message(solver, hint, *fields))
        return value

    def callback(status, t, t_target, num_steps, num_accepted):
        if np.any(np.asarray(status) < 0):
            raise ODESolverError(failure_message(solver, hint, status, t, t_target,
                                                 num_steps, num_accepted))
        return np.ones(np.shape(status), dtype=bool)

    def check():
        token = jax.pure_callback(callback, jax.ShapeDtypeStruct(info.status.shape, jnp.bool_),
                                  *map(lax.stop_gradient, fields), vmap_method="broadcast_all")
        return jnp.all(token)

    failed = jnp.any(info.status < 0)
    token = lax.cond(failed, check, lambda: jnp.ones((), bool))
    def tie(v):
        if not jnp.issubdtype(jnp.result_type(v), jnp.inexact):
            return v  # integer leaves and float0 cotangents carry no numbers to guard
        return jnp.where(token, v, jnp.full_like(v, jnp.nan))
    return jax.tree.map(tie, value)


def first_failure(infos: SolveInfo) -> SolveInfo:
    """Reduce stacked infos (leading axis: sub-solves) to the first failed one.

    Statistics are summed over the sub-solves; status, times are those of the
    first failure (or of the last sub-solve when none failed). No sub-solves
    (a solve with a single output time) is a success with zero statistics.
    """
    if infos.status.shape[0] == 0:
        zero = lambda leaf: jnp.zeros(leaf.shape[1:], leaf.dtype)
        return SolveInfo(*(zero(leaf) for leaf in infos))._replace(
            t_target=jnp.full(infos.t_target.shape[1:], jnp.inf, infos.t_target.dtype))
    failed = infos.status < 0
    index = jnp.where(jnp.any(failed), jnp.argmax(failed), infos.status.shape[0] - 1)
    return SolveInfo(status=infos.status[index], t=infos.t[index],
                     t_target=infos.t_target[index],
                     num_steps=jnp.sum(infos.num_steps), num_accepted=jnp.sum(infos.num_accepted),
                     nfev=jnp.sum(infos.nfev))
