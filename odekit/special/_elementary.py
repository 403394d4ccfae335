"""Accurate elementary kernels shared by the logistic functions (private).

XLA's own kernels on CPU are not accurate enough for a 2-ulp contract: its
``exp`` errs by up to ~1.7 ulp in float64 and its ``log1p`` by ~2.4 ulp on
[0, 1] (and ~128 ulp on [-0.6, -0.3] in float64). These replacements use
only adds, multiplies, one division and bit manipulation, so XLA fuses them
and cannot simplify them away:

* ``exp_kernel`` (for y <= 0): Cody-Waite reduction ``y = k ln2 + r``, |r| <= ln2 / 2,
  Taylor polynomial for ``exp(r)``, scaling by ``2**k`` built from bits
  (Cody & Waite, *Software Manual for the Elementary Functions*, 1980).
* ``atanh_tail``: ``R(s) = 2 atanh(s) / s - 2 = sum_k 2 s^(2k) / (2k + 1)``,
  the series behind fdlibm's ``log1p`` (``log1p(f) = 2 atanh(f / (2 + f))``),
  or the shorter fitted polynomial of ``_coefficients`` where it covers ``|s|``.
* ``one_plus``: ``1 + e = hi + lo`` exactly for ``e`` in [0, 1], as
  ``lo = (1 - hi) + e`` (both steps exact by Sterbenz's lemma). The textbook
  Fast2Sum ``e - (hi - 1)`` must not be used: XLA rewrites ``(1 + e) - 1`` to
  ``e`` under ``jit`` and it silently returns ``lo = 0``. The jit tests guard
  the form used here.
* ``log1p_unit``: ``log1p(e)`` for ``e`` in [0, 1] in fdlibm's form
  ``f - (f^2/2 - s (f^2/2 + R))``, whose leading term is exact; for
  ``e >= 1/2`` it uses ``log1p(e) = ln2 + log1p((e - 1) / 2)`` (``e - 1`` is
  exact there by Sterbenz's lemma).

All take and return arrays of one floating dtype (float32 or float64).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit.special._coefficients import ATANH_TAIL_FITS


class _Constants(NamedTuple):
    ln2_hi: float      # ln 2 rounded so that k * ln2_hi is exact for |k| <= 2**11
    ln2_lo: float      # ln 2 - ln2_hi
    exp_degree: int    # Taylor degree of exp on |r| <= ln2 / 2
    int_dtype: type    # integer type of the same width
    mantissa_bits: int
    exponent_bias: int
    min_exponent: int  # exponent of the smallest normal number


_CONSTANTS = {
    np.dtype(np.float64): _Constants(6.93147180369123816490e-01, 1.90821492927058770002e-10,
                                     13, np.int64, 52, 1023, -1022),
    np.dtype(np.float32): _Constants(6.93145751953125e-01, 1.428606765330187045e-06,
                                     7, np.int32, 23, 127, -126),
}


def constants(dtype) -> _Constants:
    """The per-dtype constants; only float32 and float64 are supported."""
    return _CONSTANTS[np.dtype(dtype)]


def _horner(z: jax.Array, coefficients: list[float]) -> jax.Array:
    """sum_k coefficients[k] z^k by Horner's rule."""
    acc = jnp.full_like(z, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * z + c
    return acc


def _atanh_terms(dtype, s_max: float) -> int:
    """Terms of ``atanh_tail`` that make the truncation below eps / 8 for |s| <= s_max."""
    eps = float(np.finfo(dtype).eps)
    k = 1
    while s_max ** (2 * k + 2) / (2 * k + 3) > eps / 8:
        k += 1
    return k


def exp_kernel(y: jax.Array) -> jax.Array:
    """exp(y) for y <= 0 to about 0.9 ulp; 0 below the normal range, nan stays nan."""
    c = constants(y.dtype)
    k = jnp.maximum(jnp.round(y * (1 / math.log(2))), c.min_exponent)
    r = (y - k * c.ln2_hi) - k * c.ln2_lo
    p = _horner(r, [1 / math.factorial(n) for n in range(c.exp_degree + 1)])
    bits = (k.astype(c.int_dtype) + c.exponent_bias) << c.mantissa_bits
    value = p * lax.bitcast_convert_type(bits, y.dtype)
    return jnp.where(y < math.log(float(np.finfo(y.dtype).tiny)), 0, value).astype(y.dtype)


def _atanh_tail_coefficients(dtype, s_max: float) -> list[float]:
    """c with R(s) = sum_k c[k] s^(2k+2) to eps / 8 for |s| <= s_max: the shorter of
    the Taylor series and the fitted polynomial (when its radius covers s_max)."""
    taylor = [2 / (2 * k + 3) for k in range(_atanh_terms(dtype, s_max))]
    radius, fitted = ATANH_TAIL_FITS[np.dtype(dtype)]
    if s_max <= radius and len(fitted) < len(taylor):
        return list(fitted)
    return taylor


def atanh_tail(s: jax.Array, s_max: float) -> jax.Array:
    """R(s) = 2 atanh(s) / s - 2 = 2 s^2 / 3 + 2 s^4 / 5 + ...  for |s| <= s_max."""
    z = s * s
    return z * _horner(z, _atanh_tail_coefficients(s.dtype, s_max))


def one_plus(e: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(hi, lo) with hi = fl(1 + e) and hi + lo = 1 + e exactly, for e in [0, 1]."""
    hi = 1 + e
    return hi, (1 - hi) + e


def log1p_unit(e: jax.Array) -> jax.Array:
    """log1p(e) for e in [0, 1] to about 1 ulp (see the module docstring)."""
    c = constants(e.dtype)
    upper = e >= 0.5
    f = jnp.where(upper, (e - 1) * 0.5, e)          # f in [-1/4, 1/2)
    s = f / (2 + f)                                  # |s| <= 1/5
    hfsq = 0.5 * f * f
    log1p_f = f - (hfsq - s * (hfsq + atanh_tail(s, 0.2)))
    return jnp.where(upper, c.ln2_hi + (log1p_f + c.ln2_lo), log1p_f)
