"""The discrete ("checkpoint") adjoint: autodiff through the solver's steps.

The derivative of the numerical solution itself (every accepted step of the
method, the interpolation at the output times), so it agrees with finite
differences of the solver to rounding and stays right where the continuous
adjoint's backward integration is unstable (:mod:`odekit.ode.adjoints.backsolve`).
Step sizes are chosen on values with their derivatives stopped (the
controller's choice is a discretisation artefact, piecewise constant in the
parameters); the steps themselves, and their landing on output times, are
differentiated.

Mechanism: a ``jax.custom_jvp``. The primal (no derivative asked) is the
ordinary forward solve, with its fast loop. The JVP rule takes one of two
ways to the same derivative, both of which JAX can transpose for reverse
mode, so ``jax.grad``, ``jax.jvp``, ``jax.jacfwd``, ``jax.jacrev`` and
``jax.hessian`` all work:

* at most ``max_directions`` perturbed input numbers: the Jacobian by
  forward mode, every direction carried by one ordinary loop, then
  ``J @ tangent`` (:mod:`odekit.ode.adjoints.few_inputs`);
* more: the same solve with the loop replaced by
  :func:`odekit.ode.engine.bounded_loop.bounded_while_loop` (nested, checkpointed
  scans), differentiated forward. The bound is the solve's step limit
  (``max_steps``; :data:`DEFAULT_MAX_STEPS` when it has none) and the
  memory/recompute trade-off is ``levels`` (see :mod:`odekit.ode.engine.bounded_loop`).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax

from jax.custom_derivatives import SymbolicZero

from odekit._sealed_jvp import sealed_jvp
from odekit._tree import float0_zeros
from odekit.ode.adjoints import few_inputs
from odekit.ode.adjoints.common import nan_if_failed
from odekit.ode.engine import bounded_loop, output
from odekit.ode.engine import solve as forward
from odekit.ode.engine.solve import Solution, SolveOptions

Pytree = Any

DEFAULT_MAX_STEPS = 4096   # bound of the differentiated loop when the solve has no step limit
# 2: three forward passes and one backward pass per gradient (two over the
# first 64 steps where the field closes over many weights); the carries
# stored, 2 sqrt(max_steps / 4) (64 at 4096 steps; 16 more with the head),
# are small next to the residuals of one block (odekit.ode.engine.bounded_loop).
DEFAULT_LEVELS = 2
# Perturbed input numbers up to which the derivative is a forward-mode Jacobian
# (odekit.ode.adjoints.few_inputs) rather than the checkpointed loop.
DEFAULT_MAX_DIRECTIONS = 16


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """``adjoint=odekit.Checkpoint(levels=2)``: the discrete adjoint.

    Attributes:
      levels: checkpointing levels. Reverse mode stores about
        ``levels * (max_steps / 4) ** (1 / levels)`` loop states and
        recomputes the steps about ``levels`` times; where the field closes
        over 16 KiB or more (a network's weights), 16 more states, and the
        first 64 steps are recomputed once. Its time follows the steps
        taken, not ``max_steps`` (:mod:`odekit.ode.engine.bounded_loop`).
        1 stores every block of 4 steps without recomputing them, and also
        the values the field closes over once per block (for a network with
        many weights, take 2 or more).
      max_steps: attempted steps the checkpointed loop may take (None: the
        solve's own limit, solve_ivp's ``max_steps``, or 4096 for odeint,
        plus one per 8 output times).
        Under ``vmap`` a batch runs until its slowest member is done.
      max_directions: when at most this many input numbers are perturbed
        (the size of the leaves you differentiate with respect to), the
        derivative is taken as a Jacobian by forward mode, all directions in
        one loop (:mod:`odekit.ode.adjoints.few_inputs`): no checkpointed loop, no
        step bound, far faster for a few parameters. 0 always uses the loop.
    """

    levels: int = DEFAULT_LEVELS
    max_steps: int | None = None
    max_directions: int = DEFAULT_MAX_DIRECTIONS

    def __post_init__(self):
        if not isinstance(self.max_directions, int) or isinstance(self.max_directions, bool) \
                or self.max_directions < 0:
            raise ValueError("Checkpoint: max_directions must be a non-negative int, got "
                             f"{self.max_directions!r}.")
        for name, value in (("levels", self.levels), ("max_steps", self.max_steps)):
            if value is None and name == "max_steps":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Checkpoint: {name} must be a positive int, got {value!r}.")


def bound(checkpoint: Checkpoint, options: SolveOptions, num_outputs: int = 0) -> int:
    """Largest number of attempted steps the differentiated loop can take.

    The differentiated loop stops its steps at every ``CAPPED_WINDOW``-th
    output time (see :class:`odekit.ode.engine.output.Outputs`), which can add
    ``ceil(num_outputs / CAPPED_WINDOW)`` steps to those of the solve: a
    bound taken from the solve's own limit makes room for them.
    """
    if checkpoint.max_steps is not None:
        return checkpoint.max_steps
    limit = options.loop.max_steps
    base = DEFAULT_MAX_STEPS if limit == float("inf") else int(limit)
    return base + -(-num_outputs // output.CAPPED_WINDOW)


def make(checkpoint: Checkpoint) -> Callable:
    """The adjoint's solve function, ``solve(func, events, options, y0, t0,
    t_end, t_eval, h0, *args) -> Solution`` (the interface of
    :func:`odekit.ode.adjoints.backsolve.solve`)."""
    return partial(solve, checkpoint)


@partial(sealed_jvp, nondiff_argnums=(0, 1, 2, 3))
def solve(checkpoint: Checkpoint, func: Callable, events: Callable | None, options: SolveOptions,
          y0: Pytree, t0: jax.Array, t_end: jax.Array, t_eval: jax.Array | None,
          h0: jax.Array, *args: Any) -> Solution:
    """:func:`odekit.ode.engine.solve.solve` with derivatives of the discrete solution.

    The undifferentiated call is the ordinary solve; a differentiated one
    stops at ``bound(checkpoint, options)`` attempted steps (status
    MAX_STEPS beyond).
    """
    return forward.solve(options, func, y0, t0, t_end, t_eval, h0, args, events)


def _differentiable(checkpoint: Checkpoint, func: Callable, events: Callable | None,
                    options: SolveOptions, y0, t0, t_end, t_eval, h0, *args) -> Solution:
    limit = bound(checkpoint, options, 0 if t_eval is None else t_eval.shape[0])
    steps = float(limit) if checkpoint.max_steps is None else min(options.loop.max_steps, float(limit))
    bounded = options._replace(loop=options.loop._replace(max_steps=steps))
    loop = bounded_loop.with_limit(limit, checkpoint.levels)
    return forward.solve(bounded, func, y0, t0, t_end, t_eval, h0, args, events, while_loop=loop)


def _scanned_jvp(checkpoint, func, events, options, primals, tangents):
    """JVP of the solve through the checkpointed loop (``primals``: ``(y0, t0,
    t_end, t_eval, h0, args)``; ``tangents`` the same, None where zero)."""
    y0, t0, t_end, t_eval, h0, args = primals
    leaves, treedef = jax.tree.flatten(primals)
    full = [few_inputs.instantiate(p, SymbolicZero.from_primal_value(p) if t is None else t)
            for p, t in zip(leaves, treedef.flatten_up_to(tangents))]
    dy0, dt0, dt_end, dt_eval, dh0, dargs = jax.tree.unflatten(treedef, full)
    return jax.jvp(partial(_differentiable, checkpoint, func, events, options),
                   (y0, t0, t_end, t_eval, h0, *args), (dy0, dt0, dt_end, dt_eval, dh0, *dargs))


def _solve_jvp(checkpoint, func, events, options, primals, tangents):
    y0, t0, t_end, t_eval, h0, *args = primals
    tree = (y0, t0, t_end, t_eval, h0, tuple(args))
    moving = tuple(jax.tree.map(few_inputs.moving, list(primals), list(tangents)))
    moving = moving[:5] + (tuple(moving[5:]),)
    if few_inputs.applies(checkpoint.max_directions, options, tree, moving):
        leaves, treedef = jax.tree.flatten(tree)
        moving_leaves = treedef.flatten_up_to(moving)
        mask = tuple(t is not None for t in moving_leaves)
        scanned = partial(_scanned_jvp, checkpoint, func, events, options)
        # The solution comes from the loop that steps J's columns (one solve, not two).
        sol, columns = few_inputs.jacobian(options, func, events, treedef, mask, scanned, leaves)
        tangent = few_inputs.contract(columns, leaves, moving_leaves, mask)
        # J's float0 columns (integer outputs) lost their shard_map type: the primal's
        tangent = jax.tree.map(lambda t, s: float0_zeros(s) if t.dtype == jax.dtypes.float0
                               else t, tangent, sol)
        return sol, nan_if_failed(options, sol, tangent)
    sol, tangent = _scanned_jvp(checkpoint, func, events, options, tree, moving)
    return sol, nan_if_failed(options, sol, tangent)


solve.defjvp(_solve_jvp, symbolic_zeros=True)

