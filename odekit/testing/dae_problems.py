"""Index-1 DAE problems of the Bari test set, with their published reference
values, for ``solve_ivp(..., mass_matrix=M)``.

Source: F. Mazzia and C. Magherini, "Test Set for Initial Value Problem
Solvers", release 2.4, Department of Mathematics, University of Bari and
INdAM, Research Unit of Bari, February 2008 (https://archimede.uniba.it/~testset/;
formerly the CWI test set, W. M. Lioen and J. J. B. de Swart, release 2.1,
1999). Every coefficient, initial value and reference value below is the one
of the test set's problem files ``chemakzo.f`` (revision 1.2, 2006/10/02) and
``transamp.f`` (revision 1.3, 2006/10/25), whose ``solut`` routines print the
reference solution at the end time (computed by the test set's authors with
PSIDE on a Cray C90 at tight tolerances); the values agree to the 14 digits
OdePkg's port of the same problems (GNU Octave, T. Treichl,
``odepkg_testsuite_implakzo.m`` and ``odepkg_testsuite_impltrans.m``) prints.

Both are written in solve_ivp's form ``M y' = fun(t, y, *args)`` with a
constant singular M (NumPy) and their parameters in ``args`` (one (p,)
float64 array, so that derivatives with respect to them can be taken):

======================  ==  ====  ==========  =========================================
name                    n   m     t_span      M
======================  ==  ====  ==========  =========================================
akzo_nobel              6   1     [0, 180]    diag(1, 1, 1, 1, 1, 0)
transistor_amplifier    8   3     [0, 0.2]    rank 5, no zero row or column (C1..C5)
======================  ==  ====  ==========  =========================================

(n components, m = n - rank M algebraic equations.) The test set's own runs
use ``atol = rtol = h0`` (its drivers, and OdePkg's); :attr:`DAEProblem.atol`
is a suggestion for a check at ``rtol = 1e-6`` instead (see each problem).
:func:`constraint_error` says how well a state satisfies the algebraic
equations, in units of the tolerance (as solve_ivp judges a ``y0``).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DAE_PROBLEMS", "DAEProblem", "constraint_error"]


@dataclasses.dataclass(frozen=True, eq=False)
class DAEProblem:
    """An index-1 DAE ``M y' = fun(t, y, *args)``, ``y(t_span[0]) = y0``, with
    its published reference value at ``t_span[1]``.

    Attributes:
      name: registry key (:data:`DAE_PROBLEMS`).
      fun: ``fun(t, y, *args)`` (solve_ivp's order) in ``jax.numpy``, (n,) -> (n,).
      numpy_fun: the same field in NumPy (for solvers outside JAX, e.g. IDA).
      mass_matrix: (n, n) float64 NumPy array M (constant, singular).
      y0: (n,) float64 NumPy array, consistent (satisfies the algebraic
        equations) with ``args``.
      t_span: ``(t0, t1)``.
      args: ``(params,)``, a (p,) float64 NumPy array named by ``parameters``.
      parameters: the names of ``params``' entries.
      reference: (n,) the test set's reference solution at ``t1``, all components.
      rtol, atol: suggested tolerances for a check against ``reference``.
      description: one line of math.
      source: where ``reference`` and the coefficients come from.

    Equality and hashing are by identity.
    """

    name: str
    fun: Callable
    numpy_fun: Callable
    mass_matrix: np.ndarray
    y0: np.ndarray
    t_span: tuple[float, float]
    args: tuple
    parameters: tuple[str, ...]
    reference: np.ndarray
    rtol: float
    atol: float
    description: str
    source: str

    @property
    def num_algebraic(self) -> int:
        """m = n - rank(M), the number of algebraic equations."""
        return int(self.mass_matrix.shape[0] - np.linalg.matrix_rank(self.mass_matrix))


def _frozen(array: Any) -> np.ndarray:
    array = np.array(array, dtype=np.float64)
    array.setflags(write=False)
    return array


# --------------------------------------------------------------------------
# Chemical Akzo Nobel problem (chemakzo).

AKZO_PARAMETERS = ("k1", "k2", "k3", "k4", "K", "klA", "Ks", "pCO2", "H")


def _akzo_nobel_field(t: Any, y: jax.Array, params: jax.Array, xp: Any = jnp) -> jax.Array:
    """The field in the array module ``xp`` (jax.numpy or numpy)."""
    k1, k2, k3, k4, big_k, kla, ks, pco2, henry = (params[i] for i in range(9))
    root_y2 = xp.sqrt(y[1])
    r1 = k1 * y[0] ** 4 * root_y2
    r2 = k2 * y[2] * y[3]
    r3 = k2 / big_k * y[0] * y[4]
    r4 = k3 * y[0] * y[3] ** 2
    r5 = k4 * y[5] ** 2 * root_y2
    f_in = kla * (pco2 / henry - y[1])
    return xp.stack([-2.0 * r1 + r2 - r3 - r4,
                      -0.5 * r1 - r4 - 0.5 * r5 + f_in,
                      r1 - r2 + r3,
                      -r2 + r3 - 2.0 * r4,
                      r2 - r3 + r5,
                      ks * y[0] * y[3] - y[5]])


def _akzo_nobel() -> DAEProblem:
    """The Chemical Akzo Nobel problem (test set problem ``chemakzo``, from
    Akzo Nobel Central Research, Arnhem: the species FLB and ZHU react while
    carbon dioxide is added continuously; F. Mazzia & C. Magherini, Test Set
    release 2.4, "Chemical Akzo Nobel problem"). Index-1 DAE of dimension 6,
    t in [0, 180]:

        y1' = -2 r1 + r2 - r3 - r4
        y2' = -r1 / 2 - r4 - r5 / 2 + F_in
        y3' =  r1 - r2 + r3
        y4' = -r2 + r3 - 2 r4
        y5' =  r2 - r3 + r5
          0 =  Ks y1 y4 - y6

    with r1 = k1 y1^4 sqrt(y2), r2 = k2 y3 y4, r3 = (k2 / K) y1 y5,
    r4 = k3 y1 y4^2, r5 = k4 y6^2 sqrt(y2), F_in = klA (p(CO2) / H - y2), and
    (k1, k2, k3, k4, K, klA, Ks, p(CO2), H) = (18.7, 0.58, 0.09, 0.42, 34.4,
    3.3, 115.83, 0.9, 737) (``params``, in this order); y0 = (0.444, 0.00123,
    0, 0.007, 0, Ks y0_1 y0_4), consistent. M = diag(1, 1, 1, 1, 1, 0).

    Reference at t = 180 (``chemakzo_solut``: PSIDE, rtol = atol = 1e-19,
    in the Cray C90's 128-bit double precision): y = (0.1150794920661702, 0.1203831471567715e-2,
    0.1611562887407974, 0.3656156421249283e-3, 0.1708010885264404e-1,
    0.4873531310307455e-2).

    Suggested tolerances: rtol = 1e-6 with atol = 1e-10. The components range
    over 3e-4 (y4) to 0.44 (y1) and y3, y5 start at 0; the test set's atol =
    rtol would control y2 and y4 to about 1e-3 of their size only, so atol is
    taken 1e-4 times rtol, below rtol |y_i| for every component at t = 180.
    """
    params = _frozen([18.7, 0.58, 0.09, 0.42, 34.4, 3.3, 115.83, 0.9, 737.0])
    ks = params[6]
    y0 = _frozen([0.444, 0.00123, 0.0, 0.007, 0.0, ks * 0.444 * 0.007])
    reference = _frozen([0.1150794920661702e0, 0.1203831471567715e-2, 0.1611562887407974e0,
                         0.3656156421249283e-3, 0.1708010885264404e-1, 0.4873531310307455e-2])
    return DAEProblem(
        "akzo_nobel", _akzo_nobel_field, partial(_akzo_nobel_field, xp=np), _frozen(np.diag([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])), y0,
        (0.0, 180.0), (params,), AKZO_PARAMETERS, reference, 1e-6, 1e-10,
        "Chemical Akzo Nobel: 5 reaction ODEs and 0 = Ks y1 y4 - y6, t up to 180",
        "Bari IVP test set 2.4, chemakzo.f rev. 1.2 (reference by PSIDE, rtol = atol = 1e-19)")


# --------------------------------------------------------------------------
# Transistor amplifier (transamp).

TRANSISTOR_PARAMETERS = ("Ub", "UF", "alpha", "beta", "R0", "R1", "R2", "R3", "R4", "R5",
                         "R6", "R7", "R8", "R9")
#: The capacitances C1..C5 (farad) of the mass matrix (``transamp.f``, ``meval``).
TRANSISTOR_CAPACITANCES = (1e-6, 2e-6, 3e-6, 4e-6, 5e-6)


def _transistor_amplifier_field(t: Any, y: jax.Array, params: jax.Array,
                                xp: Any = jnp) -> jax.Array:
    """The field in the array module ``xp`` (jax.numpy or numpy)."""
    ub, uf, alpha, beta, r0 = (params[i] for i in range(5))
    r1, r2, r3, r4, r5, r6, r7, r8, r9 = (params[i] for i in range(5, 14))
    ue = 0.1 * xp.sin(200.0 * xp.pi * t)
    g23 = beta * xp.expm1((y[1] - y[2]) / uf)         # the transistors' currents
    g56 = beta * xp.expm1((y[4] - y[5]) / uf)
    return xp.stack([(y[0] - ue) / r0,
                      y[1] / r1 + (y[1] - ub) / r2 + (1.0 - alpha) * g23,
                      y[2] / r3 - g23,
                      (y[3] - ub) / r4 + alpha * g23,
                      y[4] / r5 + (y[4] - ub) / r6 + (1.0 - alpha) * g56,
                      y[5] / r7 - g56,
                      (y[6] - ub) / r8 + alpha * g56,
                      y[7] / r9])


def transistor_mass_matrix(capacitances: tuple = TRANSISTOR_CAPACITANCES) -> np.ndarray:
    """The (8, 8) mass matrix of the transistor amplifier for C1..C5: blocks
    ``[[-C, C], [C, -C]]`` on the node pairs (1, 2), (4, 5), (7, 8) (C1, C3,
    C5) and ``-C2``, ``-C4`` on nodes 3 and 6; rank 5 (each 2 x 2 block has
    rank 1), and no row or column of zeros."""
    c1, c2, c3, c4, c5 = capacitances
    mass = np.zeros((8, 8))
    for (i, j), c in (((0, 1), c1), ((3, 4), c3), ((6, 7), c5)):
        mass[i, i] = mass[j, j] = -c
        mass[i, j] = mass[j, i] = c
    mass[2, 2], mass[5, 5] = -c2, -c4
    return _frozen(mass)


def _transistor_amplifier() -> DAEProblem:
    """The transistor amplifier (test set problem ``transamp``; Rentrop, Roche
    & Steinebach 1989; Hairer & Wanner, Solving ODEs II, 2nd ed., Sec. VII): the node
    voltages y1..y8 of a two-stage amplifier, input Ue(t) = 0.1 sin(200 pi t),
    output y8. Index-1 DAE of dimension 8, t in [0, 0.2], ``M y' = f(t, y)``:

        f1 = (y1 - Ue(t)) / R0
        f2 = y2 / R1 + (y2 - Ub) / R2 + (1 - alpha) g(y2 - y3)
        f3 = y3 / R3 - g(y2 - y3)
        f4 = (y4 - Ub) / R4 + alpha g(y2 - y3)
        f5 = y5 / R5 + (y5 - Ub) / R6 + (1 - alpha) g(y5 - y6)
        f6 = y6 / R7 - g(y5 - y6)
        f7 = (y7 - Ub) / R8 + alpha g(y5 - y6)
        f8 = y8 / R9

    with g(u) = beta (exp(u / UF) - 1), Ub = 6, UF = 0.026, alpha = 0.99,
    beta = 1e-6, R0 = 1000, R1 = ... = R9 = 9000 (``params``, in this order),
    and M from C_k = k 1e-6, k = 1..5 (:func:`transistor_mass_matrix`). The
    algebraic equations are f1 + f2 = f4 + f5 = f7 + f8 = 0 (M's left null
    space). y0 = (0, Ub / (R2 / R1 + 1), Ub / (R2 / R1 + 1), Ub, Ub / (R6 /
    R5 + 1), Ub / (R6 / R5 + 1), Ub, 0) = (0, 3, 3, 6, 3, 3, 6, 0): f = 0
    there, so it is consistent.

    Reference at t = 0.2 (``transamp.f``, ``solut``: PSIDE, rtol = atol =
    1e-14, in the Cray C90's 128-bit double precision): y = (-0.5562145012262709e-2,
    0.3006522471903042e1, 0.2849958788608128e1, 0.2926422536206241e1,
    0.2704617865010554e1, 0.2761837778393145e1, 0.4770927631616772e1,
    0.1236995868091548e1).

    Suggested tolerances: rtol = 1e-6, atol = 1e-6 (the test set's atol =
    rtol: the voltages are O(1), y1 oscillates through 0 with amplitude 0.1).
    """
    params = _frozen([6.0, 0.026, 0.99, 1e-6, 1000.0] + [9000.0] * 9)
    ub, r1, r2, r5, r6 = params[0], params[5], params[6], params[9], params[10]
    y0 = _frozen([0.0, ub / (r2 / r1 + 1.0), ub / (r2 / r1 + 1.0), ub, ub / (r6 / r5 + 1.0),
                  ub / (r6 / r5 + 1.0), ub, 0.0])
    reference = _frozen([-0.5562145012262709e-2, 0.3006522471903042e1, 0.2849958788608128e1,
                         0.2926422536206241e1, 0.2704617865010554e1, 0.2761837778393145e1,
                         0.4770927631616772e1, 0.1236995868091548e1])
    return DAEProblem(
        "transistor_amplifier", _transistor_amplifier_field,
        partial(_transistor_amplifier_field, xp=np), transistor_mass_matrix(), y0,
        (0.0, 0.2), (params,), TRANSISTOR_PARAMETERS, reference, 1e-6, 1e-6,
        "transistor amplifier: 8 node voltages, M of rank 5, Ue = 0.1 sin(200 pi t), t up to 0.2",
        "Bari IVP test set 2.4, transamp.f rev. 1.3 (reference by PSIDE, rtol = atol = 1e-14)")


DAE_PROBLEMS: dict[str, DAEProblem] = {p.name: p for p in (_akzo_nobel(), _transistor_amplifier())}


def constraint_error(problem: DAEProblem, t: Any, y: Any, rtol: float, atol: float,
                     args: tuple | None = None) -> float:
    """How far ``y`` is from satisfying ``problem``'s algebraic equations at
    ``t``, in units of the tolerance: one Newton correction of the algebraic
    components, ``delta = V_0 (U_0^T J V_0)^-1 U_0^T fun(t, y)`` (``U_0``,
    ``V_0``: orthonormal bases of M's left and right null spaces from the SVD,
    J = d fun / dy), measured as ``max_i |delta_i| / (atol + rtol |y_i|)``.
    At most 1 means solve_ivp would accept ``y`` as a consistent initial
    value at these tolerances (the rule of :mod:`odekit.ode.dae`).

    Args:
      problem: a :class:`DAEProblem`; t: the time; y: (n,) state.
      rtol, atol: the tolerances (floats).
      args: the parameters (default ``problem.args``).
    """
    mass = problem.mass_matrix
    u, _, vt = np.linalg.svd(mass)
    rank = np.linalg.matrix_rank(mass)
    left, right = jnp.asarray(u[:, rank:]), jnp.asarray(vt[rank:].T)
    args = tuple(jnp.asarray(a) for a in (problem.args if args is None else args))
    y = jnp.asarray(y, left.dtype)
    t = jnp.asarray(t, left.dtype)
    field = lambda v: problem.fun(t, v, *args)
    g = left.T @ field(y)
    coupling = left.T @ jax.jacfwd(field)(y) @ right
    delta = right @ jnp.linalg.solve(coupling, g)
    return float(jnp.max(jnp.abs(delta) / (atol + rtol * jnp.abs(y))))
