"""Defects found by running SciPy's own test_ivp.py through
tests/scipy_suite (issue 35, item 10), each with the SciPy test that showed it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit


def _oscillator(t, y):
    return jnp.stack([y[1], -y[0]])


def test_event_terminal_none_is_not_terminal():
    """SciPy's test_event_terminal_iv: ``terminal = None`` reads as not
    terminal (was refused with a ValueError)."""
    def crossing(t, y):
        return y[0]

    crossing.terminal = None
    sol = odekit.solve_ivp(_oscillator, (0.0, 10.0), jnp.array([1.0, 0.0]), events=crossing,
                           t_eval=jnp.array([10.0]))
    assert int(sol.status) == 0 and int(sol.event_counts[0]) == 3
    np.testing.assert_allclose(sol.t_events[:3], [np.pi / 2, 3 * np.pi / 2, 5 * np.pi / 2],
                               rtol=1e-6)


@pytest.mark.parametrize("terminal", [-1, 3.5, "yes"])
def test_event_terminal_refused_in_scipy_words(terminal):
    """SciPy's test_event_terminal_iv matches "The `terminal` attribute..."."""
    def crossing(t, y):
        return y[0]

    crossing.terminal = terminal
    with pytest.raises(ValueError, match="The `terminal` attribute"):
        odekit.solve_ivp(_oscillator, (0.0, 10.0), jnp.array([1.0, 0.0]), events=crossing)


@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf])
def test_non_finite_y0_is_a_bad_argument(fill):
    """SciPy's test_initial_state_finiteness (gh-17846): a concrete non-finite
    y0 is refused at trace time with a ValueError naming y0 (was a solver
    failure, NONFINITE, whose message pointed at fun)."""
    y0 = np.ones(3)
    y0[1] = fill
    with pytest.raises(ValueError, match=r"initial state `y0` must be finite.*index \(1,\)"):
        odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), y0)
    with pytest.raises(ValueError, match="must be finite.*leaf 1"):
        odekit.solve_ivp(lambda t, y: y, (0.0, 1.0), (jnp.ones(2), jnp.asarray(y0)))


def test_non_finite_traced_y0_fails_when_run():
    """Traced, y0 cannot be checked at trace time: the solve fails NONFINITE."""
    solve = jax.jit(lambda y0: odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), y0,
                                                t_eval=jnp.array([1.0]), throw=False).status)
    assert int(solve(jnp.array([1.0, jnp.nan]))) == odekit.status.NONFINITE
