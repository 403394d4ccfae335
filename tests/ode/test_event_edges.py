"""Events and dense output at their edges (issues 27 and 35): a zero exactly
at a step end, a terminal event at t0, a last step of (near) zero length,
and the state at a terminal event (from the interpolant that located it)."""
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

from odekit import solve_ivp

EXPLICIT = ["bosh3", "dopri5", "tsit5", "dopri8"]
ALL_METHODS = EXPLICIT + ["rodas5p", "kvaerno5", "auto"]


def decay(t, y):
    return -y


def dose(t, y):
    return t - 0.5


def dose_stop_at_second(t, y):
    return t - 0.5


dose_stop_at_second.terminal = 2


# ------------------------------------------------ 27.3: a zero at a step end

# bosh3 and dopri5 step and locate events as tsit5 does (one Runge-Kutta
# step, the tableau's dense output; dopri8 adds extra dense stages): long.
@pytest.mark.parametrize("method,single_kernel",
                         [(m, "1") if m not in ("bosh3", "dopri5")
                          else pytest.param(m, "1", marks=pytest.mark.long) for m in ALL_METHODS]
                         + [("tsit5", "0")]
                         + [pytest.param(m, "0", marks=pytest.mark.long)
                            for m in EXPLICIT if m != "tsit5"])
def test_zero_at_a_step_end_counts_once(method, single_kernel, monkeypatch):
    # Steps of exactly max_step = 0.25 (y' = 1: no error) end on t = 0.5,
    # where g = t - 0.5 is exactly zero, then positive: counted twice before.
    monkeypatch.setenv("ODEKIT_SINGLE_KERNEL", single_kernel)
    sol = solve_ivp(lambda t, y: jnp.ones_like(y), (0.0, 1.0), jnp.array([0.0]),
                    method=method, events=[dose, dose_stop_at_second], first_step=0.25,
                    max_step=0.25, dense_output=True)
    n = int(sol.sol.num_points)
    assert 0.5 in np.asarray(sol.sol.ts[:n])     # a step ends on the zero
    np.testing.assert_array_equal(np.asarray(sol.event_counts), [1, 1])
    # One sign change: the count of 2 that stops the solve is never reached.
    assert int(sol.status) == 0 and bool(sol.success) and float(sol.ts[int(sol.num_points) - 1]) == 1.0
    for e in range(2):
        assert float(sol.t_events[e][0]) == 0.5
        assert np.all(np.isinf(np.asarray(sol.t_events[e][1:])))
        np.testing.assert_allclose(np.asarray(sol.y_events[e][0]), [0.5], rtol=1e-12)


def test_zero_on_a_t_eval_kvaerno5_counts_once():
    # The case: kvaerno5 lands its steps on t_eval.
    sol = solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), t_eval=[0.25, 0.5, 0.75],
                    method="kvaerno5", events=[dose, dose_stop_at_second], rtol=1e-8,
                    atol=1e-10)
    np.testing.assert_array_equal(np.asarray(sol.event_counts), [1, 1])
    assert int(sol.status) == 0 and bool(sol.success)
    for e in range(2):
        assert float(sol.t_events[e][0]) == 0.5
        np.testing.assert_allclose(np.asarray(sol.y_events[e][0]), [np.exp(-0.5)], rtol=1e-7)
    np.testing.assert_allclose(np.asarray(sol.ys)[:, 0], np.exp(-np.array([0.25, 0.5, 0.75])),
                               rtol=1e-6)


def touch(t, y):
    return -(t - 0.5) ** 2


touch.terminal = 2


def test_touch_at_a_step_end_and_terminal_on_a_step_end():
    # g = -(t - 0.5)^2 touches zero exactly at a step end: an up and a down
    # crossing (SciPy's count for direction 0); the second stops the solve
    # at t = 0.5, exactly on a step end (a last step of zero length). The
    # dense output there and past it must stay finite and right (27.8:
    # 1.89e29 after a zero-length last step).
    sol = solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), t_eval=[0.25, 0.5, 0.75],
                    method="kvaerno5", events=touch, dense_output=True, rtol=1e-8, atol=1e-10)
    assert int(sol.status) == 1 and bool(sol.success)
    assert int(sol.event_counts[0]) == 2
    np.testing.assert_array_equal(np.asarray(sol.t_events[:2]), [0.5, 0.5])
    np.testing.assert_allclose(np.asarray(sol.y_events[:2, 0]), np.exp(-0.5), rtol=1e-7)
    t = np.array([0.1, 0.4, 0.5, 0.55, 0.6])
    np.testing.assert_allclose(np.asarray(sol.sol(t))[:, 0], np.exp(-t), rtol=1e-5)


def test_touch_direction_up_counts_once():
    touch_up = lambda t, y: -(t - 0.5) ** 2
    touch_up.direction = 1
    sol = solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), t_eval=[0.25, 0.5, 0.75],
                    method="kvaerno5", events=touch_up, rtol=1e-8, atol=1e-10)
    assert int(sol.event_counts[0]) == 1 and float(sol.t_events[0]) == 0.5


# ------------------------------------------------ 27.4: terminal event at t0

def at_start(t, y):
    return y[0]


at_start.terminal = True


def up_rate(t, y):
    return jnp.ones_like(y)


def scipy_up_rate(t, y):
    return np.ones_like(y)


@pytest.mark.parametrize("method", ["dopri5", "kvaerno5"])
def test_terminal_event_at_t0_is_scipys(method):
    sol = solve_ivp(up_rate, (0.0, 1.0), jnp.array([0.0]), events=at_start, method=method,
                    dense_output=True)
    ref = scipy.integrate.solve_ivp(scipy_up_rate, (0.0, 1.0), [0.0], events=at_start,
                                    dense_output=True)
    assert ref.status == 1 and ref.t_events[0].tolist() == [0.0]
    assert int(sol.status) == 1 and bool(sol.success)
    assert int(sol.event_counts[0]) == 1
    assert float(sol.t_events[0]) == ref.t_events[0][0]
    np.testing.assert_array_equal(np.asarray(sol.y_events[:1]), ref.y_events[0])
    n = int(sol.num_points)
    assert float(sol.ts[n - 1]) == 0.0 and float(sol.ys[n - 1, 0]) == 0.0
    # The dense output: y0 at t0, finite everywhere (nan before the fix).
    assert float(sol.sol(0.0)[0]) == 0.0
    values = np.asarray(sol.sol(jnp.array([0.0, 1e-3, 0.5, 1.0])))
    assert np.all(np.isfinite(values))
    np.testing.assert_allclose(values[:2, 0], [0.0, 1e-3], atol=1e-12)


def test_event_at_t0_not_terminal_and_direction():
    # Non-terminal: counted at t0 (SciPy: t_events [0.]); a direction the
    # solution does not leave t0 in: no event (SciPy: none).
    g = lambda t, y: y[0]
    g_down = lambda t, y: y[0]
    g_down.direction = -1
    g_down.terminal = True
    sol = solve_ivp(up_rate, (0.0, 1.0), jnp.array([0.0]), events=[g, g_down], method="dopri5")
    assert int(sol.status) == 0
    np.testing.assert_array_equal(np.asarray(sol.event_counts), [1, 0])
    assert float(sol.t_events[0][0]) == 0.0 and float(sol.y_events[0][0, 0]) == 0.0
    ref = scipy.integrate.solve_ivp(scipy_up_rate, (0.0, 1.0), [0.0], events=[g, g_down])
    assert ref.t_events[0].tolist() == [0.0] and ref.t_events[1].size == 0


# ------------------------------ 27.8 / 35.6: after a (near) zero-length last step

def upward_cannon(t, y):
    return jnp.stack([y[1], -9.80665 + 0.0 * y[0]])


def hit_ground(t, y):
    return y[0]


hit_ground.terminal = True
hit_ground.direction = -1


def test_scipy_duplicate_timestamps_on_a_finite_span():
    # SciPy's test_duplicate_timestamps with t_span=(0, 1): the event falls
    # a rounding error past a step end, leaving a last step of ~1e-17, and
    # sol.sol(0.01) (extrapolation) was [-1.1e26, -1.1e29].
    sol = solve_ivp(upward_cannon, (0.0, 1.0), jnp.array([0.0, 0.01]),
                    max_step=0.05 * 0.001 / 9.80665, events=hit_ground, dense_output=True,
                    method="dopri5", max_steps=1000)
    assert int(sol.status) == 1 and bool(sol.success)
    np.testing.assert_allclose(np.asarray(sol.sol(0.01)), [-0.00039033, -0.08806632],
                               rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.t_events), [0.00203943], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.y_events), [[0.0, -0.01]], atol=1e-9)
    t_event = float(sol.t_events[0])
    for t in [t_event, t_event + 1e-12, t_event + 1e-6, 0.003]:
        exact = [0.01 * t - 0.5 * 9.80665 * t * t, 0.01 - 9.80665 * t]
        np.testing.assert_allclose(np.asarray(sol.sol(t)), exact, rtol=1e-6, atol=1e-12)


def test_extrapolation_past_a_tiny_last_step_uses_the_step_before():
    # kvaerno5 lands on 0.5, then a last step of 1e-14 to t1: extrapolating
    # that step's polynomial to 0.6 gave -1.4e24.
    sol = solve_ivp(decay, (0.0, 0.5 + 1e-14), jnp.array([1.0]), t_eval=[0.5, 0.5 + 1e-14],
                    method="kvaerno5", dense_output=True, rtol=1e-8, atol=1e-10)
    assert int(sol.status) == 0
    t = np.array([0.25, 0.5, 0.5 + 5e-15, 0.5 + 1e-14, 0.55, 0.6])
    np.testing.assert_allclose(np.asarray(sol.sol(t))[:, 0], np.exp(-t), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(sol.sol(t[:4]))[:, 0], np.exp(-t[:4]), rtol=1e-7)


# --------------------------------------- 35.5: the state at a terminal event

def oscillator(t, y):
    return jnp.stack([y[1], -y[0]])


def third_zero(t, y):
    return y[0]


third_zero.terminal = 3


def near_zero(t, y):
    return y[0] - 1e-2


def test_terminal_event_state_is_the_located_one():
    sol = solve_ivp(oscillator, (0.0, 20.0), jnp.array([1.0, 0.0]),
                    events=[third_zero, near_zero], method="dopri5", rtol=1e-3,
                    dense_output=True)
    assert int(sol.status) == 1
    np.testing.assert_array_equal(np.asarray(sol.event_counts), [3, 3])
    y_stop = np.asarray(sol.y_events[0][:3])
    y_near = np.asarray(sol.y_events[1][:3])
    # g(y_events) vanishes to rounding (was 6.8e-5 at the terminal event;
    # the non-terminal event in the same step moved to 1.6e-7).
    np.testing.assert_allclose(y_stop[:, 0], 0.0, atol=2e-15)
    np.testing.assert_allclose(y_near[:, 0] - 1e-2, 0.0, atol=2e-15)
    # That non-terminal event lies in the step the terminal event shortened.
    n = int(sol.num_points)
    ts = np.asarray(sol.ts)
    t_stop, t_near = float(sol.t_events[0][2]), float(sol.t_events[1][2])
    assert ts[n - 1] == t_stop and ts[n - 2] < t_near < t_stop
    # The dense output of that step is the located one: at the event times,
    # the event states; the last recorded state is the event state.
    np.testing.assert_allclose(np.asarray(sol.sol(t_stop)), y_stop[2], rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(sol.sol(t_near)), y_near[2], rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(sol.ys[n - 1]), y_stop[2], rtol=0, atol=1e-15)
    # And it is as accurate as the solve (cos, -sin) inside the last step.
    t = np.linspace(ts[n - 2], t_stop, 5)
    np.testing.assert_allclose(np.asarray(sol.sol(t)), np.stack([np.cos(t), -np.sin(t)], 1),
                               atol=5e-3)
