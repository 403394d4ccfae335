"""Forward sensitivities (``adjoint="forward"``): tangents carried along the steps.

For few parameters and many outputs (``jax.jvp``, ``jax.jacfwd``), the
derivative of the discrete solution is cheapest forward: every step of the
solver advances the state and, beside it, the tangent of the state (the
step's Jacobian-vector product), with the step sizes of the undifferentiated
solve (their derivatives stopped, as in :mod:`odekit.ode.adjoints.checkpoint`, which
gives the same derivative), and the primal is exactly the ordinary solve.

Mechanism: a ``jax.custom_jvp`` whose rule is ``jax.jvp`` of the ordinary
solve (:func:`odekit.ode.engine.solve.solve_jvp`): one ``while_loop`` carrying state
and tangents, compiled as one CPU kernel where the solve itself would be;
under ``jax.jacfwd`` one loop carries every direction (the state is stepped
once, not once per parameter). Cost: about one solve of the state with its
tangents.

Forward mode only: a ``while_loop`` cannot be transposed, so reverse mode
(``jax.grad``, ``jax.vjp``, ``jax.jacrev``, ``jax.hessian``) through this
adjoint raises a ``ValueError`` that names ``adjoint="checkpoint"`` (whose
derivative is the same in both modes) (:mod:`odekit.ode.adjoints.forward_only`).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax

from odekit._sealed_jvp import sealed_jvp
from odekit.ode.adjoints import few_inputs, forward_only
from odekit.ode.adjoints.common import nan_if_failed
from odekit.ode.engine import solve as forward
from odekit.ode.engine.solve import Solution, SolveOptions

Pytree = Any

REVERSE_MODE = ("odekit: adjoint='forward' computes forward sensitivities only (jax.jvp, "
                "jax.jacfwd); reverse mode (jax.grad, jax.vjp, jax.jacrev, jax.hessian) cannot go "
                "through its loop. Use adjoint='checkpoint' (the same derivative, in both modes) "
                "or 'interpolate' / 'backsolve' for gradients.")


@dataclasses.dataclass(frozen=True)
class Forward:
    """``adjoint="forward"``: forward sensitivities (no options)."""


def make(spec: Forward) -> Callable:
    """The adjoint's solve function, ``solve(func, events, options, y0, t0,
    t_end, t_eval, h0, *args) -> Solution``."""
    return partial(solve, spec)


@partial(sealed_jvp, nondiff_argnums=(0, 1, 2, 3))
def solve(spec: Forward, func: Callable, events: Callable | None, options: SolveOptions,
          y0: Pytree, t0: jax.Array, t_end: jax.Array, t_eval: jax.Array | None,
          h0: jax.Array, *args: Any) -> Solution:
    """:func:`odekit.ode.engine.solve.solve` with forward-mode derivatives of the
    discrete solution (reverse mode raises, see the module doc)."""
    return forward.solve(options, func, y0, t0, t_end, t_eval, h0, args, events)


def _solve_jvp(spec, func, events, options, primals, tangents):
    y0, t0, t_end, t_eval, h0, *args = primals
    moving = jax.tree.map(few_inputs.moving, list(primals), list(tangents))
    dy0, dt0, dt_end, dt_eval, dh0, *dargs = moving
    _, tangent = forward.solve_jvp(options, func, (y0, t0, t_end, t_eval, h0, tuple(args)),
                                     (dy0, dt0, dt_end, dt_eval, dh0, tuple(dargs)), events)
    # The solution again, without tangents: in reverse mode JAX must know the
    # primal outputs before it reaches the marked tangents, and the loop that
    # carries tangents gives them only as unknowns. Called as this rule's own
    # function, so that a second forward derivative of it comes here again
    # (the ordinary solve is not differentiable).
    sol = solve(spec, func, events, options, y0, t0, t_end, t_eval, h0, *args)
    tangent = nan_if_failed(options, sol, tangent)
    return sol, jax.tree.map(lambda t: t if t.dtype == jax.dtypes.float0
                             else forward_only.mark(t, REVERSE_MODE), tangent)


solve.defjvp(_solve_jvp, symbolic_zeros=True)
