"""200-bit mpmath references for odekit.special, tabulated once per process.

Tests get them through the ``reference`` fixture (``reference.table``,
``reference.ulp_error``).

A reference value is stored as a float64 pair ``hi + lo`` so that errors in
ulps are computed without a float128 type: ``|(got - hi) - lo| / ulp(ref)``.
"""
from __future__ import annotations

import functools
import types

import mpmath
import numpy as np
import pytest

from odekit.testing.special_domains import accuracy_grid

mpmath.mp.prec = 200

N_LOG = 500     # log-spaced magnitudes per sign
N_DENSE = 801  # points of the dense grids


def _expit(x):
    return 1 / (1 + mpmath.exp(-x))


# name -> (value, first derivative, second derivative) as mpmath functions
FUNCTIONS = {
    "expit": (_expit,
              lambda x: _expit(x) * _expit(-x),
              lambda x: _expit(x) * _expit(-x) * (1 - 2 * _expit(x))),
    "log_expit": (lambda x: -mpmath.log1p(mpmath.exp(-x)),
                  lambda x: _expit(-x),
                  lambda x: -_expit(x) * _expit(-x)),
    "softplus": (lambda x: mpmath.log1p(mpmath.exp(x)),
                 _expit,
                 lambda x: _expit(x) * _expit(-x)),
    "logit": (lambda p: mpmath.log(p / (1 - p)),
              lambda p: 1 / (p * (1 - p)),
              lambda p: (2 * p - 1) / (p * (1 - p)) ** 2),
}


def grid(name: str, dtype) -> np.ndarray:
    """The points of the issue's accuracy contract for ``name`` in ``dtype``."""
    return accuracy_grid(name, dtype, N_LOG, N_DENSE)


@functools.lru_cache(maxsize=None)
def table(name: str, dtype_name: str, order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(points, hi, lo) of the ``order``-th derivative of ``name`` on its grid."""
    dtype = np.dtype(dtype_name)
    x = grid(name, dtype)
    fun = FUNCTIONS[name][order]
    hi = np.empty(x.shape)
    lo = np.empty(x.shape)
    for i, xi in enumerate(x):
        ref = fun(mpmath.mpf(float(xi)))
        hi[i] = float(ref)                      # inf where the truth overflows
        lo[i] = float(ref - hi[i]) if np.isfinite(hi[i]) else 0.0
    return x, hi, lo


def ulp_error(got: np.ndarray, hi: np.ndarray, lo: np.ndarray, dtype) -> np.ndarray:
    """|got - ref| in units of the ulp of ref rounded to ``dtype``."""
    ref = (hi + lo).astype(dtype)
    spacing = np.spacing(np.abs(ref)).astype(np.float64)
    return np.abs((np.asarray(got, np.float64) - hi) - lo) / spacing


@pytest.fixture(scope="session")
def reference() -> types.SimpleNamespace:
    """The tables and the ulp measure of this module."""
    return types.SimpleNamespace(table=table, ulp_error=ulp_error, grid=grid)
