"""Fitted polynomial coefficients of the special functions (data, private).

``ATANH_TAIL_FITS[dtype] = (radius, c)`` gives, for ``|s| <= radius``,

    R(s) = 2 atanh(s) / s - 2  ~  sum_k c[k] w^(k+1),   w = s^2,

fitted by least squares at 300 Chebyshev nodes of ``w`` in ``[0, radius^2]``
in 120-bit arithmetic and rounded to the dtype (``tools/fit_atanh_tail.py``
reproduces them). The worst error of ``R / 2``, which is the relative error
the fit adds to ``2 atanh(s)``, is 3.8e-9 in float32 and 8.6e-18 in float64,
below eps / 8 in both (``tests/special/test_coefficients.py`` checks it
against mpmath). For the same bound at radius 1/2 the Taylor series needs 10
terms in float32 and 24 in float64; these fits need 6 and 13.
"""
from __future__ import annotations

import numpy as np

ATANH_TAIL_FITS: dict[np.dtype, tuple[float, tuple[float, ...]]] = {
    np.dtype(np.float32): (0.5, (
        0.6666659712791443,
        0.4000508785247803,
        0.2844480276107788,
        0.23652051389217377,
        0.1025795042514801,
        0.3535378873348236)),
    np.dtype(np.float64): (0.5, (
        0.6666666666666801,
        0.39999999999586033,
        0.2857142861629174,
        0.22222219771974258,
        0.18181897014614845,
        0.153829900790574,
        0.13355869723247132,
        0.11549023516923787,
        0.11963181561586197,
        0.029201013965084496,
        0.2896622445795603,
        -0.3054924608678181,
        0.44935519833792165)),
}
