"""The adaptive integration loop: one ``while_loop`` over attempted steps.

``integrate`` advances ``y' = func(y, t)`` from ``t0`` to ``t_end`` (t_end >
t0; front ends reverse time as ``s = -t``). Each iteration attempts one step
of the method (:mod:`odekit.ode.methods`), measures its error, accepts or
rejects it (:mod:`odekit.ode.engine.controller`) and, after an accepted step, hands
it to the outputs (:mod:`odekit.ode.engine.output`: values at requested times, a
record of every step, events, stops with jumps). The step size is clipped so
that no step passes ``t_end``, the next stop or a terminal event.

The time a step advances is the one ``t`` actually takes in floating point,
``fl(t + h) - t``, so ``y`` and ``t`` never drift apart at large ``t``; a
step that does not move ``t`` ends the solve with ``STEP_UNDERFLOW``.

The loop never raises: it returns a status (:mod:`odekit.status`) and
statistics. It ends when ``t_end`` is reached, a terminal event occurs, the
status becomes a failure, ``max_steps`` attempts were made, or ``mxstep``
attempts passed without reaching an output. ``while_loop`` is a parameter
(a seam): an adjoint may pass a bounded or checkpointed loop.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import _lax as ops
from odekit import status as codes
from odekit._batched_cond import member_cond
from odekit._tree import tree_all_finite, tree_where, vary_like
from odekit.ode.engine import controller, output
from odekit.ode.engine.bounded_loop import decision
from odekit.ode.methods import Method
from odekit.ode.methods.rk_step import Tolerances

Pytree = Any

PROBE_INTERVAL = 500   # attempted steps between stiffness probes (Hairer: nstiff = 1000)
PROBE_INLINE_SIZE = 64  # states of at most this many numbers compute the probe on every attempt
STIFF_PROBES = 15      # stiff probes (every attempt once one fired) before the verdict below
STIFF_STEP_BUDGET = 100_000   # ... stiff only if the rest of the span needs more steps than this
ORDER_SLOTS = 6        # Stats.order_counts: orders 0..5 of a variable-order method


class LoopConfig(NamedTuple):
    """Static options of the loop (hashable).

    Attributes:
      rtol, atol: tolerances of the error norm: each a Python float, or a
        :class:`~odekit.ode.engine.controller.PerElement` (one NumPy array per
        leaf of the state, broadcastable to it; hashable, static).
      hmax: largest step size (may be inf).
      max_steps: attempted steps allowed in total (may be inf).
      mxstep: attempted steps allowed between two outputs (may be inf).
      detect_stiffness: run the method's stiffness test every PROBE_INTERVAL
        attempted steps, and on every attempt while the count of stiff
        results is positive (Hairer's dopri5.f; a non-stiff result halves
        the count); at STIFF_PROBES, fail with STIFF if the rest of the
        span, at the current step size, needs more attempts than are left
        (``stiff_step_budget``, or what max_steps leaves). The test sees
        the stages in the error norm's units, ``k / (atol + rtol |y|)``
        (the eigenvalues of the Jacobian are unchanged by that scaling;
        unscaled, Robertson's fast mode, carried by y2 ~ 1e-5, was
        invisible next to y1 and y3 for 5000 steps at the stability limit).
        Hairer's dopri5 stops at the stiff probes alone, also on a solution
        that has merely decayed below atol (y' = -y on [0, 1e4] stops at
        t = 3173); here a stability-limited step that still reaches the end
        in affordable time goes on.
      progress: report to a progress meter (:mod:`odekit.ode.engine.progress`).
      time_sign: the meter shows ``time_sign * t`` (-1 for a solve run in
        reversed time).
      stiff_step_budget: see ``detect_stiffness``; ``method="auto"`` sets 0
        (hand over at the verdict: the discrete derivative of explicit steps
        at the stability limit is not controlled by the error estimate, so
        tsit5 on Robertson to t = 100 had a gradient 6e8 off with values
        within the tolerance).
    """

    rtol: Any     # float | controller.PerElement
    atol: Any
    hmax: float = float("inf")
    max_steps: float = float("inf")
    mxstep: float = float("inf")
    detect_stiffness: bool = False
    progress: bool = False
    time_sign: float = 1.0
    stiff_step_budget: float = STIFF_STEP_BUDGET


class Stats(NamedTuple):
    """Counters of one solve (int32 scalars, batched under vmap)."""

    num_steps: jax.Array      # attempted steps
    num_accepted: jax.Array
    num_rejected: jax.Array
    nfev: jax.Array           # evaluations of the vector field
    njev: jax.Array           # Jacobian evaluations (0 for explicit methods)
    nlu: jax.Array            # LU decompositions (0 for explicit methods)
    nlinsolve: jax.Array      # solves with the iteration matrix W (0 for explicit
                              # methods; with linear_solver="krylov" each is a GMRES run)
    nliniter: jax.Array       # GMRES iterations of those solves (linear_solver="krylov";
                              # 0 with an LU)
    order_counts: jax.Array   # (ORDER_SLOTS,) accepted steps at each order of a
                              # variable-order method (index = order); zeros otherwise


class LoopState(NamedTuple):
    t: jax.Array              # current time
    y: Pytree                 # state at t
    f: Pytree                 # func(y, t)
    h: jax.Array              # step size to try next
    err_prev: jax.Array       # error norm of the last accepted step
    drift: Pytree             # change lost to rounding so far, like y (see controller)
    rejected: jax.Array       # bool: the last attempt was rejected
    num_steps: jax.Array      # int32 counters
    num_accepted: jax.Array
    nfev: jax.Array
    nlinsolve: jax.Array      # solves with W so far
    nliniter: jax.Array       # their GMRES iterations so far
    since_output: jax.Array   # attempts since the last output or stop
    stiff_count: jax.Array    # consecutive stiff probes
    status: jax.Array         # int32 code of odekit.status
    out: output.OutputState
    meter: Any                # progress meter id (None when off)
    method_state: Any = None  # the method's own state (Method.init_state), None
                              # for a one-step method


class LoopResult(NamedTuple):
    t: jax.Array              # time reached
    y: Pytree                 # state there
    h: jax.Array              # step size the controller proposes next
    status: jax.Array
    stats: Stats
    out: output.OutputState


def _progress():
    """The progress meter module, imported only when a solve asks for it."""
    from odekit.ode.engine import progress
    return progress


def _int_limit(value: float) -> jax.Array:
    """A finite step limit as an int32 (ceil; capped at the int32 range)."""
    return np.asarray(min(int(np.ceil(value)), np.iinfo(np.int32).max), np.int32)


def _is_inf(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == float("inf")


def _first_step(method: Method, func: Callable, t0: jax.Array, t_end: jax.Array, y0: Pytree,
                f0: Pytree, h0: jax.Array | None, config: LoopConfig) -> tuple[jax.Array, int]:
    """The first step size (given or Hairer's estimate) and the evaluations it cost;
    a non-finite or non-positive estimate (zero error scale) falls back to 1e-6 of the span."""
    if h0 is None:
        tol = controller.Tolerance(config.rtol, config.atol)
        h0, cost = controller.initial_step(func, t0, y0, f0, method.order, tol, t_end,
                                           config.hmax), 1
    else:
        cost = 0
    h0 = ops.cast(h0, t0)
    fallback = lax.mul(ops.cast(1e-6, t0), lax.sub(t_end, t0))
    h0 = ops.select(lax.bitwise_and(lax.is_finite(h0), lax.gt(h0, ops.cast(0, h0))), h0, fallback)
    h0 = lax.stop_gradient(h0)    # a step size, not a function of the solution
    return (h0 if _is_inf(config.hmax) else ops.minimum(h0, config.hmax)), cost


def initial_state(method: Method, func: Callable, y0: Pytree, t0: jax.Array, t_end: jax.Array,
                  h0: jax.Array | None, config: LoopConfig, outputs: output.Outputs) -> LoopState:
    """State at ``t0``: ``f0``, the first step, the outputs at ``t0``."""
    f0 = func(y0, t0)
    h, cost = _first_step(method, func, t0, t_end, y0, f0, h0, config)
    start_ok = tree_all_finite(y0, f0)
    out, out_cost = output.initial(outputs, t0, y0)
    out, y0, f0, stop_cost, _ = output.apply_stops(outputs, func, out, t0, y0, f0)
    int0 = jnp.zeros((), jnp.int32)
    meter = _progress().open_meter(t0, t_end, time_sign=config.time_sign) if config.progress else None
    method_state = None
    if method.init_state is not None:
        method_state = method.init_state(func, t0, y0, f0, h, tolerances(config))
    return LoopState(
        t=t0, y=y0, f=f0, h=h, err_prev=jnp.ones((), t0.dtype),
        drift=jax.tree.map(lambda v: lax.full_like(v, 0), y0), rejected=jnp.bool_(False),
        num_steps=int0, num_accepted=int0,
        nfev=lax.add(np.int32(1 + cost + out_cost), lax.convert_element_type(stop_cost, np.int32)),
        nlinsolve=int0, nliniter=int0, since_output=int0, stiff_count=int0,
        status=ops.select(start_ok, np.int32(codes.SUCCESS), np.int32(codes.NONFINITE)),
        out=out, meter=meter, method_state=method_state)


def tolerances(config: LoopConfig) -> Tolerances:
    """The tolerances as a method with its own state sees them: the loop's
    error norm and the tightest relative tolerance."""
    tol = controller.Tolerance(config.rtol, config.atol)
    rtol = config.rtol.tightest() if isinstance(config.rtol, controller.PerElement) else config.rtol
    return Tolerances(norm=lambda error, y0, y1: controller.error_norm(error, None, y0, y1, tol),
                      rtol=float(rtol))


def after_jump(method: Method, func: Callable, config: LoopConfig, method_state: Pytree,
               jumped: jax.Array, t: jax.Array, y: Pytree, f: Pytree, h: jax.Array) -> Pytree:
    """The method's own state after a jump at a stop replaced the solution
    by ``(y, f)`` at ``t`` where ``jumped``: a multistep method starts again
    (``Method.restart``); unchanged otherwise, and for a method without one."""
    if method.restart is None:
        return method_state
    return member_cond(jumped, lambda: method.restart(method_state, func, t, y, f, h,
                                                      tolerances(config)),
                       lambda: method_state)


def _stiffness(method: Method, config: LoopConfig, state: LoopState, h: jax.Array, step) -> jax.Array:
    """Updated count of consecutive stiff probes (a probe every PROBE_INTERVAL attempts)."""
    if not config.detect_stiffness or method.is_stiff is None:
        return state.stiff_count
    due = lax.bitwise_and(lax.eq(lax.rem(state.num_steps, np.int32(PROBE_INTERVAL)), np.int32(0)),
                          lax.gt(state.num_steps, np.int32(0)))
    due = lax.bitwise_or(due, lax.gt(state.stiff_count, np.int32(0)))
    # A verdict, not a function of the parameters (the probe stops gradients
    # itself, on the few arrays it reads: a branch takes what it reads).
    def probe() -> jax.Array:
        scale = controller.probe_scale(state.y, step.y1, controller.Tolerance(config.rtol,
                                                                              config.atol))
        return method.is_stiff(h, step, scale)
    if sum(np.size(leaf) for leaf in jax.tree.leaves(step.y1)) <= PROBE_INLINE_SIZE:
        # A few flops on a small state: computed on every attempt, which
        # compiles faster than a branch (first call).
        stiff = probe()
    else:
        # Behind a branch, taken every PROBE_INTERVAL attempts: computed on
        # every attempt it was half the time of a 300-point heat equation's
        # solve outside the single kernel (its dot products are kernels of
        # their own). The untaken side is built outside the branch with the
        # probe's type (shard_map: no constant inside a branch).
        not_probed = vary_like(np.bool_(False), h, step.y1)
        stiff = lax.cond(due, probe, lambda: not_probed)
    probed = ops.select(stiff, lax.add(state.stiff_count, np.int32(1)),
                        lax.div(state.stiff_count, np.int32(2)))
    return ops.select(due, probed, state.stiff_count)


def _hopeless(config: LoopConfig, state: LoopState, stiff_count: jax.Array, t: jax.Array,
              h_next: jax.Array, t_final: jax.Array) -> jax.Array:
    """Stiff verdict: the probes say stiff and the rest of the span, at the
    proposed step size, needs more attempts than are left."""
    left = ops.cast(config.stiff_step_budget, t)
    if not _is_inf(config.max_steps):
        steps_left = lax.sub(_int_limit(config.max_steps), state.num_steps)
        left = lax.min(left, lax.convert_element_type(steps_left, t.dtype))
    return lax.bitwise_and(lax.ge(stiff_count, np.int32(STIFF_PROBES)),
                           lax.gt(lax.sub(t_final, t), lax.mul(left, h_next)))


def _step_evaluations(method: Method, step) -> Any:
    """Evaluations of ``func`` one attempted step made: the step's own count
    (a Newton iteration's varies) or the method's fixed one."""
    return method.evaluations_per_step if step.nfev is None else step.nfev


def _attempt(method: Method, func: Callable, config: LoopConfig, outputs: output.Outputs,
             t_end: jax.Array, t_final: jax.Array, state: LoopState) -> LoopState:
    """Attempt one step from ``state``; accept or reject it; update the outputs
    (``t_end`` ends this loop, ``t_final`` the solve)."""
    t = state.t
    c = lambda value: ops.cast(value, t)
    limit = output.limit(outputs, state.out, t_end)
    if method.lands_on_outputs:
        limit = lax.min(limit, output.next_output(outputs, state.out, t_end))
    h_try = state.h if _is_inf(config.hmax) else ops.minimum(state.h, config.hmax)
    h_try = lax.min(h_try, lax.sub(limit, t))
    # The step t really takes: fl(t + h) - t (the barrier keeps XLA from
    # simplifying (t + h) - t to h).
    t_plus = lax.add(t, h_try)
    t_new = ops.select(lax.le(lax.sub(limit, t_plus), c(0)), limit, t_plus)
    h = lax.sub(lax.optimization_barrier(t_new), t)
    if method.init_state is None:
        step, trial = method.step(func, t, state.y, state.f, h), None
    else:   # a method with its own state (Method.init_state)
        step, trial = method.step(func, t, state.y, state.f, h, state.method_state,
                                  tolerances(config))
    tol = controller.Tolerance(config.rtol, config.atol)
    # Step-size control sees values only: the controller's choices are
    # piecewise constant in the parameters, and a derivative through them
    # (sqrt of a zero error) would only add nan (the checkpoint adjoint).
    # The norm, and the norm widened by what the rounding of t leaves
    # unknown (used below), from one reduction.
    err, err_rounding = (lax.stop_gradient(lax.convert_element_type(norm, t.dtype))
                         for norm in controller.error_norms(
                             step.error, step.error_secondary, state.y, step.y1, tol,
                             controller.time_rounding(t, state.f, step.f1)))
    finite = tree_all_finite(step.y1)
    accept = lax.bitwise_and(lax.le(err, c(1.0)), finite)
    # Too small to go on: a few ulp of t where the step is taken (Hairer's
    # dopri5 test). Not of the next stop: with float32 times a span to 1e5
    # made every rejected step below 0.1 an "underflow", at t = 0 too.
    tiny = lax.mul(c(controller.RESOLUTION_ULPS * jnp.finfo(t.dtype).eps), lax.abs(t))
    # A step within a factor DFACTOR of that, rejected, would end the solve:
    # it is accepted if its error is within the tolerance widened by what
    # the rounding of t leaves unknown (controller.time_rounding): a jump
    # of the field, at the resolution of t, is stepped through.
    shortest = lax.bitwise_and(lax.bitwise_and(lax.bitwise_not(accept), finite),
                               lax.bitwise_and(lax.gt(h, c(0)),
                                               lax.le(lax.mul(c(controller.DFACTOR), h), tiny)))
    accept = lax.bitwise_or(accept, lax.bitwise_and(shortest, lax.le(err_rounding, c(1.0))))
    method_state = state.method_state
    if method.advance is None:
        h_next = controller.propose_step(h, err, state.err_prev, method.controller_order, accept,
                                         state.rejected, method.controller_beta2)
    else:   # the method's own step size (and order) rules
        h_next, method_state = method.advance(trial, lax.bitwise_and(accept, lax.gt(h, c(0))),
                                              h, err)
    # A step shortened to land on a boundary says little about the next one
    # (a method with its own rules, Method.advance, decides that itself).
    if method.advance is None:
        shortened = lax.bitwise_and(accept, lax.lt(h_try, state.h))
        h_next = ops.select(shortened, lax.max(h_next, state.h), h_next)
    h_next = decision(lax.stop_gradient(h_next))
    moved = lax.gt(h, c(0))
    stuck = lax.bitwise_and(lax.bitwise_not(accept), lax.bitwise_not(lax.gt(h_next, tiny)))
    failed = lax.bitwise_or(stuck, lax.bitwise_not(moved))
    fail_code = ops.select(lax.bitwise_or(finite, lax.bitwise_not(moved)),
                           np.int32(codes.STEP_UNDERFLOW), np.int32(codes.NONFINITE))
    status = ops.select(failed, fail_code, state.status)
    going = lambda: lax.eq(status, np.int32(codes.SUCCESS))
    stiff_count = decision(_stiffness(method, config, state, h, step))
    if config.detect_stiffness and method.is_stiff is not None:
        stiff = _hopeless(config, state, stiff_count, t, h_next, t_final)
        status = ops.select(lax.bitwise_and(going(), stiff), np.int32(codes.STIFF), status)
    accept = decision(lax.bitwise_and(accept, moved))
    lost = controller.lost_to_rounding(state.y, step.y1, state.f, h)
    drift = jax.tree.map(lambda d, l: ops.select(accept, lax.add(d, l), d), state.drift, lost)
    status = ops.select(lax.bitwise_and(going(), controller.stalled(drift, state.y, tol)),
                        np.int32(codes.STALLED), status)

    res = output.after_step(outputs, method, func, state.out, accept, t, state.y, h, t_new, step)
    if outputs.jump is not None:
        method_state = after_jump(method, func, config, method_state,
                                  lax.bitwise_and(accept, res.jumped), res.t, res.y, res.f, h_next)
    since = ops.select(res.reached_output, np.int32(0), lax.add(state.since_output, np.int32(1)))
    terminated = lax.bitwise_and(lax.bitwise_and(accept, res.terminated), going())
    status = decision(ops.select(terminated, np.int32(codes.TERMINATED), status))
    # The discrete parts of a method's own state (an order, a counter) too.
    method_state = jax.tree.map(
        lambda x: x if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else decision(x),
        method_state)
    pick = lambda new, old: tree_where(accept, new, old)
    meter = state.meter
    if config.progress:   # the id comes back from the host: carried, the report runs
        meter = _progress().report_carried(meter, t, h, state.num_steps)
    nfev = lax.add(state.nfev, ops.cast(_step_evaluations(method, step), state.nfev))
    solves = method.solves_per_step if step.nsolve is None else step.nsolve
    nlinsolve = lax.add(state.nlinsolve, ops.cast(solves, state.nlinsolve))
    nliniter = state.nliniter if step.niter is None else lax.add(
        state.nliniter, ops.cast(step.niter, state.nliniter))
    return LoopState(
        t=ops.select(accept, res.t, t), y=pick(res.y, state.y), f=pick(res.f, state.f),
        h=h_next, err_prev=ops.select(accept, err, state.err_prev),
        drift=drift,
        rejected=lax.bitwise_not(accept), num_steps=lax.add(state.num_steps, np.int32(1)),
        num_accepted=lax.add(state.num_accepted, lax.convert_element_type(accept, np.int32)),
        nfev=lax.add(nfev, ops.cast(res.nfev, nfev)), nlinsolve=nlinsolve, nliniter=nliniter,
        since_output=since, stiff_count=stiff_count, status=status,
        out=res.out, meter=meter, method_state=method_state)


def steps(method: Method, func: Callable, config: LoopConfig, outputs: output.Outputs,
          state: LoopState, t_end: jax.Array, while_loop: Callable = lax.while_loop,
          t_final: jax.Array | None = None) -> LoopState:
    """Take steps from ``state`` until ``t_end``, a terminal event, a failure
    or a step limit (the while loop itself; :func:`finish` reads the result).
    ``t_final`` (default ``t_end``) is where the whole solve ends, when this
    loop runs one segment of it."""
    t_final = t_end if t_final is None else t_final
    def cond(s: LoopState):
        going = lax.bitwise_and(lax.lt(s.t, t_end), lax.eq(s.status, np.int32(codes.SUCCESS)))
        return lax.bitwise_and(going, within_limits(config, s))

    body = lambda s: _attempt(method, func, config, outputs, t_end, t_final, s)
    return while_loop(cond, body, vary_like(state, t_end))


def within_limits(config: LoopConfig, state: LoopState) -> jax.Array:
    """Whether the step limits (max_steps, mxstep) allow another attempt."""
    going = jnp.bool_(True)
    if not _is_inf(config.max_steps):
        going = lax.bitwise_and(going, lax.lt(state.num_steps, _int_limit(config.max_steps)))
    if not _is_inf(config.mxstep):
        going = lax.bitwise_and(going, lax.lt(state.since_output, _int_limit(config.mxstep)))
    return going


def finish(method: Method, config: LoopConfig, state: LoopState, t_end: jax.Array) -> LoopResult:
    """Final status (a step limit short of ``t_end``, a non-finite end) and
    statistics (Jacobians and LUs: the method's count per attempted step)."""
    unfinished = lax.bitwise_and(lax.lt(state.t, t_end),
                                 lax.eq(state.status, np.int32(codes.SUCCESS)))
    status = ops.select(unfinished, np.int32(codes.MAX_STEPS), state.status)
    # A solve that claims success must end on a finite state.
    bad_end = lax.bitwise_and(lax.ge(status, np.int32(0)),
                              lax.bitwise_not(tree_all_finite(state.y)))
    status = ops.select(bad_end, np.int32(codes.NONFINITE), status)
    if config.progress:
        _progress().close_meter(state.meter, state.t, state.num_steps, status)
    if method.statistics is None:
        njev = lax.mul(state.num_steps, np.int32(method.jacobians_per_step))
        nlu = lax.mul(state.num_steps, np.int32(method.factorizations_per_step))
        order_counts = lax.broadcast(np.int32(0), (ORDER_SLOTS,))
    else:   # counted by the method as made
        njev, nlu, order_counts = method.statistics(state.method_state)
    stats = Stats(num_steps=state.num_steps, num_accepted=state.num_accepted,
                  num_rejected=lax.sub(state.num_steps, state.num_accepted), nfev=state.nfev,
                  njev=njev, nlu=nlu, nlinsolve=state.nlinsolve, nliniter=state.nliniter,
                  order_counts=order_counts)
    return LoopResult(state.t, state.y, state.h, status, stats, state.out)


def run(method: Method, func: Callable, config: LoopConfig, outputs: output.Outputs,
        state: LoopState, t_end: jax.Array,
        while_loop: Callable = lax.while_loop) -> LoopResult:
    """Take steps from ``state`` until ``t_end``, a terminal event, a failure or a step limit.

    Args:
      method: the method record; func: ``func(y, t)`` with the structure of y.
      config: static options; outputs: what to produce (:mod:`odekit.ode.engine.output`).
      state: from :func:`initial_state`; t_end: final time (> state.t).
      while_loop: ``while_loop(cond, body, init)``, ``lax.while_loop`` by
        default; an adjoint may pass a bounded or checkpointed loop.

    Returns:
      A :class:`LoopResult`; outputs not reached hold nan.
    """
    return finish(method, config, steps(method, func, config, outputs, state, t_end, while_loop),
                  t_end)
