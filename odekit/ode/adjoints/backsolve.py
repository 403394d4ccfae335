"""The continuous ("backsolve") adjoint of a forward solve, as a custom_vjp.

Primal: the forward solve (:func:`odekit.ode.engine.solve.solve`). The adjoint
equations are those of :mod:`odekit.ode.adjoints.continuous`; backsolve takes
y(t) by integrating y backwards together with the adjoint.

All output rows are merged and sorted by time; the backward pass integrates
the augmented state (y, a, args_bar) backwards (as s = -t, so the same
forward loop serves) in ONE call, landing on every row's time, where y
restarts from the stored forward value and g_i is added to a (rows at the
same time are zero-length intervals). Recorded step times are taken as t0
plus fixed steps, the last one as t_end (the steps' own dependence on the
parameters, a discretisation artefact, is not differentiated; see
:func:`odekit.ode.adjoints.continuous.pull_back`). Memory is O(rows), O(1)
in the number of steps.

With more parameter numbers than the backward loop carries (y, a and a
monitor) and an explicit method, the parameters' cotangents are a
quadrature (:mod:`odekit.ode.adjoints.quadrature`): the backward solve
integrates (y, a) alone and records its steps (memory O(steps x n): with
the forward step limit, or 4 x ``UNLIMITED_RECORD`` steps without one,
a longer backward solve being redone with the cotangents carried), and
each recorded step is taken again once with the full field. The step
control then sees (y, a) only.

Where it fails: y is re-integrated backwards, and a mode that decays forward
in time grows backwards (y' = [[-k, 1], [0, -10]] y on [0, 20]: e^{-10 t}
comes back multiplied by e^{200}), so the reconstructed y, and with it the
adjoint, can be far off. The backward pass can tell: at every row, before y
restarts, it compares its y with the stored forward value, leaf by leaf,

    departure = max |y_back - y| / (atol + rtol max(max |y|, max |y_from|))

(y_from: the forward value at the row the interval started from), keeps the
largest, and fails with ``BACKSOLVE_UNSTABLE`` when that exceeds
``DEPARTURE_LIMIT``. (Between rows it is a constant component of the
backward state, with zero derivative and zero error estimate; the
tolerances of the backward solve are scaled so that the RMS error norm, and
so every step, is what it would be without it.)

Second order (grad of grad): the backward pass is itself a custom_vjp whose
rule differentiates an interval-by-interval version (a scan of calls of
:func:`solve`, each differentiable again), which solves the same adjoint
equations to the same tolerance.
"""
from __future__ import annotations

import math
from functools import partial, reduce
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import status as codes
from odekit._batched_cond import member_cond
from odekit.ode.adjoints import continuous, quadrature
from odekit.ode.adjoints.continuous import at
from odekit.ode.engine import dense
from odekit.ode.engine import solve as forward
from odekit.ode.engine.controller import per_leaf, scaled_tolerance
from odekit.ode.engine.solve import Solution, SolveOptions
from odekit.ode.linalg import jacobian
from odekit.ode.methods import get_method

Pytree = Any

# Largest departure of the backward solve's y from the forward solution (in
# units of the tolerance, see _departure) before the gradient is declared
# unreliable. Measured by python benchmarks/backsolve_departure.py (results
# in benchmarks/results/backsolve_departure.md): PROBLEMS' non-stiff problems
# reach 2.4e3 at most over every method and tolerance, DETEST's orbits 2.6e4;
# y' = [[-1, 1], [0, -lam]] y reaches 7.6e4 with a right gradient (lam =
# 0.5), while Van der Pol on [0, 20] at rtol = 1e-6 departs by 4.9e5 to 9.6e5
# with gradients 70% to 7x off, and issue 14's failures by 1e13 and more.
DEPARTURE_LIMIT = 2e5


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def solve(func: Callable, events: Callable | None, options: SolveOptions, y0: Pytree,
          t0: jax.Array, t_end: jax.Array, t_eval: jax.Array | None, h0: jax.Array,
          *args: Any) -> Solution:
    """:func:`odekit.ode.engine.solve.solve` with gradients by the continuous adjoint.

    Differentiable: ``y0``, ``t0``, ``t_end`` (through the final state),
    ``t_eval`` and the inexact leaves of ``args``; the record times and the
    time reached carry their derivatives with respect to ``t0`` and
    ``t_end`` (:func:`odekit.ode.adjoints.continuous.span_cotangents`); the
    event buffers and the statistics carry none.
    """
    return forward.solve(options, func, y0, t0, t_end, t_eval, h0, args, events)


def _refuse_stiff(method: str) -> None:
    """ValueError for a stiff method: re-integrating a stiff solution backwards
    in time makes the modes it damps grow. Measured (rtol 1e-8, with this
    refusal lifted): Robertson, Van der Pol (mu = 10) and y' = -1000 (y -
    cos t) on [0, 1] all failed in the backward solve (step size underflow
    or a non-finite state) with rodas5p and kvaerno5; the adjoints that take
    y from the forward solve work (tests/ode/test_stiff_gradients.py)."""
    if get_method(method).jacobians_per_step:
        raise ValueError(
            f"odekit: adjoint='backsolve' cannot differentiate a solve by the stiff method "
            f"{method!r}: it re-integrates y backwards in time, where the fast-decaying modes "
            f"of a stiff problem grow. Pass adjoint='checkpoint' (the derivative of the "
            f"forward steps; the default of solve_ivp) or adjoint='interpolate' (the "
            f"continuous adjoint with y from the forward solve's dense output).")


def _solve_fwd(func, events, options, y0, t0, t_end, t_eval, h0, *args):
    _refuse_stiff(options.method)
    sol = solve(func, events, options, y0, t0, t_end, t_eval, h0, *args)
    # Copies, not the inputs themselves: with the inputs as residuals a
    # third-order derivative failed at trace time (a shape error while JAX
    # transposes the scan of _adjoint_by_interval). XLA removes the copies.
    residuals = (sol, jax.tree.map(jnp.copy, y0), jnp.copy(t0), jnp.copy(t_end),
                 None if t_eval is None else jnp.copy(t_eval),
                 jnp.copy(h0), jax.tree.map(jnp.copy, args))
    return sol, residuals


def _solve_bwd(func, events, options, residuals, ct):
    return continuous.pull_back(partial(_adjoint, func, options), _backward_message, options,
                                residuals, ct)


def _backward_message(status: np.ndarray, departure: np.ndarray) -> str:
    status, departure = np.ravel(status), np.ravel(departure)
    i = int(np.argmax(status < 0))
    code = int(status[i])
    members = (f" ({int(np.sum(status < 0))} of {status.size} batch members)"
               if status.size > 1 else "")
    if code == codes.BACKSOLVE_UNSTABLE:
        return (f"odekit: the gradient by adjoint='backsolve' is not reliable for this "
                f"problem{members}: the backward solve re-integrates y from the final time, "
                f"and its y departed from the forward solution by {departure[i]:.3g} times "
                f"the tolerance (atol + rtol |y|) at an output time, more than the "
                f"{DEPARTURE_LIMIT:g} allowed. Modes that decay fast forward in time grow "
                f"when integrated backwards. Use adjoint='checkpoint' (which differentiates "
                f"the forward solution itself) or adjoint='interpolate' (which takes y from "
                f"it), or tighten rtol/atol.")
    return (f"odekit: the backward (adjoint) solve failed{members}: {codes.message(code)}. "
            "The continuous adjoint re-integrates the solution backwards; loosen the "
            "tolerances, raise the step limit, or use another adjoint.")


def _departure(y_back: Pytree, y: Pytree, y_from: Pytree, rtol: Any, atol: Any) -> jax.Array:
    """``max |y_back - y| / (atol + rtol max(max |y|, max |y_from|))`` per leaf
    (max over its elements), the largest over the leaves, in the widest real
    dtype: the backward solve's ``y_back`` against the forward ``y`` at a
    row, ``y_from`` being the forward value at the row the interval started
    from. Normwise, not per element: a component that happens to be 0 at a
    row (a pendulum released at rest, a planet at pericentre) is not held to
    atol alone. 0 where they agree exactly, the largest float for any other
    gap over a zero scale (atol = 0, y = 0)."""
    def leaf(b, f, start, rtol, atol):
        if np.ndim(rtol) or np.ndim(atol):
            # per-element tolerances: each component's gap over its own
            # scale (atol_i + rtol_i max |y|), the largest of them
            gap = jnp.abs(b - f)
            size = jnp.maximum(jnp.max(jnp.abs(f), initial=0),
                               jnp.max(jnp.abs(start), initial=0))
            real = gap.dtype
            rtol, atol = (np.asarray(np.broadcast_to(v, gap.shape), real) for v in (rtol, atol))
            scale = (atol + rtol * size.astype(real)).astype(real)
            ratio = jnp.where(gap == 0, 0, jnp.where(scale == 0, jnp.finfo(real).max,
                                                     gap / jnp.where(scale == 0, 1, scale)))
            return jnp.max(ratio, initial=0)
        rtol, atol = float(rtol), float(atol)
        gap = jnp.max(jnp.abs(b - f), initial=0)
        size = jnp.maximum(jnp.max(jnp.abs(f), initial=0), jnp.max(jnp.abs(start), initial=0))
        scale = (atol + rtol * size).astype(gap.dtype)
        # the largest float, not inf, which jax_debug_infs would stop at
        return jnp.where(gap == 0, 0, jnp.where(scale == 0, jnp.finfo(gap.dtype).max,
                                                gap / jnp.where(scale == 0, 1, scale)))
    count = len(jax.tree.leaves(y))
    worst = [leaf(*parts) for parts in zip(jax.tree.leaves(y_back), jax.tree.leaves(y),
                                           jax.tree.leaves(y_from), per_leaf(rtol, count),
                                           per_leaf(atol, count))]
    dtype = np.result_type(*(w.dtype for w in worst))
    return reduce(jnp.maximum, [w.astype(dtype) for w in worst])


def _augmented_dynamics(func: Callable, state: tuple, s: jax.Array, *args: Any) -> tuple:
    """d/ds of (y, a, args_bar) in reversed time s = -t (args_bar: inexact leaves)."""
    y, a, _ = state
    f, a_y, a_args = continuous.adjoint_field(func, y, a, -s, args)
    return jax.tree.map(jnp.negative, f), a_y, a_args


def _monitored_dynamics(func: Callable, state: tuple, s: jax.Array, *args: Any) -> tuple:
    """:func:`_augmented_dynamics` of (y, a, args_bar) and a constant departure monitor."""
    *aug, monitor = state
    return (*_augmented_dynamics(func, tuple(aug), s, *args), jnp.zeros_like(monitor))


def _monitor(state: tuple, y: Pytree) -> jax.Array:
    """The departure monitor's start, 0: of the state's one dtype when it has
    one (the state then stays one flat vector), else y's real dtype."""
    dtypes = {jnp.result_type(leaf) for leaf in jax.tree.leaves(state)}
    dtype = dtypes.pop() if len(dtypes) == 1 else np.result_type(
        *(jnp.finfo(jnp.result_type(leaf)).dtype for leaf in jax.tree.leaves(y)))
    return jnp.zeros((), dtype)


def _monitored_options(options: SolveOptions, state0: tuple, size: int) -> SolveOptions:
    """Backward options for the state ``state0`` = (y, a, args_bar, monitor)
    of ``size`` numbers plus the monitor, whose error estimate is exactly 0:
    tolerances scaled by sqrt(size / (size + 1)) keep the RMS error norm, and
    so every step, as without it (per-element tolerances: y's entries on y,
    see :func:`odekit.ode.adjoints.continuous.augmented_tolerance`)."""
    options = continuous.backward_options(options, state0, len(jax.tree.leaves(state0[0])))
    c = math.sqrt(size / (size + 1))
    return options._replace(loop=options.loop._replace(
        rtol=scaled_tolerance(options.loop.rtol, c), atol=scaled_tolerance(options.loop.atol, c)))


def _jump(unflatten: Callable, flatten: Callable, tol: tuple, i: jax.Array, z: Pytree,
          data: tuple) -> Pytree:
    """At reversed row i + 1: the departure of y from the stored value is
    recorded, y restarts from the stored value, g jumps into a."""
    ys_rev, gs_rev = data
    y, a, *carried, monitor = unflatten(z)     # carried: args_bar, unless a quadrature
    stored = at(ys_rev, i + 1)
    real = jnp.finfo(monitor.dtype).dtype
    departure = _departure(y, stored, at(ys_rev, i), *tol).astype(real)
    worst = jnp.maximum(jnp.real(monitor), departure)
    return flatten((stored, jax.tree.map(jnp.add, a, at(gs_rev, i + 1)), *carried,
                    worst.astype(monitor.dtype)))


def _state_dynamics(func: Callable, state: tuple, s: jax.Array, *args: Any) -> tuple:
    """d/ds of (y, a) in reversed time s = -t, and the constant departure
    monitor: the backward field without the parameters' cotangents."""
    y, a, monitor = state
    f, pullback = jax.vjp(lambda y_: func(y_, -s, *args), y)
    return jax.tree.map(jnp.negative, f), pullback(a)[0], jnp.zeros_like(monitor)


def _backward_steps(options: SolveOptions, output_rows: int) -> tuple[int, bool]:
    """The quadrature's backward record: ``(rows, capped)``. With a finite
    step limit, the backward solve's own limit plus one; without one,
    ``BACKWARD_STEP_FACTOR`` times ``UNLIMITED_RECORD`` steps plus a step
    per output row, ``capped`` (a longer backward solve is redone with the
    parameters' cotangents carried, see :func:`_adjoint_one_pass`)."""
    limit = options.loop.max_steps * continuous.BACKWARD_STEP_FACTOR
    if math.isfinite(limit):
        return int(limit) + 1, False
    return continuous.BACKWARD_STEP_FACTOR * UNLIMITED_RECORD + output_rows + 1, True


# Steps of the forward solve the quadrature's backward record is sized for
# when the solve has no step limit (odeint's mxstep=inf).
UNLIMITED_RECORD = 4096


def _adjoint_with_quadrature(func, options, rows, capped, ys, ts, g, h_next, *args):
    """:func:`_adjoint_one_pass` with the parameters' cotangents as a
    quadrature (:mod:`odekit.ode.adjoints.quadrature`): the backward solve
    carries (y, a) and the monitor and records its steps; each recorded
    step is taken again from y and a after the jumps there (y restarted
    from the stored forward value, g added to a), with the full field, and
    the parameter part summed. The step control sees (y, a) only."""
    diff_args, _ = continuous.split_args(args)
    state0 = (at(ys, -1), at(g, -1))
    size = sum(np.size(leaf) for leaf in jax.tree.leaves(state0))
    state0 = (*state0, _monitor(state0, state0[0]))
    start, field, flatten, unflatten = continuous.flat(partial(_state_dynamics, func), state0)
    s_rows = -ts[::-1]
    stops = s_rows[1:]
    ys_rev, gs_rev = (jax.tree.map(lambda v: v[::-1], tree) for tree in (ys, g))
    tol = (options.loop.rtol, options.loop.atol)
    back = _monitored_options(options, state0, size)
    back = back._replace(record=rows, loop=back.loop._replace(
        max_steps=float(min(back.loop.max_steps, rows - 1))))
    sol = forward.solve(back, field, start, s_rows[0], s_rows[-1], None, h_next, args,
                        stops=stops, jump=partial(_jump, unflatten, flatten, tol),
                        jump_data=(ys_rev, gs_rev))
    _, a0, monitor = unflatten(sol.y)

    def start_of_step(n):
        hit, last = quadrature.jump_rows(stops, dense.row(sol.ts_record, n))
        y, a, _ = unflatten(dense.row(sol.ys_record, n))
        y = jax.tree.map(lambda v, stored: jnp.where(last >= 0, stored[last + 1], v), y, ys_rev)
        return y, jax.tree.map(jnp.add, a, quadrature.summed_rows(hit, gs_rev))

    full_field = jacobian.bind(partial(_augmented_dynamics, func), args)
    zeros = [jnp.zeros_like(leaf) for leaf in diff_args]
    args_bar = quadrature.replayed_sum(get_method(options.method), full_field, sol.ts_record,
                                       sol.num_points, start_of_step, zeros, ys, args)
    departure = jnp.real(monitor)
    status = sol.status
    if capped:   # the record filled: redone below with the cotangents carried
        status = jnp.where(status == codes.MAX_STEPS, codes.SUCCESS, status)
    return (a0, continuous.time_cotangents(func, ys, ts, g, a0, args), args_bar,
            _with_departure(status, departure), departure), sol.status == codes.MAX_STEPS


def _adjoint_one_pass(func, options, ys, ts, g, h_next, *args):
    """The backward solve as one call of the forward loop with stops and
    jumps; with many parameters, their cotangents as a quadrature."""
    diff_args, _ = continuous.split_args(args)
    n = sum(np.size(leaf) for leaf in jax.tree.leaves(at(ys, 0)))
    rows, capped = _backward_steps(options, ts.shape[0])
    if quadrature.applies(get_method(options.method), 2 * n + 1,
                          sum(np.size(leaf) for leaf in diff_args),
                          continuous.same_dtype((ys, g, diff_args)), rows):
        result, overflowed = _adjoint_with_quadrature(func, options, rows, capped, ys, ts, g,
                                                      h_next, *args)
        if not capped:
            return result
        return member_cond(overflowed,
                           lambda: _adjoint_carrying_parameters(func, options, ys, ts, g, h_next,
                                                                *args),
                           lambda: result)
    return _adjoint_carrying_parameters(func, options, ys, ts, g, h_next, *args)


def _adjoint_carrying_parameters(func, options, ys, ts, g, h_next, *args):
    """The backward solve of (y, a, args_bar) and the monitor together."""
    aug_func = partial(_monitored_dynamics, func)
    diff_args, _ = continuous.split_args(args)
    state0 = (at(ys, -1), at(g, -1), [jnp.zeros_like(leaf) for leaf in diff_args])
    size = sum(np.size(leaf) for leaf in jax.tree.leaves(state0))
    state0 = (*state0, _monitor(state0, state0[0]))
    start, field, flatten, unflatten = continuous.flat(aug_func, state0)
    s_rows = -ts[::-1]
    data = (jax.tree.map(lambda v: v[::-1], ys), jax.tree.map(lambda v: v[::-1], g))
    tol = (options.loop.rtol, options.loop.atol)
    sol = forward.solve(_monitored_options(options, state0, size), field, start, s_rows[0], s_rows[-1],
                        None, h_next, args, stops=s_rows[1:],
                        jump=partial(_jump, unflatten, flatten, tol), jump_data=data)
    _, a0, args_bar, monitor = unflatten(sol.y)
    departure = jnp.real(monitor)
    return (a0, continuous.time_cotangents(func, ys, ts, g, a0, args), args_bar,
            _with_departure(sol.status, departure), departure)


def _with_departure(status: jax.Array, departure: jax.Array) -> jax.Array:
    """``status``, or BACKSOLVE_UNSTABLE when a successful backward solve
    departed from the forward solution by more than DEPARTURE_LIMIT."""
    return jnp.where((status >= 0) & (departure > DEPARTURE_LIMIT), codes.BACKSOLVE_UNSTABLE,
                     status).astype(jnp.int32)


def _adjoint_by_interval(func, options, ys, ts, g, h_next, *args):
    """The same backward solve, one call of :func:`solve` per row interval (a
    scan): every piece is differentiable again (grad of grad)."""
    aug_func = partial(_augmented_dynamics, func)
    diff_args, _ = continuous.split_args(args)
    aug_options = continuous.backward_options(
        options, (at(ys, 0), at(g, 0), diff_args), len(jax.tree.leaves(at(ys, 0))))
    tol = (options.loop.rtol, options.loop.atol)

    def interval(carry, i):
        a, args_bar, h = carry
        a = jax.tree.map(jnp.add, a, at(g, i))
        start, field, _, unflatten = continuous.flat(aug_func, (at(ys, i), a, args_bar))
        sol = solve(field, None, aug_options, start, -ts[i], -ts[i - 1], None, h, *args)
        y_back, a, args_bar = unflatten(sol.y)
        departure = _departure(*lax.stop_gradient((y_back, at(ys, i - 1), at(ys, i))), *tol)
        return (a, args_bar, sol.h), (sol.status, departure)

    a_last = jax.tree.map(jnp.zeros_like, at(g, 0))
    args_bar0 = [jnp.zeros_like(leaf) for leaf in diff_args]
    (a0, args_bar, _), (statuses, departures) = lax.scan(
        interval, (a_last, args_bar0, h_next), jnp.arange(ts.shape[0] - 1, 0, -1))
    a0 = jax.tree.map(jnp.add, a0, at(g, 0))
    status = jnp.min(jnp.concatenate([statuses, jnp.zeros((1,), jnp.int32)]))
    departure = jnp.max(departures, initial=0)
    return (a0, continuous.time_cotangents(func, ys, ts, g, a0, args), args_bar,
            _with_departure(status, departure), departure)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _adjoint(func, options, ys, ts, g, h_next, *args):
    """``(y0_bar, ts_bar, args_bar, status, departure)`` of the backward pass
    over the sorted rows ``(ts, ys, g)``, row 0 being the initial state
    (``departure``: the largest of y's, see the module doc): computed in one
    pass; differentiated through the interval-by-interval version."""
    return _adjoint_one_pass(func, options, ys, ts, g, h_next, *args)


def _adjoint_fwd(func, options, *inputs):
    return _adjoint(func, options, *inputs), inputs


def _adjoint_bwd(func, options, inputs, cotangents):
    _, pullback = jax.vjp(partial(_adjoint_by_interval, func, options), *inputs)
    return pullback(cotangents)


_adjoint.defvjp(_adjoint_fwd, _adjoint_bwd)
solve.defvjp(_solve_fwd, _solve_bwd)
