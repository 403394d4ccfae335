"""The adaptive integration loop: stepper + controller + dense output.

``integrate`` advances ``y' = func(y, t)`` from ``ts[0]`` through the output
times ``ts[1:]``, grouped in static chunks of ``window`` consecutive times.
An outer ``lax.while_loop`` runs over the chunks; inside it, the step loop (a
second ``lax.while_loop``) takes adaptive steps until the chunk's last time is
passed. Two output modes:

* ``stop_at_outputs=False`` (odeint): steps never stop at output times; after
  each accepted step the method's dense output fills the chunk's times that
  the step covers. The last step is clipped to land on ``ts[-1]``.
* ``stop_at_outputs=True`` (adjoint passes, events): chunks of one time, and
  steps are clipped so that the solver lands exactly on each output time.

Performance notes (XLA on the CPU, where every loop-carried value that
changes, every extra consumer of the stages and every branch inside the step
loop costs about as much as the arithmetic of a small step): the step loop
carries only ``y``, ``f``, the output block and ONE vector of scalars (time,
step size, controller memory, counters, status); stages are never carried.
Stiffness is probed outside the step loop: the step loop hands control back
every ``PROBE_INTERVAL`` attempted steps, and the outer loop then applies
Hairer's stage-difference test to one trial step.

The loop never raises: it returns a status (see :mod:`odekit.ode.errors`) and
statistics, and outputs it did not reach are nan. Under ``vmap`` each batch
member takes its own steps (the while loop masks finished members).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit.ode import controller, flat_carry, interpolation, stiffness
from odekit.ode.errors import (BAD_TIMES, MAX_STEPS, NONFINITE, STEP_UNDERFLOW, STIFF, SUCCESS,
                               SolveInfo)
from odekit.ode.rk_step import num_evaluations, rk_step
from odekit.ode.tableaux import ButcherTableau

Pytree = Any

# Positions in the vector of scalars carried by the step loop (time dtype;
# counts are exact up to 2**53 in float64, 2**24 in float32).
# STIFF_COUNT: consecutive stiff probes, whether the step or _probe runs them.
T, H, ERR_PREV, NUM_STEPS, NUM_ACCEPTED, NFEV, SINCE_OUTPUT, NEXT_PROBE, STATUS, STIFF_COUNT = range(10)

PROBE_INTERVAL = 500   # attempted steps between stiffness probes
STIFF_PROBES = 3       # consecutive stiff probes that end the solve


class LoopState(NamedTuple):
    scalars: jax.Array  # (10,) indexed by T ... STIFF_COUNT; ERR_PREV < 0 marks a rejected step
    y: Pytree           # state at scalars[T]
    f: Pytree           # func(y, t)


def cast_like(tree: Pytree, like: Pytree) -> Pytree:
    """Cast each leaf of ``tree`` to the dtype of the matching leaf of ``like``."""
    return jax.tree.map(lambda a, b: jnp.asarray(a).astype(b.dtype), tree, like)


def tree_where(pred: jax.Array, new: Pytree, old: Pytree) -> Pytree:
    """Leafwise ``where(pred, new, old)`` for a scalar ``pred``."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


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


def _fill_block(func, tableau, t, y, h, step, t_new, targets, covered, block):
    """Dense-output values at the covered ``targets`` of an accepted step."""
    stages = interpolation.extend_stages(func, tableau, t, y, h, step.stages)
    theta = jnp.clip((targets - t) / h, 0.0, 1.0)
    values = interpolation.evaluate(tableau, y, h, stages, theta)
    at_end = targets == t_new  # y1 itself there, not the rounding of theta = 1

    def leaf(b, v, y1):
        shape = (-1,) + (1,) * y1.ndim
        v = jnp.where(at_end.reshape(shape), y1[None], v)
        return jnp.where(covered.reshape(shape), v, b)

    return jax.tree.map(leaf, block, values, step.y1)


def _is_inf(value: Any) -> bool:
    """Whether a static option is +inf (then the loop skips its bookkeeping)."""
    return isinstance(value, (int, float)) and value == float("inf")


def _error_sees_nonfinite(tableau: ButcherTableau) -> bool:
    """Whether a nan/inf in y1 always makes the error norm nan (so err <= 1
    already rejects it): true when every stage that enters y1 (b_i != 0) also
    enters the error estimate (b_error_i != 0). Saves a reduction per step."""
    return bool(np.all((tableau.b == 0) | (tableau.b_error != 0)))


def _attempt(func, tableau, tol, hmax, mxstep, limit, targets, stop_at_outputs, one_kernel,
             state: LoopState, block: Pytree, probe_in_step: bool = False):
    """Attempt one step towards ``limit``; accept or reject; fill ``block``.

    ``one_kernel``: the loop is compiled as one function
    (:mod:`odekit.ode.single_kernel`), where a branch costs less than
    computing the dense output on every step. ``probe_in_step``: when a
    stiffness probe is due, run Hairer's test on this attempt's stages (a
    branch; the separate trial step of :func:`_probe` is then not compiled)."""
    sc = state.scalars
    t, h, err_prev = sc[T], sc[H], sc[ERR_PREV]
    h_try = jnp.minimum(h if _is_inf(hmax) else jnp.minimum(h, hmax), limit - t)
    step = rk_step(func, tableau, t, state.y, state.f, h_try)
    err = controller.error_norm(step.error, step.error_secondary, state.y, step.y1, tol)
    accept = err <= 1.0
    if not _error_sees_nonfinite(tableau):
        accept = accept & all_finite(step.y1)
    h_next = controller.propose_step(h_try, err, jnp.abs(err_prev), _controller_order(tableau),
                                     accept, err_prev < 0)
    # A step shortened to land on a boundary says little about the next one.
    h_next = jnp.where(accept & (h_try < h), jnp.maximum(h_next, h), h_next)
    t_new = jnp.where(limit - (t + h_try) <= 0, limit, t + h_try)

    # ">=": a step that landed on this chunk's first time in the previous chunk
    # leaves it to the first step here (theta = 0 gives y exactly).
    covered = accept & (targets >= t) & (targets <= t_new)
    extra = 0
    if block is None:
        pass  # integrate_to: the state itself is the output
    elif stop_at_outputs:
        block = jax.tree.map(lambda b, v: jnp.where(covered[0], v[None], b), block, step.y1)
    elif tableau.extra_c.size or one_kernel:
        # Extra stages cost evaluations, and inside one kernel a branch is
        # cheap (measured: 5% off the vmapped pendulum): fill only when an
        # output falls in this step.
        block = lax.cond(jnp.any(covered),
                         lambda: _fill_block(func, tableau, t, state.y, h_try, step, t_new,
                                             targets, covered, block),
                         lambda: block)
        extra = jnp.where(jnp.any(covered), len(tableau.extra_c), 0)
    else:
        # A handful of fused multiply-adds: cheaper than a branch (a
        # conditional thunk) when every kernel is dispatched on its own.
        block = _fill_block(func, tableau, t, state.y, h_try, step, t_new, targets, covered, block)

    tiny = 8 * jnp.finfo(t.dtype).eps * jnp.maximum(jnp.abs(t), jnp.abs(limit))
    failed = (~accept) & (h_next <= tiny)
    status = jnp.where(failed, jnp.where(jnp.isfinite(err), STEP_UNDERFLOW, NONFINITE), sc[STATUS])
    # Counters that a static option makes unnecessary are left alone (each
    # changing scalar is one more kernel in the loop): nfev is derived from
    # num_steps at the end unless extra dense stages make it irregular, and the
    # attempts since the last output only matter for a finite mxstep.
    nfev = sc[NFEV] + num_evaluations(tableau) + extra if tableau.extra_c.size else sc[NFEV]
    since = sc[SINCE_OUTPUT] if _is_inf(mxstep) else jnp.where(jnp.any(covered), 0, sc[SINCE_OUTPUT] + 1)
    next_probe, stiff_count = sc[NEXT_PROBE], sc[STIFF_COUNT]
    if probe_in_step:
        due = sc[NUM_STEPS] >= next_probe
        stacked = jax.tree.map(lambda *k: jnp.stack(k), *step.stages)
        stiff = lax.cond(due, lambda: stiffness.is_stiff_stages(tableau, h_try, stacked),
                         lambda: jnp.bool_(False))
        stiff_count = jnp.where(due, jnp.where(stiff, stiff_count + 1, 0), stiff_count)
        next_probe = jnp.where(due, sc[NUM_STEPS] + PROBE_INTERVAL, next_probe)
        status = jnp.where((status == SUCCESS) & (stiff_count >= STIFF_PROBES), STIFF, status)
    scalars = jnp.stack([
        jnp.where(accept, t_new, t), h_next, jnp.where(accept, err, -jnp.abs(err_prev)),
        sc[NUM_STEPS] + 1, sc[NUM_ACCEPTED] + accept, nfev, since, next_probe, status, stiff_count,
    ]).astype(sc.dtype)
    # Opaque to XLA's concatenate flattening, so that the flat carry of the
    # step loop of integrate_piecewise (flat_carry) stays one fused kernel.
    if not one_kernel:
        scalars = lax.optimization_barrier(scalars)
    return LoopState(scalars, tree_where(accept, step.y1, state.y),
                     tree_where(accept, step.f1, state.f)), block


class _Outer(NamedTuple):
    state: LoopState
    chunk: jax.Array        # index of the chunk being filled
    block: Pytree           # (window, ...) values of that chunk
    outputs: Pytree         # (num_chunks, window, ...) completed chunks


def _probe(func, tableau, outer: _Outer) -> _Outer:
    """Hairer's stiffness test on a trial step from the current state."""
    state = outer.state
    sc = state.scalars
    stiff = stiffness.is_stiff_probe(func, tableau, sc[T], sc[H], state.y, state.f)
    count = jnp.where(stiff, sc[STIFF_COUNT] + 1, 0)
    status = jnp.where(count >= STIFF_PROBES, STIFF, sc[STATUS])
    scalars = sc.at[NFEV].add(len(tableau.c) - 1).at[STATUS].set(status)  # the probe's evaluations
    return outer._replace(state=state._replace(scalars=scalars.at[STIFF_COUNT].set(count)))


def _advance(func, tableau, tol, mxstep, hmax, t_end, stop_at_outputs, chunks, outer: _Outer,
             detect_stiffness: bool, one_kernel: bool):
    """Run the step loop on the current chunk until it is filled, a probe is
    due, or the solve fails; store a filled chunk; probe for stiffness."""
    targets = chunks[outer.chunk]
    if stop_at_outputs:
        limit = targets[0]
    else:
        # No step may pass the next chunk's first output time: the values there
        # must come from a step taken while that chunk is being filled.
        next_first = chunks[jnp.minimum(outer.chunk + 1, chunks.shape[0] - 1), 0]
        limit = jnp.where(outer.chunk + 1 < chunks.shape[0], jnp.minimum(next_first, t_end), t_end)

    # Inside one kernel the step itself runs the probe; otherwise the loop
    # stops when a probe is due and _probe takes a separate trial step.
    probe_in_step = detect_stiffness and one_kernel
    probe_outside = detect_stiffness and not one_kernel

    def cond(carry):
        sc = carry[0].scalars
        going = (sc[T] < targets[-1]) & (sc[STATUS] == SUCCESS) & (sc[SINCE_OUTPUT] < mxstep)
        return going & (sc[NUM_STEPS] < sc[NEXT_PROBE]) if probe_outside else going

    def body(carry):
        return _attempt(func, tableau, tol, hmax, mxstep, limit, targets, stop_at_outputs,
                        one_kernel, *carry, probe_in_step=probe_in_step)

    # Not flat_carry here: measured, packing saves nothing on this loop alone
    # and costs 10-15% under vmap (the packed (batch, n) vector is read with
    # strided slices); the backward solve (_piecewise) gains ~20% from it.
    state, block = lax.while_loop(cond, body, (outer.state, outer.block))
    sc = state.scalars
    done = sc[T] >= targets[-1]
    ran_out = (~done) & (sc[STATUS] == SUCCESS) & (sc[SINCE_OUTPUT] >= mxstep)
    sc = sc.at[STATUS].set(jnp.where(ran_out, MAX_STEPS, sc[STATUS]))
    if probe_outside:
        probe_due = (~done) & (sc[STATUS] == SUCCESS) & (sc[NUM_STEPS] >= sc[NEXT_PROBE])
        sc = sc.at[NEXT_PROBE].set(jnp.where(probe_due, sc[NUM_STEPS] + PROBE_INTERVAL,
                                             sc[NEXT_PROBE]))
    outputs = jax.tree.map(
        lambda out, b: lax.dynamic_update_index_in_dim(out, b, outer.chunk, axis=0),
        outer.outputs, block)
    outer = _Outer(state._replace(scalars=sc), outer.chunk + done.astype(jnp.int32), block,
                   outputs)
    if not probe_outside:
        return outer
    return lax.cond(probe_due, lambda: _probe(func, tableau, outer), lambda: outer)


def _initial_state(func, tableau, tol, y0: Pytree, ts: jax.Array, h0, hmax,
                   detect_stiffness: bool) -> LoopState:
    """State at ts[0]: f0, the first step (given or Hairer's), status checks."""
    t0 = ts[0]
    f0 = func(y0, t0)
    if h0 is None:
        h0 = controller.initial_step(func, t0, y0, f0, tableau.order, tol)
        nfev0 = 2
    else:
        nfev0 = 1
    h0 = jnp.minimum(jnp.asarray(h0, t0.dtype), hmax)
    start_ok = all_finite(y0) & all_finite(f0)
    increasing = jnp.all(ts[1:] > ts[:-1])  # checked at trace time when t is concrete
    scalars = jnp.zeros(10, t0.dtype).at[T].set(t0).at[H].set(h0).at[ERR_PREV].set(1.0)
    scalars = scalars.at[NFEV].set(nfev0).at[NEXT_PROBE].set(
        PROBE_INTERVAL if detect_stiffness else jnp.inf)
    scalars = scalars.at[STATUS].set(
        jnp.where(increasing, jnp.where(start_ok, SUCCESS, NONFINITE), BAD_TIMES))
    return LoopState(scalars, y0, f0)


def integrate(func: Callable, tableau: ButcherTableau, tol: controller.Tolerance,
              y0: Pytree, ts: jax.Array, h0: jax.Array | None, mxstep: Any, hmax: Any,
              stop_at_outputs: bool, detect_stiffness: bool = True, one_kernel: bool = False
              ) -> tuple[Pytree, jax.Array, SolveInfo]:
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
      detect_stiffness: probe for stiffness every PROBE_INTERVAL steps.
      one_kernel: the loop will be compiled as one function
        (:mod:`odekit.ode.single_kernel`); only changes what is cheapest.

    Returns:
      ``(ys, h, info)``: ys has a leading axis of len(ts); h is the step size
      the controller proposes next; info the status and statistics.
    """
    t0, num_outputs = ts[0], ts.shape[0] - 1
    state = _initial_state(func, tableau, tol, y0, ts, h0, hmax, detect_stiffness)
    h0 = state.scalars[H]
    if num_outputs == 0:
        return jax.tree.map(lambda y: y[None], y0), h0, _info(state, jnp.asarray(jnp.inf, t0.dtype))

    if stop_at_outputs and num_outputs == 1 and not detect_stiffness:
        y1, h, info = _piecewise(func, tableau, tol, state, ts, mxstep, hmax, None)
        ys = jax.tree.map(lambda a, b: jnp.stack([a, b]), y0, y1)
        return ys, h, info

    window = 1 if stop_at_outputs else output_window(num_outputs)
    num_chunks = -(-num_outputs // window)
    padding = jnp.full((num_chunks * window - num_outputs,), ts[-1], ts.dtype)
    chunks = jnp.concatenate([ts[1:], padding]).reshape(num_chunks, window)
    block = jax.tree.map(lambda y: jnp.zeros((window,) + y.shape, y.dtype), y0)
    outputs = jax.tree.map(lambda y: jnp.zeros((num_chunks, window) + y.shape, y.dtype), y0)
    outer = _Outer(state, jnp.zeros((), jnp.int32), block, outputs)

    advance = lambda o: _advance(func, tableau, tol, mxstep, hmax, ts[-1], stop_at_outputs,
                                 chunks, o, detect_stiffness, one_kernel)
    if num_chunks == 1 and not detect_stiffness:
        outer = advance(outer)  # one pass of the step loop fills the only chunk
    else:
        outer = lax.while_loop(
            lambda o: (o.chunk < num_chunks) & (o.state.scalars[STATUS] == SUCCESS), advance, outer)
    state = _final_guard(_derive_nfev(tableau, outer.state))
    t_reached = state.scalars[T]
    reached = ts[1:] <= t_reached

    def finish(y0_leaf, out):
        rows = out.reshape((num_chunks * window,) + y0_leaf.shape)[:num_outputs]
        rows = jnp.where(reached.reshape((-1,) + (1,) * y0_leaf.ndim), rows, jnp.nan)
        return jnp.concatenate([y0_leaf[None], rows])

    ys = jax.tree.map(finish, y0, outer.outputs)
    t_target = jnp.min(jnp.where(reached, jnp.inf, ts[1:]))
    return ys, state.scalars[H], _info(state, t_target)


def _final_guard(state: LoopState) -> LoopState:
    """A solve that claims success must end on a finite state (a last line of
    defence: accepted steps are finite by construction of the error test)."""
    sc = state.scalars
    bad = (sc[STATUS] == SUCCESS) & ~all_finite(state.y)
    return state._replace(scalars=sc.at[STATUS].set(jnp.where(bad, NONFINITE, sc[STATUS])))


def _derive_nfev(tableau: ButcherTableau, state: LoopState) -> LoopState:
    """Add the evaluations of the attempted steps, which the loop does not
    count when every attempt costs the same (no extra dense stages)."""
    if tableau.extra_c.size:
        return state
    sc = state.scalars
    return state._replace(scalars=sc.at[NFEV].add(sc[NUM_STEPS] * num_evaluations(tableau)))


def integrate_piecewise(func: Callable, tableau: ButcherTableau, tol: controller.Tolerance,
                        y0: Pytree, ts: jax.Array, h0: jax.Array, mxstep: Any, hmax: Any,
                        jump: Callable[[jax.Array, Pytree], Pytree] | None
                        ) -> tuple[Pytree, jax.Array, SolveInfo]:
    """Solve from ``ts[0]`` to ``ts[-1]``, landing exactly on every ``ts[i]``
    and replacing the state there by ``jump(i, y)`` for ``0 < i < len(ts) - 1``.

    One pass of the step loop per interval and nothing else (no output
    buffer, no stiffness probe): the adjoint's backward solve, whose
    cotangent jumps at the output times, runs as one call. The state after
    a jump is a new initial value, so ``func`` is evaluated there afresh.

    Args:
      func, tableau, tol: as for :func:`integrate`.
      y0: state at ts[0]; ts: (n,) increasing times, n >= 2.
      h0: first step size to try; mxstep: attempted steps allowed per interval.
      jump: ``jump(i, y) -> y`` (same structure), or None for no jumps.

    Returns:
      ``(y_end, h, info)``: the state at ts[-1] (nan where not reached), the
      step size proposed next and the status and statistics.
    """
    state = _initial_state(func, tableau, tol, y0, ts, h0, hmax, False)
    return _piecewise(func, tableau, tol, state, ts, mxstep, hmax, jump)


def _piecewise(func, tableau, tol, state: LoopState, ts: jax.Array, mxstep, hmax, jump):
    num_times = ts.shape[0]

    def interval(state: LoopState, i) -> LoopState:
        t1 = ts[i]

        def cond(st):
            sc = st.scalars
            return (sc[T] < t1) & (sc[STATUS] == SUCCESS) & (sc[SINCE_OUTPUT] < mxstep)

        def body(st):
            # one_kernel=False even inside one kernel: keeping the barrier on
            # this flat-carry loop measured faster for the gradient.
            return _attempt(func, tableau, tol, hmax, mxstep, t1, t1[None], True, False, st,
                            None)[0]

        state = flat_carry.while_loop(cond, body, state)
        sc = state.scalars
        ran_out = (sc[T] < t1) & (sc[STATUS] == SUCCESS)
        return state._replace(scalars=sc.at[STATUS].set(jnp.where(ran_out, MAX_STEPS, sc[STATUS])))

    if num_times == 2:
        state = interval(state, 1)
    else:
        def outer(carry):
            i, st = carry
            st = interval(st._replace(scalars=st.scalars.at[SINCE_OUTPUT].set(0)), i)
            if jump is None:
                return i + 1, st
            sc = st.scalars
            apply = (sc[STATUS] == SUCCESS) & (i < num_times - 1)
            y = jump(i, st.y)
            f = func(y, ts[i])  # a new initial value: the FSAL stage is stale
            st = LoopState(sc.at[NFEV].add(apply.astype(sc.dtype)), tree_where(apply, y, st.y),
                           tree_where(apply, f, st.f))
            return i + 1, st

        _, state = lax.while_loop(
            lambda c: (c[0] < num_times) & (c[1].scalars[STATUS] == SUCCESS), outer,
            (jnp.ones((), jnp.int32), state))
    state = _final_guard(_derive_nfev(tableau, state))
    sc = state.scalars
    reached = sc[T] >= ts[-1]
    y_end = jax.tree.map(lambda leaf: jnp.where(reached, leaf, jnp.nan), state.y)
    t_target = jnp.min(jnp.where(ts[1:] > sc[T], ts[1:], jnp.inf))
    return y_end, sc[H], _info(state, t_target)


def _info(state: LoopState, t_target: jax.Array) -> SolveInfo:
    sc = state.scalars
    return SolveInfo(status=sc[STATUS].astype(jnp.int32), t=sc[T], t_target=t_target,
                     num_steps=sc[NUM_STEPS].astype(jnp.int32),
                     num_accepted=sc[NUM_ACCEPTED].astype(jnp.int32),
                     nfev=sc[NFEV].astype(jnp.int32))
