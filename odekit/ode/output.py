"""What the integration loop produces besides the final state.

After every accepted step from ``t`` to ``t_new`` (``h = t_new - t``):

* **values at requested times** ``t_eval`` (increasing, within the span):
  every ``t_eval[i]`` in ``(t, t_new]`` gets the method's dense output
  ``y(t + theta h)``, ``theta = (t_eval[i] - t) / h`` (``y1`` itself at
  ``t_new``); times never reached stay nan;
* **a record of every accepted step** ``(t_n, y_n)`` in buffers of fixed
  length (for ``t_eval=None`` and for the dense output object);
* **events** (:mod:`odekit.ode.events`); a terminal event ends the step at
  the event time;
* **stops**: times the step size is clipped to land on exactly, where
  ``jump(i, y)`` replaces the state (the adjoint's cotangent jumps) and the
  vector field is evaluated afresh.

Each part is off (None / 0) unless asked for, so it costs nothing then.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from odekit.ode import events as ev
from odekit.ode.methods import Method

Pytree = Any


class Outputs(NamedTuple):
    """What to produce (used at trace time only).

    Attributes:
      t_eval: (m,) increasing times in [t0, t_end] or None.
      record: length of the step record (0: none).
      stops: (k,) non-decreasing times in [t0, t_end] to land on, or None.
      jump: ``jump(i, y) -> y`` applied at ``stops[i]`` (None: identity).
      events: ``G(t, y) -> (E,)`` stacked event functions, or None.
      event_spec: :class:`odekit.ode.events.EventSpec` when ``events``.
    """

    t_eval: jax.Array | None = None
    record: int = 0
    stops: jax.Array | None = None
    jump: Callable | None = None
    events: Callable | None = None
    event_spec: ev.EventSpec | None = None


class OutputState(NamedTuple):
    eval_index: Any = None    # int32: next t_eval to fill
    ys_eval: Any = None       # leaves (m, ...)
    record_index: Any = None  # int32: rows of the record written
    ts_record: Any = None     # (record,)
    ys_record: Any = None     # leaves (record, ...)
    stop_index: Any = None    # int32: next stop
    events: Any = None        # ev.EventState


class StepOutcome(NamedTuple):
    t: jax.Array              # where the step ends (earlier at a terminal event)
    y: Pytree
    f: Pytree
    out: OutputState
    nfev: jax.Array           # evaluations of func spent on outputs (int32)
    terminated: jax.Array     # a terminal event ended the step
    reached_output: jax.Array  # an output time or stop was reached


def padding(dtype: Any) -> tuple[Any, Any]:
    """(time, value) that fill unused rows: inf and nan, or, where the user
    has turned on jax_debug_infs / jax_debug_nans (which would stop at them),
    the largest finite float and 0."""
    big = float(jnp.finfo(dtype).max) if jax.config.jax_debug_infs else float("inf")
    return big, (0.0 if jax.config.jax_debug_nans else float("nan"))


def all_finite(tree: Pytree) -> jax.Array:
    """Whether every element of every leaf is finite (scalar bool)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def _where(pred: jax.Array, new: Pytree, old: Pytree) -> Pytree:
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def _row(tree: Pytree, i: Any) -> Pytree:
    return jax.tree.map(lambda leaf: leaf[i], tree)


def limit(outputs: Outputs, out: OutputState, t_end: jax.Array) -> jax.Array:
    """The time no step may pass: ``t_end`` or the next stop."""
    if outputs.stops is None:
        return t_end
    k = outputs.stops.shape[0]
    nxt = outputs.stops[jnp.minimum(out.stop_index, k - 1)]
    return jnp.where(out.stop_index < k, jnp.minimum(nxt, t_end), t_end)


def apply_stops(outputs: Outputs, func: Callable, out: OutputState, t: jax.Array, y: Pytree,
                 f: Pytree) -> tuple[OutputState, Pytree, Pytree, jax.Array, jax.Array]:
    """Apply every jump at a stop <= t; returns (out, y, f, nfev, reached)."""
    if outputs.stops is None:
        return out, y, f, jnp.zeros((), jnp.int32), jnp.bool_(False)
    stops, k = outputs.stops, outputs.stops.shape[0]
    due = lambda c: (c[0] < k) & (stops[jnp.minimum(c[0], k - 1)] <= t)
    reached = due((out.stop_index,))
    if outputs.jump is None:
        index = out.stop_index + jnp.sum((stops <= t) & (jnp.arange(k) >= out.stop_index))
        return out._replace(stop_index=index.astype(jnp.int32)), y, f, jnp.zeros((), jnp.int32), reached

    def body(c):
        i, y_ = c
        return i + 1, outputs.jump(i, y_)

    index, y_new = lax.while_loop(due, body, (out.stop_index, y))
    f_new = lax.cond(reached, lambda: func(y_new, t), lambda: f)
    return (out._replace(stop_index=index), y_new, f_new, reached.astype(jnp.int32), reached)


def initial(outputs: Outputs, t0: jax.Array, y0: Pytree) -> tuple[OutputState, int]:
    """Output state at ``t0`` (values at ``t_eval == t0``, the first record
    row, the event values) and the evaluations that cost."""
    out, cost = OutputState(), 0
    if outputs.t_eval is not None:
        at_start = outputs.t_eval <= t0
        shape = lambda leaf: (-1,) + (1,) * leaf.ndim
        ys = jax.tree.map(lambda y: jnp.where(at_start.reshape(shape(y)), y[None],
                                              jnp.full((outputs.t_eval.shape[0],) + y.shape,
                                                       jnp.nan, y.dtype)), y0)
        out = out._replace(eval_index=jnp.sum(at_start).astype(jnp.int32), ys_eval=ys)
    if outputs.record:
        n = outputs.record
        ts = jnp.full((n,), padding(t0.dtype)[0], t0.dtype).at[0].set(t0)
        ys = jax.tree.map(lambda y: jnp.zeros((n,) + y.shape, y.dtype).at[0].set(y), y0)
        out = out._replace(record_index=jnp.ones((), jnp.int32), ts_record=ts, ys_record=ys)
    if outputs.stops is not None:
        out = out._replace(stop_index=jnp.zeros((), jnp.int32))
    if outputs.events is not None:
        g0 = outputs.events(t0, y0)
        out = out._replace(events=ev.init(outputs.event_spec, g0, y0, *padding(g0.dtype)))
    return out, cost


def _fill_eval(outputs: Outputs, method: Method, dense: Callable, out: OutputState,
               t: jax.Array, h: jax.Array, t_end: jax.Array, y_end: Pytree) -> OutputState:
    """Values at every t_eval in (t, t_end] from the dense output."""
    t_eval, m = outputs.t_eval, outputs.t_eval.shape[0]
    due = lambda c: (c[0] < m) & (t_eval[jnp.minimum(c[0], m - 1)] <= t_end)

    def body(c):
        i, ys = c
        t_i = t_eval[i]
        theta = ((t_i - t) / h)[None]
        value = _row(dense(theta), 0)
        value = _where(t_i == t_end, y_end, value)
        return i + 1, jax.tree.map(lambda buf, v: buf.at[i].set(v), ys, value)

    index, ys = lax.while_loop(due, body, (out.eval_index, out.ys_eval))
    return out._replace(eval_index=index, ys_eval=ys)


def _events(outputs: Outputs, method: Method, func: Callable, dense_fn: Callable,
            out: OutputState, t: jax.Array, h: jax.Array, t_new: jax.Array, y1: Pytree):
    """Detect and record the events of the step; returns (out, theta_stop, nfev)
    with theta_stop = inf when no terminal event occurred."""
    spec, state = outputs.event_spec, out.events
    g_new = outputs.events(t_new, y1)
    active = ev.crossings(spec, state.g_prev, g_new)

    def located():
        dense = dense_fn()
        def g_theta(theta):   # each event at its own theta
            ys = dense(theta)
            g_all = jax.vmap(lambda th, y: outputs.events(t + th * h, y))(theta, ys)
            return jnp.diagonal(g_all)
        resolution = 4 * jnp.finfo(t.dtype).eps * jnp.maximum(jnp.abs(t_new), jnp.abs(t)) / h
        theta = ev.locate(g_theta, state.g_prev, g_new, active, jnp.maximum(resolution, 4 * jnp.finfo(t.dtype).eps))
        theta_stop = ev.terminal_theta(spec, state.counts, active, theta)
        kept = active & (theta <= theta_stop)
        times = jnp.where(theta == 1.0, t_new, t + theta * h)
        values = _where_rows(theta == 1.0, y1, dense(theta))
        new = ev.record(state, g_new, kept, times, values)
        return new, theta_stop

    new, theta_stop = lax.cond(jnp.any(active), located,
                               lambda: (state._replace(g_prev=g_new), jnp.asarray(jnp.inf, t.dtype)))
    return out._replace(events=new), theta_stop


def _where_rows(pred: jax.Array, y: Pytree, rows: Pytree) -> Pytree:
    """Rows of ``rows`` (leading axis like ``pred``), replaced by ``y`` where ``pred``."""
    return jax.tree.map(lambda r, v: jnp.where(pred.reshape((-1,) + (1,) * v.ndim), v[None], r),
                        rows, y)


def after_step(outputs: Outputs, method: Method, func: Callable, out: OutputState, t: jax.Array,
               y: Pytree, h: jax.Array, t_new: jax.Array, step) -> StepOutcome:
    """Produce the outputs of the accepted step from ``(t, y)`` to ``t_new``."""
    nfev = jnp.zeros((), jnp.int32)
    dense_fn = lambda: (lambda theta: method.dense_eval(
        method.dense_prepare(func, t, y, h, step), theta))
    t_end, y_end, f_end = t_new, step.y1, step.f1
    terminated = jnp.bool_(False)
    if outputs.events is not None:
        out, theta_stop = _events(outputs, method, func, dense_fn, out, t, h, t_new, step.y1)
        terminated = jnp.isfinite(theta_stop)

        def stop_there():
            y_s = _row(dense_fn()(theta_stop[None]), 0)
            t_s = jnp.where(theta_stop >= 1, t_new, t + theta_stop * h)
            y_s = _where(theta_stop >= 1, step.y1, y_s)
            return t_s, y_s, func(y_s, t_s)

        t_end, y_end, f_end = lax.cond(terminated, stop_there, lambda: (t_new, step.y1, step.f1))
        nfev = nfev + terminated.astype(jnp.int32) * (1 + method.dense_evaluations)
    reached = jnp.bool_(False)
    if outputs.t_eval is not None:
        m = outputs.t_eval.shape[0]
        covered = (out.eval_index < m) & (outputs.t_eval[jnp.minimum(out.eval_index, m - 1)] <= t_end)
        out = lax.cond(covered,
                       lambda: _fill_eval(outputs, method, dense_fn(), out, t, h, t_end, y_end),
                       lambda: out)
        nfev = nfev + covered.astype(jnp.int32) * method.dense_evaluations
        reached = reached | covered
    if outputs.record:
        i = jnp.minimum(out.record_index, outputs.record - 1)
        out = out._replace(record_index=out.record_index + 1,
                           ts_record=out.ts_record.at[i].set(t_end),
                           ys_record=jax.tree.map(lambda buf, v: buf.at[i].set(v),
                                                  out.ys_record, y_end))
    out, y_end, f_end, stop_nfev, stopped = apply_stops(outputs, func, out, t_end, y_end, f_end)
    return StepOutcome(t_end, y_end, f_end, out, nfev + stop_nfev, terminated, reached | stopped)
