"""Coefficients of ESDIRK methods (singly diagonally implicit Runge-Kutta
methods with an explicit first stage), as self-checking data.

A step of size h from (t0, y0) with s stages, the first one explicit
(``a[0] == 0``, ``c[0] == 0``) and the same diagonal ``gamma`` for the rest:

    Y_i = y0 + h sum_{j<i} a[i, j] f(Y_j) + h gamma f(t0 + c_i h, Y_i)     (i = 2..s)
    y1  = y0 + h sum_i b_i f(Y_i),      err = h sum_i b_error_i f(Y_i)

Every method here is stiffly accurate (``b == a[-1]``, ``c[-1] == 1``: y1 is
the last stage) and so is its embedded solution (``b - b_error == a[-2]``,
``c[-2] == 1``: it is the last but one stage, and ``err = Y_s - Y_{s-1}``).
``predictor[i]`` gives the starting guess of stage i's Newton iteration,
``h f(Y_i) ~ sum_{j<i} predictor[i, j] h f(Y_j)`` (each row sums to 1).

Dense output from the stage values, ``z_i = Y_i - y0``:

    y(t0 + theta h) = y0 + sum_r theta^(r+1) sum_i dense[r, i] z_i

Being built from the (implicit) stage values only, never from ``h f(y0)``, it
stays bounded on stiff components: its stability function R(z, theta) has a
finite limit as z -> -inf, where a weight on the explicit stage would grow
like z. The record checks the structure (no weight on stage 1, ``y(1) =
Y_s``); the order conditions are checked by ``tests/ode/test_kvaerno5.py``.
Kvaerno's paper gives no continuous extension: the one of KVAERNO5 is derived
for this module (see its comment).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class ESDIRKTableau:
    """An ESDIRK method with an embedded error estimate.

    Attributes:
      name: lower-case method name (``method=``).
      order, error_order: orders of ``y1`` and of the embedded solution.
      gamma: the diagonal of ``a`` below its first row (one LU per step).
      a: (s, s) lower triangular coefficients, the diagonal included.
      c: (s,) nodes (row sums of ``a``).
      b: (s,) weights of ``y1``; b_error: (s,) weights of ``y1 - y1_hat``.
      predictor: (s, s) strictly lower triangular Newton predictor (rows 2..s sum to 1).
      dense: (q, s) coefficients of the dense output in the stage values.
      dense_order: order of the dense output.

    Equality and hashing are by identity, so a tableau can be static.

    Raises:
      ValueError: when built with inconsistent data, naming the condition.
    """

    name: str
    order: int
    error_order: int
    gamma: float
    a: np.ndarray
    c: np.ndarray
    b: np.ndarray
    b_error: np.ndarray
    predictor: np.ndarray
    dense: np.ndarray
    dense_order: int

    def __repr__(self):
        return (f"ESDIRKTableau({self.name!r}, order={self.order}, "
                f"error_order={self.error_order}, stages={self.num_stages})")

    @property
    def num_stages(self) -> int:
        return self.b.shape[0]

    @property
    def b_hat(self) -> np.ndarray:
        """Weights of the embedded solution."""
        return self.b - self.b_error

    def __post_init__(self):
        for field in ("a", "c", "b", "b_error", "predictor", "dense"):
            value = np.array(getattr(self, field), dtype=np.float64)
            value.setflags(write=False)
            object.__setattr__(self, field, value)
        self._validate()

    def _fail(self, condition: str):
        raise ValueError(f"ESDIRK tableau {self.name!r}: {condition}")

    def _validate(self):
        s = self.b.shape[0] if self.b.ndim == 1 else 0
        shapes = {"a": (s, s), "c": (s,), "b_error": (s,), "predictor": (s, s)}
        for field, shape in shapes.items():
            if getattr(self, field).shape != shape:
                self._fail(f"{field} has shape {getattr(self, field).shape}, expected {shape}")
        if not self.gamma > 0 or not 0 < self.error_order < self.order:
            self._fail("need gamma > 0 and 0 < error_order < order")
        if np.any(np.triu(self.a, 1) != 0) or np.any(np.triu(self.predictor) != 0):
            self._fail("a must be lower triangular and predictor strictly lower triangular")
        if np.any(self.a[0] != 0) or self.c[0] != 0:
            self._fail("the first stage must be explicit (a[0] == 0, c[0] == 0)")
        if np.any(np.diag(self.a)[1:] != self.gamma):
            self._fail("the diagonal of a below its first row must be gamma")
        tol = 1e-14
        if np.max(np.abs(self.a.sum(1) - self.c)) > tol:
            self._fail(f"c == row sums of a fails: {self.a.sum(1)} != {self.c}")
        if np.max(np.abs(self.predictor[1:].sum(1) - 1)) > tol:
            self._fail("the predictor's rows must sum to 1")
        if not np.array_equal(self.b, self.a[-1]) or self.c[-1] != 1.0:
            self._fail("not stiffly accurate: need b == a[-1] and c[-1] == 1")
        if np.max(np.abs(self.b_hat - self.a[-2])) > tol or self.c[-2] != 1.0:
            self._fail("the embedded solution must be the last but one stage "
                       "(b - b_error == a[-2], c[-2] == 1)")
        if self.dense.ndim != 2 or self.dense.shape[1] != s:
            self._fail(f"dense has shape {self.dense.shape}, expected (q, {s})")
        if np.any(self.dense[:, 0] != 0) or np.max(np.abs(self.dense.sum(0) - np.eye(s)[-1])) > 1e-12:
            self._fail("the dense output must not weigh the explicit stage and must end at Y_s")


def _esdirk(name: str, order: int, error_order: int, gamma: float, rows, predictor_rows,
            dense, dense_order: int) -> ESDIRKTableau:
    """A stiffly accurate ESDIRK pair from the rows below the first of ``a``
    (without their diagonal gamma); the embedded solution is stage s - 1."""
    s = len(rows) + 1
    a = np.zeros((s, s))
    predictor = np.zeros((s, s))
    for i, (row, guess) in enumerate(zip(rows, predictor_rows), start=1):
        a[i, :i] = row
        a[i, i] = gamma
        predictor[i, :i] = guess
    return ESDIRKTableau(name=name, order=order, error_order=error_order, gamma=gamma, a=a,
                         c=a.sum(1), b=a[-1].copy(), b_error=a[-1] - a[-2],
                         predictor=predictor, dense=np.array(dense),
                         dense_order=dense_order)


# Kvaerno5: A. Kvaerno, "Singly diagonally implicit Runge-Kutta methods with
# an explicit first stage", BIT Numerical Mathematics 44, 489-502 (2004):
# 7 stages, order 5 with an embedded order 4 (both stiffly accurate),
# L-stable (the embedded solution A-stable, R(-inf) = -0.748), gamma = 0.26. Coefficients as tabulated by diffrax
# (diffrax/_solver/kvaerno5.py, from Kvaerno's paper) and SciML's
# OrdinaryDiffEq.jl (Kvaerno5Tableau); the Newton predictors are those of
# OrdinaryDiffEq.jl as diffrax corrects them (stage 2 predicts f(Y_2) by
# f(Y_1), not by 0; see diffrax's devdocs/predictor_dirk.md). Order
# conditions verified by tests/ode/test_kvaerno5.py.
#
# Dense output of order 4, derived for odekit (2026-12-05): with d(theta) =
# sum_r theta^(r+1) dense[r] and b(theta) = d(theta) @ a, the minimum-norm
# (numpy.linalg.lstsq) solution of b(theta) . Phi(t) = theta^|t| / gamma(t)
# for all rooted trees |t| <= 4 (coefficient by coefficient in theta),
# dense[:, 0] = 0 and d(1) = e_7. Order 4 is possible with 6 stage values
# because the method has stage order 2 (sum_j a_ij c_j = c_i^2 / 2), which
# leaves 5 independent conditions. Its stiff limit R(-inf, theta) stays
# within [-0.86, 0.79] (tests/ode/test_kvaerno5.py checks both).
_KV5_GAMMA = 0.26
_KV5_ROW6 = [0.13855640231268224, 0.0, -0.04245337201752043, 0.02446657898003141,
             0.61943039072480676]
KVAERNO5 = _esdirk(
    "kvaerno5", order=5, error_order=4, gamma=_KV5_GAMMA,
    rows=[[0.26],
          [0.13, 0.84033320996790809],
          [0.22371961478320505, 0.47675532319799699, -0.06470895363112615],
          [0.16648564323248321, 0.10450018841591720, 0.03631482272098715,
           -0.13090704451073998],
          _KV5_ROW6,
          [0.13659751177640291, 0.0, -0.05496908796538376, -0.04118626728321046,
           0.62993304899016403, 0.06962479448202728]],
    predictor_rows=[[1.0],
                    [-1.366025403784441, 2.3660254037844357],
                    [-0.19650552613122207, 0.8113579546496623, 0.38514757148155954],
                    [0.10375304369958693, 0.937994698066431, -0.04174774176601781, 0.0],
                    [-0.17281112873898072, 0.6235784481025847, 0.5492326806363959, 0.0, 0.0],
                    _KV5_ROW6 + [_KV5_GAMMA]],
    dense=[[0.0, 7.76653275249028, -0.3338110607102589, -2.9738747407256567,
            -3.071529220937351, 0.5631966807617401, 0.8131966807608682],
           [0.0, -27.703473549224036, 1.2320860599923515, 8.021639216210735,
            22.422745140130743, -2.165362197401503, -1.91536219740141],
           [0.0, 27.27673294965673, -2.382078221692451, -4.371514811205678,
            -28.76615073492237, 2.4830337199895314, 2.7330337199898387],
           [0.0, -7.339792152922967, 1.4838032224103483, -0.676249664279399,
            9.414934815728968, -0.8808682033497713, -0.6308682033492933]],
    dense_order=4)

ESDIRK_TABLEAUX: dict[str, ESDIRKTableau] = {KVAERNO5.name: KVAERNO5}
