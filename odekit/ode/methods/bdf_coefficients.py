"""Coefficients of the variable-order BDF / NDF methods, as data.

The methods of orders k = 1..5 in backward-difference form (Shampine &
Reichelt, "The MATLAB ODE Suite", SIAM J. Sci. Comput. 18(1), 1997, Sec. 2.3;
the form SciPy's ``BDF`` uses). With ``nabla^j y_{n+1}`` the backward
differences of the solution on an equally spaced grid of step h, and

    gamma_k = sum_{j=1}^{k} 1 / j,        alpha_k = (1 - kappa_k) gamma_k,

the step of order k solves for ``y_{n+1} = y_pred + d``:

    d - (h / alpha_k) f(t_{n+1}, y_pred + d) + psi = 0,
    psi = (1 / alpha_k) sum_{j=1}^{k} gamma_j D_j,     y_pred = sum_{j=0}^{k} D_j,

where ``D_j = nabla^j y_n`` (the history) and d is the (k+1)-th difference
``nabla^{k+1} y_{n+1}`` of the new point. The local error is estimated as

    err = (kappa_k gamma_k + 1 / (k + 1)) d           (ERROR_CONST[k] * d).

``kappa = 0`` gives the classical BDFs; Klopfenstein and Shampine's numerical
differentiation formulas (NDFs) take ``kappa = (-0.1850, -1/9, -0.0823,
-0.0415, 0)``: for orders 1-4 a smaller error constant (the same accuracy
with larger steps) at a small cost in stability angle (Shampine & Reichelt,
Table 1: 90, 90, 80, 66, 51 degrees against BDF's 90, 90, 86, 73, 51).
MATLAB's ode15s and SciPy's BDF use the NDFs by default, and so does odekit.
"""
from __future__ import annotations

import dataclasses

import numpy as np

MAX_ORDER = 5

#: Shampine & Reichelt (1997), Table 1: the NDF's kappa for orders 1..5.
NDF_KAPPA = (-0.1850, -1.0 / 9.0, -0.0823, -0.0415, 0.0)


@dataclasses.dataclass(frozen=True, eq=False)
class BDFCoefficients:
    """The coefficients of the order-k formulas, indexed by k = 0..MAX_ORDER
    (entry 0 is padding, so that ``array[k]`` is order k's).

    Attributes:
      name: ``"ndf"`` or ``"bdf"``.
      kappa: (6,) the NDF modification per order (0: the classical BDF).
      gamma: (6,) ``gamma_k = sum_{j<=k} 1/j`` (gamma_0 = 0).
      alpha: (6,) ``(1 - kappa_k) gamma_k``.
      error_const: (6,) ``kappa_k gamma_k + 1/(k+1)``: the local error of
        order k is ``error_const[k] * d``.
    """

    name: str
    kappa: np.ndarray
    gamma: np.ndarray
    alpha: np.ndarray
    error_const: np.ndarray

    @property
    def order(self) -> int:
        """The highest order."""
        return MAX_ORDER


def _build(name: str, kappa: tuple) -> BDFCoefficients:
    kappa_full = np.concatenate([[0.0], np.asarray(kappa, np.float64)])
    gamma = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, MAX_ORDER + 1))])
    alpha = (1.0 - kappa_full) * gamma
    error_const = kappa_full * gamma + 1.0 / np.arange(1, MAX_ORDER + 2)
    arrays = [kappa_full, gamma, alpha, error_const]
    for a in arrays:
        a.setflags(write=False)
    return BDFCoefficients(name, *arrays)


#: The numerical differentiation formulas (the default of method="bdf").
NDF = _build("ndf", NDF_KAPPA)
#: The classical backward differentiation formulas.
BDF = _build("bdf", (0.0,) * MAX_ORDER)
