"""Fit the polynomials stored in odekit/special/_coefficients.py (run by hand; needs mpmath).

R(s) = 2 atanh(s) / s - 2 = sum_k c_k w^(k+1) with w = s^2 is fitted by linear
least squares at Chebyshev nodes of w in [0, radius^2] in 120-bit arithmetic
(mpmath.qr_solve), then the coefficients are rounded to the target dtype.
Least squares at Chebyshev nodes is within a small factor of the minimax
polynomial, far shorter than the Taylor series at the same radius. Prints
each fit's worst error of ``R / 2`` (the relative error it adds to
``2 atanh(s)``) after rounding.

    python tools/fit_atanh_tail.py
"""
from __future__ import annotations

import mpmath
import numpy as np

mpmath.mp.prec = 120

# dtype -> (radius, number of coefficients), as stored in _coefficients.py
FITS = {np.float32: (0.5, 6), np.float64: (0.5, 13)}


def tail_over_w(w):
    s = mpmath.sqrt(w)
    return (2 * mpmath.atanh(s) / s - 2) / w


def fit(w_max, terms: int, nodes: int = 300) -> list:
    ws = [w_max * (1 - mpmath.cos(mpmath.pi * (i + mpmath.mpf(0.5)) / nodes)) / 2
          for i in range(nodes)]
    a, b = mpmath.matrix(nodes, terms), mpmath.matrix(nodes, 1)
    for i, w in enumerate(ws):
        for j in range(terms):
            a[i, j] = w ** (j + 1)
        b[i] = tail_over_w(w) * w
    solution = mpmath.qr_solve(a, b)[0]
    return [solution[j] for j in range(terms)]


def worst_error(w_max, coefficients) -> float:
    ws = [w_max * mpmath.mpf(i) / 4000 for i in range(1, 4001)]
    return float(max(abs(sum(c * w ** (j + 1) for j, c in enumerate(coefficients))
                         - tail_over_w(w) * w) for w in ws) / 2)


def main() -> None:
    for dtype, (radius, terms) in FITS.items():
        w_max = mpmath.mpf(radius) ** 2
        rounded = [float(np.asarray(float(c), dtype)) for c in fit(w_max, terms)]
        print(f"{np.dtype(dtype).name}: radius {radius}, worst error "
              f"{worst_error(w_max, rounded):.3g} (eps/8 = {np.finfo(dtype).eps / 8:.3g})")
        print("    (" + ",\n     ".join(repr(c) for c in rounded) + ")")


if __name__ == "__main__":
    main()
