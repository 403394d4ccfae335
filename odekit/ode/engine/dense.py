"""The dense output object ``sol.sol`` of ``odekit.solve_ivp``.

The forward solve records every accepted step ``(t_n, y_n)``. To evaluate
``y(t)`` the step ``[t_n, t_{n+1}]`` holding ``t`` is taken again from
``y_n`` (one step of the same method, so the same stages) and the method's
continuous extension is evaluated at ``theta = (t - t_n) / (t_{n+1} - t_n)``.
Storing only ``(t_n, y_n)`` keeps memory at one state per step, and the
replayed step is an ordinary JAX computation: ``sol.sol(t)`` is jittable,
vectorised over ``t``, and differentiable with respect to ``t`` and (through
``y_n``, whose gradients come from the solve's adjoint, and through ``args``)
the parameters, and to the span: the recorded times ``t_n`` are t0 plus the
steps taken (the last one t1) and keep those derivatives, so that with
``y_n``'s the replayed step gives ``dy(t)/dt0 = -Phi(t, t0) f(t0, y0)``.
Times outside the solved span extrapolate the first or last step's
polynomial, as SciPy's ``OdeSolution`` does (the step before a last
step of near zero length; see :func:`interpolation_bracket`). A step that a
terminal event shortened is replayed at its full size and its polynomial
restricted to the part before the event, so that the state at the event is
the one that located it.

A multistep method cannot take a step again from ``(t_n, y_n)``: its step
depends on the history it carries (``Method.replayable`` False). For such a
method the solve records each accepted step's dense data as well
(``Method.recorded_dense``, e.g. BDF's (6, n) differences ``D'``: memory
``O(steps * 6 * n)``), and ``sol.sol(t)`` evaluates the recorded
polynomial of the step holding ``t``; its derivatives are those of the
recorded rows (the checkpoint and forward adjoints differentiate them with
the solve).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from odekit._programs import compiled
from odekit._tree import vary_like
from odekit.ode.linalg import jacobian
from odekit.ode.methods import check_replayable, get_method

Pytree = Any


def step_containing(ts: jax.Array, num_points: jax.Array, s: jax.Array) -> jax.Array:
    """The step ``n`` with ``ts[n] <= s < ts[n + 1]`` among the first
    ``num_points`` increasing times (clipped to the first and last step):
    a bisection of ``ceil(log2(len(ts)))`` dynamic slices in a ``fori_loop``,
    no gather (so a loop using it can still be compiled as one kernel; as a
    loop, not unrolled, it stays a few operations of the program however
    often a backward field evaluates it)."""
    def halve(_, bounds):
        lo, hi = bounds
        mid = lax.div(lo + hi, jnp.int32(2))     # lo, hi >= 0: the floor
        right = lax.dynamic_index_in_dim(ts, mid, keepdims=False) <= s
        return lax.select(right, mid, lo), lax.select(right, hi, mid)

    lo = jnp.zeros((), jnp.int32)
    hi = jnp.maximum(num_points - 1, 1).astype(jnp.int32)      # ts[hi] > s, or the last row
    iterations = max(1, math.ceil(math.log2(max(ts.shape[0], 2))))
    lo, _ = lax.fori_loop(0, iterations, halve, vary_like((lo, hi), ts, num_points, s))
    return lo


def row(tree: Pytree, i: jax.Array) -> Pytree:
    """Row ``i`` of every leaf (a dynamic slice, no gather)."""
    return jax.tree.map(lambda leaf: lax.dynamic_index_in_dim(leaf, i, keepdims=False), tree)


def bracket(ts: jax.Array, num_points: jax.Array, s: jax.Array) -> tuple:
    """``(n, s_n, h, theta)``: the recorded step ``[s_n, s_n + h]`` holding
    ``s`` (see :func:`step_containing`) and ``theta = (s - s_n) / h``
    (``h = 1`` when there is no step, a single recorded point)."""
    n = step_containing(ts, num_points, s)
    s_n, s_next = row(ts, n), row(ts, jnp.minimum(n + 1, ts.shape[0] - 1))
    h = jnp.where(num_points > 1, s_next - s_n, 1)
    return n, s_n, h, ((s - s_n) / h).astype(s_n.dtype)


SHORT_LAST_STEP = 1e-2   # see :func:`interpolation_bracket`


def interpolation_bracket(ts: jax.Array, num_points: jax.Array, s: jax.Array,
                          last_h: jax.Array | None = None) -> tuple:
    """``(n, s_n, h, theta)`` as :func:`bracket`, for the dense output: the
    step whose interpolant gives ``y(s)``.

    * The last step, when a terminal event shortened it (``last_h > 0``, the
      size the step was taken with), is the full step: its interpolant is
      the one that located the event, restricted to ``[s_n, s_event]``
      (SciPy keeps it too), not a shorter step taken again.
    * Past the end, a last step of (near) zero length (shorter than
      ``SHORT_LAST_STEP`` of the one before, or of no length at all) is not
      extrapolated, the step before it is: a polynomial of a step of length
      h evaluated at a distance D carries rounding of order eps (D / h)^p.
    """
    n = step_containing(ts, num_points, s)
    size = ts.shape[0]
    last = jnp.maximum(num_points - 2, 0)
    prev = jnp.maximum(n - 1, 0)
    s_prev, s_n = row(ts, prev), row(ts, n)
    s_next = row(ts, jnp.minimum(n + 1, size - 1))
    h = s_next - s_n
    if last_h is not None:
        h = jnp.where((n == last) & (last_h > 0), last_h.astype(h.dtype), h)
    h_prev = s_n - s_prev
    beyond = (n == last) & (s > s_next)
    short = (n > 0) & (beyond | (h <= 0)) & (h < SHORT_LAST_STEP * h_prev)
    n = jnp.where(short, prev, n)
    s_n = jnp.where(short, s_prev, s_n)
    h = jnp.where(short, h_prev, h)
    h = jnp.where(num_points > 1, h, 1)
    return n, s_n, h, ((s - s_n) / h).astype(s_n.dtype)


def replay_step(method: Any, func: Callable, args: tuple, s_n: jax.Array, y_n: Pytree,
                h: jax.Array) -> Pytree:
    """The dense data (``method.dense_prepare``) of the step of size ``h``
    from ``(s_n, y_n)``, taken again as the solve took it (ValueError for a
    method whose steps depend on a carried state: ``Method.replayable``)."""
    check_replayable(method, "the dense output of recorded steps (dense_output=True, "
                     "events, adjoint='interpolate')")
    field = jacobian.bind(func, args)   # as the solve does
    step = method.step(field, s_n, y_n, field(y_n, s_n), h)
    return method.dense_prepare(field, s_n, y_n, h, step)


def recorded_step(method: Any, rows: Pytree, n: jax.Array, y_n: Pytree) -> Pytree:
    """The dense data of recorded step ``n`` (``[ts[n], ts[n + 1]]``) of a
    method that is not replayable, from the record's dense rows
    (``Method.recorded_dense``; row ``n + 1`` belongs to the step ending at
    ``ts[n + 1]``) and the state ``y_n`` at its start (for the structure)."""
    last = jax.tree.leaves(rows)[0].shape[0] - 1
    return method.recorded_dense.step(row(rows, jnp.minimum(n + 1, last)), y_n)


def evaluate_step(method: Any, dense_step: Pytree, theta: jax.Array, y_n: Pytree,
                  num_points: jax.Array) -> Pytree:
    """The continuous extension of one step at the scalar ``theta`` (``y_n``
    itself when the record holds a single point)."""
    value = method.dense_eval(dense_step, theta[None])
    return jax.tree.map(lambda v, y0: jnp.where(num_points > 1, v[0], y0), value, y_n)


@jax.tree_util.register_pytree_node_class
class DenseOutput:
    """``y(t)`` anywhere in the solved span: ``sol.sol(t)`` for scalar or array ``t``.

    Returns the structure of ``y0`` with leading axes ``jnp.shape(t)``. A
    batched dense output (returned from ``jax.vmap``, so ``ts`` has batch axes
    before the step axis) is evaluated per member at the same ``t``, the batch
    axes first: leading axes ``batch + jnp.shape(t)``.
    """

    def __init__(self, ts: jax.Array, ys: Pytree, num_points: jax.Array, direction: jax.Array,
                 args: tuple, func: Callable, method: str | tuple[str, ...],
                 second_from: jax.Array | None = None, last_h: jax.Array | None = None,
                 rows: Pytree = None):
        self.ts, self.ys, self.num_points, self.direction, self.args = ts, ys, num_points, direction, args
        self.func, self.method = func, method
        # For a pair of methods (method="auto"): the first record row whose step
        # the second method took.
        self.second_from = second_from
        # The size of the last step as taken, when a terminal event shortened
        # it (0 or None: not shortened); see interpolation_bracket.
        self.last_h = last_h
        # For a method that is not replayable (Method.recorded_dense): row
        # i + 1 holds the dense data of the step [ts[i], ts[i + 1]] (None:
        # the steps are replayed).
        self.rows = rows

    def tree_flatten(self):
        return ((self.ts, self.ys, self.num_points, self.direction, self.args, self.second_from,
                 self.last_h, self.rows), (self.func, self.method))

    @classmethod
    def tree_unflatten(cls, aux, children):
        *arrays, second_from, last_h, rows = children
        return cls(*arrays, *aux, second_from=second_from, last_h=last_h, rows=rows)

    def __repr__(self) -> str:
        return f"DenseOutput(method={self.method!r}, steps={self.num_points})"

    def _one(self, s: jax.Array) -> Pytree:
        """y at reversed-or-not time ``s`` (the solve's internal time)."""
        last_h = None if self.last_h is None else lax.stop_gradient(self.last_h)
        # The step's start and size keep their derivatives (the record's times
        # move with t0 and t1): with the derivative of y_n, that of the
        # replayed step at the fixed time s is the whole of dy(s)/dt0.
        where = interpolation_bracket(self.ts, self.num_points, s, last_h)
        if isinstance(self.method, tuple):    # method="auto": the one that took the step
            branches = [partial(self._one_by, name) for name in self.method]
            value = lax.switch((where[0] >= self.second_from).astype(jnp.int32), branches, where)
        else:
            value = self._one_by(self.method, where)
        return self._exact_at_nodes(value, where[0], s)

    def _exact_at_nodes(self, value: Pytree, n: jax.Array, s: jax.Array) -> Pytree:
        """``value`` (the interpolant at ``s``, in step ``n``), with the recorded
        state where ``s`` is the step's start or end: the polynomial there
        agrees with it to rounding only (DOP853's at theta = 1 by 1.6e-15, where
        SciPy's ``sol(res.t) == res.y`` test allows 1e-15). The derivative stays
        the interpolant's (the record's rows do not move with ``s``)."""
        last = self.ts.shape[0] - 1
        following = jnp.minimum(n + 1, last)
        at_start = s == row(self.ts, n)
        at_end = (s == row(self.ts, following)) & (n + 1 < self.num_points)

        def leaf(v, start, end):
            exact = jnp.where(at_end, end, jnp.where(at_start, start, v))
            # exact - v is exact where they are this close (Sterbenz), so the sum is exact
            return v + lax.stop_gradient(exact - v)
        return jax.tree.map(leaf, value, row(self.ys, n), row(self.ys, following))

    def _one_by(self, name: str, where: tuple) -> Pytree:
        method = get_method(name)
        n, s_n, h, theta = where
        y_n = row(self.ys, n)
        if self.rows is not None and method.recorded_dense is not None:
            dense_step = recorded_step(method, self.rows, n, y_n)
        else:
            dense_step = replay_step(method, self.func, self.args, s_n, y_n, h)
        return evaluate_step(method, dense_step, theta, y_n, self.num_points)

    def __call__(self, t: Any) -> Pytree:
        t = jnp.asarray(t, self.ts.dtype)
        if self.ts.ndim > 1:
            # A batch of dense outputs (``sol.sol`` returned from ``jax.vmap``:
            # every array carries the batch axis first, ``ts`` of a single solve
            # is 1-D): each member evaluated at the same ``t``, batch axis first.
            return jax.vmap(lambda member: member(t))(self)
        program = compiled(_evaluate, self.func, self.method)
        values = program(self, (self.direction * t).reshape(-1))
        return jax.tree.map(lambda v: v.reshape(t.shape + v.shape[1:]), values)


def _evaluate(func: Callable, method: Any, dense: DenseOutput, s: jax.Array) -> Pytree:
    """``dense`` at the (m,) internal times ``s``, as one compiled program
    (outside jit, op-by-op evaluation compiled every operation on its own)."""
    del func, method   # the program's key; ``dense`` carries them too
    return jax.vmap(dense._one)(s)
