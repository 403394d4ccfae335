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

Second order (grad of grad): the backward pass is itself a custom_vjp whose
rule differentiates an interval-by-interval version (a scan of calls of
:func:`solve`, each differentiable again), which solves the same adjoint
equations to the same tolerance.
"""
from __future__ import annotations

from functools import partial
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
    y0_bar, ts_bar, args_bar, status = _adjoint(func, options, ys, times_sorted, gs,
                                                lax.stop_gradient(sol.h), *args)
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
        grads = codes.raise_if_failed(status, grads, (), _backward_message, codes.ODESolverError)
    return sum_like(grads, (y0, t0, t_end, t_eval, h0, *args))   # shard_map: shared inputs


def _backward_message(status: np.ndarray) -> str:
    status = np.ravel(status)
    code = int(status[np.argmax(status < 0)])
    return (f"odekit: the backward (adjoint) solve failed: {codes.message(code)}. The "
            "continuous adjoint re-integrates the solution backwards; loosen the tolerances, "
            "raise the step limit, or use another adjoint.")


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


def _jump(unflatten: Callable, flatten: Callable, i: jax.Array, z: Pytree, data: tuple) -> Pytree:
    """At reversed row i + 1: y restarts from the stored value, g jumps into a."""
    ys_rev, gs_rev = data
    _, a, args_bar = unflatten(z)
    return flatten((_at(ys_rev, i + 1), jax.tree.map(jnp.add, a, _at(gs_rev, i + 1)), args_bar))


def _adjoint_one_pass(func, options, ys, ts, g, h_next, *args):
    """The backward solve as one call of the forward loop with stops and jumps."""
    aug_func = partial(_augmented_dynamics, func)
    diff_args, _ = _split(args)
    state0 = (_at(ys, -1), _at(g, -1), [jnp.zeros_like(leaf) for leaf in diff_args])
    start, field, flatten, unflatten = _flat(aug_func, state0)
    s_rows = -ts[::-1]
    data = (jax.tree.map(lambda v: v[::-1], ys), jax.tree.map(lambda v: v[::-1], g))
    sol = forward.solve(_backward_options(options), field, start, s_rows[0], s_rows[-1], None,
                        h_next, args, stops=s_rows[1:], jump=partial(_jump, unflatten, flatten),
                        jump_data=data)
    _, a0, args_bar = unflatten(sol.y)
    return a0, _time_cotangents(func, ys, ts, g, a0, args), args_bar, sol.status


def _adjoint_by_interval(func, options, ys, ts, g, h_next, *args):
    """The same backward solve, one call of :func:`solve` per row interval (a
    scan): every piece is differentiable again (grad of grad)."""
    aug_func = partial(_augmented_dynamics, func)
    aug_options = _backward_options(options)
    diff_args, _ = _split(args)

    def interval(carry, i):
        a, args_bar, h = carry
        a = jax.tree.map(jnp.add, a, _at(g, i))
        start, field, _, unflatten = _flat(aug_func, (_at(ys, i), a, args_bar))
        sol = solve(field, None, aug_options, start, -ts[i], -ts[i - 1], None, h, *args)
        _, a, args_bar = unflatten(sol.y)
        return (a, args_bar, sol.h), sol.status

    a_last = jax.tree.map(jnp.zeros_like, _at(g, 0))
    args_bar0 = [jnp.zeros_like(leaf) for leaf in diff_args]
    (a0, args_bar, _), statuses = lax.scan(interval, (a_last, args_bar0, h_next),
                                           jnp.arange(ts.shape[0] - 1, 0, -1))
    a0 = jax.tree.map(jnp.add, a0, _at(g, 0))
    status = jnp.min(jnp.concatenate([statuses, jnp.zeros((1,), jnp.int32)]))
    return a0, _time_cotangents(func, ys, ts, g, a0, args), args_bar, status


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _adjoint(func, options, ys, ts, g, h_next, *args):
    """``(y0_bar, ts_bar, args_bar, status)`` of the backward pass over the
    sorted rows ``(ts, ys, g)``, row 0 being the initial state: computed in
    one pass; differentiated through the interval-by-interval version."""
    return _adjoint_one_pass(func, options, ys, ts, g, h_next, *args)


def _adjoint_fwd(func, options, *inputs):
    return _adjoint(func, options, *inputs), inputs


def _adjoint_bwd(func, options, inputs, cotangents):
    _, pullback = jax.vjp(partial(_adjoint_by_interval, func, options), *inputs)
    return pullback(cotangents)


_adjoint.defvjp(_adjoint_fwd, _adjoint_bwd)
solve.defvjp(_solve_fwd, _solve_bwd)
