"""Dense output and events with method="bdf" (issue 29, item 3).

A BDF step cannot be taken again from (t_n, y_n) alone (it depends on the
history), so the solve records each accepted step's interpolating
polynomial (the (6, n) differences D', ``Method.recorded_dense``) and
``sol.sol`` evaluates it; events are located on the same polynomial inside
the loop, and their times are differentiable through it (implicit function
theorem). Checked against exact solutions, SciPy's BDF dense output and a
tight Radau reference.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odekit
from odekit.testing import check_grads, get_problem


def _in_tolerances(y, ref, rtol, atol):
    """max |y - ref| / (atol + rtol |ref|)."""
    return float(np.max(np.abs(np.asarray(y) - ref) / (atol + rtol * np.abs(ref))))


def test_dense_output_of_exponential_decay_against_exact_and_scipy_bdf():
    """y' = -y: sol.sol between the steps within the tolerances' order of
    exp(-t), as close as SciPy BDF's dense output (both drift to ~10
    relative tolerances by t = 5: the global error of a local error
    control); at the recorded times sol.sol gives sol.ys."""
    rtol, atol = 1e-6, 1e-9
    sol = odekit.solve_ivp(lambda t, y: -y, (0.0, 5.0), jnp.array([1.0, 2.0]), method="bdf",
                           rtol=rtol, atol=atol, dense_output=True)
    n = int(sol.num_points)
    assert n > 20
    np.testing.assert_allclose(sol.sol(sol.ts[:n]), sol.ys[:n], rtol=1e-13, atol=1e-15)
    t = np.linspace(0.0, 5.0, 201)
    exact = np.exp(-t)[:, None] * np.array([1.0, 2.0])
    ours = _in_tolerances(sol.sol(jnp.asarray(t)), exact, rtol, atol)
    scipy_sol = scipy.integrate.solve_ivp(lambda t, y: -y, (0.0, 5.0), [1.0, 2.0], method="BDF",
                                          rtol=rtol, atol=atol, dense_output=True)
    theirs = _in_tolerances(scipy_sol.sol(t).T, exact, rtol, atol)
    assert ours <= 3 * max(theirs, 1.0), (ours, theirs)
    assert ours < 30
    # a scalar time, and the shape of an array of times
    assert sol.sol(0.5).shape == (2,) and sol.sol(jnp.ones((3, 4))).shape == (3, 4, 2)


def test_dense_output_of_robertson_against_radau_reference():
    """Robertson on [0, 40]: sol.sol at 60 log-spaced times (mostly between
    steps) within a few tolerances of SciPy's Radau at rtol 1e-10, as close
    as SciPy BDF's dense output."""
    problem = get_problem("robertson")
    args = tuple(jnp.asarray(a) for a in problem.args)
    rtol, atol = 1e-6, 1e-10
    sol = odekit.solve_ivp(lambda t, y, *a: problem.func(y, t, *a), (0.0, 40.0),
                           jnp.asarray(problem.y0), args=args, method="bdf", rtol=rtol,
                           atol=atol, dense_output=True)
    t = np.concatenate([[0.0], np.logspace(-5, np.log10(40.0), 59)])
    f = jax.jit(lambda t, y: problem.func(y, t, *args))
    jac = jax.jit(jax.jacfwd(lambda t, y: problem.func(y, t, *args), argnums=1))
    kw = dict(t_span=(0.0, 40.0), y0=np.asarray(problem.y0),
              jac=lambda t, y: np.asarray(jac(t, y)))
    field = lambda t, y: np.asarray(f(t, y))
    ref = scipy.integrate.solve_ivp(field, method="Radau", rtol=1e-10, atol=1e-14, t_eval=t,
                                    **kw).y.T
    scipy_bdf = scipy.integrate.solve_ivp(field, method="BDF", rtol=rtol, atol=atol,
                                          dense_output=True, **kw)
    ours = _in_tolerances(sol.sol(jnp.asarray(t)), ref, rtol, atol)
    theirs = _in_tolerances(scipy_bdf.sol(t).T, ref, rtol, atol)
    assert ours <= 3 * max(theirs, 1.0), (ours, theirs)
    n = int(sol.num_points)
    np.testing.assert_allclose(sol.sol(sol.ts[:n]), sol.ys[:n], rtol=1e-12, atol=1e-18)


def _oscillator(t, y):
    return jnp.stack([y[1], -y[0]])     # y = (cos t, -sin t)


def _crossing(t, y):
    return y[0]


def _down(t, y):
    return y[0]


_down.direction = -1


def _stop_fourth(t, y):
    return y[0] - 0.5


_stop_fourth.terminal = 4


def test_events_non_terminal_terminal_and_direction():
    """cos t = 0 at pi/2 + k pi (both directions), only the downward ones
    (pi/2, 5 pi/2), and the fourth time cos t = 0.5 (11 pi / 3) ends the
    solve: times within the tolerances' order, states on the dense output,
    the last recorded time at the terminal event."""
    rtol, atol = 1e-8, 1e-10
    sol = odekit.solve_ivp(_oscillator, (0.0, 12.0), jnp.array([1.0, 0.0]), method="bdf",
                           rtol=rtol, atol=atol, events=[_crossing, _down, _stop_fourth],
                           dense_output=True)
    assert int(sol.status) == 1
    counts = np.asarray(sol.event_counts)
    np.testing.assert_array_equal(counts, [4, 2, 4])
    t_all, t_down, t_stop = (np.asarray(t)[:c] for t, c in zip(sol.t_events, counts))
    np.testing.assert_allclose(t_all, np.pi / 2 + np.pi * np.arange(4), atol=2e-6)
    np.testing.assert_allclose(t_down, [np.pi / 2, 5 * np.pi / 2], atol=2e-6)
    np.testing.assert_allclose(t_stop, np.array([1, 5, 7, 11]) * np.pi / 3, atol=2e-6)
    for t_e, y_e, c in zip(sol.t_events, sol.y_events, counts):
        np.testing.assert_allclose(y_e[:c], sol.sol(t_e[:c]), rtol=1e-12, atol=1e-14)
        assert np.all(np.isinf(np.asarray(t_e)[c:]))
    np.testing.assert_allclose(np.asarray(sol.y_events[0])[:4, 0], 0.0, atol=1e-12)
    n = int(sol.num_points)
    assert float(sol.ts[n - 1]) == pytest.approx(float(t_stop[-1]), abs=1e-14)
    np.testing.assert_allclose(sol.ys[n - 1], sol.y_events[2][3], rtol=1e-12, atol=1e-14)


def test_events_without_dense_output_match_scipy_bdf():
    """Robertson: the time y3 reaches 0.1 against SciPy BDF's event (both
    within a few tolerances of the Radau reference's)."""
    problem = get_problem("robertson")
    args = tuple(jnp.asarray(a) for a in problem.args)

    def y3_at(t, y, *a):
        return y[2] - 0.1

    y3_at.terminal = 1
    sol = odekit.solve_ivp(lambda t, y, *a: problem.func(y, t, *a), (0.0, 1e5),
                           jnp.asarray(problem.y0), args=args, method="bdf", rtol=1e-8,
                           atol=1e-12, events=y3_at)
    f = jax.jit(lambda t, y: problem.func(y, t, *args))
    event = lambda t, y: y[2] - 0.1
    event.terminal = True
    ref = scipy.integrate.solve_ivp(lambda t, y: np.asarray(f(t, y)), (0.0, 1e5),
                                    np.asarray(problem.y0), method="Radau", rtol=1e-11,
                                    atol=1e-14, events=event).t_events[0][0]
    assert int(sol.status) == 1 and int(sol.event_counts[0]) == 1
    np.testing.assert_allclose(float(sol.t_events[0]), ref, rtol=1e-5)
    np.testing.assert_allclose(float(sol.y_events[0, 2]), 0.1, rtol=1e-12)


def _event_time(k):
    """y' = -k y, y(0) = 1: the time y = 0.5, t* = log 2 / k."""
    sol = odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 3.0), jnp.array([1.0]), args=(k,),
                           method="bdf", rtol=1e-9, atol=1e-12,
                           events=lambda t, y, k: y[0] - 0.5)
    return sol.t_events[0]


def test_event_time_derivative():
    """dt*/dk = -log 2 / k^2 by reverse mode (checkpoint adjoint) through
    the recorded polynomial (implicit function theorem)."""
    k = jnp.asarray(1.3)
    value, slope = jax.jit(jax.value_and_grad(_event_time))(k)
    np.testing.assert_allclose(value, np.log(2) / 1.3, rtol=1e-7)
    np.testing.assert_allclose(slope, -np.log(2) / 1.3**2, rtol=1e-6)


@pytest.mark.long
def test_event_time_forward_mode_and_dense_output_derivatives():
    """The same in forward mode; sol.sol(t) against central differences in
    both modes (about 2 minutes on a loaded 2-core CPU)."""
    k = jnp.asarray(1.3)
    np.testing.assert_allclose(jax.jacfwd(_event_time)(k), -np.log(2) / 1.3**2, rtol=1e-6)

    def dense(k):
        sol = odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 2.0), jnp.array([1.0, 2.0]),
                               args=(k,), method="bdf", rtol=1e-9, atol=1e-12,
                               dense_output=True, max_steps=512)
        return sol.sol(jnp.array([0.37, 1.41]))

    check_grads(dense, (k,), modes=("rev", "fwd"), rtol=1e-4, atol=1e-9)


def test_dense_output_under_vmap():
    """Each member's sol.sol from its own recorded steps."""
    def at(k):
        sol = odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 2.0), jnp.array([1.0]), args=(k,),
                               method="bdf", rtol=1e-8, atol=1e-12, dense_output=True,
                               max_steps=512)
        return sol.sol(jnp.array([0.5, 1.5]))[:, 0]

    rates = jnp.array([0.5, 2.0])
    values = jax.jit(jax.vmap(at))(rates)
    exact = np.exp(-np.asarray(rates)[:, None] * np.array([0.5, 1.5]))
    np.testing.assert_allclose(values, exact, rtol=1e-6)


# (long: bdf's interpolate adjoint, y(t) from the recorded polynomials and a
# restart at each output, is in CI in test_bdf_gradients.py on Van der Pol)
@pytest.mark.long
def test_interpolate_adjoint_reads_the_recorded_polynomials():
    """adjoint='interpolate' takes y(t) in its backward pass from the recorded
    polynomials (and the bdf backward solve restarts at each output's jump):
    y' = -k y, d/dk sum_i y(t_i) = -sum_i t_i y0 exp(-k t_i), d/dy0 likewise."""
    t_eval = np.array([0.5, 1.0])

    def total(y0, k):
        sol = odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), y0, args=(k,), method="bdf",
                               rtol=1e-9, atol=1e-12, t_eval=jnp.asarray(t_eval),
                               adjoint="interpolate")
        return sol.ys.sum()

    y0, k = jnp.array([1.0, 2.0]), jnp.asarray(1.3)
    dy0, dk = jax.jit(jax.grad(total, argnums=(0, 1)))(y0, k)
    decay = np.exp(-1.3 * t_eval)
    np.testing.assert_allclose(dk, -3.0 * np.sum(t_eval * decay), rtol=1e-6)
    np.testing.assert_allclose(dy0, np.full(2, decay.sum()), rtol=1e-6)
