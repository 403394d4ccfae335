"""What the adjoints that differentiate the discrete solution share.

A failed solve (a failure status, see :func:`odekit.ode.engine.solve.failed`)
has nan values, and its derivatives are nan too, whichever adjoint computes
them: :func:`nan_if_failed` scales every inexact tangent leaf by
``where(failed, nan, 1)``, which is linear in the tangents, so a JVP rule
that uses it stays transposable (the checkpoint adjoint's reverse mode).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from odekit.ode.engine import solve as forward
from odekit.ode.engine.solve import Solution, SolveOptions


def nan_if_failed(options: SolveOptions, sol: Solution, tangent: Solution) -> Solution:
    """``tangent`` with nan everywhere when the solve failed: derivatives of a
    failed solve are nan, as its values are (and as the other adjoints give).
    A scaling, so a rule using it stays linear in the tangents."""
    scale = jnp.where(forward.failed(options, sol.status), jnp.nan, 1.0)
    return jax.tree.map(lambda t: t * scale.astype(t.dtype)
                        if jnp.issubdtype(t.dtype, jnp.inexact) else t, tangent)
