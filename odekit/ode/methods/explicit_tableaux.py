"""Butcher tableaux of the explicit Runge-Kutta pairs, as self-checking data.

A tableau is a frozen record of float64 NumPy arrays. The generic stepper
computes the stages

    k_i = f(t0 + c_i h, y0 + h sum_j a[i, j] k_j),      i = 0..s-1,

the propagated solution ``y1 = y0 + h sum_i b_i k_i``, the local error
estimate ``h sum_i b_error_i k_i`` (``b_error = b - b_hat``, where ``b_hat``
are the weights of the embedded solution) and the dense output

    y(t0 + theta h) = y0 + h sum_i k_i sum_j dense[i, j] theta**(j + 1).

Dense rows past ``s`` belong to extra stages (DOP853 only) that are evaluated
after an accepted step, with ``c = extra_c`` and coefficients ``extra_a`` over
all earlier stages, the FSAL stage included.

Every tableau checks its own consistency when built (see ``__post_init__``);
the order conditions are checked by ``tests/ode/test_tableaux.py``.
"""
import dataclasses

import numpy as np
from numpy.polynomial import polynomial as _poly


def _tol(terms):
    """Rounding tolerance for a float64 sum of ``terms`` (any shape)."""
    return 1e-14 * (1.0 + float(np.abs(terms).sum()))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class ButcherTableau:
    """An explicit Runge-Kutta pair with an embedded error estimate and dense output.

    Attributes:
      name: lower-case method name, as used by ``method=``.
      order: order of the propagated solution (weights ``b``).
      error_order: order of the embedded solution ``b_hat = b - b_error``.
      c: (s,) nodes.
      a: (s, s) strictly lower triangular stage coefficients.
      b: (s,) weights of the propagated solution.
      b_error: (s,) ``b - b_hat``; the local error estimate is
        ``h * sum_i b_error[i] * k_i``.
      b_error_secondary: (s,) a second, lower-order estimate (DOP853's 3rd-order
        one, for its combined error norm) or None.
      fsal: whether the last stage is ``f(t0 + h, y1)`` and can be reused as the
        first stage of the next step.
      dense: (s + n_extra, p) dense-output matrix, ``b_i(theta) = sum_j
        dense[i, j] * theta**(j + 1)``.
      dense_order: order of the dense output.
      extra_c: (n_extra,) nodes of the extra dense-output stages; default (0,).
      extra_a: (n_extra, s + n_extra) coefficients of the extra stages over all
        earlier stages (strictly lower triangular in the global stage index);
        None (the default) is stored as a (0, s) array.

    Equality and hashing are by identity (the arrays are not hashable), so a
    tableau can be a static argument of ``jax.jit`` or ``custom_vjp``.

    Raises:
      ValueError: when built with inconsistent data; the message names the
        tableau and the broken condition.
    """

    name: str
    order: int
    error_order: int
    c: np.ndarray
    a: np.ndarray
    b: np.ndarray
    b_error: np.ndarray
    b_error_secondary: np.ndarray | None
    fsal: bool
    dense: np.ndarray
    dense_order: int
    extra_c: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    extra_a: np.ndarray | None = None

    def __repr__(self):
        return (f"ButcherTableau({self.name!r}, order={self.order}, "
                f"error_order={self.error_order}, stages={self.num_stages}, "
                f"dense_order={self.dense_order})")

    @property
    def num_stages(self) -> int:
        """Number of stages ``s`` of one step (without the extra dense stages)."""
        return self.b.shape[0]

    def __post_init__(self):
        s = np.shape(self.b)[0] if np.ndim(self.b) == 1 else -1
        n_extra = np.shape(self.extra_c)[0] if np.ndim(self.extra_c) == 1 else -1
        extra_a = np.zeros((0, max(s, 0))) if self.extra_a is None else self.extra_a
        for field, value in [
            ("c", self.c), ("a", self.a), ("b", self.b), ("b_error", self.b_error),
            ("b_error_secondary", self.b_error_secondary), ("dense", self.dense),
            ("extra_c", self.extra_c), ("extra_a", extra_a),
        ]:
            if value is not None:
                value = np.array(value, dtype=np.float64)
                value.setflags(write=False)
            object.__setattr__(self, field, value)
        self._validate(s, n_extra)

    def _fail(self, condition):
        raise ValueError(f"Butcher tableau {self.name!r}: {condition}")

    def _validate(self, s, n_extra):
        shapes = {"c": (s,), "a": (s, s), "b_error": (s,),
                  "extra_a": (n_extra, s + n_extra)}
        if self.b_error_secondary is not None:
            shapes["b_error_secondary"] = (s,)
        if s < 1 or n_extra < 0:
            self._fail("b and extra_c must be one-dimensional, b non-empty")
        for field, shape in shapes.items():
            if getattr(self, field).shape != shape:
                self._fail(f"{field} has shape {getattr(self, field).shape}, "
                           f"expected {shape} for {s} stages and {n_extra} extra")
        if self.dense.ndim != 2 or self.dense.shape[0] != s + n_extra:
            self._fail(f"dense has shape {self.dense.shape}, expected "
                       f"({s + n_extra}, p)")
        if not 0 < self.error_order < self.order or self.dense_order < 1:
            self._fail(f"need 0 < error_order < order and dense_order >= 1, got "
                       f"{self.error_order}, {self.order}, {self.dense_order}")
        # Explicit: every stage uses only earlier ones (global stage index).
        a_all = np.zeros((s + n_extra, s + n_extra))
        a_all[:s, :s] = self.a
        a_all[s:] = self.extra_a
        if np.any(np.triu(a_all) != 0):
            self._fail("a (with extra_a) is not strictly lower triangular")
        c_all = np.concatenate([self.c, self.extra_c])
        for i in range(s + n_extra):
            if abs(a_all[i].sum() - c_all[i]) > _tol(a_all[i]):
                self._fail(f"row-sum condition c[{i}] == sum_j a[{i}, j] fails: "
                           f"{c_all[i]!r} != {a_all[i].sum()!r}")
        if abs(self.b.sum() - 1.0) > _tol(self.b):
            self._fail(f"sum(b) == 1 fails: {self.b.sum()!r}")
        for field in ["b_error", "b_error_secondary"]:
            weights = getattr(self, field)
            if weights is not None and abs(weights.sum()) > _tol(weights):
                self._fail(f"sum({field}) == 0 fails: {weights.sum()!r}")
        if self.fsal and not (self.c[-1] == 1.0 and self.b[-1] == 0.0
                              and np.array_equal(self.a[-1], self.b)):
            self._fail("fsal needs c[-1] == 1, b[-1] == 0 and a[-1, :] == b exactly")
        at_one = self.dense.sum(axis=1)  # b_i(theta = 1)
        target = np.concatenate([self.b, np.zeros(n_extra)])
        for i in range(s + n_extra):
            if abs(at_one[i] - target[i]) > _tol(self.dense[i]):
                self._fail(f"dense output at theta=1 must give b (0 for extra "
                           f"stages): row {i} sums to {at_one[i]!r}, not "
                           f"{target[i]!r}")


def _sparse_vector(n, entries):
    """(n,) float64 array from ``{index: value}``, zeros omitted."""
    out = np.zeros(n)
    for i, value in entries.items():
        out[i] = value
    return out


def _sparse(shape, rows):
    """(rows, columns) float64 array from ``{row: {column: value}}``, zeros omitted."""
    n_rows, n_cols = shape
    return np.array([_sparse_vector(n_cols, rows.get(i, {})) for i in range(n_rows)])


def _nested_dense(b, d=None):
    """Dense matrix of Hairer's nested interpolant, cubic Hermite plus corrections.

    Hairer (DOP853's CONTD8) and SciPy write the interpolant as

        y(t0 + theta h) = y0 + theta (F0 + (1 - theta) (F1 + theta (F2
                          + (1 - theta) (F3 + theta (F4 + ...))))),

    with ``F0 = y1 - y0 = h sum b k``, ``F1 = h f0 - F0``,
    ``F2 = 2 F0 - h (f0 + f1)`` and ``F_{3+m} = h sum_i d[m, i] k_i``, where
    ``f0 = k_0`` and ``f1 = f(t0 + h, y1)`` is the FSAL stage ``s - 1``.
    F0..F2 alone are the cubic Hermite interpolant through y0, f0, y1, f1.
    Every F_j is linear in the stages, ``F_j = h sum_i M[j, i] k_i``, and the
    product in front of it is the polynomial
    ``w_j(theta) = theta**(j//2 + 1) (1 - theta)**((j + 1)//2)``; so
    ``dense = M.T @ W`` with ``W[j, m]`` the coefficient of theta**(m + 1) in w_j.

    Args:
      b: (s,) weights; the FSAL stage is the last one.
      d: (p - 3, s + n_extra) correction rows, or None for plain Hermite.

    Returns:
      (s + n_extra, p) dense matrix in the monomial form of ``ButcherTableau``.
    """
    s = len(b)
    d = np.zeros((0, s)) if d is None else np.asarray(d, dtype=np.float64)
    n = d.shape[1]
    weights, f0, f1 = np.zeros(n), np.zeros(n), np.zeros(n)
    weights[:s], f0[0], f1[s - 1] = b, 1.0, 1.0
    m = np.vstack([weights, f0 - weights, 2 * weights - f0 - f1, d])
    p = m.shape[0]
    w = np.zeros((p, p))
    for j in range(p):
        coeffs = _poly.polypow([1.0, -1.0], (j + 1) // 2)  # (1 - theta)**k
        shift = j // 2 + 1
        w[j, shift - 1:shift - 1 + len(coeffs)] = coeffs
    return m.T @ w


# --- Bogacki-Shampine 3(2) -------------------------------------------------
# P. Bogacki, L. F. Shampine, "A 3(2) pair of Runge-Kutta formulas",
# Appl. Math. Lett. 2 (1989) 321-325. Numbers as in SciPy's RK23.
# Dense output: cubic Hermite through y0, y1, f0 = k_0, f1 = k_3 (FSAL).
_BOSH3_B = [2 / 9, 1 / 3, 4 / 9, 0.0]
_BOSH3_B_HAT = [7 / 24, 1 / 4, 1 / 3, 1 / 8]

BOSH3 = ButcherTableau(
    name="bosh3",
    order=3,
    error_order=2,
    c=[0.0, 1 / 2, 3 / 4, 1.0],
    a=[
        [0.0, 0.0, 0.0, 0.0],
        [1 / 2, 0.0, 0.0, 0.0],
        [0.0, 3 / 4, 0.0, 0.0],
        _BOSH3_B,
    ],
    b=_BOSH3_B,
    b_error=np.subtract(_BOSH3_B, _BOSH3_B_HAT),
    b_error_secondary=None,
    fsal=True,
    dense=_nested_dense(np.array(_BOSH3_B)),
    dense_order=3,
)

# --- Dormand-Prince 5(4) -------------------------------------------------
# J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae",
# J. Comput. Appl. Math. 6 (1980) 19-26 (c, a, b, b_hat; as in Hairer's
# dopri5.f). Dense output of order 4: L. F. Shampine, "Some practical
# Runge-Kutta formulas", Math. Comp. 46 (1986) 135-150, in the monomial form
# of SciPy's RK45 matrix P (row i: coefficients of theta, ..., theta**4).
_DOPRI5_B = [35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0]
_DOPRI5_B_HAT = [5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200,
                 187 / 2100, 1 / 40]

DOPRI5 = ButcherTableau(
    name="dopri5",
    order=5,
    error_order=4,
    c=[0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0],
    a=[
        [0.0] * 7,
        [1 / 5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [3 / 40, 9 / 40, 0.0, 0.0, 0.0, 0.0, 0.0],
        [44 / 45, -56 / 15, 32 / 9, 0.0, 0.0, 0.0, 0.0],
        [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0.0, 0.0, 0.0],
        [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0.0, 0.0],
        _DOPRI5_B,
    ],
    b=_DOPRI5_B,
    b_error=np.subtract(_DOPRI5_B, _DOPRI5_B_HAT),
    b_error_secondary=None,
    fsal=True,
    dense=[
        [1.0, -8048581381 / 2820520608, 8663915743 / 2820520608,
         -12715105075 / 11282082432],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 131558114200 / 32700410799, -68118460800 / 10900136933,
         87487479700 / 32700410799],
        [0.0, -1754552775 / 470086768, 14199869525 / 1410260304,
         -10690763975 / 1880347072],
        [0.0, 127303824393 / 49829197408, -318862633887 / 49829197408,
         701980252875 / 199316789632],
        [0.0, -282668133 / 205662961, 2019193451 / 616988883,
         -1453857185 / 822651844],
        [0.0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423],
    ],
    dense_order=4,
)

# --- Tsitouras 5(4) ------------------------------------------------------
# Ch. Tsitouras, "Runge-Kutta pairs of order 5(4) satisfying only the first
# column simplifying assumption", Comput. Math. Appl. 62 (2011) 770-775.
# Decimals (rounded to 21 digits) from diffrax's tsit5.py, which carries the
# paper's values to 85 digits; dense output b_i(theta) from the paper as in
# OrdinaryDiffEq.jl (r_ij: coefficient of theta**j in b_i(theta)).
# b_error = b - b_hat. The paper's table lists these differences but prints
# the last one as +1/66; sources disagree on the sign, and -1/66 is the value
# for which the error weights sum to zero (checked below).
_TSIT5_B = [0.0964607668180652295182, 0.01, 0.479889650414499574775,
            1.37900857410374189319, -3.29006951543608067990,
            2.32471052409977398242, 0.0]

TSIT5 = ButcherTableau(
    name="tsit5",
    order=5,
    error_order=4,
    c=[0.0, 0.161, 0.327, 0.9, 0.980025540904509685730, 1.0, 1.0],
    a=[
        [0.0] * 7,
        [0.161, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.00848065549235698854443, 0.335480655492356988544,
         0.0, 0.0, 0.0, 0.0, 0.0],
        [2.89715305710549343213, -6.35944848997507484315, 4.36229543286958141102,
         0.0, 0.0, 0.0, 0.0],
        [5.32586482843925660443, -11.7488835640628278777, 7.49553934288983620830,
         -0.0924950663617552492565, 0.0, 0.0, 0.0],
        [5.86145544294642002866, -12.9209693178471092917, 8.15936789857615864318,
         -0.0715849732814009972245, -0.0282690503940683829090, 0.0, 0.0],
        _TSIT5_B,
    ],
    b=_TSIT5_B,
    b_error=[0.00178001105222577144338, 0.000816434459656746903224,
             -0.00788087801026199601031, 0.144711007173262907537,
             -0.582357165452555225020, 0.458082105929186946662, -1 / 66],
    b_error_secondary=None,
    fsal=True,
    dense=[
        [1.0, -2.763706197274826, 2.9132554618219126, -1.0530884977290216],
        [0.0, 0.13169999999999998, -0.2234, 0.1017],
        [0.0, 3.9302962368947516, -5.941033872131505, 2.490627285651253],
        [0.0, -12.411077166933676, 30.33818863028232, -16.548102889244902],
        [0.0, 37.50931341651104, -88.1789048947664, 47.37952196281928],
        [0.0, -27.896526289197286, 65.09189467479366, -34.87065786149661],
        [0.0, 1.5, -4.0, 2.5],
    ],
    dense_order=4,
)

# --- Dormand-Prince 8(5,3) (DOP853) ----------------------------------------
# P. J. Prince, J. R. Dormand, "High order embedded Runge-Kutta formulae",
# J. Comput. Appl. Math. 7 (1981) 67-75; the DOP853 variant with its 5th- and
# 3rd-order error estimates and 7th-order dense output is from E. Hairer,
# S. P. Norsett, G. Wanner, "Solving Ordinary Differential Equations I",
# 2nd ed., Springer 1993, Sec. II.10. Decimals from Hairer's dop853.f (as
# carried by SciPy's dop853_coefficients.py). Stages 0..11 are the method,
# stage 12 is the FSAL stage f(t0 + h, y1) (a[12] = b), stages 13..15 are
# evaluated only for dense output.
#
# Error convention: b_error = E5 (Hairer's er1..er12), a 5th-order estimate,
# so error_order = 5 (that is the order of b_hat = b - b_error, which is what
# the tests check). b_error_secondary = E3 = b - b_hat3, 3rd order. DOP853
# combines them as err = err5**2 / sqrt(err5**2 + 0.01 err3**2), which is
# O(h**8): Hairer (EXPO1 = 1/8) and SciPy (error_estimator_order = 7) use the
# controller exponent 1/8 with that combined norm, not 1/(error_order + 1).
_DOP853_C = [
    0.0, 0.526001519587677318785587544488e-1, 0.789002279381515978178381316732e-1,
    0.118350341907227396726757197510, 0.281649658092772603273242802490,
    1 / 3, 1 / 4, 4 / 13, 127 / 195, 3 / 5, 6 / 7, 1.0, 1.0,
    1 / 10, 1 / 5, 7 / 9,
]
_DOP853_A = _sparse((16, 16), {
    1: {0: 5.26001519587677318785587544488e-2},
    2: {0: 1.97250569845378994544595329183e-2,
        1: 5.91751709536136983633785987549e-2},
    3: {0: 2.95875854768068491816892993775e-2,
        2: 8.87627564304205475450678981324e-2},
    4: {0: 2.41365134159266685502369798665e-1,
        2: -8.84549479328286085344864962717e-1,
        3: 9.24834003261792003115737966543e-1},
    5: {0: 3.7037037037037037037037037037e-2,
        3: 1.70828608729473871279604482173e-1,
        4: 1.25467687566822425016691814123e-1},
    6: {0: 3.7109375e-2, 3: 1.70252211019544039314978060272e-1,
        4: 6.02165389804559606850219397283e-2, 5: -1.7578125e-2},
    7: {0: 3.70920001185047927108779319836e-2,
        3: 1.70383925712239993810214054705e-1,
        4: 1.07262030446373284651809199168e-1,
        5: -1.53194377486244017527936158236e-2,
        6: 8.27378916381402288758473766002e-3},
    8: {0: 6.24110958716075717114429577812e-1,
        3: -3.36089262944694129406857109825,
        4: -8.68219346841726006818189891453e-1,
        5: 2.75920996994467083049415600797e1,
        6: 2.01540675504778934086186788979e1,
        7: -4.34898841810699588477366255144e1},
    9: {0: 4.77662536438264365890433908527e-1,
        3: -2.48811461997166764192642586468,
        4: -5.90290826836842996371446475743e-1,
        5: 2.12300514481811942347288949897e1,
        6: 1.52792336328824235832596922938e1,
        7: -3.32882109689848629194453265587e1,
        8: -2.03312017085086261358222928593e-2},
    10: {0: -9.3714243008598732571704021658e-1,
         3: 5.18637242884406370830023853209,
         4: 1.09143734899672957818500254654,
         5: -8.14978701074692612513997267357,
         6: -1.85200656599969598641566180701e1,
         7: 2.27394870993505042818970056734e1,
         8: 2.49360555267965238987089396762,
         9: -3.0467644718982195003823669022},
    11: {0: 2.27331014751653820792359768449,
         3: -1.05344954667372501984066689879e1,
         4: -2.00087205822486249909675718444,
         5: -1.79589318631187989172765950534e1,
         6: 2.79488845294199600508499808837e1,
         7: -2.85899827713502369474065508674,
         8: -8.87285693353062954433549289258,
         9: 1.23605671757943030647266201528e1,
         10: 6.43392746015763530355970484046e-1},
    12: {0: 5.42937341165687622380535766363e-2,  # = b (FSAL stage)
         5: 4.45031289275240888144113950566,
         6: 1.89151789931450038304281599044,
         7: -5.8012039600105847814672114227,
         8: 3.1116436695781989440891606237e-1,
         9: -1.52160949662516078556178806805e-1,
         10: 2.01365400804030348374776537501e-1,
         11: 4.47106157277725905176885569043e-2},
    13: {0: 5.61675022830479523392909219681e-2,
         6: 2.53500210216624811088794765333e-1,
         7: -2.46239037470802489917441475441e-1,
         8: -1.24191423263816360469010140626e-1,
         9: 1.5329179827876569731206322685e-1,
         10: 8.20105229563468988491666602057e-3,
         11: 7.56789766054569976138603589584e-3,
         12: -8.298e-3},
    14: {0: 3.18346481635021405060768473261e-2,
         5: 2.83009096723667755288322961402e-2,
         6: 5.35419883074385676223797384372e-2,
         7: -5.49237485713909884646569340306e-2,
         10: -1.08347328697249322858509316994e-4,
         11: 3.82571090835658412954920192323e-4,
         12: -3.40465008687404560802977114492e-4,
         13: 1.41312443674632500278074618366e-1},
    15: {0: -4.28896301583791923408573538692e-1,
         5: -4.69762141536116384314449447206,
         6: 7.68342119606259904184240953878,
         7: 4.06898981839711007970213554331,
         8: 3.56727187455281109270669543021e-1,
         12: -1.39902416515901462129418009734e-3,
         13: 2.9475147891527723389556272149,
         14: -9.15095847217987001081870187138},
})
_DOP853_B = _DOP853_A[12, :13]
_DOP853_E5 = _sparse_vector(13, {
    0: 0.1312004499419488073250102996e-1, 5: -0.1225156446376204440720569753e1,
    6: -0.4957589496572501915214079952, 7: 0.1664377182454986536961530415e1,
    8: -0.3503288487499736816886487290, 9: 0.3341791187130174790297318841,
    10: 0.8192320648511571246570742613e-1, 11: -0.2235530786388629525884427845e-1,
})
# 3rd-order embedded weights (Hairer's bhh1, bhh2, bhh3).
_DOP853_B_HAT3 = _sparse_vector(13, {
    0: 0.244094488188976377952755905512, 8: 0.733846688281611857341361741547,
    11: 0.220588235294117647058823529412e-1,
})
# Hairer's d4j..d7j: the corrections F3..F6 of the nested interpolant.
_DOP853_D = _sparse((4, 16), {
    0: {0: -0.84289382761090128651353491142e1, 5: 0.56671495351937776962531783590,
        6: -0.30689499459498916912797304727e1, 7: 0.23846676565120698287728149680e1,
        8: 0.21170345824450282767155149946e1, 9: -0.87139158377797299206789907490,
        10: 0.22404374302607882758541771650e1, 11: 0.63157877876946881815570249290,
        12: -0.88990336451333310820698117400e-1,
        13: 0.18148505520854727256656404962e2,
        14: -0.91946323924783554000451984436e1,
        15: -0.44360363875948939664310572000e1},
    1: {0: 0.10427508642579134603413151009e2, 5: 0.24228349177525818288430175319e3,
        6: 0.16520045171727028198505394887e3, 7: -0.37454675472269020279518312152e3,
        8: -0.22113666853125306036270938578e2, 9: 0.77334326684722638389603898808e1,
        10: -0.30674084731089398182061213626e2,
        11: -0.93321305264302278729567221706e1,
        12: 0.15697238121770843886131091075e2,
        13: -0.31139403219565177677282850411e2,
        14: -0.93529243588444783865713862664e1,
        15: 0.35816841486394083752465898540e2},
    2: {0: 0.19985053242002433820987653617e2, 5: -0.38703730874935176555105901742e3,
        6: -0.18917813819516756882830838328e3, 7: 0.52780815920542364900561016686e3,
        8: -0.11573902539959630126141871134e2, 9: 0.68812326946963000169666922661e1,
        10: -0.10006050966910838403183860980e1,
        11: 0.77771377980534432092869265740,
        12: -0.27782057523535084065932004339e1,
        13: -0.60196695231264120758267380846e2,
        14: 0.84320405506677161018159903784e2,
        15: 0.11992291136182789328035130030e2},
    3: {0: -0.25693933462703749003312586129e2, 5: -0.15418974869023643374053993627e3,
        6: -0.23152937917604549567536039109e3, 7: 0.35763911791061412378285349910e3,
        8: 0.93405324183624310003907691704e2, 9: -0.37458323136451633156875139351e2,
        10: 0.10409964950896230045147246184e3,
        11: 0.29840293426660503123344363579e2,
        12: -0.43533456590011143754432175058e2,
        13: 0.96324553959188282948394950600e2,
        14: -0.39177261675615439165231486172e2,
        15: -0.14972683625798562581422125276e3},
})

DOPRI8 = ButcherTableau(
    name="dopri8",
    order=8,
    error_order=5,
    c=_DOP853_C[:13],
    a=_DOP853_A[:13, :13],
    b=_DOP853_B,
    b_error=_DOP853_E5,
    b_error_secondary=_DOP853_B - _DOP853_B_HAT3,
    fsal=True,
    dense=_nested_dense(_DOP853_B, _DOP853_D),
    dense_order=7,
    extra_c=_DOP853_C[13:],
    extra_a=_DOP853_A[13:],
)

TABLEAUX = {"bosh3": BOSH3, "dopri5": DOPRI5, "tsit5": TSIT5, "dopri8": DOPRI8}
