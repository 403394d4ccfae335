"""Stiffness detection for explicit methods (Hairer, Norsett & Wanner,
Solving ODEs I, Sec. IV.2 of vol. II and the test in dopri5.f / dop853.f).

Two stages evaluated at the same time ``t0 + c h`` give a cheap estimate of the
dominant eigenvalue along the step,

    |h lambda| ~= h ||k_j - k_i|| / ||Y_j - Y_i||,

where Y are the stage arguments. When ``|h lambda|`` sits at the boundary of
the method's real stability interval for many accepted steps in a row, the
step size is limited by stability, not accuracy: the problem is stiff and an
explicit method will crawl (and accumulate rounding). Tableaux without two
stages at the same node use the step's endpoints (k_1, k_s) instead.

The boundary is computed from the tableau's stability function
R(z) = 1 + z b^T (I - z A)^{-1} 1 at import, not typed in.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from odekit.ode.rk_step import StepResult, combine
from odekit.ode.tableaux import ButcherTableau

Pytree = Any

CHECK_EVERY = 1000      # accepted steps between tests while no stiffness is seen (NSTIFF)
STIFF_STEPS = 15        # consecutive stiff tests that end the solve (dopri5.f)
NONSTIFF_RESET = 6      # non-stiff tests that clear the stiff count
BOUNDARY_FRACTION = 0.98


@functools.lru_cache(maxsize=None)
def _boundary(a_bytes: bytes, b_bytes: bytes, s: int) -> float:
    a = np.frombuffer(a_bytes).reshape(s, s)
    b = np.frombuffer(b_bytes)
    ones = np.ones(s)
    for x in np.linspace(1e-3, 30.0, 30000):
        z = -x
        r = 1.0 + z * b @ np.linalg.solve(np.eye(s) - z * a, ones)
        if abs(r) > 1.0:
            return float(x)
    return 30.0


def stability_boundary(tableau: ButcherTableau) -> float:
    """Largest x with |R(-x')| <= 1 for all 0 < x' < x (real stability interval)."""
    return _boundary(tableau.a.tobytes(), tableau.b.tobytes(), tableau.num_stages)


def _stage_pair(tableau: ButcherTableau) -> tuple[int, int] | None:
    """Indices of the last two stages sharing a node, or None."""
    c = tableau.c
    for j in range(len(c) - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            if c[i] == c[j]:
                return i, j
    return None


def is_stiff_step(tableau: ButcherTableau, h: jax.Array, y0: Pytree, step: StepResult) -> jax.Array:
    """Whether the step looks limited by stability: |h lambda| beyond the
    threshold with a decaying mode (Re <dk, dy> < 0; a blow-up, lambda > 0,
    is not stiffness)."""
    pair = _stage_pair(tableau)
    if pair is None:
        dk = jax.tree.map(jnp.subtract, step.stages[-1], step.stages[0])
        dy = jax.tree.map(jnp.subtract, step.y1, y0)
    else:
        i, j = pair
        dk = jax.tree.map(jnp.subtract, step.stages[j], step.stages[i])
        dy = combine(None, h, tableau.a[j] - tableau.a[i], step.stages)
    dot = lambda u, v: sum(jnp.sum(jnp.real(jnp.conj(a) * b)) for a, b in
                           zip(jax.tree.leaves(u), jax.tree.leaves(v)))
    num, den, cross = dot(dk, dk), dot(dy, dy), dot(dy, dk)
    h_lam = jnp.where(den > 0, jnp.abs(h) * jnp.sqrt(num / jnp.where(den > 0, den, 1.0)), 0.0)
    return (h_lam > threshold(tableau)) & (cross < 0)


def threshold(tableau: ButcherTableau) -> float:
    """|h lambda| above which a step counts as limited by stability."""
    return BOUNDARY_FRACTION * stability_boundary(tableau)
