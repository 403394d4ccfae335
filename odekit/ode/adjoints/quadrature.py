"""The parameters' cotangents of a continuous adjoint as a quadrature.

With p parameters and an adjoint of n numbers, integrating ``(a,
args_bar)`` together carries p numbers through every stage, error estimate
and selection of the backward loop, though nothing in the backward field
reads ``args_bar``: its equation is a pure quadrature,

    args_bar = int a(t)^T df/dargs (y(t), t) dt.

When p is much larger than n (a neural network's weights) the backward
solve instead integrates what the field does read (the adjoint ``a``, and
for backsolve ``y``) and records its accepted steps ``(s_k, z_k)``; then
:func:`replayed_sum` takes each recorded step once more from ``(z_k, 0)``
with the full backward field and sums the parameter part of its result,
``h_k sum_j b_j a_j^T df/dargs (y_j)``: the same stages and arithmetic as
the joint integration, with the error norm over ``z`` alone (the
"seminorm" of Kidger, Chen & Lyons, "Hey, that's not an ODE", ICML 2021).

Cost: the backward record, ``rows x size(z)`` numbers, and the recorded
steps taken again once (``stages + 1`` vector-Jacobian products each, with
respect to the parameters too). Measurements:
``benchmarks/results/interpolate_overhead_notes.md``.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit._tree import vary_like
from odekit.ode.engine import dense

Pytree = Any

#: Most numbers the backward record (rows x size of the carried state) may hold.
RECORD_LIMIT = 2 ** 22
#: Fewest parameter cotangents for which the quadrature is used: below it the
#: two loops cost more to compile than carrying the cotangents saves.
MIN_PARAMETERS = 256


def applies(method: Any, carried: int, parameters: int, same_dtype: bool, rows: int) -> bool:
    """Whether the parameters' cotangents are summed as a quadrature: an
    explicit method whose steps can be taken again, one dtype over the
    backward state and the parameters, more parameter numbers than
    ``carried`` (the numbers the backward loop carries) and at least
    ``MIN_PARAMETERS`` of them, and a record of ``rows`` rows within
    ``RECORD_LIMIT``."""
    return (not method.factorizations_per_step and method.replayable and same_dtype
            and parameters > carried and parameters >= MIN_PARAMETERS
            and rows * carried <= RECORD_LIMIT)


def jump_rows(stops: jax.Array, s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The stops at time ``s`` (a (k,) mask) and the last of them (-1: none):
    the backward loop applies stop i's jump, row i + 1 of the reversed
    rows, where it lands on ``stops[i]``; the record holds the state
    before them."""
    hit = stops == s
    last = jnp.max(jnp.where(hit, jnp.arange(stops.shape[0], dtype=jnp.int32), -1))
    return hit, last


def summed_rows(hit: jax.Array, rows: Pytree) -> Pytree:
    """``sum_i rows[i + 1]`` over the stops ``hit`` (leading axis: the row)."""
    return jax.tree.map(
        lambda leaf: jnp.sum(jnp.where(hit.reshape((-1,) + (1,) * (leaf.ndim - 1)), leaf[1:], 0),
                             axis=0), rows)


def replayed_sum(method: Any, full_field: Callable, ts_record: jax.Array,
                 num_points: jax.Array, start_of_step: Callable, zeros: list,
                 *vary_with: Any) -> list:
    """``sum_k`` of the last part of the step ``k`` of the backward record
    taken again with ``full_field`` from ``(*start_of_step(k), zeros)``.

    ``ts_record`` (rows,) and ``num_points`` are the record's times and
    rows; ``start_of_step(k)`` gives the carried state at the start of step
    k (after the jumps there) as a tuple; ``full_field(state, s)`` is the
    backward field of ``(*carried, args_bar)``; ``zeros`` the parameters'
    cotangents' zeros (a list of leaves). Time O(steps) replays, memory
    O(p)."""
    def add_step(k, total):
        s_k = dense.row(ts_record, k)
        h = dense.row(ts_record, k + 1) - s_k
        state = (*start_of_step(k), zeros)
        step = method.step(full_field, s_k, state, full_field(state, s_k), h)
        return [t + d for t, d in zip(total, step.y1[-1])]

    total = vary_like(zeros, ts_record, *vary_with)
    return lax.fori_loop(0, jnp.maximum(num_points - 1, 0), add_step, total)
