"""Coefficients of Rosenbrock (linearly implicit) methods, as self-checking data.

A Rosenbrock method in the transformed form of Hairer & Wanner (Solving
ODEs II, Sec. IV.7, eq. (7.25)) takes a step of size h from (t0, y0) with
J = df/dy(t0, y0), f_t = df/dt(t0, y0) and ONE factorisation of
W = I / (h gamma) - J:

    Y_i = y0 + sum_{j<i} a[i, j] u_j
    W u_i = f(t0 + c_i h, Y_i) + sum_{j<i} (coupling[i, j] / h) u_j + h d_i f_t
    y1  = y0 + sum_i b_i u_i,        err = sum_i b_error_i u_i

The same method in the standard form (alpha, Gamma, b_std) of the order
conditions is ``Gamma = inv(I / gamma - coupling)``, ``alpha = a Gamma``,
``b_std = b Gamma`` (:meth:`RosenbrockTableau.standard_form`); the nodes are
the row sums of alpha and ``d`` those of Gamma, which the record checks when
built. The order conditions themselves are checked by
``tests/ode/test_stiff.py``.

Dense output (Steinebach's form): with ``k_r = sum_j dense[r, j] u_j``,

    y(t0 + theta h) = (1 - theta) y0 + theta (y1 + (1 - theta)(k_0 + theta k_1 + theta^2 k_2)).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class RosenbrockTableau:
    """A Rosenbrock method with an embedded error estimate and dense output.

    Attributes:
      name: lower-case method name (``method=``).
      order, error_order: orders of ``y1`` and of the embedded solution.
      gamma: the diagonal of Gamma (one value: one LU per step).
      a: (s, s) strictly lower transformed stage coefficients.
      coupling: (s, s) strictly lower transformed coefficients C.
      c: (s,) nodes; d: (s,) coefficients of the time derivative f_t.
      b: (s,) weights of ``y1``; b_error: (s,) weights of ``y1 - y1_hat``.
      dense: (q, s) coefficients of the dense output's polynomials.
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
    coupling: np.ndarray
    c: np.ndarray
    d: np.ndarray
    b: np.ndarray
    b_error: np.ndarray
    dense: np.ndarray
    dense_order: int

    def __repr__(self):
        return (f"RosenbrockTableau({self.name!r}, order={self.order}, "
                f"error_order={self.error_order}, stages={self.num_stages})")

    @property
    def num_stages(self) -> int:
        return self.b.shape[0]

    def standard_form(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(alpha, Gamma, b_std, b_hat_std)``: the method as in the order
        conditions, ``k = inv(Gamma) u`` (Hairer & Wanner II, eq. (7.4))."""
        s = self.num_stages
        big_gamma = np.linalg.inv(np.eye(s) / self.gamma - self.coupling)
        return (self.a @ big_gamma, big_gamma, self.b @ big_gamma,
                (self.b - self.b_error) @ big_gamma)

    def __post_init__(self):
        for field in ("a", "coupling", "c", "d", "b", "b_error", "dense"):
            value = np.array(getattr(self, field), dtype=np.float64)
            value.setflags(write=False)
            object.__setattr__(self, field, value)
        self._validate()

    def _fail(self, condition: str):
        raise ValueError(f"Rosenbrock tableau {self.name!r}: {condition}")

    def _validate(self):
        s = self.b.shape[0] if self.b.ndim == 1 else 0
        shapes = {"a": (s, s), "coupling": (s, s), "c": (s,), "d": (s,), "b_error": (s,)}
        for field, shape in shapes.items():
            if getattr(self, field).shape != shape:
                self._fail(f"{field} has shape {getattr(self, field).shape}, expected {shape}")
        if self.dense.ndim != 2 or self.dense.shape[1] != s:
            self._fail(f"dense has shape {self.dense.shape}, expected (q, {s})")
        if not self.gamma > 0 or not 0 < self.error_order < self.order:
            self._fail("need gamma > 0 and 0 < error_order < order")
        for field in ("a", "coupling"):
            if np.any(np.triu(getattr(self, field)) != 0):
                self._fail(f"{field} is not strictly lower triangular")
        alpha, big_gamma, _, _ = self.standard_form()
        for name, got, want in (("c == row sums of alpha", alpha.sum(1), self.c),
                                ("d == row sums of Gamma", big_gamma.sum(1), self.d)):
            if np.max(np.abs(got - want)) > 1e-13 * (1 + np.abs(alpha).max()):
                self._fail(f"{name} fails: {got} != {want}")
        last = np.eye(s)[-1]
        if not np.array_equal(self.b, self.a[-1] + last) or self.c[-1] != 1.0:
            self._fail("not stiffly accurate: need b == a[-1] + e_s and c[-1] == 1")
        if not np.array_equal(self.b_error, last):
            self._fail("the error estimate must be the last stage, u_s (y1 - Y_s)")


def _lower(rows: list[list[float]]) -> np.ndarray:
    """(s, s) strictly lower triangular matrix from its rows below the diagonal."""
    s = len(rows) + 1
    out = np.zeros((s, s))
    for i, row in enumerate(rows, start=1):
        out[i, :len(row)] = row
    return out


def _stiffly_accurate(name: str, order: int, error_order: int, gamma: float, a_rows, c_rows,
                      c, d, dense, dense_order: int) -> RosenbrockTableau:
    """A stiffly accurate pair: ``y1 = Y_s + u_s`` and ``err = u_s``."""
    a = _lower(a_rows)
    s = a.shape[0]
    b = a[-1].copy()
    b[-1] = 1.0
    return RosenbrockTableau(name=name, order=order, error_order=error_order, gamma=gamma, a=a,
                             coupling=_lower(c_rows), c=np.array(c), d=np.array(d), b=b,
                             b_error=np.eye(s)[-1], dense=np.array(dense),
                             dense_order=dense_order)


# Rodas5P: G. Steinebach, "Construction of Rosenbrock-Wanner method Rodas5P
# and numerical benchmarks within the Julia Differential Equations package",
# BIT Numerical Mathematics 63, 27 (2023) (improving Rodas5 of Di Marzo 1993).
# Coefficients in the transformed form as tabulated by SciML's
# OrdinaryDiffEq.jl (lib/OrdinaryDiffEqRosenbrock/src/rosenbrock_tableaus.jl,
# Rodas5PTableau); order 5, embedded order 4, dense output order 4, all
# verified by tests/ode/test_stiff.py.
_RODAS5P_ROW6 = [-7.502846399306121, 2.561846144803919, -11.627539656261098,
                 -0.18268767659942256, 0.030198172008377946]
RODAS5P = _stiffly_accurate(
    "rodas5p", order=5, error_order=4, gamma=0.21193756319429014,
    a_rows=[[3.0],
            [2.849394379747939, 0.45842242204463923],
            [-6.954028509809101, 2.489845061869568, -10.358996098473584],
            [2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641],
            _RODAS5P_ROW6,
            _RODAS5P_ROW6 + [1.0],
            _RODAS5P_ROW6 + [1.0, 1.0]],
    c_rows=[[-14.155112264123755],
            [-17.97296035885952, -2.859693295451294],
            [147.12150275711716, -1.41221402718213, 71.68940251302358],
            [165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306],
            [24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125,
             -0.6610691825249471],
            [30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783,
             -19.097331116725623, -28.087943162872662],
            [37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047,
             -40.06618937091002, -54.66780262877968, -9.48861652309627]],
    c=[0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716, 0.4288403609558664,
       1.0, 1.0, 1.0],
    d=[0.21193756319429014, -0.42387512638858027, -0.3384627126235924, 1.8046452872882734,
       2.325825639765069, 0.0, 0.0, 0.0],
    dense=[[25.948786856663858, -2.5579724845846235, 10.433815404888879, -2.3679251022685204,
            0.524948541321073, 1.1241088310450404, 0.4272876194431874, -0.17202221070155493],
           [-9.91568850695171, -0.9689944594115154, 3.0438037242978453, -24.495224566215796,
            20.176138334709044, 15.98066361424651, -6.789040303419874, -6.710236069923372],
           [11.419903575922262, 2.8879645146136994, 72.92137995996029, 80.12511834622643,
            -52.072871366152654, -59.78993625266729, -0.15582684282751913, 4.883087185713722]],
    dense_order=4)

ROSENBROCK_TABLEAUX: dict[str, RosenbrockTableau] = {RODAS5P.name: RODAS5P}
