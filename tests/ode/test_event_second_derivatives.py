"""Second derivatives of event times, and jacfwd of jacfwd through the
forward sensitivities with t_eval=None (issue 27, items 6 and 14).

Free fall x' = v, v' = -w from x = h at rest: the ground is reached at
t* = sqrt(2 h / w), so dt*/dw = -sqrt(2 h) w^{-3/2} / 2 and
d2t*/dw2 = 3 sqrt(2 h) w^{-5/2} / 4 (the first-order correction the event
times had gave 4.8e-8 for a second derivative of 4.29). The event times
now differentiate the implicit rule again, at every order.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

TOL = dict(rtol=1e-10, atol=1e-12, max_steps=64)
H = 10.0
# The event times' rule is the same for every method; bosh3 (exact on free
# fall, as tsit5 is) traces and compiles the second derivative in 25% less
# time. tsit5's (solve_ivp's default) second derivatives: in CI in
# tests/ode/test_solve_ivp.py.
METHOD = "bosh3"


def _fall(t, y, w):
    return jnp.stack([y[1], -w + 0.0 * y[0]])


def _ground(t, y, w):
    return y[0]


_ground.terminal = True


def _landing(w, adjoint):
    sol = odekit.solve_ivp(_fall, (0.0, 3.0), jnp.array([H, 0.0]), args=(w,), events=_ground,
                           method=METHOD, adjoint=adjoint, **TOL)
    return sol.t_events[0]


def _exact(w):
    return (np.sqrt(2 * H / w), -0.5 * np.sqrt(2 * H) * w ** -1.5,
            0.75 * np.sqrt(2 * H) * w ** -2.5)


@pytest.mark.parametrize("adjoint", ["checkpoint", pytest.param("backsolve", marks=pytest.mark.long),
                                     pytest.param("forward", marks=pytest.mark.long)])
def test_second_derivative_of_an_event_time(adjoint):
    w = 9.81
    value, first, second = _exact(w)
    landing = lambda w: _landing(w, adjoint)
    d = jax.jacfwd if adjoint == "forward" else jax.grad
    # one program for the three (compiling them one by one took 1.3x longer)
    got = jax.jit(lambda w: (landing(w), d(landing)(w), d(d(landing))(w)))(w)
    np.testing.assert_allclose(got[0], value, rtol=1e-12)
    np.testing.assert_allclose(got[1], first, rtol=1e-9)
    np.testing.assert_allclose(got[2], second, rtol=1e-8)


@pytest.mark.long
def test_mixed_second_derivatives_with_the_start_time():
    """t* = t0 + sqrt(2 h / w): d2t*/dt0 dw = 0 and d2t*/dt0^2 = 0, and the
    hessian in (t0, w) by jax.hessian (forward over reverse)."""
    def landing(p):
        t0, w = p[0], p[1]
        sol = odekit.solve_ivp(_fall, (t0, t0 + 3.0), jnp.array([H, 0.0]), args=(w,),
                               events=_ground, **TOL)
        return sol.t_events[0]

    w = 9.81
    hessian = jax.hessian(landing)(jnp.array([0.5, w]))
    np.testing.assert_allclose(hessian, [[0.0, 0.0], [0.0, _exact(w)[2]]], rtol=1e-8,
                               atol=1e-10)


def test_interpolate_refuses_a_second_derivative():
    with pytest.raises(TypeError, match="first derivatives only"):
        jax.grad(jax.grad(_landing))(9.81, "interpolate")


def test_jacfwd_of_jacfwd_forward_sensitivities_every_recorded_row():
    """adjoint="forward", t_eval=None: "Cannot lower jaxpr with verifier
    errors" before (a tangent leaf batched in one rule and not in the other). y' = -k y: y(t_i) = e^{-k t_i}, d2/dk2 = t_i^2 e^{-k t_i}
    at every recorded row, and d2 sol.ts/dk2 = 0."""
    def rows(k):
        sol = odekit.solve_ivp(lambda t, y: -k * y, (0.0, 1.0), jnp.array([1.0]),
                               adjoint="forward", **TOL)
        return sol.ys[:, 0], sol.ts, sol.num_points

    k = 0.7
    _, ts, n = rows(k)
    n = int(n)
    d2y, d2t = jax.jacfwd(jax.jacfwd(lambda k: rows(k)[:2]))(k)
    ts = np.asarray(ts[:n])
    # The discrete solution's second derivative (step sizes held fixed) is
    # off the exact one by its discretisation error: 3.7e-6 at most here.
    np.testing.assert_allclose(d2y[:n], ts ** 2 * np.exp(-k * ts), rtol=1e-5, atol=1e-12)
    np.testing.assert_array_equal(d2t[:n], 0.0)
