"""The forward solve: one call of the integration loop, no custom rule.

:func:`solve` integrates ``dy/dt = func(y, t, *args)`` from ``t0`` to
``t_end > t0`` and returns the values at ``t_eval``, the record of every
accepted step, the events, the final state, the status and the statistics
(:class:`Solution`). It is what every front end and every adjoint calls:
the adjoints wrap it in their custom rules (one module each), the front ends
(``odeint``, ``solve_ivp``) check arguments, reverse time and raise.

On the CPU the whole loop is compiled as one kernel when the problem allows
it (:mod:`odekit.ode.engine.single_kernel`).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

from odekit import status as codes
from odekit._tree import float0_zeros, vary_like
from odekit.ode.engine import events as ev
from odekit.ode.engine import loop, output, segments, single_kernel
from odekit.ode.linalg import jacobian, linear_system
from odekit.ode.methods import get_method

Pytree = Any

# Outputs per vectorised write when the loop runs kernel by kernel: a step
# fills all the window's slots (a select per slot), so its cost grows with
# window x n, while a step that passes the window's end is taken again by
# the next segment. WINDOW_BYTES bounds the block (window x n numbers):
# 16 outputs for a 2-state float64 solve, 4 from 8 states up. Measured
# (interleaved medians, kernel by kernel): neural ODE (2 states, MLP of 64,
# 40 outputs, 16 steps) 0.475 ms at 4, 0.339 at 16 (9 steps taken twice at
# 4); pendulum (101 outputs) 350 / 334 us at 4 / 16, 371 at 32; heat
# equation (100 states) 78 ms at 4, 98 at 16, 128 at 32.
OUTPUT_WINDOW = 4
WIDEST_OUTPUT_WINDOW = 16
WINDOW_BYTES = 256


def output_window(y0: Pytree) -> int:
    """The output window for a state like ``y0``: ``WINDOW_BYTES`` over the
    state's bytes, between :data:`OUTPUT_WINDOW` and
    :data:`WIDEST_OUTPUT_WINDOW`."""
    size = sum(np.size(leaf) * np.dtype(jnp.result_type(leaf)).itemsize
               for leaf in jax.tree.leaves(y0))
    return int(min(max(WINDOW_BYTES // max(size, 1), OUTPUT_WINDOW), WIDEST_OUTPUT_WINDOW))


class SolveOptions(NamedTuple):
    """Static options of a forward solve (hashable: a nondiff argument of the
    adjoints' custom rules and a static argument of ``jax.jit``).

    Attributes:
      method: registry name (:mod:`odekit.ode.methods`).
      loop: the loop's options (tolerances, step limits, stiffness, progress).
      record: length of the step record (0: no record).
      event_spec: :class:`odekit.ode.engine.events.EventSpec` or None.
      given_first_step: use ``h0`` instead of Hairer's initial step.
      single_kernel: compile the loop as one CPU kernel where eligible.
      throw: a failed backward (adjoint) solve raises; else its gradients are nan.
      stiff_taken_over: an ending in ``TAKEN_OVER`` (STIFF, MAX_STEPS) is not
        a failure of the derivatives (method="auto" solves again with a stiff
        method and discards this solve's values, so its derivatives must be 0
        there, not nan).
      dense_record: the record also keeps each accepted step's dense row,
        for a method whose dense output cannot be replayed from ``(t_n,
        y_n)`` (``Method.recorded_dense``; ignored for the others): the
        dense output object and events' times read it.
    """

    method: str
    loop: loop.LoopConfig
    record: int = 0
    event_spec: ev.EventSpec | None = None
    given_first_step: bool = False
    single_kernel: bool = False
    throw: bool = True
    stiff_taken_over: bool = False
    dense_record: bool = False


# Endings of an explicit solve that method="auto" hands to the stiff method.
TAKEN_OVER = (codes.STIFF, codes.MAX_STEPS)


def taken_over(status: jax.Array) -> jax.Array:
    """Whether method="auto" solves again with the stiff method."""
    return (status == TAKEN_OVER[0]) | (status == TAKEN_OVER[1])


def failed(options: SolveOptions, status: jax.Array) -> jax.Array:
    """Whether a solve's derivatives are nan: it failed, and no other solve
    takes over from it (see ``stiff_taken_over``)."""
    if options.stiff_taken_over:
        return (status < 0) & ~taken_over(status)
    return status < 0


class Solution(NamedTuple):
    """Everything one forward solve produces (see :mod:`odekit.ode.engine.output`)."""

    ys_eval: Pytree        # leaves (m, ...) at t_eval (nan where not reached), or None
    ts_record: Any         # (record,) accepted step times, inf after the last, or None
    ys_record: Pytree      # leaves (record, ...), or None
    num_points: Any        # int32 rows of the record written, or None
    events: Any            # ev.EventState or None
    t: jax.Array           # time reached
    y: Pytree              # state there
    h: jax.Array           # step size proposed next
    status: jax.Array      # int32 (odekit.status)
    stats: loop.Stats
    dense_record: Pytree = None   # leaves (record, ...): each step's dense row
                                  # (SolveOptions.dense_record), or None


def _integrate(options: SolveOptions, func: Callable, events: Callable | None,
               jump: Callable | None, while_loop: Callable, one_kernel: bool, y0: Pytree, t0: jax.Array,
               t_end: jax.Array, t_eval: jax.Array | None, h0: jax.Array, args: tuple,
               stops: jax.Array | None, jump_data: Pytree) -> Solution:
    method = get_method(options.method)
    if jump is not None:
        jump = (lambda f: lambda i, y: f(i, y, jump_data))(jump)
    # shard_map: the field's arguments vary like the rest of the solve, so that
    # no cast is recorded inside a branch of the loop (vmap's batching rule
    # for cond traces the branches again with other types, and such a cast fails)
    args = vary_like(args, y0, t0, t_end, t_eval, stops, jump_data)
    vector_field = jacobian.bind(func, args)
    event_field = None if events is None else (lambda t, y: events(t, y, *args))
    outputs = output.Outputs(t_eval=t_eval, record=options.record, stops=stops, jump=jump,
                             events=event_field, event_spec=options.event_spec,
                             recorded_dense=_recorded_dense(options, method),
                             **_filling(one_kernel, while_loop, y0))
    first = h0 if options.given_first_step else None
    state = loop.initial_state(method, vector_field, y0, t0, t_end, first, options.loop, outputs)
    state = vary_like(state, t_end, t_eval, args, stops, jump_data)   # shard_map: one carry type
    if while_loop is lax.while_loop and segments.applies(outputs):
        res = segments.run(method, vector_field, options.loop, outputs, state, t_end)
    else:
        res = loop.run(method, vector_field, options.loop, outputs, state, t_end, while_loop)
    out = res.out
    return Solution(ys_eval=out.ys_eval, ts_record=out.ts_record, ys_record=out.ys_record,
                    num_points=out.record_index, events=out.events, t=res.t, y=res.y, h=res.h,
                    status=res.status, stats=res.stats, dense_record=out.dense_record)


def _recorded_dense(options: SolveOptions, method: Any) -> Any:
    """The method's way to keep its steps' dense output in the record, when
    the options ask for it and the method has one (else None: replayed)."""
    if options.record and options.dense_record and not method.replayable:
        return method.recorded_dense
    return None


def _filling(one_kernel: bool, while_loop: Callable, y0: Pytree) -> dict:
    """How the loop fills the values at t_eval: by a loop inside one kernel,
    a window at a time kernel by kernel (:func:`output_window`), a capped
    window under a replaced loop (one that autodiff goes through: no inner
    while loop)."""
    if while_loop is not lax.while_loop:
        return dict(window=output.CAPPED_WINDOW, capped=True)
    return dict(window=0 if one_kernel else output_window(y0))


def _eligible(options: SolveOptions, func: Callable, events: Callable | None, y0: Pytree,
              t0: jax.Array, args: tuple) -> bool:
    if not options.single_kernel or options.loop.progress:
        return False
    if get_method(options.method).factorizations_per_step \
            and not single_kernel.stiff_linear_algebra_fits(func, y0, t0, args):
        return False   # LAPACK's LU (large or structured W) is a call the emitter cannot make
    if not single_kernel.eligible(func, y0, t0, *args):
        return False
    return events is None or single_kernel.eligible(lambda y, t, *a: events(t, y, *a), y0, t0, *args)


def solve(options: SolveOptions, func: Callable, y0: Pytree, t0: jax.Array, t_end: jax.Array,
          t_eval: jax.Array | None, h0: jax.Array, args: tuple, events: Callable | None = None,
          stops: jax.Array | None = None, jump: Callable | None = None,
          jump_data: Pytree = None, while_loop: Callable = lax.while_loop) -> Solution:
    """Integrate ``dy/dt = func(y, t, *args)``, ``y(t0) = y0``, up to ``t_end``.

    Args:
      options: static options (:class:`SolveOptions`).
      func: ``func(y, t, *args)`` returning a pytree like ``y`` (closes over
        no traced values: closure-convert it first).
      y0: initial state pytree; t0, t_end: scalar times, t_end >= t0.
      t_eval: (m,) increasing times in [t0, t_end] to interpolate at, or None.
      h0: first step to try when ``options.given_first_step`` (else ignored).
      args: tuple of arrays passed to ``func`` and ``events``.
      events: ``events(t, y, *args) -> (E,)`` stacked event functions, or None.
      stops, jump, jump_data: (k,) times to land on and ``jump(i, y,
        jump_data)`` applied there (the adjoint's cotangent jumps), or None.
      while_loop: the loop primitive (a seam for bounded/checkpointed loops).

    Returns:
      A :class:`Solution`. It never raises: failures are in ``status``.
    """
    one_kernel = while_loop is lax.while_loop and _eligible(options, func, events, y0, t0, args)
    run = lambda kernel: lambda *operands: _integrate(options, func, events, jump, while_loop,
                                                      kernel, *operands)
    operands = (y0, t0, t_end, t_eval, h0, args, stops, jump_data)
    if one_kernel:
        return single_kernel.run(run(True), *operands)
    return run(False)(*operands)


def _tangents_compilable(func: Callable, events: Callable | None, y0: Pytree, t0: jax.Array,
                         args: tuple, directions: int) -> bool:
    """Whether the JVP of ``func`` (and of ``events``), batched over
    ``directions`` tangents when positive, uses only primitives the
    single-kernel emitter compiles (the loop around them is odekit's own)."""
    def tangent_of(f: Callable) -> Callable:
        def jvp(y, t, dy, args, dargs):
            return jax.jvp(lambda y, a: f(y, t, *a), (y, args), (dy, dargs))
        if directions:
            return lambda y, t, dy, args, dargs: jax.vmap(
                partial(jvp, y, t), in_axes=(0, None, 0))(dy, args, dargs)
        return jvp
    batch = lambda tree: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((directions,) + jnp.shape(x), jnp.result_type(x))
        if directions else x, tree)
    fields = [func] + ([] if events is None else [lambda y, t, *a: events(t, y, *a)])
    return all(single_kernel.compilable(tangent_of(f), y0, t0, batch(y0), args, batch(args))
               for f in fields)


def solve_jvp(options: SolveOptions, func: Callable, primals: tuple, tangents: tuple,
              events: Callable | None = None, batched: bool = False
              ) -> tuple[Solution, Solution]:
    """``jax.jvp`` of :func:`solve` with the ordinary loop: each step carries
    the tangents of its state along (forward mode of the discrete solution:
    step sizes are the primal solve's, their derivatives stopped).

    Args:
      options, func, events: as for :func:`solve`.
      primals: ``(y0, t0, t_end, t_eval, h0, args)``.
      tangents: the same structure with ``None`` at unperturbed leaves
        (their tangent is zero and never computed).
      batched: the tangent leaves carry a leading axis of D directions (a
        Jacobian's columns), all stepped by one loop; the solution's tangent
        leaves then have that axis too.

    Returns:
      ``(solution, tangent)``: the solution (the same as :func:`solve`'s:
      the tangents do not enter the step-size control; compiled as one CPU
      kernel, up to where XLA contracts ``a * b + c`` into fused
      multiply-adds, which differs between the two programs) and its
      tangent, a :class:`Solution` with float0 zeros at integer leaves. The
      tangent is not error-controlled: through an explicit method near its
      stability limit it depends on the rounding of the steps taken (see
      the auto section of docs/stiff.md).

    Compiled as one CPU kernel where :func:`solve` would be, and, under
    ``vmap`` over the tangents only (``jax.jacfwd``), one loop carries all
    directions: the state is stepped once for all of them.
    """
    y0, t0, _, _, _, args = primals
    leaves, treedef = jax.tree.flatten(primals)
    tangent_leaves = treedef.flatten_up_to(tangents)
    moving = tuple(i for i, t in enumerate(tangent_leaves) if t is not None)
    moving_tangents = [tangent_leaves[i] for i in moving]
    kernel = _eligible(options, func, events, y0, t0, args)

    def one(fixed: list, directions: list) -> tuple[Solution, Pytree]:
        def of_moving(*values):
            full = list(fixed)
            for i, v in zip(moving, values):
                full[i] = v
            y0, t0, t_end, t_eval, h0, args = jax.tree.unflatten(treedef, full)
            return _integrate(options, func, events, None, lax.while_loop, kernel, y0, t0,
                              t_end, t_eval, h0, args, None, None)
        # Under shard_map a tangent has its primal's type (a one-hot basis
        # built from constants would be invariant where the primal varies).
        directions = [vary_like(d, fixed[i]) for i, d in zip(moving, directions)]
        sol, tangent = jax.jvp(of_moving, [fixed[i] for i in moving], directions)
        # Every tangent leaf depends on the directions, also one that is zero
        # whatever they are (the record's times for a parameter): under vmap
        # over the directions each is then batched, as the custom_vmap rule
        # below declares, and as JAX's own jvp of this function (the second
        # order rule) batches it; without it jacfwd of jacfwd met leaves
        # batched in one and not the other ("Cannot lower jaxpr").
        tangent = _depending(tangent, directions)
        # float0 tangents (of integer outputs) cannot leave a compiled kernel: None here,
        # rebuilt by the caller.
        return sol, jax.tree.map(lambda t: t if t.dtype != jax.dtypes.float0 else None, tangent)

    size = sum(np.size(leaf) for leaf in jax.tree.leaves(y0))

    def tagged(fn: Callable, *operands, directions: int = 0) -> Pytree:
        if kernel and size * (1 + max(directions, 1)) <= 2 * single_kernel.MAX_ELEMENTS \
                and _tangents_compilable(func, events, y0, t0, args, directions):
            return single_kernel.run(fn, *operands)
        return fn(*operands)

    def many(fixed: list, directions: list, axes: list) -> tuple[Solution, Pytree]:
        """All directions (leading axis where ``axes`` is 0) in one loop."""
        return jax.vmap(partial(one, fixed), in_axes=(axes,), out_axes=(None, 0))(directions)

    if batched:
        count = moving_tangents[0].shape[0] if moving_tangents else 0
        sol, tangent = tagged(partial(many, axes=[0] * len(moving_tangents)), list(leaves),
                              moving_tangents, directions=count)
        return sol, _with_float0(sol, tangent, (count,))

    @custom_vmap
    def stepped(fixed: list, directions: list):
        return tagged(one, fixed, directions)

    @stepped.def_vmap
    def _batched(axis_size: int, in_batched: list, fixed: list, directions: list):
        fixed_batched, directions_batched = in_batched
        if not any(fixed_batched):
            # Only the tangents are batched (jax.jacfwd): one loop steps the state once and
            # carries every direction.
            axes = [0 if b else None for b in directions_batched]
            sol, tangent = tagged(partial(many, axes=axes), fixed, directions,
                                  directions=axis_size)
            return (sol, tangent), (jax.tree.map(lambda _: False, sol),
                                    jax.tree.map(lambda _: True, tangent))
        axes = ([0 if b else None for b in fixed_batched],
                [0 if b else None for b in directions_batched])
        out = jax.vmap(lambda f, d: tagged(one, f, d), in_axes=axes)(fixed, directions)
        return out, jax.tree.map(lambda _: True, out)

    @jax.custom_jvp
    def carried(fixed: list, directions: list):
        return stepped(fixed, directions)

    @carried.defjvp
    def _second_order(primals, tangents):
        # jvp of the jvp (jax.jacfwd of jax.jacfwd): JAX's own, on the untagged loop.
        return jax.jvp(one, primals, tangents)

    sol, tangent = carried(list(leaves), moving_tangents)
    return sol, _with_float0(sol, tangent)


def _depending(tangent: Pytree, directions: list) -> Pytree:
    """``tangent`` plus ``0 * direction`` terms (zero, linear in the
    directions), so that every inexact leaf depends on the directions."""
    zeros = [jnp.sum(jnp.real(d)) * 0 for d in directions if jnp.issubdtype(d.dtype, jnp.inexact)]

    def leaf(t: jax.Array) -> jax.Array:
        if not jnp.issubdtype(t.dtype, jnp.inexact):
            return t
        return t + sum((z.astype(t.dtype) for z in zeros), start=jnp.zeros((), t.dtype))
    return jax.tree.map(leaf, tangent)


def _with_float0(sol: Solution, tangent: Pytree, batch: tuple = ()) -> Solution:
    """``tangent`` (None at integer leaves) with float0 zeros there, of the
    solution's shapes behind ``batch``."""
    sol_leaves, sol_tree = jax.tree.flatten(sol)
    tangent_leaves = [float0_zeros(s, batch) if t is None else t
                      for s, t in zip(sol_leaves, sol_tree.flatten_up_to(tangent))]
    return jax.tree.unflatten(sol_tree, tangent_leaves)
