"""Small arithmetic helpers over ``jax.lax`` primitives, for code traced on
every solve (the ODE loop, its controller and outputs, the failure check).

Why not ``jax.numpy`` there: every ``jax.numpy`` function and every operator
on a traced array is a jitted wrapper. Under a trace each call is a cache
lookup, and each new signature (shapes, dtypes, weak types) a trace of its
own, which ``jax.clear_caches()`` drops and every first call pays again.
A solve traces a few hundred such calls (measured:
``benchmarks/results/pendulum_notes.md``); these helpers bind the
primitives directly.

``lax`` does not promote: both operands of a binary primitive must have the
same dtype. :func:`cast` gives a Python number (or an array) the dtype of
the array it meets; the helpers below do it for their scalar operands.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import lax


def cast(value: Any, like: Any) -> Any:
    """``value`` in the dtype of ``like``: a NumPy scalar for a Python number
    (a literal in the jaxpr), else ``lax.convert_element_type``."""
    dtype = like.dtype if hasattr(like, "dtype") else np.result_type(like)
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return np.asarray(value, dtype)
    return lax.convert_element_type(value, dtype)


def select(pred: Any, on_true: Any, on_false: Any) -> jax.Array:
    """``where(pred, on_true, on_false)`` for a scalar ``pred`` (or one of the
    operands' shape); a Python number takes the other operand's dtype and shape."""
    if not hasattr(on_true, "dtype"):
        on_true = lax.full_like(on_false, on_true)
    elif not hasattr(on_false, "dtype"):
        on_false = lax.full_like(on_true, on_false)
    return lax.select(pred, on_true, on_false)


def minimum(a: Any, b: Any) -> jax.Array:
    """Elementwise min; a Python number takes the other operand's dtype."""
    return lax.min(a, cast(b, a)) if hasattr(a, "dtype") else lax.min(cast(a, b), b)


def all_of(x: jax.Array) -> jax.Array:
    """``x.all()`` over every axis (bool scalar)."""
    return lax.reduce_and(x, tuple(range(np.ndim(x)))) if np.ndim(x) else x


def any_of(x: jax.Array) -> jax.Array:
    """``x.any()`` over every axis (bool scalar)."""
    return lax.reduce_or(x, tuple(range(np.ndim(x)))) if np.ndim(x) else x


def total(x: jax.Array) -> jax.Array:
    """``x.sum()`` over every axis, in ``x``'s dtype."""
    return lax.reduce_sum(x, tuple(range(np.ndim(x)))) if np.ndim(x) else x


def is_finite(x: jax.Array) -> jax.Array:
    """Elementwise ``isfinite`` for real and complex arrays."""
    if np.issubdtype(x.dtype, np.complexfloating):
        return lax.bitwise_and(lax.is_finite(lax.real(x)), lax.is_finite(lax.imag(x)))
    return lax.is_finite(x)


def abs_squared(x: jax.Array) -> jax.Array:
    """``|x|^2`` elementwise, real (``re^2 + im^2`` for a complex ``x``)."""
    if np.issubdtype(x.dtype, np.complexfloating):
        re, im = lax.real(x), lax.imag(x)
        return lax.add(lax.mul(re, re), lax.mul(im, im))
    return lax.mul(x, x)


def row(x: jax.Array, i: jax.Array) -> jax.Array:
    """``x[i]`` for an integer scalar ``0 <= i < len(x)`` (clamped otherwise)."""
    zero = np.zeros((), i.dtype if hasattr(i, "dtype") else np.asarray(i).dtype)
    piece = lax.dynamic_slice(x, (i,) + (zero,) * (x.ndim - 1), (1,) + x.shape[1:],
                              allow_negative_indices=False)
    return lax.reshape(piece, x.shape[1:])


def put_row(x: jax.Array, value: jax.Array, i: jax.Array) -> jax.Array:
    """``x.at[i].set(value)`` for an integer scalar ``0 <= i < len(x)``."""
    zero = np.zeros((), i.dtype if hasattr(i, "dtype") else np.asarray(i).dtype)
    update = lax.reshape(lax.convert_element_type(value, x.dtype), (1,) + x.shape[1:])
    return lax.dynamic_update_slice(x, update, (i,) + (zero,) * (x.ndim - 1),
                                    allow_negative_indices=False)
