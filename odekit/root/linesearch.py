"""Backtracking on the merit ``|f(x)|^2``, one trial per loop step.

From ``x`` along the full step ``d`` (Newton or Broyden) a trial point
``x + lam d`` is accepted when it is finite and satisfies the Armijo
decrease

    |f(x + lam d)|^2 <= (1 - 2 c lam) |f(x)|^2,   c = 1e-4,

which a full Newton step satisfies near a root; then the next trial starts
again at ``lam = 1``. A rejected trial keeps ``x`` and halves ``lam``, so one
bad step cannot throw the iteration off to infinity. Each trial is one step
of the solver's single loop (no nested loop: under ``vmap`` members that
backtrack and members that step advance together), and ``lam`` below
``2**-30`` is reported as ``NO_PROGRESS``.

References:
  Dennis & Schnabel (1996), Numerical Methods for Unconstrained Optimization
  and Nonlinear Equations, section 6.3; Kelley (2003), Solving Nonlinear
  Equations with Newton's Method, section 1.10.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from odekit import status as _status
from odekit._tree import tree_add, tree_sum_squares, tree_where, widest_dtype
from odekit.custom.iteration import Iterate

PyTree = Any
MIN_FRACTION = 2.0 ** -30
ARMIJO = 1e-4


def _merits(new: PyTree, old: PyTree) -> tuple[jax.Array, jax.Array]:
    """``(|new|^2, |old|^2)`` in the widest dtype: one reduction per leaf (the
    two leaves stacked), where two sums would be two kernels in every step."""
    pairs = list(zip(jax.tree.leaves(new), jax.tree.leaves(old)))
    if not pairs or any(jnp.shape(a) != jnp.shape(b) or a.dtype != b.dtype for a, b in pairs):
        return tree_sum_squares(new), tree_sum_squares(old)
    dtype = widest_dtype(new)
    sums = sum(jnp.sum(jnp.square(jnp.stack([a, b]).reshape(2, -1)), axis=1).astype(dtype)
               for a, b in pairs)
    return sums[0], sums[1]


def first_fraction(it: Iterate) -> jax.Array:
    """The fraction ``lam = 1`` of the first trial, in the iterate's widest dtype."""
    return jnp.ones((), widest_dtype(it.x))


def try_step(evaluate: Callable[..., Iterate], it: Iterate, lam: jax.Array,
             force: jax.Array | None = None) -> tuple[Iterate, Iterate, jax.Array, jax.Array]:
    """Evaluate the trial ``it.x + lam * it.step``.

    Args:
      evaluate: ``evaluate(x) -> Iterate`` with ``residual = f(x)``.
      it: the current iterate; ``it.residual`` is ``f(it.x)``.
      lam: the step fraction to try.
      force: optional bool; where True the trial is accepted without the
        Armijo test (the first evaluation, at the start, of a lazily
        initialised solver whose ``it`` is a placeholder).

    Returns:
      ``(trial, kept, accepted, next_lam)``: the trial iterate, the iterate
      the solver continues from (the trial if accepted, else ``it``, with
      status ``NO_PROGRESS`` once ``lam`` underflows), whether the trial was
      accepted and the fraction for the next trial.
    """
    trial = evaluate(tree_add(it.x, it.step, lam))
    value, merit = _merits(trial.residual, it.residual)
    accepted = jnp.isfinite(value) & (value <= (1 - 2 * ARMIJO * lam) * merit)
    if force is not None:
        accepted = accepted | force
    # lam / lam is exactly 1 (lam is finite and nonzero), but a division is
    # an operation XLA will not repeat inside each consumer's kernel: the
    # trial's evaluation and the Armijo test then run once per step instead
    # of once per carried array.
    accepted = jnp.where(accepted, lam, 0) / lam > 0.5
    next_lam = jnp.where(accepted, jnp.ones_like(lam), lam / 2)
    kept = tree_where(accepted, trial, it)
    stalled = ~accepted & (next_lam < MIN_FRACTION)
    status = jnp.where(stalled, _status.NO_PROGRESS, kept.status).astype(jnp.int32)
    return trial, kept._replace(status=status), accepted, next_lam
