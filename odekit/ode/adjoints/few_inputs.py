"""The checkpoint adjoint's rule when few numbers are perturbed: a Jacobian by forward mode.

The derivative of the discrete solution with respect to ``D`` perturbed
input numbers (the leaves of ``y0``, ``args``, times that carry a nonzero
tangent) is a linear map ``J`` of ``D`` columns. For small ``D`` it is
cheapest to compute ``J`` whole, by forward mode: one loop steps the state
and ``D`` tangent directions together (:func:`odekit.ode.engine.solve.solve_jvp`,
one CPU kernel where the solve is one), and the tangent of the solution is
``J @ tangent``. That product is linear in the tangents and transposes to
``J^T @ cotangent``, so reverse mode (``jax.grad``) gets the same derivative
without a reverse pass through the steps: about ``D + 1`` tangents carried
by one solve instead of ``levels`` recomputations and a backward pass run
kernel by kernel. The same choice, forward sensitivities below some number
of parameters, is the default of Julia's SciMLSensitivity.

The same loop gives the solution itself: the rule does not solve the state a
second time (on Robertson's rate constants a warm gradient took 0.52-0.65x
the time of solving it apart, and its first call 0.75-0.79x;
benchmarks/results/stiff_first_call_notes.md).

Second derivatives: ``(solution, J)`` is a ``jax.custom_jvp`` whose own
derivative comes from the checkpointed loop (:mod:`odekit.ode.engine.bounded_loop`),
which JAX can transpose, so grad of grad and ``jax.hessian`` work (at the
checkpointed loop's cost), also in directions J leaves out.

Used when ``D <= Checkpoint.max_directions`` and ``J`` stays small
(:data:`MAX_JACOBIAN` numbers), for real perturbed inputs; otherwise the
rule runs the checkpointed loop (:mod:`odekit.ode.adjoints.checkpoint`).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from odekit._sealed_jvp import sealed_jvp
from odekit._tree import float0_zeros
from odekit.ode.engine import solve as forward
from odekit.ode.engine.solve import Solution, SolveOptions
from odekit.ode.methods import METHODS, get_method

Pytree = Any

MAX_JACOBIAN = 2 ** 24   # numbers in J (128 MiB in float64) above which the loop is used


def moving(primal: Any, tangent: Any) -> Any:
    """The tangent of an inexact primal that is perturbed, else None."""
    if isinstance(tangent, SymbolicZero) or not jnp.issubdtype(jnp.result_type(primal),
                                                               jnp.inexact):
        return None
    return tangent


def instantiate(primal: Any, tangent: Any) -> Any:
    """A symbolic zero tangent as an array (float0 for an integer primal)."""
    if not isinstance(tangent, SymbolicZero):
        return tangent
    if jnp.issubdtype(jnp.result_type(primal), jnp.inexact):
        return jnp.zeros(np.shape(primal), jnp.result_type(primal))
    return float0_zeros(primal)


def _real(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def applies(max_directions: int, options: SolveOptions, primals: tuple,
            moving_tangents: tuple) -> bool:
    """Whether the rule takes the Jacobian: at most ``max_directions`` perturbed
    numbers, all real, and J (``D`` times the solution's size) at most
    :data:`MAX_JACOBIAN` numbers. ``primals``: ``(y0, t0, t_end, t_eval, h0,
    args)``; ``moving_tangents``: the same with None where unperturbed."""
    leaves, treedef = jax.tree.flatten(primals)
    perturbed = [p for p, t in zip(leaves, treedef.flatten_up_to(moving_tangents))
                 if t is not None]
    directions = sum(int(np.size(p)) for p in perturbed)
    if not 0 < directions <= max_directions or not all(map(_real, perturbed)):
        return False
    y0, _, _, t_eval, _, _ = primals
    n = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(y0))
    m = 0 if t_eval is None else int(np.size(t_eval))
    events = 0 if options.event_spec is None else sum(options.event_spec.capacity)
    return directions * (n * (m + options.record + 2) + events * (n + 1)
                         + options.record * _dense_row_size(options, y0)) <= MAX_JACOBIAN


def _dense_row_size(options: SolveOptions, y0: Any) -> int:
    """Numbers of one recorded dense row (a method that is not replayable,
    when the options keep its steps' polynomials; 0 otherwise)."""
    if not (options.dense_record and options.method in METHODS):
        return 0
    recorded = get_method(options.method).recorded_dense
    if recorded is None:
        return 0
    row = jax.eval_shape(recorded.empty, y0)
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(row))


def _basis(leaves: list, mask: tuple[bool, ...], dtype_of: Callable = jnp.result_type) -> list:
    """One-hot tangents, batched over the D perturbed numbers: leaf i's
    tangent is ``(D,) + shape_i`` with the identity in its block of columns."""
    sizes = [int(np.size(leaf)) if m else 0 for leaf, m in zip(leaves, mask)]
    total, start, out = sum(sizes), 0, []
    for leaf, m, size in zip(leaves, mask, sizes):
        if not m:
            out.append(None)
            continue
        eye = jnp.eye(total, size, -start, dtype=dtype_of(leaf))
        out.append(eye.reshape((total,) + np.shape(leaf)))
        start += size
    return out


def _as_columns(tangents: Solution) -> Solution:
    """J from the solution's tangents for the one-hot directions (a leading
    axis of D): every float leaf with a trailing axis of D columns, float0
    leaves with the solution's shapes."""
    return jax.tree.map(lambda c: np.zeros(c.shape[1:], c.dtype) if c.dtype == jax.dtypes.float0
                        else jnp.moveaxis(c, 0, -1), tangents)


@partial(sealed_jvp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def jacobian(options: SolveOptions, func: Callable, events: Callable | None, treedef: Any,
             mask: tuple[bool, ...], scanned: Callable, leaves: list) -> tuple[Solution, Solution]:
    """``(solution, J)``: the solution and J of the discrete solution w.r.t.
    the leaves where ``mask`` holds (``leaves``: the flattened ``(y0, t0,
    t_end, t_eval, h0, args)``), both from one ordinary loop that steps the
    state and all D directions (the state is not solved a second time).
    ``scanned(primals, tangents)`` is the JVP through the checkpointed loop,
    used for the derivatives of both outputs."""
    basis = jax.tree.unflatten(treedef, _basis(leaves, mask))
    sol, tangents = forward.solve_jvp(options, func, jax.tree.unflatten(treedef, leaves), basis,
                                      events, batched=True)
    return sol, _as_columns(tangents)


@jacobian.defjvp
def _jacobian_jvp(options, func, events, treedef, mask, scanned, primals, tangents):
    def through_loop(leaves: list) -> Solution:
        def column(direction: list) -> Solution:
            return scanned(jax.tree.unflatten(treedef, leaves),
                           jax.tree.unflatten(treedef, direction))[1]

        basis = _basis(leaves, mask)
        axes = [None if b is None else 0 for b in basis]
        return _as_columns(jax.vmap(column, in_axes=(axes,))(basis))
    (leaves,), (directions,) = primals, tangents
    # The solution's own derivative, in every direction (also of the leaves J
    # leaves out: an outer derivative may perturb them).
    solution, solution_dot = scanned(jax.tree.unflatten(treedef, leaves),
                                     jax.tree.unflatten(treedef, list(directions)))
    columns, columns_dot = jax.jvp(through_loop, primals, tangents)
    return (solution, columns), (solution_dot, columns_dot)


def contract(columns: Solution, leaves: list, tangents: list, mask: tuple[bool, ...]) -> Solution:
    """``J @ t``: the tangent of the solution for the tangents of the
    perturbed leaves (column blocks in leaf order)."""
    blocks, start = [], 0
    for leaf, t, m in zip(leaves, tangents, mask):
        if m:
            blocks.append((start, int(np.size(leaf)), jnp.ravel(t)))
            start += int(np.size(leaf))

    def apply(col: jax.Array) -> jax.Array:
        if col.dtype == jax.dtypes.float0:
            return col
        return sum(jnp.tensordot(col[..., a:a + n], t.astype(col.dtype), axes=1)
                   for a, n, t in blocks)
    return jax.tree.map(apply, columns)
