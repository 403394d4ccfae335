"""The adaptive integration loop: stepper + controller + dense output.

``integrate`` advances ``y' = func(y, t)`` from ``ts[0]`` through the output
times ``ts[1:]``, grouped in static chunks of ``window`` consecutive times.
A ``lax.scan`` runs over the chunks; inside each, a ``lax.while_loop`` takes
adaptive steps until the chunk's last time is passed. Two output modes:

* ``stop_at_outputs=False`` (odeint): steps never stop at output times; after
  each accepted step the method's dense output fills the chunk's times that
  the step covers. The last step is clipped to land on ``ts[-1]``.
* ``stop_at_outputs=True`` (adjoint passes, events): chunks of one time, and
  steps are clipped so that the solver lands exactly on each output time.

Performance notes (XLA on the CPU, where each kernel launch inside a loop
costs about as much as the arithmetic of a small step): stages and previous
states are never carried across iterations; the counters travel as one int32
vector; the dense output is evaluated only on steps that cover an output.

The loop never raises: it returns a status (see :mod:`odekit.ode.errors`) and
statistics, and outputs it did not reach are nan. Under ``vmap`` each batch
member takes its own steps (the while loop masks finished members).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from odekit.ode import controller, interpolation, stiffness
from odekit.ode.errors import MAX_STEPS, NONFINITE, STEP_UNDERFLOW, STIFF, SUCCESS, SolveInfo
from odekit.ode.rk_step import num_evaluations, rk_step
from odekit.ode.tableaux import ButcherTableau

Pytree = Any

# Positions in the int32 counter vector carried by the loop.
NUM_STEPS, NUM_ACCEPTED, NFEV, SINCE_OUTPUT, STATUS, STIFF_COUNT, NONSTIFF_COUNT = range(7)


class LoopState(NamedTuple):
    t: jax.Array         # current time
    y: Pytree            # state at t
    f: Pytree            # func(y, t)
    h: jax.Array         # proposed next step size
    err_prev: jax.Array  # error norm of the last accepted step (PI memory); < 0 after a rejection
    counters: jax.Array  # int32, indexed by NUM_STEPS ... NONSTIFF_COUNT


def cast_like(tree: Pytree, like: Pytree) -> Pytree:
    """Cast each leaf of ``tree`` to the dtype of the matching leaf of ``like``."""
    return jax.tree.map(lambda a, b: jnp.asarray(a).astype(b.dtype), tree, like)


def all_finite(tree: Pytree) -> jax.Array:
    """Whether every element of every leaf is finite (scalar bool)."""
    leaves = jax.tree.leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def output_window(num_outputs: int) -> int:
    """Output times per chunk (static): a few, more when there are many."""
    return max(1, min(num_outputs, max(4, -(-num_outputs // 32))))


def _controller_order(tableau: ButcherTableau) -> int:
    """Exponent order of the step-size rule: error_order + 1, except for the
    DOP853 combined estimate, which behaves like h^8 (Hairer's EXPO1 = 1/8)."""
    return tableau.order if tableau.b_error_secondary is not None else tableau.error_order + 1


def _attempt(func, tableau, tol, hmax, limit, targets, stop_at_outputs, state: LoopState,
             block: Pytree):
    """Attempt one step towards ``limit``; accept or reject; fill ``block``."""
    h_try = jnp.minimum(jnp.minimum(state.h, hmax), limit - state.t)
    step = rk_step(func, tableau, state.t, state.y, state.f, h_try)
    err = controller.error_norm(step.error, step.error_secondary, state.y, step.y1, tol)
    accept = (err <= 1.0) & all_finite(step.y1)
    h_next = controller.propose_step(h_try, err, jnp.abs(state.err_prev), _controller_order(tableau),
                                     accept, state.err_prev < 0)
    # A step shortened to land on a boundary says little about the next one.
    h_next = jnp.where(accept & (h_try < state.h), jnp.maximum(h_next, state.h), h_next)
    t_new = jnp.where(limit - (state.t + h_try) <= 0, limit, state.t + h_try)

    covered = accept & (targets > state.t) & (targets <= t_new)
    if stop_at_outputs:
        block = jax.tree.map(lambda b, v: jnp.where(covered[0], v[None], b), block, step.y1)
        extra = 0
    else:
        def fill():
            stages = interpolation.extend_stages(func, tableau, state.t, state.y, h_try, step.stages)
            theta = jnp.clip((targets - state.t) / h_try, 0.0, 1.0)
            values = interpolation.evaluate(tableau, state.y, h_try, stages, theta)
            at_end = targets == t_new  # y1 itself there, not the rounding of theta = 1

            def leaf(b, v, y1):
                shape = (-1,) + (1,) * y1.ndim
                v = jnp.where(at_end.reshape(shape), y1[None], v)
                return jnp.where(covered.reshape(shape), v, b)
            return jax.tree.map(leaf, block, values, step.y1)
        if tableau.extra_c.size:
            # Extra stages cost evaluations: spend them only when an output falls here.
            block = lax.cond(jnp.any(covered), fill, lambda: block)
            extra = jnp.where(jnp.any(covered), len(tableau.extra_c), 0)
        else:
            # A handful of fused multiply-adds: cheaper than a branch on the CPU.
            block, extra = fill(), 0

    tiny = 8 * jnp.finfo(state.t.dtype).eps * jnp.maximum(jnp.abs(state.t), jnp.abs(limit))
    failed = (~accept) & (h_next <= tiny)
    status = jnp.where(failed, jnp.where(jnp.isfinite(err), STEP_UNDERFLOW, NONFINITE),
                       state.counters[STATUS])
    stiff_count, nonstiff_count = _stiffness_test(tableau, state, step, h_try, accept)
    status = jnp.where(stiff_count >= stiffness.STIFF_STEPS, STIFF, status)
    counters = jnp.stack([
        state.counters[NUM_STEPS] + 1,
        state.counters[NUM_ACCEPTED] + accept,
        state.counters[NFEV] + num_evaluations(tableau) + extra,
        jnp.where(jnp.any(covered), 0, state.counters[SINCE_OUTPUT] + 1),
        status, stiff_count, nonstiff_count]).astype(jnp.int32)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)
    new_state = LoopState(
        t=jnp.where(accept, t_new, state.t), y=keep(step.y1, state.y), f=keep(step.f1, state.f),
        h=h_next, err_prev=jnp.where(accept, err, -jnp.abs(state.err_prev)), counters=counters)
    return new_state, block


def _stiffness_test(tableau, state: LoopState, step, h, accept):
    """Hairer's counters: test every CHECK_EVERY accepted steps, and on every
    accepted step once one test was positive (dopri5.f). Computed without a
    branch: the estimate is a few fused reductions, cheaper than a cond."""
    c = state.counters
    due = accept & ((c[NUM_ACCEPTED] % stiffness.CHECK_EVERY == stiffness.CHECK_EVERY - 1)
                    | (c[STIFF_COUNT] > 0))
    stiff = due & stiffness.is_stiff_step(tableau, h, state.y, step)
    nonstiff = due & ~stiff
    nonstiff_count = jnp.where(stiff, 0, c[NONSTIFF_COUNT] + nonstiff)
    stiff_count = jnp.where(stiff, c[STIFF_COUNT] + 1,
                            jnp.where(nonstiff_count >= stiffness.NONSTIFF_RESET, 0, c[STIFF_COUNT]))
    return stiff_count, jnp.where(nonstiff_count >= stiffness.NONSTIFF_RESET, 0, nonstiff_count)


def _advance_chunk(func, tableau, tol, mxstep, hmax, t_end, stop_at_outputs,
                   state: LoopState, targets: jax.Array):
    """Step until the chunk's last output time; return its values (nan if missed)."""
    limit = targets[0] if stop_at_outputs else t_end
    block = jax.tree.map(lambda y: jnp.zeros(targets.shape + y.shape, y.dtype), state.y)

    def cond(carry):
        s, _ = carry
        return ((s.t < targets[-1]) & (s.counters[STATUS] == SUCCESS)
                & (s.counters[SINCE_OUTPUT] < mxstep))

    def body(carry):
        return _attempt(func, tableau, tol, hmax, limit, targets, stop_at_outputs, *carry)

    state, block = lax.while_loop(cond, body, (state, block))
    ran_out = (state.t < targets[-1]) & (state.counters[STATUS] == SUCCESS)
    status = jnp.where(ran_out, MAX_STEPS, state.counters[STATUS])
    counters = state.counters.at[STATUS].set(status).at[SINCE_OUTPUT].set(0)
    reached = targets <= state.t
    block = jax.tree.map(
        lambda b: jnp.where(reached.reshape((-1,) + (1,) * (b.ndim - 1)), b, jnp.nan), block)
    return state._replace(counters=counters), (block, jnp.where(reached, jnp.inf, targets))


def integrate(func: Callable, tableau: ButcherTableau, tol: controller.Tolerance,
              y0: Pytree, ts: jax.Array, h0: jax.Array | None, mxstep: Any, hmax: Any,
              stop_at_outputs: bool) -> tuple[Pytree, jax.Array, SolveInfo]:
    """Solve ``y' = func(y, t)``, ``y(ts[0]) = y0`` and return ``y`` at ``ts``.

    Args:
      func: ``func(y, t)`` returning a pytree like ``y``.
      tableau: explicit method.
      tol: tolerances for the error norm.
      y0: initial state pytree; ts: (n,) increasing times.
      h0: first step size to try, or None for Hairer's initial step.
      mxstep: attempted steps allowed per output interval (may be inf).
      hmax: largest step size (may be inf).
      stop_at_outputs: land exactly on every output time (else interpolate).

    Returns:
      ``(ys, h, info)``: ys has a leading axis of len(ts); h is the step size
      the controller proposes next; info the status and statistics.
    """
    t0, num_outputs = ts[0], ts.shape[0] - 1
    f0 = func(y0, t0)
    if h0 is None:
        h0 = controller.initial_step(func, t0, y0, f0, tableau.order, tol)
        nfev0 = 2
    else:
        nfev0 = 1
    h0 = jnp.minimum(jnp.asarray(h0, t0.dtype), hmax)
    start_ok = all_finite(y0) & all_finite(f0)
    counters = jnp.array([0, 0, nfev0, 0, 0, 0, 0], jnp.int32).at[STATUS].set(
        jnp.where(start_ok, SUCCESS, NONFINITE))
    state = LoopState(t=t0, y=y0, f=f0, h=h0, err_prev=jnp.ones((), t0.dtype), counters=counters)
    if num_outputs == 0:
        ys = jax.tree.map(lambda y: y[None], y0)
        return ys, h0, _info(state, jnp.asarray(jnp.inf, t0.dtype))

    window = 1 if stop_at_outputs else output_window(num_outputs)
    num_chunks = -(-num_outputs // window)
    padding = jnp.full((num_chunks * window - num_outputs,), ts[-1], ts.dtype)
    chunks = jnp.concatenate([ts[1:], padding]).reshape(num_chunks, window)

    def scan_body(state, targets):
        return _advance_chunk(func, tableau, tol, mxstep, hmax, ts[-1], stop_at_outputs,
                              state, targets)

    state, (blocks, missed) = lax.scan(scan_body, state, chunks)

    def finish(y0_leaf, b):
        rows = b.reshape((num_chunks * window,) + y0_leaf.shape)[:num_outputs]
        return jnp.concatenate([y0_leaf[None], rows])

    ys = jax.tree.map(finish, y0, blocks)
    return ys, state.h, _info(state, jnp.min(missed))


def _info(state: LoopState, t_target: jax.Array) -> SolveInfo:
    c = state.counters
    return SolveInfo(status=c[STATUS], t=state.t, t_target=t_target, num_steps=c[NUM_STEPS],
                     num_accepted=c[NUM_ACCEPTED], nfev=c[NFEV])
