"""Derivatives of the recorded rows (``t_eval=None``) with respect to the
span ``(t0, t1)`` by the continuous adjoints (issue 27, item 2).

The last recorded row is y(t1): d/dt1 = f(t1, y(t1)) and d/dt0 = -Phi(t1,
t0) f(t0, y0). Every other row sits at t0 plus the steps taken: it does not
depend on t1, and for y' = f(y) not on t0 either (the discrete derivative
of the steps, which adjoint="checkpoint" takes, is the reference).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

CONTINUOUS = ["interpolate", "backsolve"]
TOL = dict(rtol=1e-10, atol=1e-12, max_steps=400)   # a short record: cheap jacrev
ODEINT_TOL = dict(rtol=1e-10, atol=1e-12)


def _decay(t, y):
    return -1.3 * y


def _lotka_volterra(t, y):
    return jnp.stack([1.5 * y[0] - y[0] * y[1], -3.0 * y[1] + y[0] * y[1]])


def _rows(func, y0, adjoint, t0, t1, **kw):
    sol = odekit.solve_ivp(func, (t0, t1), y0, t_eval=None, adjoint=adjoint, **kw)
    return sol.ys, sol.num_points


def _span_jacobians(func, y0, adjoint, t0, t1, jit, **kw):
    """(rows, d rows/dt0, d rows/dt1) over the recorded rows: one jacrev in
    the span (t0, t1), one program for both derivatives (30-45% less time
    than one jacrev for each end)."""
    ys, n = _rows(func, y0, adjoint, t0, t1, **kw)
    d = jax.jacrev(lambda span: _rows(func, y0, adjoint, span[0], span[1], **kw)[0])
    if jit:
        d = jax.jit(d)
    n = int(n)
    both = d(jnp.array([t0, t1]))[:n]
    return ys[:n], both[..., 0], both[..., 1]


# (without jit: long; test_every_row_of_a_decay_matches_checkpoint takes both
# adjoints' span derivatives eagerly in CI)
@pytest.mark.parametrize("jit", [pytest.param(False, marks=pytest.mark.long), True])
@pytest.mark.parametrize("adjoint", CONTINUOUS)
def test_last_row_of_a_decay_against_the_closed_form(adjoint, jit):
    """y' = -1.3 y, y0 = 1 on [0, 2]: d y(2)/dt1 = -1.3 e^{-2.6} (was 0.0),
    d y(2)/dt0 = 1.3 e^{-2.6}; grad of the last row, as a user writes it."""
    y0 = jnp.array([1.0])

    def last(t0, t1, adj):
        sol = odekit.solve_ivp(_decay, (t0, t1), y0, t_eval=None, adjoint=adj, **TOL)
        return sol.ys[sol.num_points - 1, 0]

    grad = jax.grad(last, argnums=(0, 1))
    if jit:
        grad = jax.jit(grad, static_argnums=2)
    d0, d1 = grad(0.0, 2.0, adjoint)
    exact = 1.3 * np.exp(-2.6)
    np.testing.assert_allclose(d1, -exact, rtol=1e-8)
    np.testing.assert_allclose(d0, exact, rtol=1e-8)
    ref0, ref1 = grad(0.0, 2.0, "checkpoint")
    np.testing.assert_allclose(d1, ref1, rtol=1e-8)
    np.testing.assert_allclose(d0, ref0, rtol=1e-8)


# (backsolve: long; its every row's span derivatives run in CI under jit, on
# Lotka-Volterra below)
@pytest.mark.parametrize("adjoint", ["interpolate", pytest.param("backsolve",
                                                                 marks=pytest.mark.long)])
def test_every_row_of_a_decay_matches_checkpoint(adjoint):
    """Rows before the last: no t1 dependence, and (autonomous) none on t0
    (was 1.3 y_i for every row, the first, y0 itself, included)."""
    y0 = jnp.array([1.0])
    ys, d0, d1 = _span_jacobians(_decay, y0, adjoint, 0.0, 2.0, jit=False, **TOL)
    _, r0, r1 = _span_jacobians(_decay, y0, "checkpoint", 0.0, 2.0, jit=False, **TOL)
    assert d0.shape == r0.shape
    np.testing.assert_allclose(d1, r1, atol=1e-10)
    np.testing.assert_allclose(d0, r0, atol=1e-10)
    np.testing.assert_allclose(d1[-1], -1.3 * ys[-1], rtol=1e-8)
    np.testing.assert_array_equal(d1[:-1], 0.0)


@pytest.mark.parametrize("span", [(0.0, 2.0), pytest.param((2.0, 0.0), marks=pytest.mark.long)])
@pytest.mark.parametrize("adjoint", [pytest.param("interpolate", marks=pytest.mark.long),
                                     "backsolve"])
def test_lotka_volterra_rows_match_checkpoint_under_jit(adjoint, span):
    """A nonlinear 2-component problem, forwards and backwards in time: every
    row's t0 and t1 derivative as checkpoint's, the last row's d/dt1 = f."""
    y0 = jnp.array([1.0, 1.0])
    kw = dict(rtol=1e-10, atol=1e-10, max_steps=400)
    ys, d0, d1 = _span_jacobians(_lotka_volterra, y0, adjoint, *span, jit=True, **kw)
    _, r0, r1 = _span_jacobians(_lotka_volterra, y0, "checkpoint", *span, jit=True, **kw)
    assert d0.shape == r0.shape
    np.testing.assert_allclose(d1, r1, atol=1e-6)
    np.testing.assert_allclose(d0, r0, atol=1e-6)
    f_end = _lotka_volterra(span[1], ys[-1])
    np.testing.assert_allclose(d1[-1], f_end, rtol=1e-6)
    np.testing.assert_allclose(d0[-1], -f_end, rtol=1e-6)   # autonomous: -d/dt1


@pytest.mark.parametrize("adjoint", [pytest.param("interpolate", marks=pytest.mark.long),
                                     "backsolve"])
def test_rows_after_a_terminal_event_match_checkpoint(adjoint):
    """A terminal event y = 0.3 stops y' = -y: the last row is 0.3 whatever
    t0 is (was d/dt0 = 0.3: its time taken as fixed)."""
    def event(t, y):
        return y[0] - 0.3
    event.terminal = True

    def last(t0, adj):
        sol = odekit.solve_ivp(lambda t, y: -y, (t0, 3.0), jnp.array([1.0]), events=event,
                               adjoint=adj, **TOL)
        return sol.ys[sol.num_points - 1, 0]

    np.testing.assert_allclose(jax.grad(last)(0.0, adjoint), jax.grad(last)(0.0, "checkpoint"),
                               atol=1e-9)


# (backsolve, odeint's default: long; its time derivatives meet central
# differences and the closed form in tests/ode/test_odeint_grads.py)
@pytest.mark.parametrize("adjoint", ["interpolate", pytest.param("backsolve",
                                                                 marks=pytest.mark.long)])
def test_odeint_time_derivatives_unchanged(adjoint):
    """odeint (its grid always given): d y(t_i)/d t_i = f, d/dt_0 = -Phi f."""
    t = jnp.array([0.0, 1.0, 2.0])
    jac = jax.jacrev(lambda t: odekit.odeint(lambda y, t: -1.3 * y, jnp.array([1.0]), t,
                                             adjoint=adjoint, **ODEINT_TOL)[:, 0])(t)
    ref = jax.jacrev(lambda t: odekit.odeint(lambda y, t: -1.3 * y, jnp.array([1.0]), t,
                                             adjoint="checkpoint", **ODEINT_TOL)[:, 0])(t)
    np.testing.assert_allclose(jac, ref, atol=1e-9)
    np.testing.assert_allclose(jac[2, 2], -1.3 * np.exp(-2.6), rtol=1e-8)
    np.testing.assert_allclose(jac[2, 0], 1.3 * np.exp(-2.6), rtol=1e-8)
