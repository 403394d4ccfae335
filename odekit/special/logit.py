"""logit, the inverse of the logistic sigmoid.

``logit(p) = log(p / (1 - p)) = 2 atanh(z)`` with ``z = 2p - 1``, which is
exact for p in [1/4, 1] (Sterbenz's lemma). Near p = 1/2, where
``log(p) - log(1 - p)`` cancels, the series ``2 atanh(z) = 2z + z R(z)`` is
used (``R`` from ``_elementary.atanh_tail``); elsewhere
``logit(p) = log(p / (1 - p))``, where ``|logit(p)| >= log 3``, so the two
roundings of the ratio cost well under an ulp of the result. ``1 - p`` is
exact for p >= 1/2, so the right tail is resolved down to ``1 - p = eps / 2``.
The derivative is ``logit'(p) = 1 / (p (1 - p))`` and
``logit''(p) = (2p - 1) logit'(p)^2``, which has no cancellation at p = 1/2
and overflows to inf (not nan) where the true value does. Outside [0, 1]
logit and all its derivatives are nan.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from odekit.special import _elementary as el
from odekit.special._dtypes import define_jvp, evaluate

__all__ = ["logit"]

# Largest |2p - 1| handled by the series. Beyond it |logit(p)| >= log 3: the
# ratio branch then never lands in the binade [1/2, 1), where the roundings of
# 1 - p and of the ratio plus XLA's logarithm would add up to 2 ulp.
_SERIES_RADIUS = 0.5


def _logit_kernel(p: jax.Array) -> jax.Array:
    z = 2 * p - 1
    near_half = 2 * z + z * el.atanh_tail(z, _SERIES_RADIUS)   # 2z exact: one rounding
    tails = jnp.log(p / (1 - p))
    return jnp.where(jnp.abs(z) <= _SERIES_RADIUS, near_half, tails)


@jax.custom_jvp
def logit(p: ArrayLike) -> jax.Array:
    """The log-odds ``logit(p) = log(p / (1 - p))``, inverse of :func:`expit`.

    Args:
      p: real array of probabilities.

    Returns:
      An array of p's floating dtype, within 2 ulp; ``-inf`` at 0, ``+inf``
      at 1, nan outside [0, 1]. The derivative ``1 / (p (1 - p))`` is
      within 4 ulp.
    """
    return evaluate(_logit_kernel, p)


def _logit_prime_kernel(p: jax.Array) -> jax.Array:
    # 1 / (p (1 - p)) is finite outside [0, 1], where logit (and so its slope) is nan.
    inside = (p >= 0) & (p <= 1)
    return jnp.where(inside, 1 / (p * (1 - p)), jnp.nan)


@jax.custom_jvp
def _logit_prime(p: ArrayLike) -> jax.Array:
    """logit'(p) = 1 / (p (1 - p)) on [0, 1] (inf at the ends), nan outside like logit."""
    return evaluate(_logit_prime_kernel, p)


define_jvp(logit, _logit_prime)
define_jvp(_logit_prime, lambda p: (2 * p - 1) * _logit_prime(p) ** 2)
