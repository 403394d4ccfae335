"""``odekit.odeint``: drop-in replacement for ``jax.experimental.ode.odeint``."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import _lax as ops
from odekit import status as codes
from odekit._programs import compiled
from odekit.ode import adjoints
from odekit.ode.arguments import (check_args, check_output, check_tolerances, convert_field,
                                  effective_rtol, known_value, prepare_y0, static_float,
                                  static_tolerance)
from odekit.ode.engine import single_kernel
from odekit.ode.engine.loop import LoopConfig
from odekit.ode.engine.solve import SolveOptions
from odekit.ode.methods import get_method

Pytree = Any



def _check_times(t: Any) -> jax.Array:
    known = known_value(t)   # checked when known at trace time, also inside jit
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        raise TypeError(f"odeint: t must be an array of floats, got dtype {t.dtype}; "
                        f"use e.g. jnp.linspace(0., 10., 101) or jnp.asarray(t, float).")
    if t.ndim != 1 or t.shape[0] < 1:
        raise ValueError(f"odeint: t must be a 1-D array of at least one time, got shape {t.shape}.")
    if known is not None:
        if not np.all(np.isfinite(known)):
            raise ValueError(f"odeint: t must be finite, got {known!r}; "
                             "integrate up to a finite time.")
        diffs = np.diff(known)
        if np.any(~(diffs > 0)):
            bad = int(np.argmax(~(diffs > 0)))
            raise ValueError(f"odeint: t must be strictly increasing, but t[{bad}]={float(known[bad])} "
                             f"is followed by t[{bad + 1}]={float(known[bad + 1])}.")
    return t


def _convert_checked(func: Callable, y0: Pytree, t0: jax.Array,
                     args: tuple) -> tuple[Callable, list]:
    """``closure_convert(func, y0, t0, *args)`` after checking what ``func``
    returns (one trace of ``func`` for both; a result of another structure
    holding as many numbers is read into y0's, see ``convert_field``)."""
    try:
        return convert_field(func, (y0, t0, *args), y0, lambda out: check_output(out, y0))
    except IndexError as error:
        raise TypeError(f"odeint: calling func(y, t, *args) failed ({error}). odeint uses "
                        "jax.experimental.ode's argument order func(y, t, *args); "
                        "SciPy's order fun(t, y, *args) is odekit.solve_ivp's.") from error


DEFAULT_RTOL = 1.4e-8   # jax.experimental.ode's


def odeint(func: Callable, y0: Pytree, t: jax.Array, *args: Any, rtol: float = DEFAULT_RTOL,
           atol: float = 1.4e-8, mxstep: float = jnp.inf, hmax: float = jnp.inf,
           method: str = "dopri5", adjoint: Any = None) -> Pytree:
    """Adaptive Runge-Kutta solution of ``dy/dt = func(y, t, *args)`` at times ``t``.

    Same signature and defaults as ``jax.experimental.ode.odeint``; gradients
    with respect to ``y0``, ``t``, ``*args`` and values closed over by ``func``
    come from the continuous adjoint (see :mod:`odekit.ode.adjoints.backsolve`).

    Args:
      func: ``func(y, t, *args)`` returning dy/dt with the structure of ``y``.
      y0: initial state at ``t[0]``: an array or any pytree (nested lists too)
        of real or complex arrays.
      t: (n,) strictly increasing float times; ``t[0]`` is the initial time.
      *args: arrays (or pytrees of arrays) passed to ``func``.
      rtol, atol: relative and absolute local error tolerances (>= 0):
        numbers, or per component: an array broadcastable to ``y0`` when
        ``y0`` is one array, or a pytree with ``y0``'s structure whose leaves
        broadcast to its leaves (concrete values, not traced ones; no
        component with both zero). An rtol (entry) below 4 eps of y's dtype
        is raised to it with a warning (the default, 1.4e-8, is kept for
        float32); a state that stops moving because its steps fall below
        rounding fails with "stalled". The backward solve of backsolve keeps
        the entries on y and gives the adjoint's components the tightest
        positive entry.
      mxstep: attempted steps allowed between consecutive output times.
      hmax: largest step size.
      method: "bosh3", "dopri5" (default), "tsit5" or "dopri8" (explicit), or
        "rodas5p", "kvaerno5" or "bdf" (variable-order NDF/BDF) for stiff problems.
      adjoint: gradient method (None: "backsolve" for the explicit methods,
        "checkpoint" for a stiff one, where the backward re-integration of
        backsolve cannot work): "backsolve" (continuous adjoint, memory
        O(len(t))) or "checkpoint" / ``odekit.Checkpoint(levels,
        max_steps)`` (derivative of the discrete solution, forward and reverse
        mode; with respect to at most 16 numbers a forward-mode Jacobian,
        beyond that a checkpointed loop of at most 4096 steps unless
        ``Checkpoint(max_steps=...)`` says otherwise); "forward" (forward
        sensitivities for ``jax.jvp`` / ``jax.jacfwd``: the same derivative
        of the discrete solution, the tangents carried along the ordinary
        loop, about one solve; reverse mode raises); "interpolate"
        / ``odekit.Interpolate(max_steps)`` (continuous adjoint with y(t)
        from the recorded forward steps: stable where backsolve is not,
        memory O(steps), at most 4096 steps, first derivatives only).

    Returns:
      The solution at every ``t``: the structure of ``y0`` with a leading axis
      of length ``len(t)``.

    Raises:
      ODESolverError: when the solver stops early (mxstep reached, step size
        underflow, non-finite state, stiffness, a stalled state), also under jit and vmap
        (see :mod:`odekit.status` for what reaches the caller there).
      TypeError, ValueError: for invalid arguments (at trace time).
    """
    get_method(method)
    if adjoint is None:
        adjoint = "checkpoint" if get_method(method).factorizations_per_step else "backsolve"
    adjoint = adjoints.resolve(adjoint, "odeint")
    mxstep = static_float(mxstep, "mxstep", allow_inf=True)
    hmax = static_float(hmax, "hmax", allow_inf=True)
    if mxstep < 1 or hmax == 0:
        raise ValueError(f"odeint: mxstep must be >= 1 and hmax > 0, got mxstep={mxstep}, hmax={hmax}.")
    check_args(args)
    y0 = prepare_y0(y0)
    rtol, atol = static_tolerance(rtol, "rtol", y0), static_tolerance(atol, "atol", y0)
    rtol = effective_rtol(rtol, y0, default=DEFAULT_RTOL)
    check_tolerances(rtol, atol, y0)
    options = SolveOptions(
        method=method, loop=LoopConfig(rtol=rtol, atol=atol, hmax=hmax, mxstep=mxstep,
                                       detect_stiffness=True),
        single_kernel=single_kernel.switched_on())
    t = _check_times(t)
    # Times less precise than the state would round every step (a float32 t
    # with a float64 y0 cost 23x in accuracy): compute them in y's precision.
    real = np.result_type(*(jnp.finfo(leaf.dtype).dtype for leaf in jax.tree.leaves(y0)))
    if jnp.finfo(t.dtype).bits < jnp.finfo(real).bits:
        t = t.astype(real)
    converted, consts = _convert_checked(func, y0, t[0], args)
    with adjoints.forward_mode_explained(adjoint):
        ys, fields = compiled(_solve, converted, options, adjoint)(y0, t, *args, *consts)
    return codes.raise_if_failed(fields[0], ys, fields[1:],
                                 partial(failure_message, f"odekit.odeint ({method})"),
                                 codes.ODESolverError)


HINTS = {
    codes.MAX_STEPS: ("Raise the step limit (mxstep for odeint), or loosen rtol/atol. A solve "
                      "differentiated with adjoint='interpolate', or with 'checkpoint' "
                      "with respect to more than 16 numbers, stops at its "
                      "bound: 4096 attempted steps (checkpoint: plus "
                      "one per 8 output times), unless odekit.Checkpoint(max_steps=...) or "
                      "odekit.Interpolate(max_steps=...) sets it."),
    codes.STEP_UNDERFLOW: ("Look for a singularity of func near that time, or use a stiff "
                           "method (method=\"rodas5p\"). With atol=0 a zero component has "
                           "no error scale; with a large t the step may be below its rounding."),
    codes.NONFINITE: ("Check func for nan/inf near that time (division by zero, log or sqrt of "
                      "negative numbers, overflow), or a solution that blows up there."),
    codes.STIFF: ("Pass method=\"rodas5p\", odekit's stiff (L-stable Rosenbrock) method, "
                  "with adjoint=\"checkpoint\" for gradients. The verdict means the rest of "
                  "the span would take more than 100,000 steps at "
                  "the stability limit; a solution that has decayed below atol over a very "
                  "long span (y' = -y on [0, 1e6]) meets the same limit."),
    codes.STALLED: ("Steps became smaller than the rounding of y, so y stopped moving: "
                    "loosen rtol/atol or use a more precise dtype for y0 (float64)."),
    codes.BAD_TIMES: "Pass strictly increasing times, e.g. jnp.linspace(t0, t1, n).",
}


def failure_message(solver: str, status: np.ndarray, t: np.ndarray, times: np.ndarray,
                    num_steps: np.ndarray, num_accepted: np.ndarray, hint: str = "") -> str:
    """Text for the first failed member of a (batched) solve: reason, time
    reached ``t``, the first output time not reached (from the output grid
    ``times``, shape ``batch + (n,)``), steps taken, and what to change. Runs
    on the host, after a failure only (the search over the grid is not
    compiled into every solve)."""
    status = np.ravel(status)
    failed = np.flatnonzero(status < 0)
    index = int(failed[0]) if failed.size else 0
    pick = lambda v: np.ravel(v)[index] if np.size(v) > 1 else np.ravel(v)[0]
    code = int(status[index])
    where = ""
    if status.size > 1:
        where = f" ({failed.size} of {status.size} batch members failed; the first is batch member {index} of {status.size})"
    grid = np.reshape(times, (-1, np.shape(times)[-1]))
    grid = grid[index] if grid.shape[0] > 1 else grid[0]
    t_reached = float(pick(t))
    ahead = grid[grid > t_reached]
    t_target = float(ahead[0]) if ahead.size else float(grid[-1])
    text = (f"{solver} failed{where}: {codes.message(code)}. "
            f"Stopped at t={t_reached:.10g} before the output time t={t_target:.10g} "
            f"after {int(pick(num_steps))} attempted steps ({int(pick(num_accepted))} accepted).")
    hint = " ".join(h for h in (HINTS.get(code, ""), hint) if h)
    return text + (f" {hint}" if hint else "")


def _solve(func: Callable, options: SolveOptions, adjoint: Any, y0: Pytree, t: jax.Array,
           *args: Any) -> tuple[Pytree, tuple]:
    """The solve as one program: y at the times ``t``, and the status fields."""
    n = t.shape[0]
    h0 = jnp.zeros((), t.dtype)
    t_first, t_last = (lax.index_in_dim(t, i, keepdims=False) for i in (0, n - 1))
    sol = adjoints.solver(adjoint)(func, None, options, y0, t_first, t_last, t, h0, *args)
    # checked at trace time when t is concrete
    increasing = ops.all_of(lax.gt(lax.slice(t, (1,), (n,)), lax.slice(t, (0,), (n - 1,))))
    status = ops.select(increasing, lax.convert_element_type(sol.status, np.int32),
                        np.int32(codes.BAD_TIMES))
    # The output time not reached is found on the host, after a failure.
    fields = (status, lax.stop_gradient(sol.t), lax.stop_gradient(t), sol.stats.num_steps,
              sol.stats.num_accepted)
    return sol.ys_eval, fields
