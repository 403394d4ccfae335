"""What the integration loop produces besides the final state.

After every accepted step from ``t`` to ``t_new`` (``h = t_new - t``):

* **values at requested times** ``t_eval`` (increasing, within the span):
  every ``t_eval[i]`` in ``(t, t_new]`` gets the method's dense output
  ``y(t + theta h)``, ``theta = (t_eval[i] - t) / h`` (``y1`` itself at
  ``t_new``); times never reached stay nan;
* **a record of every accepted step** ``(t_n, y_n)`` in buffers of fixed
  length (for ``t_eval=None`` and for the dense output object); for a method
  whose dense output cannot be replayed from ``(t_n, y_n)``
  (``Method.recorded_dense``), also each step's dense row, when asked;
* **events** (:mod:`odekit.ode.engine.events`); a terminal event ends the step at
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
import numpy as np
from jax import lax

from odekit import _lax as ops
from odekit._batched_cond import member_cond
from odekit._tree import tree_where, vary_like
from odekit.ode.engine import events as ev
from odekit.ode.methods import Method

Pytree = Any


CAPPED_WINDOW = 8   # Outputs.window of a capped loop (see Outputs.capped)


class Outputs(NamedTuple):
    """What to produce (used at trace time only).

    Attributes:
      t_eval: (m,) increasing times in [t0, t_end] or None.
      record: length of the step record (0: none).
      stops: (k,) non-decreasing times in [t0, t_end] to land on, or None.
      jump: ``jump(i, y) -> y`` applied at ``stops[i]`` (None: identity).
      events: ``G(t, y) -> (E,)`` stacked event functions, or None.
      event_spec: :class:`odekit.ode.engine.events.EventSpec` when ``events``.
      window: outputs filled per vectorised write before looping (0: a loop
        only, the cheaper choice inside one kernel).
      capped: no step passes the ``window``-th output time not yet filled,
        so one vectorised write fills every output a step passes: no inner
        loop, which reverse-mode autodiff can go through, and O(window)
        work per step however many output times there are.
      recorded_dense: the method's
        :class:`~odekit.ode.methods.registry.RecordedDense` when the record
        also keeps each accepted step's dense row (``record`` > 0), else None.
    """

    t_eval: jax.Array | None = None
    record: int = 0
    stops: jax.Array | None = None
    jump: Callable | None = None
    events: Callable | None = None
    event_spec: ev.EventSpec | None = None
    window: int = 0
    capped: bool = False
    recorded_dense: Any = None


class OutputState(NamedTuple):
    eval_index: Any = None    # int32: next t_eval to fill
    ys_eval: Any = None       # leaves (m, ...)
    record_index: Any = None  # int32: rows of the record written
    ts_record: Any = None     # (record,)
    ys_record: Any = None     # leaves (record, ...)
    stop_index: Any = None    # int32: next stop
    events: Any = None        # ev.EventState
    dense_record: Any = None  # leaves (record, ...): row i, the dense row of
                              # the step ending at ts_record[i] (row 0 zeros)


class StepOutcome(NamedTuple):
    t: jax.Array              # where the step ends (earlier at a terminal event)
    y: Pytree
    f: Pytree
    out: OutputState
    nfev: jax.Array           # evaluations of func spent on outputs (int32)
    terminated: jax.Array     # a terminal event ended the step
    reached_output: jax.Array  # an output time or stop was reached
    jumped: jax.Array         # a jump at a stop replaced the state (a multistep
                              # method restarts there: Method.restart)


def padding(dtype: Any) -> tuple[Any, Any]:
    """(time, value) that fill unused rows: inf and nan, or, where the user
    has turned on jax_debug_infs / jax_debug_nans (which would stop at them),
    the largest finite float and 0."""
    big = float(jnp.finfo(dtype).max) if jax.config.jax_debug_infs else float("inf")
    return big, (0.0 if jax.config.jax_debug_nans else float("nan"))


def _time_at(times: jax.Array, i: jax.Array) -> jax.Array:
    """``times[min(i, len - 1)]`` for an int32 index ``i`` >= 0."""
    last = np.int32(times.shape[0] - 1)
    return ops.row(times, lax.min(i, last))


def _row(tree: Pytree, i: Any) -> Pytree:
    return jax.tree.map(lambda leaf: leaf[i], tree)


def limit(outputs: Outputs, out: OutputState, t_end: jax.Array) -> jax.Array:
    """The time no step may pass: ``t_end``, the next stop, or (capped) the
    ``window``-th output time not yet filled."""
    if outputs.capped and outputs.t_eval is not None:
        m = outputs.t_eval.shape[0]
        cap = outputs.t_eval[jnp.minimum(out.eval_index + outputs.window - 1, m - 1)]
        t_end = jnp.where(out.eval_index < m, jnp.minimum(cap, t_end), t_end)
    if outputs.stops is None:
        return t_end
    k = outputs.stops.shape[0]
    nxt = outputs.stops[jnp.minimum(out.stop_index, k - 1)]
    return jnp.where(out.stop_index < k, jnp.minimum(nxt, t_end), t_end)


def next_output(outputs: Outputs, out: OutputState, t_end: jax.Array) -> jax.Array:
    """The first output time not yet filled (``t_end`` when none): the limit of
    a method that lands its steps on the output times (``Method.lands_on_outputs``)."""
    if outputs.t_eval is None:
        return t_end
    m = outputs.t_eval.shape[0]
    nxt = outputs.t_eval[jnp.minimum(out.eval_index, m - 1)]
    return jnp.where(out.eval_index < m, jnp.minimum(nxt, t_end), t_end)


def apply_stops(outputs: Outputs, func: Callable, out: OutputState, t: jax.Array, y: Pytree,
                f: Pytree, accept: Any = True) -> tuple[OutputState, Pytree, Pytree, jax.Array, jax.Array]:
    """Apply every jump at a stop <= t (none when ``accept`` is False);
    returns (out, y, f, nfev, reached)."""
    if outputs.stops is None:
        return out, y, f, jnp.zeros((), jnp.int32), jnp.bool_(False)
    stops, k = outputs.stops, outputs.stops.shape[0]
    due = lambda c: accept & (c[0] < k) & (stops[jnp.minimum(c[0], k - 1)] <= t)
    reached = due((out.stop_index,))
    if outputs.jump is None:
        passed = (stops <= t) & (jnp.arange(k, dtype=jnp.int32) >= out.stop_index) & accept
        index = out.stop_index + jnp.sum(passed).astype(jnp.int32)
        return out._replace(stop_index=index), y, f, jnp.zeros((), jnp.int32), reached

    def body(c):
        i, y_ = c
        return i + 1, outputs.jump(i, y_)

    index, y_new = lax.while_loop(due, body, (out.stop_index, y))
    f_new = member_cond(reached, lambda: func(y_new, t), lambda: f)
    return (out._replace(stop_index=index), y_new, f_new, reached.astype(jnp.int32), reached)


def initial(outputs: Outputs, t0: jax.Array, y0: Pytree) -> tuple[OutputState, int]:
    """Output state at ``t0`` (values at ``t_eval == t0``, the first record
    row, the event values) and the evaluations that cost."""
    out, cost = OutputState(), 0
    if outputs.t_eval is not None:
        m = outputs.t_eval.shape[0]
        at_start = lax.le(outputs.t_eval, t0)

        def first_rows(y):
            rows = (m,) + y.shape
            mask = lax.broadcast_in_dim(at_start, rows, (0,))
            start = lax.broadcast_in_dim(y, rows, tuple(range(1, len(rows))))
            return lax.select(mask, start, lax.full(rows, padding(t0.dtype)[1], y.dtype))
        ys = jax.tree.map(first_rows, y0)
        count = ops.total(lax.convert_element_type(at_start, np.int32))
        out = out._replace(eval_index=count, ys_eval=ys)
    if outputs.record:
        n = outputs.record
        ts = jnp.full((n,), padding(t0.dtype)[0], t0.dtype).at[0].set(t0)
        ys = jax.tree.map(lambda y: jnp.zeros((n,) + y.shape, y.dtype).at[0].set(y), y0)
        out = out._replace(record_index=jnp.ones((), jnp.int32), ts_record=ts, ys_record=ys)
        if outputs.recorded_dense is not None:
            rows = jax.tree.map(lambda r: jnp.zeros((n,) + r.shape, r.dtype),
                                outputs.recorded_dense.empty(y0))
            out = out._replace(dense_record=rows)
    if outputs.stops is not None:
        out = out._replace(stop_index=jnp.zeros((), jnp.int32))
    if outputs.events is not None:
        g0 = outputs.events(t0, y0)
        out = out._replace(events=ev.init(outputs.event_spec, g0, y0, *padding(g0.dtype)))
    return out, cost


def _theta(t_out: jax.Array, t: jax.Array, h: jax.Array) -> jax.Array:
    """``(t_out - t) / h``, the place of the output times in the step
    ``[t, t + h]``, with ``h = 0`` replaced by 1: a zero-length step (a
    bounded loop's idle iteration, a step ending on the final time) writes
    no row, and a quotient by 0 there is not finite; its derivative's
    derivative, ``0 * inf`` in the discarded branch, made grad of grad NaN."""
    return lax.div(lax.sub(t_out, t), lax.select(lax.eq(h, lax.full_like(h, 0)),
                                                 lax.full_like(h, 1), h))


def _fill_eval(outputs: Outputs, dense: Callable, out: OutputState, accept: jax.Array,
               t: jax.Array, h: jax.Array, t_end: jax.Array, y_end: Pytree) -> OutputState:
    """Values at every t_eval in (t, t_end] from the dense output (none when
    the step was rejected); the buffer is updated in place."""
    t_eval, m = outputs.t_eval, outputs.t_eval.shape[0]
    due = lambda i: lax.bitwise_and(lax.bitwise_and(accept, lax.lt(i, np.int32(m))),
                                    lax.le(_time_at(t_eval, i), t_end))

    def value_at(t_i):
        theta = _theta(t_i, t, h)
        return tree_where(lax.eq(t_i, t_end), y_end, _row(dense(lax.broadcast(theta, (1,))), 0))

    def one_by_one(c):
        i, ys = c
        put = lambda buf, v: ops.put_row(buf, v, i)
        return lax.add(i, np.int32(1)), jax.tree.map(put, ys, value_at(ops.row(t_eval, i)))

    index, ys = out.eval_index, out.ys_eval
    if outputs.capped:
        index, ys = _fill_window(outputs.window, t_eval, dense, ys, index, due, t, h, t_end, y_end)
    elif outputs.window:
        # Kernel by kernel (no single kernel), a loop costs a dispatch per
        # iteration: fill a window of outputs at once, loop only beyond it.
        index, ys = _fill_window(outputs.window, t_eval, dense, ys, index, due, t, h, t_end,
                                 y_end)
        if outputs.window < m:
            rest = lambda: lax.while_loop(lambda c: due(c[0]), one_by_one, (index, ys))
            index, ys = lax.cond(due(index), rest, lambda: (index, ys))
    else:
        index, ys = lax.while_loop(lambda c: due(c[0]), one_by_one, (index, ys))
    return out._replace(eval_index=index, ys_eval=ys)


def _fill_window(window: int, t_eval: jax.Array, dense: Callable, ys: Pytree, index: jax.Array,
                 due: Callable, t: jax.Array, h: jax.Array, t_end: jax.Array, y_end: Pytree):
    """The next ``window`` outputs from ``index`` in one vectorised write."""
    m = t_eval.shape[0]
    width = min(window, m)
    start = jnp.minimum(index, m - width)
    rows = start + jnp.arange(width, dtype=jnp.int32)
    write = (rows >= index) & jax.vmap(due)(rows)
    t_rows = t_eval[rows]
    values = _where_rows(t_rows == t_end, y_end, dense(_theta(t_rows, t, h)))

    def put(buf, v):
        old = lax.dynamic_slice_in_dim(buf, start, width)
        new = jnp.where(write.reshape((-1,) + (1,) * (v.ndim - 1)), v, old)
        return lax.dynamic_update_slice_in_dim(buf, new, start, 0)

    return index + jnp.sum(write).astype(jnp.int32), jax.tree.map(put, ys, values)


def _locate_events(outputs: Outputs, dense: Callable, state: ev.EventState, active: jax.Array,
                   g_new: jax.Array, t: jax.Array, h: jax.Array, t_new: jax.Array,
                   y1: Pytree) -> tuple[jax.Array, jax.Array, Pytree]:
    """(theta, times, values) of the active events (a branch taken only when
    some event occurred; it returns small arrays, never the buffers)."""
    num_events = g_new.shape[0]

    def located():
        def g_theta(theta):   # each event at its own theta
            ys = dense(theta)
            return jnp.diagonal(jax.vmap(lambda th, y: outputs.events(t + th * h, y))(theta, ys))
        eps = jnp.finfo(t.dtype).eps
        resolution = jnp.maximum(4 * eps * jnp.maximum(jnp.abs(t_new), jnp.abs(t)) / h, 4 * eps)
        theta = ev.locate(g_theta, state.g_prev, g_new, active, resolution)
        return theta, _where_rows(theta == 1.0, y1, dense(theta))

    # Built outside the branch, typed like the located values (shard_map: a
    # cast recorded inside a branch breaks when vmap batches the branches).
    nothing = vary_like((jnp.ones(num_events, t.dtype), jax.tree.map(
        lambda y: jnp.broadcast_to(y, (num_events,) + y.shape), y1)), g_new, t, h, y1)
    theta, values = member_cond(jnp.any(active), located, lambda: nothing)
    times = jnp.where(theta == 1.0, t_new, t + theta * h)
    return theta, times, values


def _where_rows(pred: jax.Array, y: Pytree, rows: Pytree) -> Pytree:
    """Rows of ``rows`` (leading axis like ``pred``), replaced by ``y`` where ``pred``."""
    return jax.tree.map(lambda r, v: jnp.where(pred.reshape((-1,) + (1,) * v.ndim), v[None], r),
                        rows, y)


def _dense_step(method: Method, func: Callable, t: jax.Array, y: Pytree, h: jax.Array, step,
                needed: jax.Array) -> Pytree:
    """The step's continuous extension; behind a branch when it costs evaluations."""
    prepare = lambda: method.dense_prepare(func, t, y, h, step)
    if method.dense_evaluations == 0:
        return prepare()
    shapes = jax.eval_shape(prepare)
    return member_cond(needed, prepare,
                       lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))


def _record(outputs: Outputs, out: OutputState, accept: jax.Array, t_end: jax.Array,
            y_end: Pytree, dense_step: Pytree) -> OutputState:
    """Append (t_end, y_end) to the step record when the step was accepted
    (one row written in place either way), and the step's dense row
    (``Outputs.recorded_dense``) when one is kept."""
    i = jnp.minimum(out.record_index, outputs.record - 1)
    write = lambda buf, v: buf.at[i].set(jnp.where(accept, v, buf[i]))
    if outputs.recorded_dense is not None:
        row = outputs.recorded_dense.row(dense_step)
        out = out._replace(dense_record=jax.tree.map(write, out.dense_record, row))
    return out._replace(record_index=out.record_index + accept.astype(jnp.int32),
                        ts_record=write(out.ts_record, t_end),
                        ys_record=jax.tree.map(write, out.ys_record, y_end))


def after_step(outputs: Outputs, method: Method, func: Callable, out: OutputState,
               accept: jax.Array, t: jax.Array, y: Pytree, h: jax.Array, t_new: jax.Array,
               step) -> StepOutcome:
    """Produce the outputs of the step from ``(t, y)`` to ``t_new`` if it was
    accepted (``accept``); a rejected step leaves every output as it was."""
    nfev = jnp.zeros((), jnp.int32)
    t_end, y_end, f_end = t_new, step.y1, step.f1
    needed = jnp.bool_(False)
    if outputs.t_eval is not None:
        m = outputs.t_eval.shape[0]
        needed = lax.bitwise_and(lax.lt(out.eval_index, np.int32(m)),
                                 lax.le(_time_at(outputs.t_eval, out.eval_index), t_new))
    if outputs.events is not None:
        g_new = outputs.events(t_new, step.y1)
        active = ev.crossings(outputs.event_spec, out.events.g_prev, out.events.side,
                              g_new) & accept
        needed = needed | jnp.any(active)
    if outputs.record and outputs.recorded_dense is not None:
        needed = jnp.bool_(True)    # every accepted step's dense row is kept
    needed = lax.bitwise_and(needed, accept)
    dense_step = _dense_step(method, func, t, y, h, step, needed)
    dense = lambda theta: method.dense_eval(dense_step, theta)
    if method.dense_evaluations:
        extra = lax.mul(lax.convert_element_type(needed, np.int32), np.int32(method.dense_evaluations))
        nfev = lax.add(nfev, extra)
    terminated = jnp.bool_(False)
    if outputs.events is not None:
        state = out.events
        theta, times, values = _locate_events(outputs, dense, state, active, g_new, t, h, t_new,
                                              step.y1)
        theta_stop = ev.terminal_theta(outputs.event_spec, state.counts, active, theta)
        kept = active & (theta <= theta_stop)
        g_end = jnp.where(accept, g_new, state.g_prev)
        side = jnp.where(accept, ev.next_side(state.g_prev, state.side, g_new), state.side)
        terminated = jnp.isfinite(theta_stop)
        # The step a terminal event shortens keeps its interpolant (the one
        # that located the event): the dense output replays the full step.
        stop_h = jnp.where(terminated, lax.stop_gradient(h).astype(state.stop_h.dtype), state.stop_h)
        out = out._replace(events=ev.record(state, g_end, kept, times, values, side, stop_h))

        def stop_there():
            y_s = tree_where(theta_stop >= 1, step.y1, _row(dense(theta_stop[None]), 0))
            t_s = jnp.where(theta_stop >= 1, t_new, t + theta_stop * h)
            return t_s, y_s, func(y_s, t_s)

        t_end, y_end, f_end = member_cond(terminated, stop_there,
                                          lambda: (t_new, step.y1, step.f1))
        nfev = nfev + terminated.astype(jnp.int32)
    reached = jnp.bool_(False)
    if outputs.t_eval is not None:
        out = _fill_eval(outputs, dense, out, accept, t, h, t_end, y_end)
        reached = needed
    if outputs.record:
        out = _record(outputs, out, accept, t_end, y_end, dense_step)
    out, y_end, f_end, stop_nfev, stopped = apply_stops(outputs, func, out, t_end, y_end, f_end,
                                                        accept)
    jumped = stopped if outputs.jump is not None else jnp.bool_(False)
    return StepOutcome(t_end, y_end, f_end, out, lax.add(nfev, stop_nfev), terminated,
                       lax.bitwise_or(reached, stopped), jumped)
