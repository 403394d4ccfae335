"""The discrete ("checkpoint") adjoint: autodiff through the solver's steps.

The derivative of the numerical solution itself (every accepted step of the
method, the interpolation at the output times), so it agrees with finite
differences of the solver to rounding and stays right where the continuous
adjoint's backward integration is unstable (:mod:`adjoint_backsolve`).
Step sizes are chosen on values with their derivatives stopped (the
controller's choice is a discretisation artefact, piecewise constant in the
parameters); the steps themselves, and their landing on output times, are
differentiated.

Mechanism: a ``jax.custom_jvp``. The primal (no derivative asked) is the
ordinary forward solve, with its fast loop. The JVP rule runs the same
solve with the loop replaced by :func:`odekit.ode.bounded_loop.bounded_while_loop`
(nested, checkpointed scans) and differentiates it forward; JAX transposes
that for reverse mode, so ``jax.grad``, ``jax.jvp``, ``jax.jacfwd``,
``jax.jacrev`` and ``jax.hessian`` all work. The bound is the solve's step
limit (``max_steps``; :data:`DEFAULT_MAX_STEPS` when it has none) and the
memory/recompute trade-off is ``levels`` (see :mod:`bounded_loop`).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from odekit.ode import bounded_loop, output
from odekit.ode import solve as forward
from odekit.ode.solve import Solution, SolveOptions

Pytree = Any

DEFAULT_MAX_STEPS = 4096   # bound of the differentiated loop when the solve has no step limit
# 3, not 2: fewer iterations are skipped one by one at the end of the last
# chunk (16 per level, not 64), which made levels=3 the faster choice on the
# pendulum (4.6 against 8.2 ms) and on a 9,797-step solve (75 against 118 ms,
# 0.09 against 1.22 MiB) in python benchmarks/adjoints.py, 2026-12-05.
DEFAULT_LEVELS = 3


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """``adjoint=odekit.Checkpoint(levels=3)``: the discrete adjoint.

    Attributes:
      levels: checkpointing levels. Reverse mode stores about
        ``levels * max_steps ** (1 / levels)`` loop states and recomputes
        the steps about ``levels`` times (1: every step stored, fastest).
      max_steps: attempted steps a differentiated solve may take (None: the
        solve's own limit, solve_ivp's ``max_steps``, or 4096 for odeint,
        plus one per 8 output times).
        Under ``vmap`` a batch runs until its slowest member is done.
    """

    levels: int = DEFAULT_LEVELS
    max_steps: int | None = None

    def __post_init__(self):
        for name, value in (("levels", self.levels), ("max_steps", self.max_steps)):
            if value is None and name == "max_steps":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Checkpoint: {name} must be a positive int, got {value!r}.")


def bound(checkpoint: Checkpoint, options: SolveOptions, num_outputs: int = 0) -> int:
    """Largest number of attempted steps the differentiated loop can take.

    The differentiated loop stops its steps at every ``CAPPED_WINDOW``-th
    output time (see :class:`odekit.ode.output.Outputs`), which can add
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
    :func:`odekit.ode.adjoint_backsolve.solve`)."""
    return partial(solve, checkpoint)


@partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3))
def solve(checkpoint: Checkpoint, func: Callable, events: Callable | None, options: SolveOptions,
          y0: Pytree, t0: jax.Array, t_end: jax.Array, t_eval: jax.Array | None,
          h0: jax.Array, *args: Any) -> Solution:
    """:func:`odekit.ode.solve.solve` with derivatives of the discrete solution.

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


@solve.defjvp
def _solve_jvp(checkpoint, func, events, options, primals, tangents):
    sol, tangent = jax.jvp(partial(_differentiable, checkpoint, func, events, options), primals,
                           tangents)
    # Derivatives of a failed solve are nan, as its values are (and as the
    # other adjoints give): a scaling, so the rule stays linear in tangents.
    scale = jnp.where(forward.failed(options, sol.status), jnp.nan, 1.0)
    tangent = jax.tree.map(lambda t: t * scale.astype(t.dtype)
                           if jnp.issubdtype(t.dtype, jnp.inexact) else t, tangent)
    return sol, tangent
