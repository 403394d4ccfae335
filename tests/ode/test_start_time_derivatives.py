"""Derivatives with respect to a traced start time t0 (issue 27, item 9).

Event times, event states, dense output and the recorded times all move
with t0; every adjoint must carry that derivative. Exact values:

* free fall x' = v, v' = -g from x = 10 at t0: t* = t0 + sqrt(20 / g), so
  dt*/dt0 = 1 (was 0.0);
* y' = t, y(t0) = 0, event y = 4: t* = sqrt(t0^2 + 8), dt*/dt0 = t0 / t*
  = 1/3 at t0 = 1 (was -0.277); the state z' = 1 there is t* - t0, so
  dz(t*)/dt0 = 1/3 - 1 (was -0.301);
* y' = -y, y(t0) = 1: y(2) = e^{t0 - 2}, d sol.sol(2)/dt0 = e^{-1.5} at
  t0 = 0.5 (was 0.0);
* t_eval=None: every recorded time but the last is t0 plus the steps
  taken (d/dt0 = 1), the last is t1 (d/dt1 = 1; the continuous adjoints
  gave 0).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

TOL = dict(rtol=1e-10, atol=1e-12, max_steps=64)
ADJOINTS = ["checkpoint", "forward", "interpolate", "backsolve"]


def _fall(t, y):
    return jnp.stack([y[1], -9.81 + 0.0 * y[0]])


def _ground(t, y):
    return y[0]


_ground.terminal = True
_ground.direction = -1


def _quantities(t0, adjoint):
    """(4,) outputs of solves starting at t0 + offsets, each with a known
    derivative 1 (see the module doc)."""
    fall = odekit.solve_ivp(_fall, (t0, t0 + 5.0), jnp.array([10.0, 0.0]), events=_ground,
                            adjoint=adjoint, **TOL)
    level = lambda t, y: y[0] - 4.0
    ramp = odekit.solve_ivp(lambda t, y: jnp.stack([t, 1.0 + 0.0 * t]), (t0 + 1.0, 10.0),
                            jnp.zeros(2), events=level, adjoint=adjoint, **TOL)
    decay = odekit.solve_ivp(lambda t, y: -y, (t0 + 0.5, 3.0), jnp.array([1.0]),
                             dense_output=True, adjoint=adjoint, **TOL)
    return jnp.stack([fall.t_events[0], ramp.t_events[0], ramp.y_events[0, 1],
                      decay.sol(2.0)[0]])


@pytest.mark.parametrize("adjoint", ["checkpoint", pytest.param("interpolate", marks=pytest.mark.long),
                                     pytest.param("forward", marks=pytest.mark.long),
                                     pytest.param("backsolve", marks=pytest.mark.long)])
def test_event_times_states_and_dense_output_move_with_t0(adjoint):
    jac = jax.jacfwd if adjoint == "forward" else jax.jacrev
    derivative = jax.jit(jac(_quantities), static_argnums=1)(0.0, adjoint)
    exact = [1.0, 1.0 / 3.0, 1.0 / 3.0 - 1.0, np.exp(-1.5)]
    np.testing.assert_allclose(derivative, exact, rtol=1e-8)


# (the continuous adjoints' derivatives of every recorded row in t0 and t1:
# tests/ode/test_span_derivatives.py in CI; here long)
@pytest.mark.parametrize("adjoint", [a if a in ("checkpoint", "forward")
                                     else pytest.param(a, marks=pytest.mark.long)
                                     for a in ADJOINTS])
def test_recorded_times_move_with_the_span(adjoint):
    """sol.ts (t_eval=None): d ts_k/dt0 = 1 but for the last row, d/dt1 = 1 there."""
    def times(span):
        sol = odekit.solve_ivp(lambda t, y: -y, (span[0], span[1]), jnp.array([1.0]),
                               adjoint=adjoint, **TOL)
        return sol.ts[:6], sol.num_points

    ts, n = times(jnp.array([0.0, 0.05]))
    n = int(n)
    assert 2 < n < 6
    jac = jax.jacfwd if adjoint == "forward" else jax.jacrev
    d = jac(lambda span: times(span)[0])(jnp.array([0.0, 0.05]))[:n]
    expected = np.zeros((n, 2))
    expected[:-1, 0] = 1.0
    expected[-1, 1] = 1.0
    np.testing.assert_allclose(d, expected, atol=1e-12)


# Long: its parts run in CI, an event time and an event state moving with
# the solve's inputs and a t0 traced into a solve (checkpoint:
# test_event_times_states_and_dense_output_move_with_t0 above).
@pytest.mark.parametrize("adjoint", [pytest.param("checkpoint", marks=pytest.mark.long)])
def test_bouncing_ball_restarted_from_the_bounce(adjoint):
    """A ball dropped from height h bounces (v -> -e v) and is restarted from
    the bounce, t_span = (t_bounce, ...): the second landing time is
    t1 + 2 e v1 / g with t1 = sqrt(2 h / g), v1 = g t1; its derivative in h
    (through the first event time and the restart) is exact."""
    g, e = 9.81, 0.8

    def second_landing(h):
        first = odekit.solve_ivp(_fall, (0.0, 5.0), jnp.stack([h, 0.0]), events=_ground,
                                 adjoint=adjoint, **TOL)
        t1, y1 = first.t_events[0], first.y_events[0]
        second = odekit.solve_ivp(_fall, (t1, t1 + 5.0), jnp.stack([y1[0], -e * y1[1]]),
                                  events=_ground, adjoint=adjoint, **TOL)
        return second.t_events[0]

    h = 10.0
    t1 = np.sqrt(2 * h / g)
    exact = t1 + 2 * e * g * t1 / g
    d_exact = (1 + 2 * e) * 0.5 * np.sqrt(2 / (g * h))
    np.testing.assert_allclose(second_landing(h), exact, rtol=1e-8)
    np.testing.assert_allclose(jax.grad(second_landing)(h), d_exact, rtol=1e-7)


def test_interpolate_after_a_terminal_event_that_shortened_the_last_step():
    """adjoint="interpolate" takes y(t) in the last step from the step as it
    was taken (the full step that located the event, as sol.sol does), not
    a shorter step taken again. y' = -p y^2, y(0) = 1, stopped by the event
    t = T: y(T) = 1 / (1 + p T), d y(T)/dp = -T / (1 + p T)^2, to the
    tolerance (measured: 1.39e-4 relative at rtol 1e-3, 5.6e-6 at 1e-5)."""
    T, p = 2.7, 1.3

    def stop(t, y, p):
        return t - T

    stop.terminal = True

    def final(p, rtol):
        sol = odekit.solve_ivp(lambda t, y, p: -p * y ** 2, (0.0, 10.0), jnp.array([1.0]),
                               args=(p,), events=stop, adjoint="interpolate", rtol=rtol,
                               atol=1e-12, max_steps=64)
        return sol.ys[sol.num_points - 1, 0]

    exact = -T / (1 + p * T) ** 2
    np.testing.assert_allclose(jax.grad(final)(p, 1e-3), exact, rtol=5e-4)
    np.testing.assert_allclose(jax.grad(final)(p, 1e-5), exact, rtol=2e-5)
