"""What the continuous adjoints (backsolve, interpolate) share.

Both differentiate the forward solve's outputs: values of ``y' = f(y, t,
*args)`` at times ``t_i`` (the requested times, the recorded steps and the
final time). For a loss L with cotangents ``g_i = dL/dy(t_i)`` the adjoint
``a(t) = dL/dy(t)`` obeys, between those times (Pontryagin; Chen et al.,
"Neural ODEs", NeurIPS 2018, appendix C),

    a'(t)      = -a^T df/dy,            a jumps by g_i at t_i,
    dL/dargs   = int_{t_0}^{t_N} a^T df/dargs dt,
    dL/dt_i    = g_i . f(y(t_i), t_i),
    dL/dt_0    = -a(t_0) . f(y0, t_0),    dL/dy0 = a(t_0).

A recorded step (t_eval=None, dense output) is at t_0 plus the steps
taken, its dL/dt_i going to t_0, and the last one at t_end, its dL/dt_i
going to t_end, as the final state's (after a terminal event both are at
t_0 plus the steps): the derivatives of the steps themselves
(checkpoint's), with the step sizes held fixed.

They differ in where the backward pass takes y(t) from. This module turns
the cotangents of a :class:`~odekit.ode.engine.solve.Solution` into the sorted rows
``(t_i, y_i, g_i)`` the backward pass runs over (:func:`rows`), and the
backward pass's results into the cotangents of the solve's inputs
(:func:`pull_back`).
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
from odekit.ode.engine.controller import PerElement
from odekit.ode.engine.solve import Solution, SolveOptions, failed

Pytree = Any

# adjoint_pass(ys, ts, gs, h_last, *args) -> (y0_bar, ts_bar, args_bar, status, detail)
AdjointPass = Callable[..., tuple]


def at(tree: Pytree, i: Any) -> Pytree:
    return jax.tree.map(lambda leaf: leaf[i], tree)


def dot_real(a: Pytree, b: Pytree, dtype: Any = None) -> jax.Array:
    """Re(sum(a * b)) over all leaves (JAX's cotangent pairing), summed in
    ``dtype`` (leaves may mix float32 and float64)."""
    terms = [jnp.sum(jnp.real(x * y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    dtype = dtype or np.result_type(*(t.dtype for t in terms))
    return sum(t.astype(dtype) for t in terms)


def is_differentiable(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def split_args(args: tuple) -> tuple[list, Callable]:
    """Inexact leaves of ``args`` and a function rebuilding ``args`` from them."""
    leaves, treedef = jax.tree.flatten(args)
    mask = [is_differentiable(leaf) for leaf in leaves]

    def rebuild(diff_leaves):
        it = iter(diff_leaves)
        return jax.tree.unflatten(treedef, [next(it) if m else leaf for m, leaf in zip(mask, leaves)])

    return [leaf for m, leaf in zip(mask, leaves) if m], rebuild


def adjoint_field(func: Callable, y: Pytree, a: Pytree, t: jax.Array, args: tuple) -> tuple:
    """``(f, a^T df/dy, a^T df/dargs)`` at ``(y, t)`` (args: their inexact leaves)."""
    diff_args, rebuild = split_args(args)
    f, pullback = jax.vjp(lambda y_, d_: func(y_, t, *rebuild(d_)), y, diff_args)
    return (f, *pullback(a))


def _zeros_like_cotangent(ct: Pytree, like: Pytree) -> Pytree:
    """The cotangent ``ct``, or zeros like ``like`` where JAX passed a symbolic zero."""
    return jax.tree.map(lambda c, x: jnp.zeros_like(x) if c is None or getattr(c, "dtype", None)
                        == jax.dtypes.float0 else c, ct, like, is_leaf=lambda c: c is None)


def rows(sol: Solution, ct: Solution, t_eval: jax.Array | None):
    """Every differentiable output row as (times, values, cotangents, kind),
    kind 0 for t_eval rows, 1 for recorded steps, 2 for the final state.
    Rows past the time reached sit at that time with the final state."""
    t_reached, parts = sol.t, []
    if t_eval is not None:
        parts.append((t_eval, sol.ys_eval, ct.ys_eval, 0))
    if sol.ts_record is not None:
        parts.append((sol.ts_record, sol.ys_record, ct.ys_record, 1))
    parts.append((t_reached[None], at(sol.y, None), at(ct.y, None), 2))
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


def same_dtype(tree: Pytree) -> bool:
    return len({jnp.result_type(leaf) for leaf in jax.tree.leaves(tree)}) == 1


def _flat_dynamics(dynamics: Callable, unravel: Callable, z: jax.Array, s: jax.Array,
                   *args: Any) -> jax.Array:
    """``dynamics`` on the flat vector ``z`` of a pytree state."""
    return ravel_pytree(dynamics(unravel(z), s, *args))[0]


# The backward system (the adjoint, args_bar and, for backsolve, y) is
# larger and can be less smooth than y's: its solve may take this many times
# the forward solve's step limit (a finite limit; odeint's is unlimited).
BACKWARD_STEP_FACTOR = 4


def backward_options(options: SolveOptions, state0: Pytree = None, y_leaves: int = 0
                     ) -> SolveOptions:
    """The forward options, for a backward solve: no record, events,
    stiffness test or progress meter; the first step is the one given; the
    step limit ``BACKWARD_STEP_FACTOR`` times the forward one; per-element
    tolerances made those of the backward state (:func:`augmented_tolerance`;
    ``state0``: that state before :func:`flat`, its first ``y_leaves`` leaves y's)."""
    loop = options.loop._replace(detect_stiffness=False, progress=False,
                                 max_steps=options.loop.max_steps * BACKWARD_STEP_FACTOR)
    loop = loop._replace(rtol=augmented_tolerance(loop.rtol, state0, y_leaves),
                         atol=augmented_tolerance(loop.atol, state0, y_leaves))
    return options._replace(record=0, event_spec=None, given_first_step=True, loop=loop)


def augmented_tolerance(value: float | PerElement, state0: Pytree, y_leaves: int
                        ) -> float | PerElement:
    """A tolerance of y, for the backward state ``state0`` (a tuple whose
    first ``y_leaves`` leaves are y's, when the backward solve integrates y
    too, as backsolve's does).

    A float applies to every component, as in the forward solve. A
    per-element tolerance keeps its entries on y's components; the other
    components (the adjoint ``a = dL/dy``, ``args_bar``, a monitor) get its
    tightest positive entry (:meth:`PerElement.tightest`): a is a sum over
    y's components, which the entries do not separate, and the tightest
    entry makes the gradient as accurate as with that scalar tolerance (a
    zero entry, pure relative control of one component, is not imposed on
    them). Laid out as :func:`flat` lays out the state: one vector when its
    leaves share a dtype."""
    if not isinstance(value, PerElement):
        return value
    tightest = value.tightest()
    if not y_leaves:
        return tightest
    leaves = jax.tree.leaves(state0)
    parts = list(value.leaves) + [np.asarray(tightest)] * (len(leaves) - y_leaves)
    if not same_dtype(state0):
        return PerElement(parts)
    return PerElement([np.concatenate([np.broadcast_to(part, np.shape(leaf)).ravel()
                                       for part, leaf in zip(parts, leaves)])])


def time_cotangents(func, ys, ts, g, a0, args):
    """dL/dt_i = g_i . f(y_i, t_i) for rows i >= 1; dL/dt_0 = -a(t_0) . f(y0, t_0)."""
    f_at_rows = jax.vmap(lambda y, t: func(y, t, *args))(ys, ts)
    t_bar = jax.vmap(partial(dot_real, dtype=ts.dtype))(f_at_rows, g)
    t0_bar = -dot_real(a0, at(f_at_rows, 0), ts.dtype)
    return jnp.concatenate([t0_bar[None], t_bar[1:]]).astype(ts.dtype)


def flat(aug_func: Callable, state0: tuple):
    """(start, field, to_flat, from_flat): one flat vector when all leaves share a
    dtype (every stage is then one kernel, not one per leaf), else the pytree."""
    if not same_dtype(state0):
        return state0, aug_func, (lambda z: z), (lambda z: z)
    start, unravel = ravel_pytree(state0)
    return start, partial(_flat_dynamics, aug_func, unravel), (lambda z: ravel_pytree(z)[0]), unravel


def span_cotangents(sol: Solution, ct: Solution, reached_end: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """The cotangents of ``(t0, t_end)`` from those of the output times
    themselves: the record's times ``ts_record`` (N,) and the time reached
    ``t`` (scalar), as the rows' values move them (:func:`rows`).

    A recorded time is t0 plus the steps taken, ``s_k = t0 + c_k`` (the
    steps held fixed), so ``ds_k/dt0 = 1``; the time reached and the
    record's row there are ``t_end`` when the solve got there
    (``reached_end``; ``ds/dt_end = 1``), else t0 plus the steps (a
    terminal event, whose time the front end differentiates on its own).
    Rows past the record's end (padding) carry nothing. Returns
    ``(t0_bar, t_end_bar)``, scalars in the times' dtype."""
    dtype = sol.t.dtype
    t_bar = _zeros_like_cotangent(ct.t, sol.t).astype(dtype)
    t0_bar = jnp.where(reached_end, 0, t_bar)
    t_end_bar = jnp.where(reached_end, t_bar, 0)
    if sol.ts_record is not None:
        record_bar = _zeros_like_cotangent(ct.ts_record, sol.ts_record).astype(dtype)
        index = jnp.arange(sol.ts_record.shape[0], dtype=jnp.int32)
        valid = index < sol.num_points
        at_end = valid & reached_end & (sol.ts_record == sol.t)
        t0_bar = t0_bar + jnp.sum(jnp.where(valid & ~at_end, record_bar, 0))
        t_end_bar = t_end_bar + jnp.sum(jnp.where(at_end, record_bar, 0))
    return t0_bar, t_end_bar


def pull_back(adjoint_pass: AdjointPass, message: Callable, options: SolveOptions,
              residuals: tuple, ct: Solution, *extra: Any) -> tuple:
    """The cotangents of ``(y0, t0, t_end, t_eval, h0, *args)`` of a solve
    from those of its :class:`Solution` ``ct``.

    ``residuals = (sol, y0, t0, t_end, t_eval, h0, args)``; ``adjoint_pass(ys,
    ts, gs, h_last, *args)`` runs the backward pass over the sorted rows
    (row 0: the initial state) and returns ``(y0_bar, ts_bar, args_bar,
    status, detail)`` (``args_bar``: the inexact leaves' cotangents;
    ``detail`` goes to ``message(status, detail)`` when it failed).
    ``extra`` (say, a record of the forward steps) follows ``args``.
    """
    sol, y0, t0, t_end, t_eval, h0, args = residuals
    times, values, cots, kinds = rows(sol, ct, t_eval)
    order = jnp.argsort(lax.stop_gradient(times), stable=True)
    times_sorted = jnp.concatenate([t0[None], times[order]])
    pick = lambda tree: jax.tree.map(lambda leaf: leaf[order], tree)
    ys = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), y0, pick(values))
    gs = jax.tree.map(lambda a, b: jnp.concatenate([jnp.zeros_like(a)[None], b]), y0, pick(cots))
    y0_bar, ts_bar, args_bar, status, detail = adjoint_pass(
        ys, times_sorted, gs, lax.stop_gradient(sol.h), *args, *extra)
    row_t_bar = jnp.zeros_like(times).at[order].set(ts_bar[1:])
    t_eval_bar = None if t_eval is None else row_t_bar[:t_eval.shape[0]]
    reached_end = (sol.status >= 0) & (sol.t >= t_end)
    # The rows at the time reached (the final state and the record's last
    # row) are at t_end when it was reached. The record's other rows, and
    # those at a terminal event's time, are at t0 plus the steps taken
    # (whose own dependence is not differentiated): their time cotangents
    # go to t0 (for y' = f(y) their values do not depend on t0 at all, as
    # the discrete derivative of the steps says).
    at_end = reached_end & ((kinds == 2) | ((kinds == 1) & (times == lax.stop_gradient(sol.t))))
    t_end_bar = jnp.sum(jnp.where(at_end, row_t_bar, 0))
    t0_bar = ts_bar[0] + jnp.sum(jnp.where((kinds != 0) & ~at_end, row_t_bar, 0))
    span_t0_bar, span_t_end_bar = span_cotangents(sol, ct, reached_end)
    t0_bar, t_end_bar = t0_bar + span_t0_bar, t_end_bar + span_t_end_bar
    it = iter(args_bar)
    args_cotangent = jax.tree.map(
        lambda leaf: next(it) if is_differentiable(leaf)
        else np.zeros(np.shape(leaf), dtype=jax.dtypes.float0), args)
    grads = (y0_bar, t0_bar.astype(t0.dtype), t_end_bar.astype(t_end.dtype), t_eval_bar,
             jnp.zeros_like(sol.h), *args_cotangent)
    # Gradients of a failed forward solve are nan (its values are, too).
    forward_failed = failed(options, sol.status)
    failed_ = (status < 0) | forward_failed if not options.throw else forward_failed
    grads = jax.tree.map(
        lambda g: jnp.where(failed_, jnp.nan, g) if g is not None and is_differentiable(g) else g,
        grads, is_leaf=lambda g: g is None)
    if options.throw:
        grads = codes.raise_if_failed(status, grads, (detail,), message, codes.ODESolverError)
    return sum_like(grads, (y0, t0, t_end, t_eval, h0, *args))   # shard_map: shared inputs
