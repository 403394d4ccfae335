"""``method="auto"``: an explicit method that hands a stiff problem to a stiff one.

The solve starts with ``EXPLICIT`` and its stiffness verdict on (Hairer's
test fires on STIFF_PROBES attempts, see :mod:`odekit.ode.engine.loop`),
with no step budget: the explicit method hands over at the verdict, not
only when it could not finish. Steps near the stability limit keep the
values within the tolerance (the controller reacts to the fast mode), but
their derivative, with the step sizes held fixed, is not error-controlled:
tsit5 alone on Robertson to t = 10 (rtol 1e-6) had d y2/d k1 3x off, while
rodas5p's was within 1e-6. So the verdict must come early, also at tight
tolerances where the controller holds the step below the boundary (the
probe's threshold, :data:`odekit.ode.methods.stiffness.BOUNDARY_FRACTION`). When the
verdict stops it at ``t_s`` (status STIFF), ``STIFF_METHOD`` goes on from
``(t_s, y(t_s))``, as LSODA switches in mid-course: the values at ``t_eval``
up to ``t_s``, the recorded steps up to ``t_s`` (and so the dense output
there) are the explicit method's, the rest the stiff method's, and the
statistics count both. Events found before ``t_s`` are the explicit
method's, those after it the stiff method's, in one buffer per event with
one count. Two cases start the stiff method from ``t0`` instead: the
explicit method ran out of steps (MAX_STEPS: at its stability limit it may
exhaust ``max_steps`` before the verdict, and it has used the whole step
budget), an event whose ``terminal`` count is 2 or more occurred before
``t_s`` (the stiff solve counts its events from 0 and would stop late), and
an event function exactly zero at ``t_s``, reached from one side (the stiff
solve would take that zero for one at its t0, where no side is known, and
count the sign change again when g leaves it: a "dose at t_k" event
``t - t_k`` on the step end where the verdict came counted twice). A
problem that becomes non-stiff again stays with the stiff method.

Derivatives go through both parts (the switch time is held fixed relative to
``t0``, as the step sizes before it are: ``t_s - t0`` does not move, so ``t_s``
moves with ``t0``). Under ``vmap`` the stiff solve runs only when some
member needs it, and each member keeps its own switch.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import status as codes
from odekit._batched_cond import any_member
from odekit._tree import tree_where
from odekit.ode.engine.events import EventSpec, EventState
from odekit.ode.engine.solve import Solution, SolveOptions, taken_over

AUTO = "auto"
EXPLICIT = "tsit5"
STIFF_METHOD = "rodas5p"
METHODS = (EXPLICIT, STIFF_METHOD)   # DenseOutput's methods, in the order of the steps


def solve(run: Callable[..., Solution], options: SolveOptions, y0, t0: jax.Array,
          t_eval: jax.Array | None) -> tuple[Solution, jax.Array]:
    """``(solution, stiff_from)``: ``run(options, y0, t0)`` with ``EXPLICIT``
    and, where it ends STIFF or MAX_STEPS, ``STIFF_METHOD`` after it (see the
    module doc). ``stiff_from`` (int32) is the first step record row whose
    step the stiff method took (the record length when it took none).
    ``t_eval``: the output times (internal, increasing) or None."""
    explicit = run(options._replace(method=EXPLICIT, stiff_taken_over=True,
                                    loop=options.loop._replace(detect_stiffness=True,
                                                               stiff_step_budget=0.0)), y0, t0)
    switch = taken_over(explicit.status)
    carry_on = (switch & (explicit.status == codes.STIFF)
                & ~_counting_toward_a_stop(options.event_spec, explicit.events)
                & ~_at_a_zero(explicit.events))
    rows = options.record
    # The record row where the stiff steps begin: the explicit solve's last
    # point when it goes on from there, row 0 when it starts again.
    offset = jnp.where(carry_on, jnp.maximum(explicit.num_points - 1, 0), 0) \
        if rows else jnp.zeros((), jnp.int32)
    # The switch is held fixed like the step sizes before it: t_s - t0 does not
    # move, so t_s moves with t0 (the grid t0 + h_1 + ... shifts with it);
    # stopping t_s itself dropped d/dt0 of everything after the switch.
    t_switch = jnp.where(carry_on, lax.stop_gradient(explicit.t - t0) + t0, t0)

    def with_stiff() -> Solution:
        start = tree_where(carry_on, explicit.y, y0)
        stiff = run(options._replace(method=STIFF_METHOD), start, t_switch)
        both = type(stiff.stats)(*(a + b for a, b in zip(explicit.stats, stiff.stats)))
        joined = _joined(explicit, stiff, carry_on, t_switch, t_eval, offset, rows)
        return tree_where(switch, joined._replace(stats=both), explicit)

    sol = lax.cond(any_member(switch), with_stiff, lambda: explicit)
    stiff_from = jnp.where(switch, offset, rows).astype(jnp.int32)
    return sol, stiff_from


def _counting_toward_a_stop(spec: EventSpec | None, events: EventState | None) -> jax.Array:
    """Whether an event with a terminal count of 2 or more occurred already:
    the stiff solve, counting from 0, would stop after too many."""
    if spec is None:
        return jnp.bool_(False)
    counted = np.asarray(spec.terminal) > 1
    if not counted.any():
        return jnp.bool_(False)
    return jnp.any(jnp.asarray(counted) & (events.counts > 0))


def _at_a_zero(events: EventState | None) -> jax.Array:
    """Whether an event function is exactly zero where the explicit solve
    stopped, reached from one side: the stiff solve, starting there, would
    not know that side (g at zero at its t0 counts when it leaves), and one
    sign change would count twice."""
    if events is None:
        return jnp.bool_(False)
    return jnp.any((events.g_prev == 0) & (events.side != 0))


def _joined_events(explicit: EventState, stiff: EventState, carry_on: jax.Array) -> EventState:
    """One buffer per event: the explicit solve's occurrences, then the stiff
    solve's (only the stiff solve's where it started again from t0)."""
    shift = jnp.where(carry_on, explicit.counts, 0)
    times, values = [], []
    for e, (t_first, y_first, t_then, y_then) in enumerate(
            zip(explicit.times, explicit.values, stiff.times, stiff.values)):
        slot = jnp.arange(t_first.shape[0], dtype=jnp.int32)
        before = slot < shift[e]
        later = jnp.clip(slot - shift[e], 0, t_first.shape[0] - 1)
        pick = lambda a, b: jnp.where(before.reshape((-1,) + (1,) * (a.ndim - 1)), a,
                                      jnp.take(b, later, axis=0))
        times.append(pick(t_first, t_then))
        values.append(jax.tree.map(pick, y_first, y_then))
    return EventState(stiff.g_prev, (shift + stiff.counts).astype(jnp.int32), tuple(times),
                      tuple(values), stiff.side, stiff.stop_h)


def _joined(explicit: Solution, stiff: Solution, carry_on: jax.Array, t_switch: jax.Array,
            t_eval: jax.Array | None, offset: jax.Array, rows: int) -> Solution:
    """The stiff solve with the explicit part in front where it went on from
    the explicit solve (``carry_on``): values at ``t_eval <= t_switch`` and
    record rows before ``offset`` from ``explicit``, events in front."""
    sol = stiff
    if explicit.events is not None:
        sol = sol._replace(events=_joined_events(explicit.events, stiff.events, carry_on))
    if t_eval is not None:
        early = carry_on & (t_eval <= t_switch)
        sol = sol._replace(ys_eval=jax.tree.map(
            lambda a, b: jnp.where(early.reshape((-1,) + (1,) * (a.ndim - 1)), a, b),
            explicit.ys_eval, stiff.ys_eval))
    if rows:
        i = jnp.arange(rows, dtype=jnp.int32)
        before = i < offset
        later = jnp.clip(i - offset, 0, rows - 1)
        pick = lambda a, b: jnp.where(before.reshape((-1,) + (1,) * (a.ndim - 1)), a,
                                      jnp.take(b, later, axis=0))
        count = offset + stiff.num_points
        # More rows than the record holds: the step budget is spent.
        full = (count > rows) & (stiff.status >= 0)
        sol = sol._replace(ts_record=pick(explicit.ts_record, stiff.ts_record),
                           ys_record=jax.tree.map(pick, explicit.ys_record, stiff.ys_record),
                           num_points=jnp.minimum(count, rows).astype(jnp.int32),
                           status=jnp.where(full, codes.MAX_STEPS, stiff.status).astype(
                               stiff.status.dtype))
    return sol
