"""solve_ivp's arguments (issue 27, items 1, 5, 16, 17, 23; issue 35, item
9): traced times are checked when the program runs (status BAD_TIMES, as
odeint), NaN and infinite times are refused, an empty t_eval returns no rows,
event directions and SciPy's options odekit lacks get clear errors."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import status
from odekit import solve_ivp


def decay(t, y):
    return -y


Y0 = jnp.array([1.0])

# Traced t_eval that break solve_ivp's rules: (t_span, t_eval).
BAD_TRACED_TIMES = {
    "before t0": ((0.0, 1.0), [-0.5, 0.5, 1.0]),
    "after t1": ((0.0, 1.0), [0.5, 1.5]),
    "unsorted": ((0.0, 1.0), [0.5, 0.2, 1.0]),
    "duplicate": ((0.0, 1.0), [0.5, 0.5, 1.0]),
    "backward span, increasing times": ((1.0, 0.0), [0.2, 0.5, 1.0]),
    "nan": ((0.0, 1.0), [0.0, np.nan, 1.0]),
}


@functools.cache
def _traced_t_eval_solve(span: tuple, throw: bool):
    """solve_ivp of t_eval under jit, one function per span and throw shared
    by the cases (a compilation per t_eval length, not one per case)."""
    return jax.jit(lambda te: solve_ivp(decay, span, Y0, t_eval=te, throw=throw))


@pytest.mark.parametrize("case", list(BAD_TRACED_TIMES))
def test_traced_t_eval_that_breaks_the_rules_gives_bad_times(case):
    span, t_eval = BAD_TRACED_TIMES[case]
    sol = _traced_t_eval_solve(span, False)(jnp.asarray(t_eval))
    assert int(sol.status) == status.BAD_TIMES and not bool(sol.success)
    assert np.all(np.isnan(np.asarray(sol.ys)))   # no plausible-looking numbers
    raising = _traced_t_eval_solve(span, True)
    with pytest.raises(status.ERRORS, match="not strictly monotonic.*t_eval finite"):
        jax.block_until_ready(raising(jnp.asarray(t_eval)))


def test_valid_traced_t_eval_still_solves():
    for span, t_eval in [((0.0, 1.0), [0.0, 0.5, 1.0]), ((1.0, 0.0), [1.0, 0.5, 0.0])]:
        sol = jax.jit(lambda te: solve_ivp(decay, span, Y0, t_eval=te, rtol=1e-10,
                                           atol=1e-12))(jnp.asarray(t_eval))
        assert int(sol.status) == 0
        np.testing.assert_allclose(sol.ys[:, 0], np.exp(-(np.array(t_eval) - span[0])),
                                   rtol=1e-8)


def test_traced_times_are_checked_per_member_under_vmap():
    t_eval = jnp.array([[0.0, 0.5, 1.0], [-0.5, 0.5, 1.0]])
    sol = jax.vmap(lambda te: solve_ivp(decay, (0.0, 1.0), Y0, t_eval=te, throw=False))(t_eval)
    np.testing.assert_array_equal(sol.status, [0, status.BAD_TIMES])
    np.testing.assert_allclose(sol.ys[0, :, 0], np.exp(-np.array([0.0, 0.5, 1.0])), rtol=1e-5)


@functools.cache
def _traced_span_solve(which: str, throw: bool):
    """solve_ivp with t0 or t1 traced, one jitted function shared by the values."""
    def solve(t):
        span = (t, 1.0) if which == "t0" else (0.0, t)
        return solve_ivp(decay, span, Y0, throw=throw)
    return jax.jit(solve)


@pytest.mark.parametrize("which", ["t0", "t1"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_traced_non_finite_t_span_gives_bad_times(which, value):
    sol = _traced_span_solve(which, False)(jnp.asarray(value))
    assert int(sol.status) == status.BAD_TIMES and not bool(sol.success)
    with pytest.raises(status.ERRORS, match="not strictly monotonic"):
        jax.block_until_ready(_traced_span_solve("t1", True)(jnp.asarray(value)).ys)


def test_traced_t_span_with_concrete_t_eval_outside_it_gives_bad_times():
    sol = jax.jit(lambda t1: solve_ivp(decay, (0.0, t1), Y0, t_eval=[0.5, 2.0],
                                       throw=False))(jnp.asarray(1.0))
    assert int(sol.status) == status.BAD_TIMES


def test_concrete_nan_in_t_eval_is_refused():
    with pytest.raises(ValueError, match="t_eval must be finite"):
        solve_ivp(decay, (0.0, 1.0), Y0, t_eval=[0.0, np.nan, 1.0])
    with pytest.raises(ValueError, match="t_eval must be finite"):   # also inside jit
        jax.jit(lambda y0: solve_ivp(decay, (0.0, 1.0), y0, t_eval=np.array([0.0, np.nan])).ys)(Y0)


def test_infinite_t_span_is_refused_with_how_to_write_it():
    with pytest.raises(ValueError, match=r"t_span must be finite.*terminal event.*finite t1"):
        solve_ivp(decay, (0.0, np.inf), Y0, events=lambda t, y: y[0] - 0.5)


def test_empty_t_eval_returns_no_rows_and_still_locates_events():
    event = lambda t, y: y[0] - 0.5
    sol = solve_ivp(decay, (0.0, 1.0), Y0, t_eval=[], events=event, dense_output=True,
                    rtol=1e-10, atol=1e-12)
    assert sol.ts.shape == (0,) and sol.ys.shape == (0, 1)
    assert int(sol.status) == 0 and int(sol.num_points) == 0
    np.testing.assert_allclose(sol.t_events[0], np.log(2.0), rtol=1e-8)
    np.testing.assert_allclose(sol.sol(0.5), np.exp(-0.5), rtol=1e-8)
    # inside jit, backwards, with a pytree state
    tree = {"a": jnp.array([1.0, 2.0])}
    sol = jax.jit(lambda y0: solve_ivp(lambda t, y: jax.tree.map(jnp.negative, y), (1.0, 0.0),
                                       y0, t_eval=jnp.zeros((0,))))(tree)
    assert sol.ts.shape == (0,) and sol.ys["a"].shape == (0, 2) and int(sol.status) == 0


@pytest.mark.parametrize("direction", ["up", None, np.nan, True, jnp.array([1.0, 2.0])])
def test_event_direction_must_be_a_number(direction):
    event = lambda t, y: y[0] - 0.5
    event.direction = direction
    with pytest.raises(ValueError, match=r"direction must be a number: > 0.*< 0.*or 0"):
        solve_ivp(decay, (0.0, 1.0), Y0, events=event)


# (direction, crossings of y = 0.5 by y = e^{-t} on [0, 1]) for one event each
NUMERIC_DIRECTIONS = [(-1, 1), (-2.5, 1), (np.float32(1.0), 0), (0, 1)]


@functools.cache
def _counts_by_direction() -> tuple[int, ...]:
    """One solve with an event per direction (one compilation, not four)."""
    events = []
    for direction, _ in NUMERIC_DIRECTIONS:
        event = lambda t, y: y[0] - 0.5
        event.direction = direction
        events.append(event)
    sol = solve_ivp(decay, (0.0, 1.0), Y0, events=events)
    return tuple(int(c) for c in sol.event_counts)


@pytest.mark.parametrize("direction, count", NUMERIC_DIRECTIONS)
def test_numeric_event_directions_still_work(direction, count):
    assert _counts_by_direction()[NUMERIC_DIRECTIONS.index((direction, count))] == count


@pytest.mark.parametrize("name, value, words", [
    ("vectorized", True, "jax.vmap"),
    ("ml", 1, "lband=, uband="),
    ("mu", 1, "lband=, uband="),
    ("min_step", 1e-3, "no minimum step"),
    ("Dfun", None, "jac="),
    ("hmax", 0.1, "max_step="),
])
def test_scipy_options_odekit_lacks_say_what_to_do_instead(name, value, words):
    with pytest.raises(TypeError, match=f"SciPy's option {name}=: .*{words}"):
        solve_ivp(decay, (0.0, 1.0), Y0, **{name: value})


def test_scipy_defaults_of_those_options_are_accepted():
    sol = solve_ivp(decay, (0.0, 1.0), Y0, vectorized=False, lband=None, uband=None,
                    jac_sparsity=None, min_step=0.0)
    assert int(sol.status) == 0


@pytest.mark.parametrize("name, value", [("lband", 1), ("uband", 1), ("jac_sparsity", np.eye(1))])
def test_sparsity_options_of_an_explicit_method_say_they_are_for_the_stiff_ones(name, value):
    with pytest.raises(ValueError, match="stiff methods"):
        solve_ivp(decay, (0.0, 1.0), Y0, **{name: value})


def test_unknown_keyword_gets_pythons_message():
    with pytest.raises(TypeError, match=r"^solve_ivp\(\) got an unexpected keyword argument 'rtoll'$"):
        solve_ivp(decay, (0.0, 1.0), Y0, rtoll=1e-3)


def test_fixed_point_at_max_steps_suggests_raising_it_or_anderson():
    with pytest.raises(odekit.SolverError, match=r'Raise max_steps, or pass method="anderson"'):
        odekit.fixed_point(lambda x: 0.999 * x + 0.001, jnp.zeros(2), max_steps=20)
