"""A registry of ODE test problems with exact or trusted reference solutions.

Every ODE test draws its problems from :data:`PROBLEMS`. A :class:`Problem`
holds a vector field in the ``odeint`` convention ``func(y, t, *args)``
(written with ``jax.numpy``), the initial state ``y0`` at ``t[0]``, the output
times the tests use, and its parameters as ``args`` so that gradient tests can
differentiate them. Where a closed form exists, ``exact(t, *args)`` returns it
(also written with ``jax.numpy``, so that it is differentiable); otherwise
:func:`reference_solution` integrates the problem with SciPy at a tolerance
far below anything the tests request.

Problems (all start at t = 0; the formulas are in each builder's docstring):

========================  ==========================================  =========
name                      equation                                    reference
========================  ==========================================  =========
exponential_decay         y' = -k y, k a vector                       exact
harmonic_oscillator       x'' = -w^2 x                                exact
time_dependent_linear     y' = a cos(t) y                             exact
complex_rotation          y' = i w y, complex y                       exact
pytree_state              dict state {x: (3,), z: (2, 2)}             exact
kepler                    r'' = -mu r / |r|^3, eccentricity 0.6       exact
pendulum                  theta'' = -b theta' - g sin(theta)          SciPy
lotka_volterra            x' = a x - b x y, y' = d x y - c y          SciPy
robertson (stiff)         Robertson's chemical kinetics to t = 1e5     SciPy
========================  ==========================================  =========

:data:`DETEST` holds non-stiff problems of the DETEST set (Hull, Enright,
Fellen & Sedgwick 1972), all on 0 <= t <= 20; :func:`get_problem` finds them
too. They are not in :data:`PROBLEMS`, whose every entry the method grids run:

========================  ==========================================  =========
name                      equation                                    reference
========================  ==========================================  =========
detest_a2                 y' = -y^3 / 2                               exact
detest_b1                 y1' = 2 (y1 - y1 y2), y2' = -(y2 - y1 y2)   SciPy
detest_b5                 rigid body, solution (sn, cn, dn)(t | 0.51) SciPy
detest_c1                 10-equation radioactive decay chain         exact
detest_d1, _d3, _d5       two-body orbits, e = 0.1, 0.5, 0.9          exact
detest_e1                 Bessel's equation of order 1/2              exact
detest_e2                 Van der Pol, mu = 1                         SciPy
========================  ==========================================  =========

:data:`STIFF` holds stiff problems beyond Robertson, for stiff methods and
for the explicit methods' stiffness test:

========================  ==========================================  =========
name                      equation                                    reference
========================  ==========================================  =========
hires                     8-species plant physiology (HIRES)          SciPy
heat_equation             u_t = kappa u_xx, 100 points, Dirichlet     exact
van_der_pol               Van der Pol, mu = 1000, t up to 3000        SciPy
========================  ==========================================  =========
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

Pytree = Any

__all__ = ["DETEST", "PROBLEMS", "STIFF", "Problem", "brusselator_1d", "falling_body",
           "get_problem", "reference_solution", "robertson_groups", "scipy_solution"]

# Tolerances of the SciPy references: DOP853 for non-stiff problems, Radau for
# stiff ones (Radau's Newton iterations cannot reach 1e-13 relative accuracy
# on Robertson's problem in reasonable time; 1e-10 is still ~1e4 times below
# any tolerance the failure tests use).
REFERENCE_RTOL = 1e-13
REFERENCE_ATOL = 1e-13
STIFF_REFERENCE_RTOL = 1e-10
STIFF_REFERENCE_ATOL = 1e-14


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """An initial value problem ``y' = func(y, t, *args)``, ``y(t[0]) = y0``.

    Attributes:
      name: registry key.
      func: vector field ``func(y, t, *args)`` in ``jax.numpy``, returning a
        pytree with the structure of ``y``.
      y0: initial state at ``t[0]``: a pytree of float64 or complex128 NumPy
        arrays.
      t: (n,) increasing float64 output times used by the tests; ``t[0]`` is
        the initial time.
      args: parameters passed to ``func`` (floats or NumPy arrays).
      exact: ``exact(t, *args)`` returning the solution at the (m,) times ``t``
        as a pytree like ``y0`` with a leading axis of length m (evaluate it
        with float64 enabled), or None when there is no closed form.
      stiff: whether the problem needs a stiff solver.
      description: one line of math.
      invariants: ``invariants(ys, *args)`` returning a dict of quantities that
        are conserved along the solution, each with a leading time axis, or
        None.

    Equality and hashing are by identity.
    """

    name: str
    func: Callable
    y0: Pytree
    t: np.ndarray
    args: tuple
    exact: Callable | None
    stiff: bool
    description: str
    invariants: Callable | None = None

    @property
    def t0(self) -> float:
        """The initial time ``t[0]``."""
        return float(self.t[0])


# --------------------------------------------------------------------------
# Problems with exact solutions.

def _exponential_decay() -> Problem:
    """y' = -k y elementwise, y(t) = y0 exp(-k t), with rates k = (0.5, 1, 2)."""
    y0 = np.array([1.0, 2.0, -0.5])

    def func(y, t, k):
        return -k * y

    def exact(t, k):
        t = jnp.asarray(t)
        return jnp.asarray(y0)[None, :] * jnp.exp(-jnp.asarray(k)[None, :] * t[:, None])

    return Problem("exponential_decay", func, y0, np.linspace(0.0, 5.0, 11),
                   (np.array([0.5, 1.0, 2.0]),), exact, False,
                   "y' = -k y, y(t) = y0 exp(-k t)")


def _harmonic_oscillator() -> Problem:
    """(x, v)' = (v, -w^2 x), x(t) = x0 cos(w t) + v0 / w sin(w t), w = 2.

    Invariant: the energy v^2 / 2 + w^2 x^2 / 2.
    """
    y0 = np.array([1.0, 0.5])

    def func(y, t, w):
        return jnp.stack([y[1], -w**2 * y[0]])

    def exact(t, w):
        wt = w * jnp.asarray(t)
        x = y0[0] * jnp.cos(wt) + y0[1] / w * jnp.sin(wt)
        v = -y0[0] * w * jnp.sin(wt) + y0[1] * jnp.cos(wt)
        return jnp.stack([x, v], axis=-1)

    def invariants(ys, w):
        ys = np.asarray(ys)
        return {"energy": 0.5 * ys[:, 1] ** 2 + 0.5 * w**2 * ys[:, 0] ** 2}

    return Problem("harmonic_oscillator", func, y0, np.linspace(0.0, 10.0, 51), (2.0,),
                   exact, False, "x'' = -w^2 x, x(t) = x0 cos(wt) + v0/w sin(wt)", invariants)


def _time_dependent_linear() -> Problem:
    """y' = a cos(t) y, y(t) = y0 exp(a sin t), a = 1 (a non-autonomous field)."""
    y0 = np.array([1.0, -0.5])

    def func(y, t, a):
        return a * jnp.cos(t) * y

    def exact(t, a):
        return jnp.asarray(y0)[None, :] * jnp.exp(a * jnp.sin(jnp.asarray(t)))[:, None]

    return Problem("time_dependent_linear", func, y0, np.linspace(0.0, 10.0, 41), (1.0,),
                   exact, False, "y' = a cos(t) y, y(t) = y0 exp(a sin t)")


def _complex_rotation() -> Problem:
    """y' = i w y for complex y, y(t) = y0 exp(i w t), w = 1.5; |y| is conserved."""
    y0 = np.array([1.0 + 0.0j, 0.5 - 0.5j])

    def func(y, t, w):  # i w as a complex of w's precision: clean under strict promotion
        w = jnp.asarray(w)
        return jax.lax.complex(jnp.zeros_like(w), w) * y

    def exact(t, w):
        wt = w * jnp.asarray(t)
        return jnp.asarray(y0)[None, :] * jnp.exp(jax.lax.complex(jnp.zeros_like(wt), wt))[:, None]

    def invariants(ys, w):
        return {"modulus": np.abs(np.asarray(ys))}

    return Problem("complex_rotation", func, y0, np.linspace(0.0, 10.0, 41), (1.5,),
                   exact, False, "y' = i w y, y(t) = y0 exp(i w t)", invariants)


def _pytree_state() -> Problem:
    """A dict state with leaves of two shapes, coupled one way:

        x' = -k x                  (shape (3,)),   x(t) = x0 exp(-k t)
        z' = k x_0 ones((2, 2))    (shape (2, 2)), z(t) = z0 + x0_0 (1 - exp(-k t))

    with k = 0.7.
    """
    y0 = {"x": np.array([1.0, -2.0, 0.5]), "z": np.array([[0.0, 1.0], [2.0, -1.0]])}

    def func(y, t, k):
        return {"x": -k * y["x"], "z": k * y["x"][0] * jnp.ones_like(y["z"])}

    def exact(t, k):
        decay = jnp.exp(-k * jnp.asarray(t))
        x = jnp.asarray(y0["x"])[None, :] * decay[:, None]
        z = jnp.asarray(y0["z"])[None] + (y0["x"][0] * (1.0 - decay))[:, None, None]
        return {"x": x, "z": z}

    return Problem("pytree_state", func, y0, np.linspace(0.0, 3.0, 7), (0.7,), exact, False,
                   "{x, z}' = {-k x, k x_0}, x = x0 exp(-kt), z = z0 + x0_0 (1 - exp(-kt))")


def kepler_energy(ys: Any, mu: Any) -> np.ndarray:
    """Energy |v|^2 / 2 - mu / |r| of Kepler states (..., 4) = (x, y, vx, vy)."""
    ys = np.asarray(ys)
    return 0.5 * (ys[..., 2] ** 2 + ys[..., 3] ** 2) - mu / np.hypot(ys[..., 0], ys[..., 1])


def kepler_angular_momentum(ys: Any) -> np.ndarray:
    """Angular momentum x vy - y vx of Kepler states (..., 4)."""
    ys = np.asarray(ys)
    return ys[..., 0] * ys[..., 3] - ys[..., 1] * ys[..., 2]


def _solve_kepler_equation(mean_anomaly: jax.Array, e: jax.Array) -> jax.Array:
    """E with E - e sin E = M by Newton's method from Danby's start E = M + 0.85 e."""
    m = jnp.mod(mean_anomaly, 2 * jnp.pi)
    big_e = m + 0.85 * e * jnp.sign(jnp.sin(m))

    def newton(_, x):
        return x - (x - e * jnp.sin(x) - m) / (1.0 - e * jnp.cos(x))

    # quadratic convergence: 12 iterations are plenty for e <= 0.9 (DETEST D5)
    return jax.lax.fori_loop(0, 12, newton, big_e) + (mean_anomaly - m)


def _kepler() -> Problem:
    """Planar two-body problem on an orbit of eccentricity 0.6, two orbits (t up to 4 pi)."""
    return _two_body("kepler", 0.6, np.linspace(0.0, 4.0 * np.pi, 41),
                     "r'' = -mu r / |r|^3, e = 0.6, exact from Kepler's equation")


def _two_body(name: str, ecc: float, t: np.ndarray, description: str) -> Problem:
    """Planar two-body problem r'' = -mu r / |r|^3 on an orbit of eccentricity ``ecc``.

    State (x, y, vx, vy), mu = 1, starting at pericentre r0 = (1 - e, 0) with
    speed sqrt(mu (1 + e) / (1 - e)) (semi-major axis 1, period 2 pi), output
    times ``t``. Exact solution from Kepler's equation E - e sin E = M, with the
    orbital elements computed from y0 and mu (so the formula holds for any mu):
    a = -mu / (2 energy), n = sqrt(mu / a^3), M = M0 + n t and, in the
    perifocal frame (P along the eccentricity vector, Q = P turned by the sense
    of rotation), r = a (cos E - e) P + a sqrt(1 - e^2) sin E Q,
    v = sqrt(mu a) / |r| (-sin E P + sqrt(1 - e^2) cos E Q).
    Invariants: energy and angular momentum.
    """
    y0 = np.array([1.0 - ecc, 0.0, 0.0, np.sqrt((1.0 + ecc) / (1.0 - ecc))])

    def func(y, t, mu):
        r3 = (y[0] ** 2 + y[1] ** 2) ** 1.5
        return jnp.stack([y[2], y[3], -mu * y[0] / r3, -mu * y[1] / r3])

    def exact(t, mu):
        r_vec, v_vec = jnp.asarray(y0[:2]), jnp.asarray(y0[2:])
        r, v2 = jnp.linalg.norm(r_vec), jnp.sum(v_vec**2)
        rv = jnp.dot(r_vec, v_vec)
        a = 1.0 / (2.0 / r - v2 / mu)
        e_vec = ((v2 - mu / r) * r_vec - rv * v_vec) / mu
        e = jnp.linalg.norm(e_vec)
        p_hat = e_vec / e
        sense = jnp.sign(r_vec[0] * v_vec[1] - r_vec[1] * v_vec[0])
        q_hat = sense * jnp.stack([-p_hat[1], p_hat[0]])
        e0 = jnp.arctan2(rv / jnp.sqrt(mu * a), 1.0 - r / a)
        n = jnp.sqrt(mu / a**3)
        big_e = _solve_kepler_equation(e0 - e * jnp.sin(e0) + n * jnp.asarray(t), e)
        cos_e, sin_e = jnp.cos(big_e), jnp.sin(big_e)
        root = jnp.sqrt(1.0 - e**2)
        radius = a * (1.0 - e * cos_e)
        px, qx = a * (cos_e - e), a * root * sin_e
        pv, qv = -jnp.sqrt(mu * a) * sin_e / radius, jnp.sqrt(mu * a) * root * cos_e / radius
        pos = px[:, None] * p_hat[None, :] + qx[:, None] * q_hat[None, :]
        vel = pv[:, None] * p_hat[None, :] + qv[:, None] * q_hat[None, :]
        return jnp.concatenate([pos, vel], axis=1)

    def invariants(ys, mu):
        return {"energy": kepler_energy(ys, mu), "angular_momentum": kepler_angular_momentum(ys)}

    return Problem(name, func, y0, t, (1.0,), exact, False, description, invariants)


# --------------------------------------------------------------------------
# Problems with SciPy references.

def _pendulum() -> Problem:
    """The damped pendulum of the JAX benchmark, (theta, omega)' =
    (omega, -b omega - g sin theta), y0 = (pi - 0.1, 0), b = 0.25, g = 9.8."""
    y0 = np.array([np.pi - 0.1, 0.0])

    def func(y, t, b, g):
        theta, omega = y[0], y[1]
        return jnp.stack([omega, -b * omega - g * jnp.sin(theta)])

    return Problem("pendulum", func, y0, np.linspace(0.0, 10.0, 101), (0.25, 9.8), None, False,
                   "theta'' = -b theta' - g sin(theta)")


def _lotka_volterra() -> Problem:
    """Predator-prey x' = a x - b x y, y' = d x y - c y with (a, b, c, d) =
    (1.5, 1, 3, 1), y0 = (1, 1). Invariant: d x - c ln x + b y - a ln y."""
    y0 = np.array([1.0, 1.0])

    def func(y, t, a, b, c, d):
        prey, predator = y[0], y[1]
        return jnp.stack([a * prey - b * prey * predator, d * prey * predator - c * predator])

    def invariants(ys, a, b, c, d):
        ys = np.asarray(ys)
        x, y = ys[:, 0], ys[:, 1]
        return {"V": d * x - c * np.log(x) + b * y - a * np.log(y)}

    return Problem("lotka_volterra", func, y0, np.linspace(0.0, 10.0, 51), (1.5, 1.0, 3.0, 1.0),
                   None, False, "x' = a x - b x y, y' = d x y - c y", invariants)


def _robertson() -> Problem:
    """Robertson's stiff chemical kinetics (Hairer & Wanner, Solving ODEs II, Sec. IV.1):

        y1' = -k1 y1 + k2 y2 y3
        y2' =  k1 y1 - k2 y2 y3 - k3 y2^2
        y3' =  k3 y2^2

    with (k1, k2, k3) = (0.04, 1e4, 3e7), y0 = (1, 0, 0), up to t = 1e5.
    Invariant: y1 + y2 + y3 = 1.
    """
    y0 = np.array([1.0, 0.0, 0.0])

    def func(y, t, k1, k2, k3):
        y1, y2, y3 = y[0], y[1], y[2]
        return jnp.stack([-k1 * y1 + k2 * y2 * y3,
                          k1 * y1 - k2 * y2 * y3 - k3 * y2**2,
                          k3 * y2**2])

    def invariants(ys, k1, k2, k3):
        return {"mass": np.sum(np.asarray(ys), axis=1)}

    t = np.concatenate([[0.0], np.logspace(-5.0, 5.0, 11)])
    return Problem("robertson", func, y0, t, (0.04, 1e4, 3e7), None, True,
                   "Robertson's stiff kinetics, k = (0.04, 1e4, 3e7), t up to 1e5", invariants)


# --------------------------------------------------------------------------
# DETEST: non-stiff problems of Hull, Enright, Fellen & Sedgwick, "Comparing
# numerical methods for ordinary differential equations", SIAM J. Numer.
# Anal. 9(4), 603-637 (1972), Appendix: classes A (single equations), B (small
# systems), C (moderate linear systems), D (orbits), E (second order), all on
# 0 <= t <= 20. Output times: t = 0, 1, ..., 20.

DETEST_TIMES = np.linspace(0.0, 20.0, 21)


def _detest_a2() -> Problem:
    """DETEST A2: y' = -y^3 / 2, y(0) = 1; exact y = 1 / sqrt(1 + t)."""
    def func(y, t):
        return -0.5 * y**3

    def exact(t):
        return (1.0 / jnp.sqrt(1.0 + jnp.asarray(t)))[:, None]

    return Problem("detest_a2", func, np.array([1.0]), DETEST_TIMES, (), exact, False,
                   "DETEST A2: y' = -y^3/2, y = 1/sqrt(1 + t)")


def _detest_b1() -> Problem:
    """DETEST B1 (growth of two conflicting populations, Lotka-Volterra type):
    y1' = a (y1 - y1 y2), y2' = -b (y2 - y1 y2), (a, b) = (2, 1), y(0) = (1, 3).
    Invariant: b (y1 - ln y1) + a (y2 - ln y2)."""
    def func(y, t, a, b):
        return jnp.stack([a * (y[0] - y[0] * y[1]), -b * (y[1] - y[0] * y[1])])

    def invariants(ys, a, b):
        ys = np.asarray(ys)
        return {"H": b * (ys[:, 0] - np.log(ys[:, 0])) + a * (ys[:, 1] - np.log(ys[:, 1]))}

    return Problem("detest_b1", func, np.array([1.0, 3.0]), DETEST_TIMES, (2.0, 1.0), None,
                   False, "DETEST B1: y1' = 2 (y1 - y1 y2), y2' = -(y2 - y1 y2)", invariants)


def _detest_b5() -> Problem:
    """DETEST B5 (Euler's equations of a rigid body without external forces):
    y1' = y2 y3, y2' = -y1 y3, y3' = -m y1 y2, m = 0.51, y(0) = (0, 1, 1).
    The solution is (sn, cn, dn)(t | m) (Jacobi elliptic functions; the
    reference is SciPy's, the tests compare it with scipy.special.ellipj).
    Invariants: y1^2 + y2^2 = 1 and m y1^2 + y3^2 = 1."""
    def func(y, t, m):
        return jnp.stack([y[1] * y[2], -y[0] * y[2], -m * y[0] * y[1]])

    def invariants(ys, m):
        ys = np.asarray(ys)
        return {"sn^2 + cn^2": ys[:, 0] ** 2 + ys[:, 1] ** 2,
                "m sn^2 + dn^2": m * ys[:, 0] ** 2 + ys[:, 2] ** 2}

    return Problem("detest_b5", func, np.array([0.0, 1.0, 1.0]), DETEST_TIMES, (0.51,), None,
                   False, "DETEST B5: rigid body, (y1, y2, y3) = (sn, cn, dn)(t | 0.51)",
                   invariants)


def _detest_c1() -> Problem:
    """DETEST C1 (radioactive decay chain, 10 equations): y1' = -y1,
    yi' = y(i-1) - yi for i = 2..9, y10' = y9, y(0) = (1, 0, ..., 0). Exact:
    yi = t^(i-1) e^(-t) / (i-1)! for i <= 9, y10 = 1 - (y1 + ... + y9).
    Invariant: the total y1 + ... + y10 = 1."""
    factorials = np.array([float(np.prod(np.arange(1, k + 1))) for k in range(9)])

    def func(y, t):
        inflow = jnp.concatenate([jnp.zeros(1, y.dtype), y[:-1]])
        outflow = jnp.concatenate([y[:-1], jnp.zeros(1, y.dtype)])
        return inflow - outflow

    def exact(t):
        t = jnp.asarray(t)
        powers = jnp.stack([t**k for k in range(9)], axis=-1)  # integer powers: 0^0 = 1
        first = powers * jnp.exp(-t)[:, None] / factorials[None, :]
        return jnp.concatenate([first, 1.0 - jnp.sum(first, axis=1, keepdims=True)], axis=1)

    def invariants(ys):
        return {"total": np.sum(np.asarray(ys), axis=1)}

    return Problem("detest_c1", func, np.eye(10)[0], DETEST_TIMES, (), exact, False,
                   "DETEST C1: decay chain y' = A y, A bidiagonal (-1, 1), y10' = y9",
                   invariants)


def _detest_e1() -> Problem:
    """DETEST E1 (Bessel's equation of order 1/2, shifted by one):
    y'' = -y' / (t + 1) - (1 - 0.25 / (t + 1)^2) y, solution
    y = J_(1/2)(t + 1) = sqrt(2 / (pi x)) sin x with x = t + 1; state (y, y')
    and y(0) = (0.6713967..., 0.0954005...) from the closed form."""
    def func(y, t):
        x = t + 1.0
        return jnp.stack([y[1], -y[1] / x - (1.0 - 0.25 / x**2) * y[0]])

    def exact(t):
        x = jnp.asarray(t) + 1.0
        amplitude = jnp.sqrt(2.0 / (jnp.pi * x))
        return jnp.stack([amplitude * jnp.sin(x),
                          amplitude * (jnp.cos(x) - 0.5 * jnp.sin(x) / x)], axis=-1)

    y0 = np.sqrt(2.0 / np.pi) * np.array([np.sin(1.0), np.cos(1.0) - 0.5 * np.sin(1.0)])
    return Problem("detest_e1", func, y0, DETEST_TIMES, (), exact, False,
                   "DETEST E1: Bessel y'' + y'/x + (1 - 1/(4x^2)) y = 0, y = J_1/2(x), x = t+1")


def _detest_e2() -> Problem:
    """DETEST E2 (Van der Pol): y'' = mu (1 - y^2) y' - y, mu = 1, state (y, y'),
    y(0) = (2, 0)."""
    def func(y, t, mu):
        return jnp.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])

    return Problem("detest_e2", func, np.array([2.0, 0.0]), DETEST_TIMES, (1.0,), None, False,
                   "DETEST E2: Van der Pol y'' = (1 - y^2) y' - y")


def _detest_d(number: int, ecc: float) -> Problem:
    """DETEST D1-D5: the two-body orbit of :func:`_two_body` (mu = 1, start at
    pericentre) with eccentricity 0.1, 0.3, 0.5, 0.7, 0.9, on 0 <= t <= 20."""
    return _two_body(f"detest_d{number}", ecc, DETEST_TIMES,
                     f"DETEST D{number}: two-body orbit, e = {ecc}, exact from Kepler's equation")


# --------------------------------------------------------------------------
# Stiff problems beyond Robertson.

def _hires() -> Problem:
    """HIRES (Schaefer 1975; Hairer & Wanner, Solving ODEs II, Sec. IV.10; the
    Bari test set): 8 species of a light-induced plant physiology process,

        y1' = -1.71 y1 + 0.43 y2 + 8.32 y3 + 0.0007
        y2' =  1.71 y1 - 8.75 y2
        y3' = -10.03 y3 + 0.43 y4 + 0.035 y5
        y4' =  8.32 y2 + 1.71 y3 - 1.12 y4
        y5' = -1.745 y5 + 0.43 y6 + 0.43 y7
        y6' = -k y6 y8 + 0.69 y4 + 1.71 y5 - 0.43 y6 + 0.69 y7
        y7' =  k y6 y8 - 1.81 y7
        y8' = -k y6 y8 + 1.81 y7

    with k = 280, y0 = (1, 0, 0, 0, 0, 0, 0, 0.0057), on [0, 321.8122].
    """
    y0 = np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0057])

    def func(y, t, k):
        y1, y2, y3, y4, y5, y6, y7, y8 = (y[i] for i in range(8))
        r = k * y6 * y8
        return jnp.stack([
            -1.71 * y1 + 0.43 * y2 + 8.32 * y3 + 0.0007,
            1.71 * y1 - 8.75 * y2,
            -10.03 * y3 + 0.43 * y4 + 0.035 * y5,
            8.32 * y2 + 1.71 * y3 - 1.12 * y4,
            -1.745 * y5 + 0.43 * y6 + 0.43 * y7,
            -r + 0.69 * y4 + 1.71 * y5 - 0.43 * y6 + 0.69 * y7,
            r - 1.81 * y7,
            -r + 1.81 * y7])

    return Problem("hires", func, y0, np.array([0.0, 5.0, 321.8122]), (280.0,), None, True,
                   "HIRES: 8-species plant physiology, k = 280, t up to 321.8122")


HEAT_POINTS = 100


def _heat_equation() -> Problem:
    """The heat equation ``u_t = kappa u_xx`` on (0, 1) with u = 0 at both ends,
    by the method of lines: 100 interior points x_i = i / 101, second
    differences, ``u_i' = kappa (u_{i-1} - 2 u_i + u_{i+1}) / dx^2``, from the
    hat ``u(x, 0) = min(x, 1 - x)``, kappa = 1, on [0, 0.5]. The semi-discrete
    system is exact in the discrete sine basis: mode j (sin(j pi x_i)) decays
    at the rate ``kappa (4 / dx^2) sin^2(j pi dx / 2)``, up to 4e4 (stiff)."""
    n = HEAT_POINTS
    dx = 1.0 / (n + 1)
    x = np.arange(1, n + 1) * dx
    y0 = np.minimum(x, 1.0 - x)
    modes = np.sin(np.pi * np.outer(np.arange(1, n + 1), x))      # (j, i), orthogonal rows
    coefficients = modes @ y0 * (2.0 / (n + 1))
    rates = (4.0 / dx**2) * np.sin(np.arange(1, n + 1) * np.pi * dx / 2) ** 2

    def func(u, t, kappa):
        padded = jnp.concatenate([jnp.zeros(1, u.dtype), u, jnp.zeros(1, u.dtype)])
        return kappa * (padded[:-2] - 2.0 * u + padded[2:]) / dx**2

    def exact(t, kappa):
        decay = jnp.exp(-jnp.asarray(kappa) * jnp.asarray(t)[:, None] * rates[None, :])
        return (decay * coefficients[None, :]) @ jnp.asarray(modes)

    return Problem("heat_equation", func, y0, np.linspace(0.0, 0.5, 6), (1.0,), exact, True,
                   "u_t = kappa u_xx by the method of lines, 100 points, t up to 0.5")


def _van_der_pol() -> Problem:
    """Van der Pol's relaxation oscillator (Hairer & Wanner, Solving ODEs II,
    Sec. IV.1), ``y1' = y2``, ``y2' = mu (1 - y1^2) y2 - y1``, mu = 1000, y0 =
    (2, 0), on [0, 3000] (about two periods; stiff between the jumps). SciPy's
    Radau reference takes about 10 s on 2 cores."""
    def func(y, t, mu):
        return jnp.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])

    return Problem("van_der_pol", func, np.array([2.0, 0.0]), np.linspace(0.0, 3000.0, 7),
                   (1000.0,), None, True, "Van der Pol, mu = 1000, t up to 3000")


PROBLEMS: dict[str, Problem] = {p.name: p for p in (
    _exponential_decay(), _harmonic_oscillator(), _time_dependent_linear(),
    _complex_rotation(), _pytree_state(), _kepler(), _pendulum(), _lotka_volterra(),
    _robertson())}


# The DETEST problems are kept out of PROBLEMS so that the method x problem
# grids over PROBLEMS stay as they are; tests/testing/test_detest.py runs them.
DETEST: dict[str, Problem] = {p.name: p for p in (
    _detest_a2(), _detest_b1(), _detest_b5(), _detest_c1(), _detest_d(1, 0.1),
    _detest_d(3, 0.5), _detest_d(5, 0.9), _detest_e1(), _detest_e2())}

# Stiff problems beyond Robertson (for stiff methods and the stiffness test).
STIFF: dict[str, Problem] = {p.name: p for p in (_hires(), _heat_equation(), _van_der_pol())}

def get_problem(name: str) -> Problem:
    """The registered problem called ``name`` (in :data:`PROBLEMS`, :data:`DETEST`
    or :data:`STIFF`).

    Raises:
      KeyError: naming the available problems when ``name`` is unknown.
    """
    for registry in (PROBLEMS, DETEST, STIFF):
        if name in registry:
            return registry[name]
    raise KeyError(f"Unknown problem {name!r}; choose one of "
                   f"{sorted(PROBLEMS) + sorted(DETEST) + sorted(STIFF)}.")


# --------------------------------------------------------------------------
# References.

def _leaf_layout(y0: Pytree) -> tuple[list, Any]:
    leaves, treedef = jax.tree.flatten(y0)
    return [(np.shape(leaf), np.asarray(leaf).dtype) for leaf in leaves], treedef


def _ravel(tree: Pytree, xp: Any) -> Any:
    """All leaves of ``tree`` flattened and concatenated (complex if any is)."""
    return xp.concatenate([xp.ravel(leaf) for leaf in jax.tree.leaves(tree)])


def _unravel(flat: Any, layout: list, treedef: Any, xp: Any) -> Pytree:
    """Inverse of :func:`_ravel` along the last axis of ``flat`` (leading axes kept)."""
    leaves, start = [], 0
    for shape, dtype in layout:
        size = int(np.prod(shape))
        piece = flat[..., start:start + size]
        if not np.issubdtype(dtype, np.complexfloating):
            piece = xp.real(piece)
        leaves.append(piece.reshape(flat.shape[:-1] + shape))
        start += size
    return jax.tree.unflatten(treedef, leaves)


def _as_numpy(tree: Pytree) -> Pytree:
    return jax.tree.map(np.asarray, tree)


def _key(problem: Problem, t: np.ndarray, args: tuple, method: str, rtol: float,
         atol: float) -> tuple:
    arg_bytes = tuple(np.asarray(a).tobytes() + f"{np.shape(a)}{np.asarray(a).dtype}".encode()
                      for a in jax.tree.leaves(args))
    return (problem, t.tobytes(), arg_bytes, method, rtol, atol)


_SCIPY_CACHE: dict[tuple, Pytree] = {}
_JITTED_EXACT: dict[Problem, Callable] = {}


def scipy_solution(problem: Problem, t: Any = None, args: tuple | None = None,
                   method: str | None = None, rtol: float | None = None,
                   atol: float | None = None) -> Pytree:
    """Solve ``problem`` with ``scipy.integrate.solve_ivp`` and return y at ``t``.

    The state pytree is raveled into one vector for SciPy (complex when any leaf
    is), and the vector field is jitted once per call in float64. Results are
    cached by problem, times, arguments and tolerances.

    Args:
      problem: the problem; integration starts from ``problem.y0`` at
        ``problem.t0``.
      t: (m,) increasing output times >= ``problem.t0``; default ``problem.t``.
      args: parameters; default ``problem.args``.
      method: SciPy method; default "DOP853", or "Radau" for stiff problems
        (with the Jacobian from ``jax.jacfwd``).
      rtol, atol: SciPy tolerances; default 1e-13 (1e-10 and 1e-14 for stiff
        problems).

    Returns:
      A pytree like ``y0`` of float64/complex128 NumPy arrays with a leading
      axis of length m.

    Raises:
      RuntimeError: when SciPy fails.
    """
    t = np.asarray(problem.t if t is None else t, np.float64).reshape(-1)
    args = problem.args if args is None else tuple(args)
    method = method or ("Radau" if problem.stiff else "DOP853")
    rtol = rtol if rtol is not None else (STIFF_REFERENCE_RTOL if problem.stiff else REFERENCE_RTOL)
    atol = atol if atol is not None else (STIFF_REFERENCE_ATOL if problem.stiff else REFERENCE_ATOL)
    if t.size and t[0] < problem.t0:
        raise ValueError(f"scipy_solution: t must start at or after t0 = {problem.t0}, got {t[0]}.")
    key = _key(problem, t, args, method, rtol, atol)
    if key not in _SCIPY_CACHE:
        _SCIPY_CACHE[key] = _solve_with_scipy(problem, t, args, method, rtol, atol)
    return jax.tree.map(np.copy, _SCIPY_CACHE[key])


def _solve_with_scipy(problem, t, args, method, rtol, atol):
    import scipy.integrate  # lazily: ``import odekit`` must not import SciPy

    layout, treedef = _leaf_layout(problem.y0)
    y0_flat = _ravel(jax.tree.map(np.asarray, problem.y0), np)
    with jax.enable_x64(True):
        np_args = tuple(jax.tree.map(lambda a: np.asarray(a, np.float64), args))

        def flat_func(s, y):
            return _ravel(problem.func(_unravel(y, layout, treedef, jnp), s, *np_args), jnp)

        fun = jax.jit(flat_func)
        jac = jax.jit(jax.jacfwd(flat_func, argnums=1)) if method in ("Radau", "BDF", "LSODA") else None
        extra = {"jac": (lambda s, y: np.asarray(jac(s, y)))} if jac is not None else {}
        if t[-1] > problem.t0:
            sol = scipy.integrate.solve_ivp(
                lambda s, y: np.asarray(fun(s, y)), (problem.t0, float(t[-1])), y0_flat,
                method=method, t_eval=t, rtol=rtol, atol=atol, **extra)
            if not sol.success:
                raise RuntimeError(f"scipy_solution({problem.name!r}): {sol.message}")
            ys = sol.y.T
        else:
            ys = np.repeat(y0_flat[None], t.size, axis=0)
    return _unravel(ys, layout, treedef, np)


def reference_solution(problem: Problem, t: Any = None, args: tuple | None = None) -> Pytree:
    """The solution of ``problem`` at times ``t``: exact when known, else SciPy's.

    The exact solution is evaluated in float64; without one, the problem is
    solved by :func:`scipy_solution` (DOP853 at rtol = atol = 1e-13, or Radau
    at rtol = 1e-10, atol = 1e-14 for stiff problems; cached).

    Args:
      problem: a :class:`Problem`.
      t: (m,) output times >= ``problem.t0``; default ``problem.t``.
      args: parameters; default ``problem.args``.

    Returns:
      A pytree like ``problem.y0`` of NumPy arrays with a leading axis of
      length m.
    """
    t = np.asarray(problem.t if t is None else t, np.float64).reshape(-1)
    args = problem.args if args is None else tuple(args)
    if problem.exact is None:
        return scipy_solution(problem, t, args)
    with jax.enable_x64(True):
        if problem not in _JITTED_EXACT:
            _JITTED_EXACT[problem] = jax.jit(problem.exact)
        return _as_numpy(_JITTED_EXACT[problem](t, *args))


def _fall(t: Any, y: jax.Array, g: Any) -> jax.Array:
    return jnp.stack([y[1], -g * jnp.ones_like(y[0])])


def _hit_ground(t: Any, y: jax.Array, g: Any) -> jax.Array:
    return y[0]


_hit_ground.terminal, _hit_ground.direction = True, -1


def falling_body() -> tuple[Callable, Callable]:
    """``(fall, hit_ground)``: a body falling under gravity ``g``, in
    solve_ivp's argument order, and its terminal event (height 0, falling).

    ``fall(t, y, g) = [y[1], -g]`` for ``y = [height, velocity]``;
    ``hit_ground(t, y, g) = y[0]`` with ``terminal=True, direction=-1``.
    From height ``h`` at rest the fall time is ``sqrt(2 h / g)`` (its
    derivative w.r.t. g: ``-sqrt(2 h / g**3) / 2``) and ``y(t) = h - g t**2 / 2``.
    """
    return _fall, _hit_ground


def brusselator_1d(t: Any, y: jax.Array, params: jax.Array) -> jax.Array:
    """The 1-D Brusselator by the method of lines (Hairer & Wanner, Solving
    ODEs II, problem BRUSS): ``y`` of shape (2N,) interleaves (u_i, v_i) on
    N interior points of [0, 1] with u = 1 and v = 3 at both ends;
    ``params = (a, b, alpha)``. Its Jacobian is banded (bandwidth 2)."""
    del t
    a, b, alpha = params[0], params[1], params[2]
    uv = y.reshape(-1, 2)
    u, v = uv[:, 0], uv[:, 1]
    dx2 = (1.0 / (u.shape[0] + 1)) ** 2
    one, three = jnp.ones((1,), u.dtype), jnp.full((1,), 3.0, u.dtype)
    u_ext, v_ext = jnp.concatenate([one, u, one]), jnp.concatenate([three, v, three])
    du = a + u * u * v - (b + 1) * u + alpha * (u_ext[:-2] - 2 * u + u_ext[2:]) / dx2
    dv = b * u - u * u * v + alpha * (v_ext[:-2] - 2 * v + v_ext[2:]) / dx2
    return jnp.stack([du, dv], axis=1).reshape(-1)


def robertson_groups(t: Any, y: jax.Array, k1: Any, k2: Any, k3: Any) -> jax.Array:
    """Robertson's mechanism repeated over independent groups (SciPy's
    argument order): ``y`` of shape (3 g,) holds g copies of (y1, y2, y3),

        y1' = -k1 y1 + k3 y2 y3,   y2' = -y1' - y3',   y3' = k2 y2^2

    (here k2 = 3e7 multiplies y2^2 and k3 = 1e4 multiplies y2 y3, the
    reverse of the registry's order). Its Jacobian is block diagonal, 3 x 3
    blocks with 7 nonzeros each."""
    del t
    g = y.reshape(-1, 3)
    a, b, c = g[:, 0], g[:, 1], g[:, 2]
    da = -k1 * a + k3 * b * c
    dc = k2 * b * b
    return jnp.stack([da, -da - dc, dc], axis=1).reshape(-1)

