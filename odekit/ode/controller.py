"""Error norms, the PI step-size controller and the initial step size.

Error norm (Hairer, Norsett & Wanner, Solving ODEs I, eq. II.4.11): with
``scale = atol + rtol * max(|y0|, |y1|)``,

    err = sqrt(mean((e / scale)^2))          over every element of every leaf,

and for Dormand-Prince 8(5,3) the combined estimate of DOP853 (ibid.,
Sec. II.10): ``err = e5^2 / sqrt(e5^2 + 0.01 e3^2)`` with e5, e3 the norms of
the 5th- and 3rd-order estimates.

PI controller (Gustafsson 1991; Hairer, Norsett & Wanner, Sec. II.4, and the
defaults of Hairer's dopri5.f, beta = 0.04 for k = 5): with k the exponent
order (error_order + 1),

    h_new = h * clip(safety * err^(-beta1) * err_prev^(beta2), dfactor, ifactor)

beta2 = 0.2 / k, beta1 = 1 / k - 0.75 beta2; after a rejected step the step
does not grow. A step is accepted when err <= 1.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Pytree = Any

SAFETY = 0.9
IFACTOR = 10.0   # largest growth factor
DFACTOR = 0.2    # smallest shrink factor
BETA2_NUMERATOR = 0.2


class Tolerance(NamedTuple):
    """Relative and absolute tolerance (Python floats or arrays)."""

    rtol: Any
    atol: Any


def _sum_squares(tree: Pytree) -> tuple[jax.Array, int]:
    """Sum of |x|^2 over every element, in the widest real dtype of the leaves
    (a pytree may mix float32 and float64 leaves)."""
    leaves = jax.tree.leaves(tree)
    real = np.result_type(*(jnp.finfo(jnp.result_type(leaf)).dtype for leaf in leaves))
    total, count = jnp.zeros((), real), 0
    for leaf in leaves:
        total = total + jnp.sum(jnp.real(leaf * jnp.conj(leaf))).astype(real)
        count += leaf.size
    return total, count


def scaled(err: Pytree, y0: Pytree, y1: Pytree, tol: Tolerance) -> Pytree:
    """Each error leaf divided by ``atol + rtol * max(|y0|, |y1|)``; an exact
    zero error counts as zero even where the scale is zero (``atol=0`` on a
    component that stays 0), any other error over a zero scale as inf."""
    def leaf(e, a, b):
        scale = (tol.atol + tol.rtol * jnp.maximum(jnp.abs(a), jnp.abs(b))).astype(e.dtype)
        if tol.atol > 0:
            return e / scale
        return jnp.where(e == 0, jnp.zeros_like(e), e / jnp.where(scale == 0, 0.0, scale).astype(e.dtype))
    return jax.tree.map(leaf, err, y0, y1)


def rms(tree: Pytree) -> jax.Array:
    """Root mean square over all elements of all leaves (real scalar)."""
    total, count = _sum_squares(tree)
    return jnp.sqrt(total / max(count, 1))


def error_norm(error: Pytree, error_secondary: Pytree, y0: Pytree, y1: Pytree,
               tol: Tolerance) -> jax.Array:
    """Scaled RMS norm of the local error estimate (DOP853 form when two)."""
    e5 = rms(scaled(error, y0, y1, tol))
    if error_secondary is None:
        return e5
    e3 = rms(scaled(error_secondary, y0, y1, tol))
    denom = jnp.sqrt(e5 * e5 + 0.01 * e3 * e3)
    # 0 / 0 -> 0 (a perfect step); nan stays nan so that the step is rejected.
    return jnp.where(denom == 0, 0.0, e5 * e5 / jnp.where(denom == 0, 1.0, denom))


def lost_to_rounding(y0: Pytree, y1: Pytree, f0: Pytree, h: jax.Array) -> Pytree:
    """The part of a step that rounding swallowed: ``h f0_i`` on the components
    the step left bit-for-bit unchanged (``y1_i == y0_i``), 0 elsewhere. When
    ``h f`` falls below half an ulp of ``y`` (a tolerance below the dtype's
    precision), every step loses it; summed over the steps (with its sign,
    so that rounding noise in ``f`` averages out) it is the change the solve
    failed to make. A pytree like ``y``.

    Only a change rounding can explain counts: ``|h f0_i| <= eps |y0_i|``.
    A larger ``h f0_i`` on an unchanged component is the method's own doing
    (an explicit step at its stability limit near an equilibrium, whose
    stages cancel), not a loss to rounding."""
    def leaf(a, b, f):
        change = h.astype(f.dtype) * f
        ulp = jnp.finfo(a.dtype).eps * jnp.abs(a)
        return jnp.where((b == a) & (jnp.abs(change) <= ulp), change, 0)
    return jax.tree.map(leaf, y0, y1, f0)


def stalled(drift: Pytree, y: Pytree, tol: Tolerance) -> jax.Array:
    """Whether the accumulated lost change exceeds the tolerance on some
    component: ``max_i |drift_i| / (atol + rtol |y_i|) > 1`` (bool scalar)."""
    def leaf(d, a):
        scale = tol.atol + tol.rtol * jnp.abs(a)
        return jnp.any(jnp.abs(d) > scale)
    return functools.reduce(jnp.logical_or, jax.tree.leaves(jax.tree.map(leaf, drift, y)))


def propose_step(h: jax.Array, err: jax.Array, err_prev: jax.Array,
                 exponent_order: int, accepted: jax.Array,
                 previous_rejected: jax.Array) -> jax.Array:
    """Next step size from the PI rule; ``err`` may be nan (then shrink hard)."""
    k = float(exponent_order)
    beta2 = BETA2_NUMERATOR / k
    beta1 = 1.0 / k - 0.75 * beta2
    finite = jnp.isfinite(err)
    safe_err = jnp.where(finite & (err > 0), err, 1.0)
    # One exp of a sum of logs, not two powers: XLA's CPU backend inlines exp
    # and log but calls libm for pow, which is a measurable part of a step.
    factor = SAFETY * jnp.exp(beta2 * jnp.log(jnp.maximum(err_prev, 1e-4)) - beta1 * jnp.log(safe_err))
    factor = jnp.where(err == 0, IFACTOR, factor)
    factor = jnp.where(accepted, factor, jnp.minimum(factor, 1.0))
    factor = jnp.where(accepted & previous_rejected, jnp.minimum(factor, 1.0), factor)
    factor = jnp.clip(factor, DFACTOR, IFACTOR)
    factor = jnp.where(finite, factor, DFACTOR)
    return h * factor.astype(h.dtype)


def initial_step(func: Callable, t0: jax.Array, y0: Pytree, f0: Pytree,
                 order: int, tol: Tolerance) -> jax.Array:
    """Starting step size (Hairer, Norsett & Wanner, Solving ODEs I, II.4, p. 169).

    Returns a positive scalar of the dtype of ``t0``; costs one evaluation.
    """
    scale = lambda y: jax.tree.map(lambda v: tol.atol + tol.rtol * jnp.abs(v), y)
    divide = lambda u, s: jax.tree.map(lambda a, b: a / b.astype(a.dtype), u, s)
    s0 = scale(y0)
    norm = lambda tree: rms(tree).astype(t0.dtype)
    d0, d1 = norm(divide(y0, s0)), norm(divide(f0, s0))
    h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0))
    h0 = h0.astype(t0.dtype)
    y1 = jax.tree.map(lambda y, f: y + h0.astype(f.dtype) * f, y0, f0)
    f1 = func(y1, t0 + h0)
    df = jax.tree.map(lambda a, b: a - b, f1, f0)
    d2 = norm(divide(df, s0)) / h0
    dmax = jnp.maximum(d1, d2)
    h1 = jnp.where(dmax <= 1e-15, jnp.maximum(1e-6, h0 * 1e-3),
                   (0.01 / jnp.where(dmax > 0, dmax, 1.0)) ** (1.0 / (order + 1.0)))
    return jnp.minimum(100.0 * h0, h1.astype(t0.dtype))
