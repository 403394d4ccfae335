"""The logistic sigmoid and its logarithms: expit, log_expit, softplus.

With ``e = exp(-|x|)`` (never overflows) the functions are

* ``expit(x) = 1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` for x < 0;
* ``softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(e)``;
* ``log_expit(x) = -softplus(-x) = min(x, 0) - log1p(e)``;
* ``expit'(x) = e / (1 + e)^2 = e / (1 + e (2 + e))`` and
  ``expit''(x) = -expit'(x) tanh(x / 2)``.

``1 + e`` is split exactly into ``hi + lo`` and the quotient corrected,
``q / (1 + lo / hi) ~ q - q lo / hi``, which removes the rounding of the sum;
``exp`` and ``log1p`` are the accurate kernels of ``_elementary``. Derivatives
are ``softplus' = expit``, ``log_expit'(x) = expit(-x)``, ``expit' = _expit_prime``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from odekit.special import _elementary as el
from odekit.special._dtypes import define_jvp, evaluate

__all__ = ["expit", "log_expit", "softplus"]


def _expit_kernel(x: jax.Array) -> jax.Array:
    e = el.exp_kernel(-jnp.abs(x))
    hi, lo = el.one_plus(e)
    positive = x >= 0
    numerator = jnp.where(positive, 1, e)
    # numerator / (hi + lo) = q - numerator lo / hi^2 to working precision.
    # Each division has one user, so XLA fuses the whole kernel into one loop
    # (a quotient with two users made it split the kernel and evaluate exp twice).
    return numerator / hi - (numerator * lo) / (hi * hi)


def _expit_prime_kernel(x: jax.Array) -> jax.Array:
    e = el.exp_kernel(-jnp.abs(x))
    return e / (1 + e * (2 + e))


def _log1p_exp_neg_abs(x: jax.Array) -> jax.Array:
    """log1p(exp(-|x|)), the shared tail of softplus and log_expit."""
    return el.log1p_unit(el.exp_kernel(-jnp.abs(x)))


@jax.custom_jvp
def expit(x: ArrayLike) -> jax.Array:
    """The logistic sigmoid ``expit(x) = 1 / (1 + exp(-x))``.

    Args:
      x: real array (integers are promoted to the default float dtype).

    Returns:
      An array of x's floating dtype in [0, 1]: within 2 ulp, with the
      limits 0 at -inf and 1 at +inf; its derivative ``expit(x) expit(-x)``
      is within 4 ulp and never underflows where the true value is normal.
    """
    return evaluate(_expit_kernel, x)


@jax.custom_jvp
def _expit_prime(x: ArrayLike) -> jax.Array:
    """expit'(x) = expit(x) expit(-x), accurate in both tails."""
    return evaluate(_expit_prime_kernel, x)


@jax.custom_jvp
def softplus(x: ArrayLike) -> jax.Array:
    """``softplus(x) = log(1 + exp(x))``, the smooth ReLU; its derivative is expit.

    Args:
      x: real array.

    Returns:
      An array of x's floating dtype, within 2 ulp; ``softplus(x) = x`` to
      working precision for large x and ``exp(x)`` for very negative x.
    """
    return evaluate(lambda v: jnp.maximum(v, 0) + _log1p_exp_neg_abs(v), x)


@jax.custom_jvp
def log_expit(x: ArrayLike) -> jax.Array:
    """The log-sigmoid ``log_expit(x) = log(expit(x)) = -softplus(-x)``.

    Args:
      x: real array.

    Returns:
      An array of x's floating dtype, <= 0, within 2 ulp; ``x`` to working
      precision for very negative x; the derivative is ``expit(-x)``.
    """
    return evaluate(lambda v: jnp.minimum(v, 0) - _log1p_exp_neg_abs(v), x)


define_jvp(expit, _expit_prime)
define_jvp(_expit_prime, lambda x: -jnp.tanh(0.5 * x) * _expit_prime(x))
define_jvp(softplus, expit)
define_jvp(log_expit, lambda x: expit(-x))
