"""The fitted atanh tail polynomials stay within eps / 8 of 2 atanh(s) / s - 2."""
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest

from odekit.special import _elementary
from odekit.special._coefficients import ATANH_TAIL_FITS


def _true_tail(s: float):
    s = mpmath.mpf(s)
    return 2 * mpmath.atanh(s) / s - 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stored_fit_error_below_eps_over_8(dtype):
    radius, coefficients = ATANH_TAIL_FITS[np.dtype(dtype)]
    with mpmath.workdps(40):
        worst = 0
        for s in np.linspace(radius / 1000, radius, 1000):
            w = mpmath.mpf(float(s)) ** 2
            fit = sum(mpmath.mpf(float(np.asarray(c, dtype))) * w ** (k + 1)
                      for k, c in enumerate(coefficients))
            worst = max(worst, abs(fit - _true_tail(float(s))) / 2)
    assert worst <= np.finfo(dtype).eps / 8, f"{np.dtype(dtype).name}: {float(worst):.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_atanh_tail_uses_the_shorter_polynomial(dtype):
    radius, fitted = ATANH_TAIL_FITS[np.dtype(dtype)]
    assert _elementary._atanh_tail_coefficients(dtype, radius) == list(fitted)
    # a small radius keeps the (then shorter) Taylor series
    small = _elementary._atanh_tail_coefficients(dtype, 0.05)
    assert len(small) < len(fitted) and small[0] == pytest.approx(2 / 3)
    # beyond the fit's radius only the Taylor series is valid
    wide = _elementary._atanh_tail_coefficients(dtype, 0.6)
    assert wide[:2] == pytest.approx([2 / 3, 2 / 5])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_atanh_tail_values(dtype):
    s = np.random.default_rng(1).uniform(-0.5, 0.5, 300).astype(dtype)
    got = np.asarray(_elementary.atanh_tail(jnp.asarray(s), 0.5), np.float64)
    want = np.array([float(_true_tail(float(v))) for v in s])
    # R is added to 2: its error counts relative to 2 + R
    assert np.max(np.abs(got - want) / (2 + want)) <= np.finfo(dtype).eps / 2
