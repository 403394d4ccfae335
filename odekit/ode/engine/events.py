"""Event detection and location inside the integration loop.

Event functions ``g_e(t, y)`` (stacked into one vector function ``G``) are
evaluated at the end of every accepted step. Event e occurs in the step
``[t, t + h]`` when ``g_e`` changes sign in the requested direction (up
when ``g_old < 0 <= g_new``, down when ``g_old > 0 >= g_new``;
``direction > 0`` keeps up-crossings, ``< 0`` down-crossings, ``0`` both). A
zero exactly at a step end counts once, in the step that reaches it (see
:func:`crossings`); a zero at ``t0`` counts when g leaves it, as in SciPy.
Its time is the root of ``theta -> g_e(t + theta h, y(t + theta h))`` on
the method's dense output, found by the Illinois variant of regula falsi
(Dowell & Jarratt, BIT 11, 1971) to a bracket of a few ulp of ``t``. At most
one occurrence per event function is recorded per step, as in SciPy. A
terminal event (``terminal`` = the occurrence count that stops the solve)
ends the step at the event time.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from odekit._sealed_jvp import sealed_jvp
from odekit._tree import vary_like

Pytree = Any

LOCATE_ITERATIONS = 200   # bound on Illinois iterations (it stops at a few ulp long before)


class EventSpec(NamedTuple):
    """Static description of the events of a solve (hashable).

    Attributes:
      directions: (E,) crossing direction per event (+1, -1 or 0).
      terminal: (E,) occurrences that stop the solve (0: never).
      capacity: (E,) recorded occurrences per event (buffer length).
    """

    directions: tuple
    terminal: tuple
    capacity: tuple


class EventState(NamedTuple):
    g_prev: jax.Array    # (E,) event values at the current time
    counts: jax.Array    # (E,) int32 occurrences so far
    times: tuple         # per event: (capacity_e,) times (inf where none)
    values: tuple        # per event: y at those times, leaves (capacity_e, ...)
    side: jax.Array      # (E,) the side of zero g is on (see :func:`crossings`)
    stop_h: jax.Array    # size of the step a terminal event shortened (0: none)


def init(spec: EventSpec, g0: jax.Array, y0: Pytree, no_time: float = float("inf"),
         no_value: float = float("nan")) -> EventState:
    """Empty buffers (filled with ``no_time`` / ``no_value``) and the event
    values ``g0 = G(t0, y0)``."""
    times = tuple(jnp.full((cap,), no_time, g0.dtype) for cap in spec.capacity)
    values = tuple(jax.tree.map(lambda y: jnp.full((cap,) + y.shape, no_value, y.dtype), y0)
                   for cap in spec.capacity)
    return EventState(g0, jnp.zeros(len(spec.capacity), jnp.int32), times, values,
                      jnp.sign(g0), jnp.zeros((), g0.dtype))


def crossings(spec: EventSpec, g_old: jax.Array, side: jax.Array, g_new: jax.Array) -> jax.Array:
    """(E,) bool: which events changed sign in their direction.

    ``side`` is the side of zero g was on at the step's start: the sign of
    g there, and where g was exactly zero, the side it had crossed to in
    reaching zero (0 when g started at zero at t0, where no side is known).
    A zero reached at a step's end completes a crossing (g goes from -1 to
    0: up), so g going on from that zero to the same side is not a second
    one: one sign change is one event, also when a step lands exactly on
    the zero (-1, 0, +1 at three step ends). A zero at t0 counts when g
    leaves it (SciPy's rule there), and a touch (-1, 0, -1) is an up and a
    down crossing, as in SciPy. A g that stays at zero over a step does not
    cross.
    """
    moved = (g_old != 0) | (g_new != 0)
    up = moved & jnp.where(side == 0, g_new > 0, (side < 0) & (g_new >= 0))
    down = moved & jnp.where(side == 0, g_new < 0, (side > 0) & (g_new <= 0))
    direction = jnp.asarray(spec.directions, g_new.dtype)
    return (up & (direction > 0)) | (down & (direction < 0)) | ((up | down) & (direction == 0))


def next_side(g_old: jax.Array, side: jax.Array, g_new: jax.Array) -> jax.Array:
    """The side of zero after a step from ``g_old`` to ``g_new`` (see
    :func:`crossings`): the sign of ``g_new``, or, at an exact zero reached
    from elsewhere, the side opposite to the one the step started on."""
    return jnp.where(g_new != 0, jnp.sign(g_new), jnp.where(g_old != 0, -side, side))


def locate(g_theta: Callable[[jax.Array], jax.Array], g_old: jax.Array, g_new: jax.Array,
           active: jax.Array, resolution: jax.Array) -> jax.Array:
    """(E,) theta in [0, 1] of each active event's root (1 where inactive).

    ``g_theta(theta)`` evaluates every event at its own ``theta`` ((E,) ->
    (E,)). Illinois iteration on each bracket until it is shorter than
    ``resolution`` (in units of theta) or g vanishes; returns the end of the
    bracket on the far side of the sign change, so the event has happened
    at the returned time.
    """
    zero = jnp.zeros_like(g_old)
    lo, hi, g_lo, g_hi = zero, jnp.ones_like(g_old), g_old, g_new

    def cond(carry):
        i, lo, hi, g_lo, g_hi, _ = carry
        open_ = active & (hi - lo > resolution) & (g_hi != 0) & (g_lo != 0)
        return (i < LOCATE_ITERATIONS) & jnp.any(open_)

    def body(carry):
        i, lo, hi, g_lo, g_hi, side = carry
        denom = g_hi - g_lo
        secant = jnp.where(denom != 0, lo - g_lo * (hi - lo) / jnp.where(denom != 0, denom, 1), 0.5 * (lo + hi))
        mid = jnp.clip(secant, lo, hi)
        # Bisect when the secant point sits on a bracket end (no progress).
        mid = jnp.where((mid <= lo) | (mid >= hi), 0.5 * (lo + hi), mid)
        g_mid = jnp.where(active, lax.stop_gradient(g_theta(jnp.where(active, mid, 1.0))), 0.0)
        same_as_lo = jnp.sign(g_mid) == jnp.sign(g_lo)
        new_lo, new_hi = jnp.where(same_as_lo, mid, lo), jnp.where(same_as_lo, hi, mid)
        new_g_lo, new_g_hi = jnp.where(same_as_lo, g_mid, g_lo), jnp.where(same_as_lo, g_hi, g_mid)
        # Illinois: halve the value at the end that stays put twice in a row.
        new_side = jnp.where(same_as_lo, 1, -1)
        new_g_hi = jnp.where(same_as_lo & (side == 1), 0.5 * new_g_hi, new_g_hi)
        new_g_lo = jnp.where(~same_as_lo & (side == -1), 0.5 * new_g_lo, new_g_lo)
        keep = ~active | (g_lo == 0) | (g_hi == 0)
        pick = lambda new, old: jnp.where(keep, old, new)
        return (i + 1, pick(new_lo, lo), pick(new_hi, hi), pick(new_g_lo, g_lo),
                pick(new_g_hi, g_hi), pick(new_side, side))

    side0 = jnp.zeros(g_old.shape, jnp.int32)
    # The located theta carries no derivative (the front end differentiates
    # event times by the implicit function theorem), so no autodiff mode has
    # to go through this loop.
    start = lax.stop_gradient((jnp.zeros((), jnp.int32), lo, hi, g_lo, g_hi, side0))
    start = vary_like(start, g_old, g_new, active, resolution)   # shard_map: one carry type
    _, lo, hi, g_lo, _, _ = lax.while_loop(cond, body, start)
    theta = jnp.where(g_lo == 0, lo, hi)
    return jnp.where(active, theta, 1.0)


def terminal_theta(spec: EventSpec, counts: jax.Array, active: jax.Array,
                   theta: jax.Array) -> jax.Array:
    """The smallest theta of an active event that reaches its terminal count
    (inf when none does)."""
    limit = jnp.asarray(spec.terminal, jnp.int32)
    stops = active & (limit > 0) & (counts + 1 >= limit)
    return jnp.min(jnp.where(stops, theta, jnp.inf))


def record(state: EventState, g_end: jax.Array, active: jax.Array, times: jax.Array,
           values: Pytree, side: jax.Array, stop_h: jax.Array) -> EventState:
    """Store each active event's occurrence (``times`` (E,), ``values``
    leaves (E, ...)) and move on to the values ``g_end`` and ``side`` at the
    step's end (``stop_h``: see :class:`EventState`)."""
    new_times, new_values = [], []
    for e, (t_buf, y_buf) in enumerate(zip(state.times, state.values)):
        slot = jnp.minimum(state.counts[e], t_buf.shape[0] - 1)
        write = active[e] & (state.counts[e] < t_buf.shape[0])
        put = lambda buf, v: buf.at[slot].set(jnp.where(write, v, buf[slot]))  # one row in place
        new_times.append(put(t_buf, times[e]))
        new_values.append(jax.tree.map(lambda buf, v: put(buf, v[e]), y_buf, values))
    return EventState(g_end, state.counts + active.astype(jnp.int32), tuple(new_times),
                      tuple(new_values), side, stop_h)


@partial(sealed_jvp, nondiff_argnums=(0,))
def implicit_time(residual: Callable[[jax.Array, Pytree], jax.Array], located: jax.Array,
                  params: Pytree) -> jax.Array:
    """The root ``t*(p)`` of ``G(t, p) = residual(t, params)`` (a scalar),
    whose value is ``located`` (found by :func:`locate`, no derivative),
    with derivatives of every order by the implicit function theorem.

    Differentiating ``G(t*(p), p) = 0`` gives ``G_t dt* + G_p dp = 0``:

        dt* = -(G_p(t*(p), p) . dp) / G_t(t*(p), p).

    The rule evaluates this at ``t*(p)`` computed by this same function, so
    differentiating the rule again (grad of grad, ``jax.hessian``, jacfwd of
    jacfwd) differentiates ``t*`` inside it as well and gives the exact
    higher derivatives (for the second,
    ``t*'' = -(G_tt t*'^2 + 2 G_tp t*' + G_pp) / G_t``), where a first-order
    correction ``t* - (G - stop_gradient(G)) / G_t`` is right to first order
    only. ``residual`` closes over no traced values (``params`` carries them:
    for an event, the dense output, ``args`` and the event's constants);
    where ``G_t = 0`` (a tangential zero, no crossing) the derivative is
    ``-G_p dp`` (finite, not inf).

    Args:
      residual: ``residual(t, params) -> ()``, differentiable in both.
      located: () the root as located (any derivative it carries is ignored).
      params: a pytree of arrays; integer leaves carry no derivative.

    Returns:
      () ``located``, differentiable in ``params``.
    """
    del residual, params
    return located


@implicit_time.defjvp
def _implicit_time_jvp(residual, primals, tangents):
    located, params = primals
    _, d_params = tangents
    t = implicit_time(residual, located, params)    # the primal again: higher orders
    _, dg = jax.jvp(lambda p: residual(t, p), (params,), (d_params,))
    _, slope = jax.jvp(lambda s: residual(s, params), (t,), (jnp.ones_like(t),))
    safe = jnp.where(slope != 0, slope, jnp.ones_like(slope))
    return t, (-dg / safe).astype(t.dtype)
