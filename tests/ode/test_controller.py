"""The step-size rule (odekit.ode.engine.controller.propose_step) and each method's
choice of it, against the formula and against SciPy's DOP853."""
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

from odekit import solve_ivp
from odekit.ode.engine import controller
from odekit.ode.methods import METHODS, get_method
from odekit.testing.problems import get_problem


def _factor(err, err_prev, k, beta2=None, accepted=True, previous_rejected=False):
    h = controller.propose_step(jnp.array(1.0), jnp.array(err), jnp.array(err_prev), k,
                                jnp.array(accepted), jnp.array(previous_rejected), beta2)
    return float(h)


@pytest.mark.parametrize("err", [1e-3, 0.05, 0.7, 3.0])
def test_plain_rule_ignores_the_previous_error(err):
    expected = np.clip(controller.SAFETY * err ** (-1 / 8), controller.DFACTOR, controller.IFACTOR)
    if err > 1:
        expected = min(expected, 1.0)
    for err_prev in (1e-6, 0.3, 1.0):
        got = _factor(err, err_prev, 8, beta2=0.0, accepted=err <= 1)
        np.testing.assert_allclose(got, expected, rtol=1e-14)


@pytest.mark.parametrize("err, err_prev", [(0.05, 0.3), (0.5, 1e-6), (0.9, 0.9)])
def test_pi_rule_formula(err, err_prev):
    k = 5
    beta2 = controller.default_beta2(k)
    assert beta2 == pytest.approx(0.04)  # Hairer's dopri5.f
    beta1 = 1 / k - 0.75 * beta2
    expected = controller.SAFETY * err ** -beta1 * max(err_prev, 1e-4) ** beta2
    expected = np.clip(expected, controller.DFACTOR, controller.IFACTOR)
    np.testing.assert_allclose(_factor(err, err_prev, k), expected, rtol=1e-14)
    np.testing.assert_allclose(_factor(err, err_prev, k, beta2=beta2), expected, rtol=1e-14)


def test_rule_per_method():
    assert get_method("dopri8").controller_beta2 == 0.0   # dop853.f and SciPy's DOP853
    for name in ("bosh3", "dopri5", "tsit5"):
        assert METHODS[name].controller_beta2 is None       # Gustafsson's 0.2 / k


@pytest.mark.parametrize("rtol", [1e-4, 1e-7, 1e-10])
def test_dopri8_steps_like_scipy_dop853_on_the_kepler_orbit(rtol):
    """The same method with the same rule accepts as many steps as SciPy's
    DOP853 and evaluates as often within a few rejected steps."""
    p = get_problem("detest_d3")
    span = (p.t0, float(p.t[-1]))
    sol = solve_ivp(lambda t, y: p.func(y, t, *p.args), span, jnp.asarray(p.y0), method="dopri8",
                    rtol=rtol, atol=rtol * 1e-3, max_steps=10_000)
    mu = float(p.args[0])

    def two_body(t, y):
        r3 = (y[0] ** 2 + y[1] ** 2) ** 1.5
        return np.array([y[2], y[3], -mu * y[0] / r3, -mu * y[1] / r3])

    ref = scipy.integrate.solve_ivp(two_body, span, np.asarray(p.y0), method="DOP853", rtol=rtol,
                                    atol=rtol * 1e-3)
    accepted = int(sol.stats["num_accepted"])
    assert abs(accepted - (len(ref.t) - 1)) <= 2, (accepted, len(ref.t) - 1)
    assert int(sol.stats["nfev"]) <= 1.1 * ref.nfev, (sol.stats, ref.nfev)
