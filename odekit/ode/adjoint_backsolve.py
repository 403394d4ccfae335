"""The continuous ("backsolve") adjoint of a forward solve, as a custom_vjp.

Primal: the forward solve (:func:`odekit.ode.solve.solve`), whose
differentiable outputs are values of ``y' = f(y, t, *args)`` at times
``t_i``: the requested times, the recorded steps and the final time. For a
loss L with cotangents ``g_i = dL/dy(t_i)`` the adjoint ``a(t) = dL/dy(t)``
obeys, between those times (Pontryagin; Chen et al., "Neural ODEs",
NeurIPS 2018, appendix C),

    a'(t)      = -a^T df/dy,            a jumps by g_i at t_i,
    dL/dargs   = int_{t_0}^{t_N} a^T df/dargs dt,
    dL/dt_i    = g_i . f(y(t_i), t_i),
    dL/dt_0    = -a(t_0) . f(y0, t_0),    dL/dy0 = a(t_0).

All output rows are merged and sorted by time; the backward pass integrates
the augmented state (y, a, args_bar) backwards (as s = -t, so the same
forward loop serves) in ONE call, landing on every row's time, where y
restarts from the stored forward value and g_i is added to a (rows at the
same time are zero-length intervals). Recorded step times are taken as
fixed (their own dependence on the parameters, a discretisation artefact, is
not differentiated). Memory is O(rows), O(1) in the number of steps.

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
from jax.flatten_util import ravel_pytree

from odekit import status as codes
from odekit._tree import sum_like
from odekit.ode import solve as forward
from odekit.ode.solve import Solution, SolveOptions

Pytree = Any

# Largest departure of the backward solve's y from the forward solution (in
# units of the tolerance, see _departure) before the gradient is declared
# unreliable. From python benchmarks/backsolve_departure.py: the registry's
# non-stiff problems reach ~1e3 (y' = -k y, e^{-10} over the span, whose
# gradient is as accurate as its solution); y' = [[-1, 1], [0, -lam]] y on
# [0, 20] reaches 8e4 with a gradient 2e-5 off at lam = 0.5, rtol = 1.4e-8,
# and 6e6 with one 15% off at lam = 2, rtol = 1e-6; issue 14's failures
# reach 1e13 and more.
DEPARTURE_LIMIT = 1e6


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def solve(func: Callable, events: Callable | None, options: SolveOptions, y0: Pytree,
          t0: jax.Array, t_end: jax.Array, t_eval: jax.Array | None, h0: jax.Array,
          *args: Any) -> Solution:
    """:func:`odekit.ode.solve.solve` with gradients by the continuous adjoint.

    Differentiable: ``y0``, ``t0``, ``t_end`` (through the final state),
    ``t_eval`` and the inexact leaves of ``args``; the event buffers, the
    record times and the statistics carry no gradient.
    """
    return forward.solve(options, func, y0, t0, t_end, t_eval, h0, args, events)


def _solve_fwd(func, events, options, y0, t0, t_end, t_eval, h0, *args):
    sol = solve(func, events, options, y0, t0, t_end, t_eval, h0, *args)
    # Copies, not the inputs themselves: with the inputs as residuals a
    # third-order derivative failed at trace time (a shape error while JAX
    # transposes the scan of _adjoint_by_interval). XLA removes the copies.
    residuals = (sol, jax.tree.map(jnp.copy, y0), jnp.copy(t0), jnp.copy(t_end), t_eval,
                 jnp.copy(h0), jax.tree.map(jnp.copy, args))
    return sol, residuals


def _at(tree: Pytree, i: Any) -> Pytree:
    return jax.tree.map(lambda leaf: leaf[i], tree)


def _dot_real(a: Pytree, b: Pytree, dtype: Any = None) -> jax.Array:
    """Re(sum(a * b)) over all leaves (JAX's cotangent pairing), summed in
    ``dtype`` (leaves may mix float32 and float64)."""
    terms = [jnp.sum(jnp.real(x * y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    dtype = dtype or np.result_type(*(t.dtype for t in terms))
    return sum(t.astype(dtype) for t in terms)


def _is_differentiable(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def _split(args: tuple) -> tuple[list, Callable]:
    """Inexact leaves of ``args`` and a function rebuilding ``args`` from them."""
    leaves, treedef = jax.tree.flatten(args)
    mask = [_is_differentiable(leaf) for leaf in leaves]

    def rebuild(diff_leaves):
        it = iter(diff_leaves)
        return jax.tree.unflatten(treedef, [next(it) if m else leaf for m, leaf in zip(mask, leaves)])

    return [leaf for m, leaf in zip(mask, leaves) if m], rebuild


def _zeros_like_cotangent(ct: Pytree, like: Pytree) -> Pytree:
    """The cotangent ``ct``, or zeros like ``like`` where JAX passed a symbolic zero."""
    return jax.tree.map(lambda c, x: jnp.zeros_like(x) if c is None or getattr(c, "dtype", None)
                        == jax.dtypes.float0 else c, ct, like, is_leaf=lambda c: c is None)


def _rows(sol: Solution, ct: Solution, t_eval: jax.Array | None):
    """Every differentiable output row as (times, values, cotangents, kind),
    kind 0 for t_eval rows, 1 for recorded steps, 2 for the final state.
    Rows past the time reached sit at that time with the final state."""
    t_reached, parts = sol.t, []
    if t_eval is not None:
        parts.append((t_eval, sol.ys_eval, ct.ys_eval, 0))
    if sol.ts_record is not None:
        parts.append((sol.ts_record, sol.ys_record, ct.ys_record, 1))
    parts.append((t_reached[None], _at(sol.y, None), _at(ct.y, None), 2))
    times, values, cots, kinds = [], [], [], []
    for ts, ys, gs, kind in parts:
        gs = _zeros_like_cotangent(gs, ys)
        beyond = ~(ts <= t_reached)
        times.append(jnp.where(beyond, t_reached, ts))
        mask = lambda leaf: beyond.reshape((-1,) + (1,) * (leaf.ndim - 1))
        values.append(jax.tree.map(lambda v, y: jnp.where(mask(v), y[None], v), ys, sol.y))
        cots.append(jax.tree.map(lambda g: jnp.where(mask(g), 0, g) if kind == 1 else g, gs))
        kinds.append(np.full(ts.shape[0], kind))
    cat = lambda *xs: jnp.concatenate(xs)
    return (cat(*times), jax.tree.map(cat, *values), jax.tree.map(cat, *cots),
            np.concatenate(kinds))


def _solve_bwd(func, events, options, residuals, ct):
    sol, y0, t0, t_end, t_eval, h0, args = residuals
    times, values, cots, kinds = _rows(sol, ct, t_eval)
    order = jnp.argsort(lax.stop_gradient(times), stable=True)
    times_sorted = jnp.concatenate([t0[None], times[order]])
    pick = lambda tree: jax.tree.map(lambda leaf: leaf[order], tree)
    ys = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), y0, pick(values))
    gs = jax.tree.map(lambda a, b: jnp.concatenate([jnp.zeros_like(a)[None], b]), y0, pick(cots))
    y0_bar, ts_bar, args_bar, status, departure = _adjoint(
        func, options, ys, times_sorted, gs, lax.stop_gradient(sol.h), *args)
    row_t_bar = jnp.zeros_like(times).at[order].set(ts_bar[1:])
    t_eval_bar = None if t_eval is None else row_t_bar[:t_eval.shape[0]]
    reached_end = (sol.status >= 0) & (sol.t >= t_end)
    t_end_bar = jnp.where(reached_end, jnp.sum(jnp.where(kinds == 2, row_t_bar, 0)), 0)
    it = iter(args_bar)
    args_cotangent = jax.tree.map(
        lambda leaf: next(it) if _is_differentiable(leaf)
        else np.zeros(np.shape(leaf), dtype=jax.dtypes.float0), args)
    grads = (y0_bar, ts_bar[0], t_end_bar.astype(t_end.dtype), t_eval_bar,
             jnp.zeros_like(sol.h), *args_cotangent)
    # Gradients of a failed forward solve are nan (its values are, too).
    failed = (status < 0) | (sol.status < 0) if not options.throw else sol.status < 0
    grads = jax.tree.map(lambda g: jnp.where(failed, jnp.nan, g) if g is not None and _is_differentiable(g) else g,
                         grads, is_leaf=lambda g: g is None)
    if options.throw:
        grads = codes.raise_if_failed(status, grads, (departure,), _backward_message,
                                      codes.ODESolverError)
    return sum_like(grads, (y0, t0, t_end, t_eval, h0, *args))   # shard_map: shared inputs


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
                f"when integrated backwards. Use adjoint='checkpoint', which differentiates "
                f"the forward solution itself, or tighten rtol/atol.")
    return (f"odekit: the backward (adjoint) solve failed{members}: {codes.message(code)}. "
            "The continuous adjoint re-integrates the solution backwards; loosen the "
            "tolerances, raise the step limit, or use another adjoint.")


def _departure(y_back: Pytree, y: Pytree, y_from: Pytree, rtol: float, atol: float) -> jax.Array:
    """``max |y_back - y| / (atol + rtol max(max |y|, max |y_from|))`` per leaf
    (max over its elements), the largest over the leaves, in the widest real
    dtype: the backward solve's ``y_back`` against the forward ``y`` at a
    row, ``y_from`` being the forward value at the row the interval started
    from. Normwise, not per element: a component that happens to be 0 at a
    row (a pendulum released at rest, a planet at pericentre) is not held to
    atol alone. 0 where they agree exactly, the largest float for any other
    gap over a zero scale (atol = 0, y = 0)."""
    def leaf(b, f, start):
        gap = jnp.max(jnp.abs(b - f), initial=0)
        size = jnp.maximum(jnp.max(jnp.abs(f), initial=0), jnp.max(jnp.abs(start), initial=0))
        scale = (atol + rtol * size).astype(gap.dtype)
        # the largest float, not inf, which jax_debug_infs would stop at
        return jnp.where(gap == 0, 0, jnp.where(scale == 0, jnp.finfo(gap.dtype).max,
                                                gap / jnp.where(scale == 0, 1, scale)))
    worst = jax.tree.leaves(jax.tree.map(leaf, y_back, y, y_from))
    dtype = np.result_type(*(w.dtype for w in worst))
    return reduce(jnp.maximum, [w.astype(dtype) for w in worst])


def _augmented_dynamics(func: Callable, state: tuple, s: jax.Array, *args: Any) -> tuple:
    """d/ds of (y, a, args_bar) in reversed time s = -t (args_bar: inexact leaves)."""
    y, a, _ = state
    diff_args, rebuild = _split(args)
    f, pullback = jax.vjp(lambda y_, d_: func(y_, -s, *rebuild(d_)), y, diff_args)
    a_y, a_args = pullback(a)
    return jax.tree.map(jnp.negative, f), a_y, a_args


def _same_dtype(tree: Pytree) -> bool:
    return len({jnp.result_type(leaf) for leaf in jax.tree.leaves(tree)}) == 1


def _flat_dynamics(dynamics: Callable, unravel: Callable, z: jax.Array, s: jax.Array,
                   *args: Any) -> jax.Array:
    """``dynamics`` on the flat vector ``z`` of a pytree state."""
    return ravel_pytree(dynamics(unravel(z), s, *args))[0]


def _backward_options(options: SolveOptions) -> SolveOptions:
    return options._replace(record=0, event_spec=None, given_first_step=True,
                            loop=options.loop._replace(detect_stiffness=False, progress=False))


def _time_cotangents(func, ys, ts, g, a0, args):
    """dL/dt_i = g_i . f(y_i, t_i) for rows i >= 1; dL/dt_0 = -a(t_0) . f(y0, t_0)."""
    f_at_rows = jax.vmap(lambda y, t: func(y, t, *args))(ys, ts)
    t_bar = jax.vmap(partial(_dot_real, dtype=ts.dtype))(f_at_rows, g)
    t0_bar = -_dot_real(a0, _at(f_at_rows, 0), ts.dtype)
    return jnp.concatenate([t0_bar[None], t_bar[1:]]).astype(ts.dtype)


def _flat(aug_func: Callable, state0: tuple):
    """(start, field, to_flat, from_flat): one flat vector when all leaves share a
    dtype (every stage is then one kernel, not one per leaf), else the pytree."""
    if not _same_dtype(state0):
        return state0, aug_func, (lambda z: z), (lambda z: z)
    start, unravel = ravel_pytree(state0)
    return start, partial(_flat_dynamics, aug_func, unravel), (lambda z: ravel_pytree(z)[0]), unravel


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


def _monitored_options(options: SolveOptions, size: int) -> SolveOptions:
    """Backward options for a state of ``size`` numbers plus the monitor,
    whose error estimate is exactly 0: tolerances scaled by sqrt(size / (size
    + 1)) keep the RMS error norm, and so every step, as without it."""
    options = _backward_options(options)
    c = math.sqrt(size / (size + 1))
    return options._replace(loop=options.loop._replace(rtol=options.loop.rtol * c,
                                                       atol=options.loop.atol * c))


def _jump(unflatten: Callable, flatten: Callable, tol: tuple, i: jax.Array, z: Pytree,
          data: tuple) -> Pytree:
    """At reversed row i + 1: the departure of y from the stored value is
    recorded, y restarts from the stored value, g jumps into a."""
    ys_rev, gs_rev = data
    y, a, args_bar, monitor = unflatten(z)
    stored = _at(ys_rev, i + 1)
    real = jnp.finfo(monitor.dtype).dtype
    departure = _departure(y, stored, _at(ys_rev, i), *tol).astype(real)
    worst = jnp.maximum(jnp.real(monitor), departure)
    return flatten((stored, jax.tree.map(jnp.add, a, _at(gs_rev, i + 1)), args_bar,
                    worst.astype(monitor.dtype)))


def _adjoint_one_pass(func, options, ys, ts, g, h_next, *args):
    """The backward solve as one call of the forward loop with stops and jumps."""
    aug_func = partial(_monitored_dynamics, func)
    diff_args, _ = _split(args)
    state0 = (_at(ys, -1), _at(g, -1), [jnp.zeros_like(leaf) for leaf in diff_args])
    size = sum(np.size(leaf) for leaf in jax.tree.leaves(state0))
    state0 = (*state0, _monitor(state0, state0[0]))
    start, field, flatten, unflatten = _flat(aug_func, state0)
    s_rows = -ts[::-1]
    data = (jax.tree.map(lambda v: v[::-1], ys), jax.tree.map(lambda v: v[::-1], g))
    tol = (options.loop.rtol, options.loop.atol)
    sol = forward.solve(_monitored_options(options, size), field, start, s_rows[0], s_rows[-1],
                        None, h_next, args, stops=s_rows[1:],
                        jump=partial(_jump, unflatten, flatten, tol), jump_data=data)
    _, a0, args_bar, monitor = unflatten(sol.y)
    departure = jnp.real(monitor)
    return (a0, _time_cotangents(func, ys, ts, g, a0, args), args_bar,
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
    aug_options = _backward_options(options)
    diff_args, _ = _split(args)
    tol = (options.loop.rtol, options.loop.atol)

    def interval(carry, i):
        a, args_bar, h = carry
        a = jax.tree.map(jnp.add, a, _at(g, i))
        start, field, _, unflatten = _flat(aug_func, (_at(ys, i), a, args_bar))
        sol = solve(field, None, aug_options, start, -ts[i], -ts[i - 1], None, h, *args)
        y_back, a, args_bar = unflatten(sol.y)
        departure = _departure(*lax.stop_gradient((y_back, _at(ys, i - 1), _at(ys, i))), *tol)
        return (a, args_bar, sol.h), (sol.status, departure)

    a_last = jax.tree.map(jnp.zeros_like, _at(g, 0))
    args_bar0 = [jnp.zeros_like(leaf) for leaf in diff_args]
    (a0, args_bar, _), (statuses, departures) = lax.scan(
        interval, (a_last, args_bar0, h_next), jnp.arange(ts.shape[0] - 1, 0, -1))
    a0 = jax.tree.map(jnp.add, a0, _at(g, 0))
    status = jnp.min(jnp.concatenate([statuses, jnp.zeros((1,), jnp.int32)]))
    departure = jnp.max(departures, initial=0)
    return (a0, _time_cotangents(func, ys, ts, g, a0, args), args_bar,
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
