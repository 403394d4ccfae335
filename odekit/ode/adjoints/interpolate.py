"""The interpolating continuous adjoint (``adjoint="interpolate"``), a custom_vjp.

The adjoint equations are those of :mod:`odekit.ode.adjoints.continuous`;
this adjoint takes y(t) from the forward solution instead of integrating y
backwards with the adjoint (as backsolve does). The forward solve records
every accepted step ``(t_n, y_n)``; the backward pass takes each recorded
step ``[t_n, t_n+1]`` again from ``y_n`` once, keeps its dense data (the
stages), and evaluates y(t) by the method's continuous extension of the step
holding t (:mod:`odekit.ode.engine.dense`), so the backward pass sees the forward
solution to the forward tolerance, however unstable y's equation is
backwards in time (a mode that decays forward never comes back multiplied
by e^{200}).

Cost: memory of one state per step for the record (at most
:func:`recorded_steps` steps) and, during the backward pass, the dense data
of every step (for tsit5 eight states a step; past ``PREPARED_LIMIT``
numbers the step holding t is replayed at each evaluation instead, about
``stages + 1`` evaluations of ``func``); the recorded steps are taken again
once (the cost of the forward solve), then each evaluation of the backward
field is one polynomial evaluation plus the vector-Jacobian product.

A method whose steps cannot be taken again from ``(t_n, y_n)`` (a
multistep method, ``Method.recorded_dense``) records each step's dense data
in the forward pass instead (for bdf its (6, n) backward differences:
memory ``O(steps * 6 * n)``), and the backward pass reads y(t) from it. The
derivatives of values read from those recorded polynomials (``sol.sol``,
event times) are not propagated by this adjoint: with such a method the
front end refuses it together with dense output or events.

With more parameter cotangents than state components (a neural network's
weights), an explicit method integrates the adjoint alone backwards and
records its steps; the parameters' cotangents are then summed over those
steps taken again once with the full backward field (a quadrature, never
part of the loop's state or its error norm: ``_adjoint_pass_with_quadrature``).

With a mass matrix (``M y' = f``, an index-1 DAE; the forward field's
linear system carries M) the backward pass solves the adjoint DAE ``M^T
lambda' = -J^T lambda`` with the mass matrix ``blockdiag(M^T, I)`` over
lambda and the parameters' cotangents, and jumps that keep lambda
consistent (:mod:`odekit.ode.adjoints.dae_adjoint`).

First derivatives only: the backward pass is a custom_vjp whose own
derivative raises (use ``adjoint="checkpoint"`` for higher orders).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit._sealed_jvp import sealed_jvp
from odekit import status as codes
from odekit._tree import vary_like
from odekit.ode.adjoints import continuous, dae_adjoint, quadrature
from odekit.ode.adjoints.continuous import at
from odekit.ode.engine import dense
from odekit.ode.engine import solve as forward
from odekit.ode.engine.solve import Solution, SolveOptions
from odekit.ode.linalg import jacobian
from odekit.ode.methods import get_method

Pytree = Any

DEFAULT_MAX_STEPS = 4096   # steps recorded when the solve has no step limit (odeint's mxstep=inf)


@dataclasses.dataclass(frozen=True)
class Interpolate:
    """``adjoint=odekit.Interpolate(max_steps)``: the continuous adjoint with
    y(t) from the recorded forward steps.

    Attributes:
      max_steps: attempted steps a differentiated solve may take, each
        accepted one recorded (None: the solve's own limit, solve_ivp's
        ``max_steps``, or 4096 for odeint).
    """

    max_steps: int | None = None

    def __post_init__(self):
        value = self.max_steps
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ValueError(f"Interpolate: max_steps must be a positive int, got {value!r}.")


def recorded_steps(spec: Interpolate, options: SolveOptions) -> int:
    """Most steps the differentiated solve may take (and record)."""
    if spec.max_steps is not None:
        return spec.max_steps
    limit = options.loop.max_steps
    return DEFAULT_MAX_STEPS if limit == float("inf") else int(limit)


def make(spec: Interpolate) -> Callable:
    """The adjoint's solve function (the interface of
    :func:`odekit.ode.adjoints.backsolve.solve`)."""
    return partial(solve, spec)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def solve(spec: Interpolate, func: Callable, events: Callable | None, options: SolveOptions,
          y0: Pytree,
          t0: jax.Array, t_end: jax.Array, t_eval: jax.Array | None, h0: jax.Array,
          *args: Any) -> Solution:
    """:func:`odekit.ode.engine.solve.solve` with gradients by the interpolating
    continuous adjoint. Differentiable as :func:`odekit.ode.adjoints.backsolve.solve`;
    a differentiated solve takes at most :func:`recorded_steps` steps."""
    return forward.solve(options, func, y0, t0, t_end, t_eval, h0, args, events)


def _recording(spec: Interpolate, options: SolveOptions) -> SolveOptions:
    """The options of the differentiated solve: a record of every step (and
    of its dense data, for a method that cannot replay it)."""
    steps = recorded_steps(spec, options)
    return options._replace(record=max(options.record, steps + 1), dense_record=True,
                            loop=options.loop._replace(max_steps=float(steps)))


SECOND_ORDER = ("odekit: adjoint='interpolate' gives first derivatives only. For grad of grad, "
                "jax.hessian or jax.jacfwd use adjoint='checkpoint' (any order).")


@partial(sealed_jvp, nondiff_argnums=(0, 1, 2, 3))
def _recorded_solve(spec, func, events, options, y0, t0, t_end, t_eval, h0, *args):
    """The forward solve with its record; differentiating it (which only a
    second derivative does) is refused with a clear error."""
    return forward.solve(_recording(spec, options), func, y0, t0, t_end, t_eval, h0, args, events)


@_recorded_solve.defjvp
def _recorded_solve_jvp(spec, func, events, options, primals, tangents):
    raise TypeError(SECOND_ORDER)


def _solve_fwd(spec, func, events, options, y0, t0, t_end, t_eval, h0, *args):
    recorded = _recorded_solve(spec, func, events, options, y0, t0, t_end, t_eval, h0, *args)
    # The size a terminal event's step was taken with (0: none shortened):
    # the backward pass takes y there from that step's own interpolant.
    last_h = (jnp.zeros((), recorded.t.dtype) if recorded.events is None
              else recorded.events.stop_h.astype(recorded.t.dtype))
    record = (recorded.ts_record, recorded.ys_record, recorded.num_points, last_h,
              lax.stop_gradient(recorded.dense_record))
    if recorded.dense_record is not None and options.dense_record:
        raise ValueError("odekit: adjoint='interpolate' does not differentiate values read "
                         f"from the recorded polynomials of method={options.method!r} "
                         "(dense output, event times): use adjoint='checkpoint' or 'forward'.")
    sol = recorded._replace(dense_record=None)
    if options.record:      # the caller's record is shorter: its rows, same values
        sol = sol._replace(ts_record=recorded.ts_record[:options.record],
                           ys_record=at(recorded.ys_record, slice(0, options.record)))
    else:
        sol = sol._replace(ts_record=None, ys_record=None, num_points=None)
    return sol, ((sol, y0, t0, t_end, t_eval, h0, args), record)


def _solve_bwd(spec, func, events, options, saved, ct):
    residuals, record = saved
    return continuous.pull_back(partial(_adjoint, func, options), _message, options,
                                residuals, ct, *record)


def _message(status: np.ndarray, detail: np.ndarray) -> str:
    del detail
    status = np.ravel(status)
    i = int(np.argmax(status < 0))
    members = (f" ({int(np.sum(status < 0))} of {status.size} batch members)"
               if status.size > 1 else "")
    return (f"odekit: the backward (adjoint) solve of adjoint='interpolate' failed{members}: "
            f"{codes.message(int(status[i]))}. Loosen the tolerances, raise the step limit, "
            "or use adjoint='checkpoint'.")


# Most numbers (over all recorded steps) the backward pass keeps of the
# steps' dense data (for tsit5 eight states a step: the state and the
# stages); a larger record replays each step where y(t) is needed instead.
PREPARED_LIMIT = 2 ** 24


def _step_size(ts: jax.Array, num_points: jax.Array, last_h: jax.Array, n: jax.Array
               ) -> jax.Array:
    """The size recorded step ``n`` was taken with: ``ts[n+1] - ts[n]``, but
    ``last_h`` for the last step when a terminal event shortened it
    (``last_h > 0``; the forward solve located the event on the full step's
    interpolant and stored its value there, see
    :func:`odekit.ode.engine.dense.interpolation_bracket`)."""
    h = dense.row(ts, n + 1) - dense.row(ts, n)
    return jnp.where((n == num_points - 2) & (last_h > 0), last_h.astype(h.dtype), h)


def _prepared_steps(method: Any, func: Callable, args: tuple, ts: jax.Array, ys: Pytree,
                    num_points: jax.Array, last_h: jax.Array) -> Pytree | None:
    """The dense data of every recorded step (leading axis: the step; rows
    past the last step are zeros), computed once, step by step, each of
    the size it was taken with (:func:`_step_size`); None when it would
    hold more than ``PREPARED_LIMIT`` numbers."""
    def one(n):
        s_n = dense.row(ts, n)
        return dense.replay_step(method, func, args, s_n, dense.row(ys, n),
                                 _step_size(ts, num_points, last_h, n))

    rows = ts.shape[0] - 1
    shapes = jax.eval_shape(one, jnp.zeros((), jnp.int32))
    if rows * sum(np.prod(x.shape, dtype=int) for x in jax.tree.leaves(shapes)) > PREPARED_LIMIT:
        return None
    buffer = jax.tree.map(lambda x: jnp.zeros((rows,) + x.shape, x.dtype), shapes)
    buffer = vary_like(buffer, ts, ys, args)   # shard_map: the type the steps give it

    def store(n, buffer):
        return jax.tree.map(lambda b, v: lax.dynamic_update_index_in_dim(b, v, n, 0),
                            buffer, one(n))

    return lax.fori_loop(0, jnp.maximum(num_points - 1, 0), store, buffer)


def _recorded_y(func: Callable, method: Any, t: jax.Array, ts_record: jax.Array,
                ys_record: Pytree, num_points: jax.Array, last_h: jax.Array,
                prepared: Pytree | None, rows: Pytree | None, args: tuple) -> Pytree:
    """y(t) by the method's continuous extension of the recorded step
    holding t (as ``sol.sol`` takes it: a step a terminal event shortened
    at its full size, :func:`odekit.ode.engine.dense.interpolation_bracket`):
    from the forward pass's dense rows (``rows``, a method that cannot
    replay its steps), its prepared dense data, or by replaying it."""
    n, s_n, h, theta = dense.interpolation_bracket(ts_record, num_points, t, last_h)
    y_n = dense.row(ys_record, n)
    if rows is not None:
        dense_step = dense.recorded_step(method, rows, n, y_n)
    elif prepared is None:
        dense_step = dense.replay_step(method, func, args, s_n, y_n, h)
    else:
        dense_step = dense.row(prepared, n)
    return dense.evaluate_step(method, dense_step, theta, y_n, num_points)


def _backward_field(func: Callable, method: Any, state: tuple, s: jax.Array,
                    ts_record: jax.Array, ys_record: Pytree, num_points: jax.Array,
                    last_h: jax.Array, prepared: Pytree | None, rows: Pytree | None,
                    *args: Any) -> tuple:
    """d/ds of (a, args_bar) in reversed time s = -t, with y(t) from the record."""
    a, _ = state
    t = -s
    y = _recorded_y(func, method, t, ts_record, ys_record, num_points, last_h, prepared, rows,
                    args)
    _, a_y, a_args = continuous.adjoint_field(func, y, a, t, args)
    return a_y, a_args


def _jump(unflatten: Callable, flatten: Callable, i: jax.Array, z: Pytree,
          gs_rev: Pytree) -> Pytree:
    """At reversed row i + 1, g jumps into a."""
    a, args_bar = unflatten(z)
    return flatten((jax.tree.map(jnp.add, a, at(gs_rev, i + 1)), args_bar))


def _adjoint_pass(func, options, ys, ts, g, h_last, *args_and_record):
    """The backward solve over the sorted rows (one call of the forward
    loop with stops and jumps): ``(y0_bar, ts_bar, args_bar, status, 0)``."""
    *args, ts_record, ys_record, num_points, last_h, rows = args_and_record
    args = tuple(args)
    method = get_method(options.method)
    ts_record, last_h = lax.stop_gradient((ts_record, last_h))
    prepared = None
    if rows is None:   # a replayable method: its steps taken again (once, if they fit)
        prepared = _prepared_steps(method, func, args, ts_record, ys_record, num_points, last_h)
    mass = dae_adjoint.mass_of(func)
    record = (ts_record, ys_record, num_points, last_h, prepared, rows)
    if mass is not None:
        return _dae_adjoint_pass(func, options, method, mass, ys, ts, g, h_last, args, record)
    diff_args, _ = continuous.split_args(args)
    backward_rows = _backward_record_rows(ts_record.shape[0], ts.shape[0])
    if _separate_quadrature(method, g, diff_args, backward_rows):
        return _adjoint_pass_with_quadrature(func, options, method, ys, ts, g, h_last, args,
                                             record, backward_rows)
    state0 = (at(g, -1), [jnp.zeros_like(leaf) for leaf in diff_args])
    start, field, flatten, unflatten = continuous.flat(
        partial(_backward_field, func, method), state0)
    s_rows = -ts[::-1]
    gs_rev = jax.tree.map(lambda v: v[::-1], g)
    sol = forward.solve(continuous.backward_options(options), field, start, s_rows[0],
                        s_rows[-1], None, h_last,
                        (ts_record, ys_record, num_points, last_h, prepared, rows, *args),
                        stops=s_rows[1:], jump=partial(_jump, unflatten, flatten),
                        jump_data=gs_rev)
    a0, args_bar = unflatten(sol.y)
    return (a0, continuous.time_cotangents(func, ys, ts, g, a0, args), args_bar,
            sol.status.astype(jnp.int32), jnp.zeros((), ts.dtype))



def _backward_record_rows(forward_rows: int, output_rows: int) -> int:
    """Rows of the backward solve's step record (its step limit plus one): the
    backward solve may take ``BACKWARD_STEP_FACTOR`` times the forward
    record's steps plus a step per output row."""
    return continuous.BACKWARD_STEP_FACTOR * forward_rows + output_rows + 1


def _separate_quadrature(method: Any, g: Pytree, diff_args: list, backward_rows: int) -> bool:
    """Whether :func:`_adjoint_pass_with_quadrature` applies
    (:func:`odekit.ode.adjoints.quadrature.applies` for the adjoint alone)."""
    n = sum(np.size(leaf) for leaf in jax.tree.leaves(g)) // max(
        jax.tree.leaves(g)[0].shape[0], 1)
    p = sum(np.size(leaf) for leaf in diff_args)
    return quadrature.applies(method, n, p, continuous.same_dtype((g, diff_args)), backward_rows)


def _backward_field_adjoint_only(func: Callable, method: Any, a: Pytree, s: jax.Array,
                                 ts_record: jax.Array, ys_record: Pytree,
                                 num_points: jax.Array, last_h: jax.Array,
                                 prepared: Pytree | None, rows: Pytree | None,
                                 *args: Any) -> Pytree:
    """d a / ds in reversed time s = -t: ``a^T df/dy`` at y(t) from the record
    (no parameter cotangents)."""
    t = -s
    y = _recorded_y(func, method, t, ts_record, ys_record, num_points, last_h, prepared, rows,
                    args)
    return jax.vjp(lambda y_: func(y_, t, *args), y)[1](a)[0]


def _add_row(unflatten: Callable, flatten: Callable, i: jax.Array, z: Pytree,
             gs_rev: Pytree) -> Pytree:
    """At reversed row i + 1, g jumps into a (the adjoint alone)."""
    return flatten(jax.tree.map(jnp.add, unflatten(z), at(gs_rev, i + 1)))


def _adjoint_pass_with_quadrature(func, options, method, ys, ts, g, h_last, args, record,
                                  backward_rows):
    """:func:`_adjoint_pass` with the parameters' cotangents as a quadrature.

    The backward solve integrates the adjoint a alone (its field a vjp in y
    only; n numbers carried, not n + p) and records its accepted steps; then
    each recorded step is taken again, once, with the full backward field
    from ``(a_n, 0)`` (a_n after the jumps at s_n), and the parameter part of
    its result, ``h sum_j b_j a_j^T df/dp (y_j)``, is summed: the same stages
    and arithmetic as integrating ``(a, args_bar)`` together, without
    carrying p numbers through every stage, error estimate and selection of
    the loop (``benchmarks/results/interpolate_overhead_notes.md``). The error
    norm sees a alone (the parameters' cotangents are a quadrature of it:
    the "seminorm" of Kidger, Chen & Lyons, ICML 2021). Extra memory: the
    backward record, ``backward_rows x n``."""
    diff_args, _ = continuous.split_args(args)
    start, field, flatten, unflatten = continuous.flat(
        partial(_backward_field_adjoint_only, func, method), at(g, -1))
    s_rows = -ts[::-1]
    gs_rev = jax.tree.map(lambda v: v[::-1], g)
    options_back = continuous.backward_options(options)
    loop = options_back.loop._replace(max_steps=float(min(options_back.loop.max_steps,
                                                          backward_rows - 1)))
    options_back = options_back._replace(record=backward_rows, loop=loop)
    sol = forward.solve(options_back, field, start, s_rows[0], s_rows[-1], None, h_last,
                        (*record, *args), stops=s_rows[1:], jump=partial(_add_row, unflatten, flatten),
                        jump_data=gs_rev)
    a0 = unflatten(sol.y)
    args_bar = _quadrature(func, method, sol, unflatten, s_rows[1:], gs_rev, record, args,
                           diff_args)
    return (a0, continuous.time_cotangents(func, ys, ts, g, a0, args), args_bar,
            sol.status.astype(jnp.int32), jnp.zeros((), ts.dtype))


def _quadrature(func, method, sol, unflatten, stops, gs_rev, record, args, diff_args) -> list:
    """Sum over the backward solve's recorded steps of the parameter part of
    each step taken again with the full backward field (see
    :func:`_adjoint_pass_with_quadrature`)."""
    full_field = jacobian.bind(partial(_backward_field, func, method), (*record, *args))

    def start_of_step(n):
        hit, _ = quadrature.jump_rows(stops, dense.row(sol.ts_record, n))
        a = unflatten(dense.row(sol.ys_record, n))
        return (jax.tree.map(jnp.add, a, quadrature.summed_rows(hit, gs_rev)),)

    zeros = [jnp.zeros_like(leaf) for leaf in diff_args]
    return quadrature.replayed_sum(method, full_field, sol.ts_record, sol.num_points,
                                   start_of_step, zeros, sol.ys_record, args)


def _dae_jump(func: Callable, mass: Any, unflatten: Callable, flatten: Callable,
              i: jax.Array, z: Pytree, data: tuple) -> Pytree:
    """At reversed row i + 1, lambda and args_bar jump by
    :func:`odekit.ode.adjoints.dae_adjoint.jump` of that row's cotangent."""
    gs_rev, ys_rev, ts_rev, args = data
    lam, args_bar = unflatten(z)
    d_lam, d_args = dae_adjoint.jump(func, mass, at(ys_rev, i + 1), ts_rev[i + 1], args,
                                     at(gs_rev, i + 1))
    return flatten((jax.tree.map(jnp.add, lam, d_lam), [a + d for a, d in zip(args_bar, d_args)]))


def _dae_adjoint_pass(func, options, method, mass, ys, ts, g, h_last, args, record):
    """:func:`_adjoint_pass` for ``M y' = f``: the adjoint DAE ``M^T lambda'
    = -J^T lambda`` with consistent jumps (:mod:`odekit.ode.adjoints.dae_adjoint`);
    the rows at t0 go to y0 directly."""
    at_start = ts == ts[0]
    mask = lambda leaf: at_start.reshape((-1,) + (1,) * (leaf.ndim - 1))
    g_later = jax.tree.map(lambda v: jnp.where(mask(v), 0, v), g)
    g_at_start = jax.tree.map(lambda v: jnp.sum(jnp.where(mask(v), v, 0), axis=0), g)
    lam_end, args_end = dae_adjoint.jump(func, mass, at(ys, -1), ts[-1], args, at(g_later, -1))
    state0 = (lam_end, args_end)
    if not continuous.same_dtype(state0):
        raise TypeError("odekit: adjoint='interpolate' with a mass_matrix needs the state and "
                        "the differentiated parameters in one dtype (got "
                        f"{sorted({str(jnp.result_type(x)) for x in jax.tree.leaves(state0)})}); "
                        "cast them, or use adjoint='checkpoint'.")
    start, field, flatten, unflatten = continuous.flat(
        partial(_backward_field, func, method), state0)
    field = dae_adjoint.with_adjoint_mass(field, mass, start.shape[0])
    s_rows = -ts[::-1]
    rev = lambda tree: jax.tree.map(lambda v: v[::-1], tree)
    sol = forward.solve(continuous.backward_options(options), field, start, s_rows[0],
                        s_rows[-1], None, h_last, (*record, *args), stops=s_rows[1:],
                        jump=partial(_dae_jump, func, mass, unflatten, flatten),
                        jump_data=(rev(g_later), rev(ys), ts[::-1], args))
    lam0, args_bar = unflatten(sol.y)
    return (dae_adjoint.initial_cotangent(mass, lam0, g_at_start),
            dae_adjoint.time_cotangents(func, mass, ys, ts, g, lam0, g_at_start, args),
            args_bar, sol.status.astype(jnp.int32), jnp.zeros((), ts.dtype))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _adjoint(func, options, ys, ts, g, h_last, *args_and_record):
    """:func:`_adjoint_pass`, whose own derivative is refused."""
    return _adjoint_pass(func, options, ys, ts, g, h_last, *args_and_record)


def _adjoint_fwd(func, options, *inputs):
    return _adjoint(func, options, *inputs), None


def _adjoint_bwd(func, options, residuals, cotangents):
    raise TypeError(SECOND_ORDER)


_adjoint.defvjp(_adjoint_fwd, _adjoint_bwd)
solve.defvjp(_solve_fwd, _solve_bwd)
