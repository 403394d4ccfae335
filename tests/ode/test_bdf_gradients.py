"""Gradients through bdf steps against central differences (issue 29, item
5): the checkpoint adjoint in reverse and forward mode, the interpolate
adjoint (y(t) from the recorded polynomials) and the forward adjoint, on Van der Pol with mu = 1000 over its stiff start and on the 1-D
Brusselator (20 grid points, state 40). Robertson is in test_bdf.py.

The derivative is that of the discrete solution with the step sizes and
orders held fixed (they carry none); central differences also see the
steps move with the parameters, an effect of the order of the tolerance,
so the solves use tight tolerances and the comparison a relative 1e-4. On
Van der Pol the reference is central differences of a tight Radau solve
(see ``van_der_pol_sensitivities``).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odekit
from odekit.testing.problems import brusselator_1d
from odekit.testing import check_grads


def _van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


VDP_T = np.array([0.1, 0.5])


def _van_der_pol_solve(adjoint):
    def solve(y0, mu):
        return odekit.solve_ivp(_van_der_pol, (0.0, 0.5), y0, args=(mu,), method="bdf",
                                rtol=1e-9, atol=1e-11, t_eval=jnp.asarray(VDP_T),
                                adjoint=adjoint, max_steps=1024).ys
    return solve


VDP_ARGS = (jnp.array([2.0, 0.0]), jnp.asarray(1000.0))


@pytest.fixture(scope="module")
def van_der_pol_sensitivities():
    """d y(t) / d (y0, mu) at t = 0.1, 0.5: central differences of SciPy's
    Radau at rtol 1e-13 ((2, 2, 3): time, component, (y0_1, y0_2, mu)).
    Central differences of the bdf solve itself are not used here: over
    the fast start a perturbation of 1e-5 moves step and order choices,
    and the jumps of the discrete solution there (~1e-9) make differences
    off by 1e-4 while the derivatives below agree to 1e-8."""
    def solve(p):
        mu = p[2]
        fun = lambda t, y: [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]
        jac = lambda t, y: [[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]]
        return scipy.integrate.solve_ivp(fun, (0.0, 0.5), p[:2], method="Radau", rtol=1e-13,
                                         atol=1e-15, t_eval=VDP_T, jac=jac).y.T
    p0, steps = np.array([2.0, 0.0, 1000.0]), np.array([1e-5, 1e-5, 1e-2])
    columns = [(solve(p0 + s * e) - solve(p0 - s * e)) / (2 * s) for s, e in zip(steps, np.eye(3))]
    return np.stack(columns, axis=-1)


def _van_der_pol_jacobian(adjoint, transform):
    dy0, dmu = jax.jit(transform(_van_der_pol_solve(adjoint), argnums=(0, 1)))(*VDP_ARGS)
    return np.concatenate([np.asarray(dy0), np.asarray(dmu)[..., None]], axis=-1)


def test_van_der_pol_checkpoint_reverse(van_der_pol_sensitivities):
    np.testing.assert_allclose(_van_der_pol_jacobian("checkpoint", jax.jacrev),
                               van_der_pol_sensitivities, rtol=1e-6, atol=1e-9)


def test_van_der_pol_forward_adjoint(van_der_pol_sensitivities):
    np.testing.assert_allclose(_van_der_pol_jacobian("forward", jax.jacfwd),
                               van_der_pol_sensitivities, rtol=1e-6, atol=1e-9)


def test_van_der_pol_interpolate_adjoint(van_der_pol_sensitivities):
    """The continuous adjoint with y(t) from the recorded bdf polynomials:
    within the tolerances' order of the exact sensitivities."""
    np.testing.assert_allclose(_van_der_pol_jacobian("interpolate", jax.jacrev),
                               van_der_pol_sensitivities, rtol=1e-5, atol=1e-8)


def test_van_der_pol_checkpoint_forward(van_der_pol_sensitivities):
    np.testing.assert_allclose(_van_der_pol_jacobian("checkpoint", jax.jacfwd),
                               van_der_pol_sensitivities, rtol=1e-6, atol=1e-9)


_brusselator = brusselator_1d


GRID = 20
X = np.arange(1, GRID + 1) / (GRID + 1)
BRUSS_Y0 = jnp.asarray(np.stack([1 + np.sin(2 * np.pi * X), np.full(GRID, 3.0)], axis=1).ravel())
BRUSS_PARAMS = jnp.array([1.0, 3.0, 1.0 / 50.0])


def _brusselator_solve(adjoint):
    def solve(params):
        sol = odekit.solve_ivp(_brusselator, (0.0, 0.5), BRUSS_Y0, args=(params,),
                               method="bdf", rtol=1e-8, atol=1e-10,
                               t_eval=jnp.array([0.5]), adjoint=adjoint, max_steps=1024)
        return sol.ys[-1, ::7]
    return solve


# (long, as the other adjoints on the Brusselator below: bdf's checkpoint
# gradient in reverse mode is in CI on Van der Pol, against Radau's sensitivities)
@pytest.mark.long
def test_brusselator_checkpoint_reverse():
    check_grads(jax.jit(_brusselator_solve("checkpoint")), (BRUSS_PARAMS,), modes=("rev",),
                rtol=1e-4, atol=1e-8)


@pytest.mark.long
def test_brusselator_interpolate_adjoint():
    check_grads(_brusselator_solve("interpolate"), (BRUSS_PARAMS,), modes=("rev",), rtol=1e-4,
                atol=1e-8)


@pytest.mark.long
def test_brusselator_forward_adjoint():
    check_grads(_brusselator_solve("forward"), (BRUSS_PARAMS,), modes=("fwd",), rtol=1e-4,
                atol=1e-8)


@pytest.mark.long
def test_brusselator_checkpoint_forward():
    check_grads(_brusselator_solve("checkpoint"), (BRUSS_PARAMS,), modes=("fwd",), rtol=1e-4,
                atol=1e-8)


def _forced(t, y, a):
    return jnp.stack([-a * y[0] + jnp.cos(t), -2.0 * y[1] + y[0]])


@pytest.mark.parametrize("adjoint", ["checkpoint",
                                     pytest.param("forward", marks=pytest.mark.long),
                                     pytest.param("interpolate", marks=pytest.mark.long)])
def test_derivatives_with_respect_to_both_ends_of_the_span(adjoint):
    """The last step is clipped to land on t1 and re-samples the history for
    its size: d y(t1) / d t1 = y'(t1) only if that re-sampling carries the
    derivative (it did not: 0.28 where FD and rodas5p give 0.65). Rows at
    t0, inside the last step and at t1."""
    weights = jnp.array([[0.5, -1.0], [1.0, 2.0], [-0.7, 0.3], [0.7, 0.4]])

    def loss(t0, t1):
        sol = odekit.solve_ivp(_forced, (t0, t1), jnp.array([1.0, 0.5]), args=(jnp.asarray(0.8),),
                               method="bdf", rtol=1e-10, atol=1e-12, adjoint=adjoint,
                               t_eval=jnp.stack([t0, 1.5, t1 - 1e-3, t1]))
        return jnp.sum(sol.ys * weights)

    span = (jnp.asarray(0.2), jnp.asarray(3.0))
    modes = ("fwd",) if adjoint == "forward" else ("rev",)
    check_grads(jax.jit(loss), span, modes=modes, rtol=1e-6, atol=1e-9)
    if adjoint == "checkpoint":
        # d/dt1 of the last row alone is W . y'(t1), the field at the solution there
        def last(t1):
            sol = odekit.solve_ivp(_forced, (span[0], t1), jnp.array([1.0, 0.5]),
                                   args=(jnp.asarray(0.8),), method="bdf", rtol=1e-10,
                                   atol=1e-12, adjoint=adjoint, t_eval=jnp.stack([t1]))
            return jnp.sum(sol.ys[0] * weights[-1]), sol.ys[0]
        # (one program gives the slope and y(t1))
        slope, y1 = jax.jit(jax.grad(last, has_aux=True))(span[1])
        expected = jnp.sum(_forced(span[1], y1, jnp.asarray(0.8)) * weights[-1])
        np.testing.assert_allclose(float(slope), float(expected), rtol=1e-7)
