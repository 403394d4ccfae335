"""Stiffness detection for explicit methods (Hairer & Wanner, Solving ODEs II,
Sec. IV.2, and the test in dopri5.f / dop853.f).

Two stage evaluations give a cheap estimate of the dominant eigenvalue,

    |h lambda| ~= h ||k_j - k_i|| / ||Y_j - Y_i||,

where Y are the stage arguments. When ``|h lambda|`` sits at the boundary of
the method's real stability interval again and again, the step size is
limited by stability, not accuracy: the problem is stiff and an explicit
method will crawl (and accumulate rounding). Hairer uses two stages of the
step at the same node; :func:`is_stiff_stages` applies that test to the
stages of a step the loop attempts anyway, every few hundred steps.

The boundary is computed from the tableau's stability polynomial
R(z) = 1 + sum_k (b^T A^(k-1) 1) z^k (once per tableau), not typed in.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import _lax as ops
from odekit.ode.methods.explicit_tableaux import ButcherTableau
from odekit.ode.methods.rk_step import combine

Pytree = Any

# A step counts as limited by stability past this fraction of the boundary.
# Hairer's codes use 0.98 (dopri5.f: 3.25 of 3.31) and 0.95 (dop853.f: 6.1 of
# 6.39). At tight tolerances the step-size controller settles well below the
# boundary on a stiff problem: tsit5 on Robertson with a forced k1 at rtol
# 1e-9 stays at h rho = 2.6-2.7 of its 3.51 (where R(-h rho) = 0.24), so at
# 0.95 the probe hardly fired, auto switched after 4,100 tsit5 steps instead
# of 515, and its d y(10) / d t0 was 6% off (see docs/stiff.md, auto).
BOUNDARY_FRACTION = 0.7


@functools.lru_cache(maxsize=None)
def _boundary(a_bytes: bytes, b_bytes: bytes, s: int) -> float:
    """First x > 0 where |R(-x)| reaches 1. For an explicit method R is the
    polynomial R(z) = 1 + sum_k (b^T A^(k-1) 1) z^k (degree <= s), so the
    boundary is the smallest positive real root of R(-x) - 1 or R(-x) + 1."""
    a = np.frombuffer(a_bytes).reshape(s, s)
    b = np.frombuffer(b_bytes)
    coefficients, power = [1.0], np.ones(s)
    for _ in range(s):
        coefficients.append(float(b @ power))
        power = a @ power
    in_x = np.array(coefficients) * (-1.0) ** np.arange(s + 1)   # R(-x), ascending powers
    candidates = []
    for shift in (-1.0, 1.0):
        poly = in_x.copy()
        poly[0] += shift
        roots = np.roots(np.trim_zeros(poly[::-1], "f"))
        real = roots[np.abs(roots.imag) < 1e-9].real
        candidates += [r for r in real if r > 1e-6]
    return float(min(candidates)) if candidates else 30.0


def stability_boundary(tableau: ButcherTableau) -> float:
    """Largest x with |R(-x')| <= 1 for all 0 < x' < x (real stability interval)."""
    return _boundary(tableau.a.tobytes(), tableau.b.tobytes(), tableau.num_stages)


def _stage_pair(tableau: ButcherTableau) -> tuple[int, int] | None:
    """Indices (i, j) of the last two stages sharing a node, or None."""
    c = tableau.c
    for j in range(len(c) - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            if c[i] == c[j]:
                return i, j
    return None


def is_stiff_stages(tableau: ButcherTableau, h: jax.Array, stages: tuple,
                    scale: Pytree) -> jax.Array:
    """Hairer's test on the stages ``(k_1, ..., k_s)`` of a step of size ``h``
    (no evaluations), in the norm weighted by ``scale`` (a pytree like the
    state, the error control's ``atol + rtol |y|``). Uses the last two
    stages at the same node (dopri5, tsit5: the 6th and 7th; dopri8: the
    12th and 13th); without such a pair, the step's end points. The stage
    arguments' difference is the linear combination ``h sum_l (a[j, l] -
    a[i, l]) k_l``, unrolled like the step; both differences are divided by
    the scale once, after they are formed (one kernel, not one a stage).
    """
    pair = _stage_pair(tableau)
    i, j = pair if pair is not None else (0, len(tableau.c) - 1)
    weights = tableau.a[j] - tableau.a[i] if pair is not None else tableau.b
    weigh = lambda tree: jax.tree.map(
        lambda v, w: lax.div(v, lax.convert_element_type(w, v.dtype)), tree, scale)
    dk = weigh(jax.tree.map(lambda a, b: lax.sub(b, a), stages[i], stages[j]))
    # A verdict, not a function of the parameters.
    dy = weigh(combine(None, h, weights, stages))
    return _decaying_beyond(tableau, *lax.stop_gradient((h, dk, dy)))


def _decaying_beyond(tableau: ButcherTableau, h: jax.Array, dk: Pytree, dy: Pytree) -> jax.Array:
    """|h lambda| past the threshold along a decaying mode (Re <dk, dy> < 0)."""
    def dot(u: Pytree, v: Pytree) -> jax.Array:   # Re <u, v>
        def leaf(a, b):
            product = lax.mul(lax.conj(a), b) if jnp.iscomplexobj(a) else lax.mul(a, b)
            return lax.convert_element_type(ops.total(lax.real(product) if jnp.iscomplexobj(a)
                                                      else product), h.dtype)
        return functools.reduce(lax.add, map(leaf, jax.tree.leaves(u), jax.tree.leaves(v)))
    num, den, cross = dot(dk, dk), dot(dy, dy), dot(dy, dk)
    positive = lax.gt(den, ops.cast(0, den))
    ratio = lax.div(num, ops.select(positive, den, 1.0))
    h_lam = ops.select(positive, lax.mul(lax.abs(h), lax.sqrt(ratio)), 0.0)
    return lax.bitwise_and(lax.gt(h_lam, ops.cast(threshold(tableau), h_lam)),
                           lax.lt(cross, ops.cast(0, cross)))


def threshold(tableau: ButcherTableau) -> float:
    """|h lambda| above which a step counts as limited by stability."""
    return BOUNDARY_FRACTION * stability_boundary(tableau)
