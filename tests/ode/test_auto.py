"""method="auto" in solve_ivp: explicit until the stiffness verdict, then the
stiff method (issue 15 item 2)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odekit
from odekit.testing import check_grads


def robertson(t, y, k1, k2, k3):
    return jnp.stack([-k1 * y[0] + k3 * y[1] * y[2],
                      k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2], k2 * y[1] ** 2])


def forced_robertson(t, y, k1, k2, k3):
    return robertson(t, y, k1 * (1.0 + 0.5 * jnp.sin(t)), k2, k3)


def robertson_numpy(t, y, k1, k2, k3):
    """The same field in NumPy, for SciPy's references (the jnp one, called
    op by op on every one of Radau's 13,000 evaluations, took 4 s a solve)."""
    return np.array([-k1 * y[0] + k3 * y[1] * y[2],
                     k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2], k2 * y[1] ** 2])


Y0 = jnp.array([1.0, 0.0, 0.0])
RATES = (0.04, 3e7, 1e4)
TOL = dict(rtol=1e-6, atol=1e-10)


def _radau(t_eval, t_end=1e5):
    sol = scipy.integrate.solve_ivp(robertson_numpy, (0.0, t_end), np.asarray(Y0),
                                    method="Radau", rtol=1e-10, atol=1e-14,
                                    t_eval=np.asarray(t_eval), args=RATES)
    return sol.y.T


def test_a_stiff_problem_is_handed_to_the_stiff_method_in_mid_course():
    t_eval = jnp.array([1e-3, 0.1, 1.0, 10.0, 1e3, 1e5])
    kw = dict(args=RATES, t_eval=t_eval, **TOL)
    auto = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="auto", **kw)
    stiff = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="rodas5p", **kw)
    assert int(auto.status) == 0
    np.testing.assert_allclose(auto.ys, _radau(t_eval), rtol=2e-5, atol=1e-9)
    # the stiff method starts where the verdict stopped the explicit one, not at t0:
    # fewer Jacobians than solving the whole span with it; the statistics count both
    assert 0 < int(auto.stats["njev"]) < int(stiff.stats["njev"])
    assert int(auto.stats["num_steps"]) > int(stiff.stats["num_steps"])


def test_the_record_and_dense_output_run_across_the_switch():
    auto = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="auto", args=RATES,
                            dense_output=True, **TOL)
    n = int(auto.num_points)
    ts, ys = auto.ts[:n], auto.ys[:n]
    assert int(auto.stats["njev"]) > 0 and bool(jnp.all(jnp.diff(ts) > 0))
    assert float(ts[-1]) == 1e5
    np.testing.assert_allclose(auto.sol(ts), ys, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(jnp.sum(ys, axis=1), 1.0, atol=1e-12)     # mass
    t = jnp.array([1e-4, 0.05, 3.0, 300.0, 3e4])
    np.testing.assert_allclose(auto.sol(t), _radau(t), rtol=2e-5, atol=1e-9)


def test_out_of_steps_before_the_verdict_starts_the_stiff_method_again():
    # 300 explicit steps do not reach the verdict; rodas5p solves it from t0 in ~110
    kw = dict(args=RATES, t_eval=jnp.array([1e5]), max_steps=300, **TOL)
    auto = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="auto", **kw)
    stiff = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="rodas5p", **kw)
    np.testing.assert_array_equal(auto.ys, stiff.ys)
    assert int(auto.stats["njev"]) == int(stiff.stats["njev"])


def test_a_non_stiff_problem_stays_explicit_with_dense_output():
    kw = dict(dense_output=True, rtol=1e-8, atol=1e-10)
    auto = odekit.solve_ivp(lambda t, y: -y, (0.0, 2.0), jnp.ones(2), method="auto", **kw)
    tsit5 = odekit.solve_ivp(lambda t, y: -y, (0.0, 2.0), jnp.ones(2), method="tsit5", **kw)
    assert int(auto.stats["njev"]) == 0
    np.testing.assert_array_equal(auto.ys, tsit5.ys)
    np.testing.assert_allclose(auto.sol(0.5), np.exp(-0.5) * np.ones(2), rtol=1e-7)


def _radau_event_times(*events):
    sol = scipy.integrate.solve_ivp(lambda t, y: robertson_numpy(t, y, *RATES), (0.0, 1e5),
                                    np.asarray(Y0), method="Radau", rtol=1e-10, atol=1e-14,
                                    events=events)
    return sol.t_events


@pytest.mark.long
def test_events_on_both_sides_of_the_switch_and_a_terminal_one_in_the_stiff_part():
    # tsit5 hands over at t ~ 2.4: y0 = 0.99 is crossed before, 0.5 after it,
    # and y0 = 0.1 (terminal, t ~ 1.1e4) stops the stiff part
    def stop_at_a_tenth(t, y, *args):
        return y[0] - 0.1
    stop_at_a_tenth.terminal = True
    events = [lambda t, y, *a: y[0] - 0.99, lambda t, y, *a: y[0] - 0.5, stop_at_a_tenth]
    auto = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="auto", args=RATES,
                            events=events, dense_output=True, **TOL)
    reference = _radau_event_times(*[lambda t, y, g=g: g(t, y) for g in events])
    # it went on from the switch (stiff steps recorded after tsit5's), not from t0
    switch_row = int(auto.sol.second_from)
    assert switch_row > 0 and int(auto.stats["njev"]) > 0
    assert reference[0][0] < float(auto.sol.ts[switch_row]) < reference[1][0]
    assert int(auto.status) == 1 and list(np.asarray(auto.event_counts)) == [1, 1, 1]
    for t_found, t_ref in zip(auto.t_events, reference):
        np.testing.assert_allclose(t_found[0], t_ref[0], rtol=2e-5)
        assert np.all(np.isinf(t_found[1:]))
    # y at the event times from the dense output (the step cut short at the
    # terminal event is re-taken to its end there: within the tolerance)
    np.testing.assert_allclose([y[0, 0] for y in auto.y_events], [0.99, 0.5, 0.1], rtol=1e-7)
    assert float(auto.ts[int(auto.num_points) - 1]) == pytest.approx(float(auto.t_events[2][0]))
    t = jnp.array([0.1, 5.0, 300.0])
    np.testing.assert_allclose(auto.sol(t), _radau(t), rtol=2e-5, atol=1e-9)


@pytest.mark.long
def test_a_terminal_count_begun_before_the_switch_starts_the_stiff_method_again():
    # y0 passes 0.99 (t ~ 0.26, tsit5) and 0.5 (t ~ 268, after the switch): the
    # second occurrence stops the solve; rodas5p solves it from t0 and counts both
    def two_levels(t, y, *args):
        return (y[0] - 0.99) * (y[0] - 0.5)
    two_levels.terminal = 2
    auto = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="auto", args=RATES,
                            events=two_levels, dense_output=True, **TOL)
    assert int(auto.status) == 1 and int(auto.event_counts[0]) == 2
    # every recorded step is rodas5p's (from t0), and there were some
    assert int(auto.sol.second_from) == 0 and int(auto.stats["njev"]) > 0
    t_ref = _radau_event_times(lambda t, y: (y[0] - 0.99) * (y[0] - 0.5))[0]
    np.testing.assert_allclose(auto.t_events[:2], t_ref[:2], rtol=2e-5)


# (long: reverse mode through the switch, d/dk1 among them, is checked in CI by
# test_derivatives_in_the_span_through_the_switch[few-inputs])
@pytest.mark.long
def test_gradient_through_the_switch():
    def loss(k1):
        return odekit.solve_ivp(robertson, (0.0, 10.0), Y0, args=(k1, 3e7, 1e4), method="auto",
                                t_eval=jnp.array([10.0]), rtol=1e-9, atol=1e-12).ys[0, 0]
    assert int(odekit.solve_ivp(robertson, (0.0, 10.0), Y0, args=RATES, method="auto",
                                **TOL).stats["njev"]) > 0
    check_grads(loss, (0.04,), order=1, modes=("rev",), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("adjoint", ["checkpoint", pytest.param(odekit.Checkpoint(max_directions=0),
                                                                 marks=pytest.mark.long)],
                         ids=["few-inputs", "scanned"])
def test_derivatives_in_the_span_through_the_switch(adjoint):
    """d/dt0, d/dt1 and d/dk1 of values before and after the switch, against
    central differences, on a non-autonomous Robertson (k1 (1 + 0.5 sin t))
    at rtol 1e-9. The switch time moves with t0 as the steps before it do
    (held fixed, it dropped d/dt0 of everything after it: 0 instead of
    0.0082). The explicit steps before the verdict are near their stability
    limit, where their derivative is not error-controlled: with the probe's
    threshold at 0.95 of tsit5's stability boundary the verdict came after
    4,100 steps (the controller held h rho at 2.6-2.7 of 3.51) and d y1(10) /
    d t0 was 6% off; at 0.7 it comes after the first probe's 500."""
    def solve(t0, t1, k1):
        return odekit.solve_ivp(forced_robertson, (t0, t1), Y0, args=(k1,) + RATES[1:],
                                method="auto", t_eval=jnp.stack([t0 + 0.1, t1]), rtol=1e-9,
                                atol=1e-13, adjoint=adjoint)

    inputs = (0.5, 10.0, 0.04)
    stats = solve(*inputs).stats     # (the program check_grads calls first)
    explicit_steps = int(stats["num_steps"]) - int(stats["njev"])
    assert int(stats["njev"]) > 0 and explicit_steps < 600     # it switched at the first probes
    check_grads(lambda *inputs: solve(*inputs).ys[:, 0], inputs, order=1, modes=("fwd", "rev"),
                rtol=1e-5, atol=1e-9)


def test_a_batch_mixes_members_that_switch_and_members_that_do_not():
    def solve(lam):
        return odekit.solve_ivp(lambda t, y, lam: -lam * y, (0.0, 1e3), jnp.ones(1), args=(lam,),
                                method="auto", t_eval=jnp.array([1.0]), rtol=1e-6, atol=1e-12)
    sols = jax.vmap(solve)(jnp.array([1.0, 1e6]))
    assert list(np.asarray(sols.stats["njev"]) > 0) == [False, True]
    np.testing.assert_allclose(sols.ys[0, 0, 0], np.exp(-1.0), rtol=1e-5)
    assert abs(float(sols.ys[1, 0, 0])) < 1e-10


def test_backsolve_cannot_differentiate_auto():
    with pytest.raises(ValueError, match="method='auto'.*adjoint='checkpoint'"):
        odekit.solve_ivp(robertson, (0.0, 1.0), Y0, args=RATES, method="auto",
                         adjoint="backsolve")


def test_events_across_the_switch_under_jit_and_vmap():
    # each member its own switch and events; event times against Radau's
    def half(t, y, *args):
        return y[0] - 0.5

    @jax.jit
    @jax.vmap
    def event_time(k1):
        sol = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, method="auto", args=(k1, 3e7, 1e4),
                               events=half, **TOL)
        return sol.t_events[0], sol.event_counts[0], sol.stats["njev"]

    k1s = jnp.array([0.04, 0.08])
    times, counts, njev = event_time(k1s)
    assert list(np.asarray(counts)) == [1, 1] and bool(jnp.all(njev > 0))
    for k1, t_found in zip([0.04, 0.08], times):
        ref = scipy.integrate.solve_ivp(
            robertson_numpy, (0.0, 1e5), np.asarray(Y0), args=(k1, 3e7, 1e4),
            method="Radau", rtol=1e-10, atol=1e-14, events=lambda t, y, *args: y[0] - 0.5)
        np.testing.assert_allclose(t_found, ref.t_events[0][0], rtol=2e-5)
