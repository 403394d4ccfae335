"""odekit.solve_ivp: values against SciPy and exact solutions, statistics,
t_eval=None, backward time, dense output, events, failures, jit/vmap and
gradients against finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odekit
from odekit.testing.problems import falling_body
from odekit import ODESolverError, solve_ivp
from odekit.testing import check_grads

METHODS = ["bosh3", "dopri5", "tsit5", "dopri8"]


def lotka(t, y, a, b, c, d):
    x, z = y
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


LOTKA_ARGS = (1.5, 1.0, 3.0, 1.0)
LOTKA_Y0 = np.array([1.0, 1.0])


def decay(t, y, k):
    return -k * y


fall, hit_ground = falling_body()


def scipy_lotka(t_eval):
    ref = scipy.integrate.solve_ivp(lambda t, y: np.asarray(lotka(t, y, *LOTKA_ARGS)),
                                    (0.0, 10.0), LOTKA_Y0, method="DOP853", rtol=1e-12,
                                    atol=1e-14, t_eval=t_eval)
    return ref.y.T


# ---------------------------------------------------------------- values

# Every method at rtol 1e-8; at 1e-5 dopri5 in CI, the others in the long run
# (the same code with another static tolerance: a compilation each).
@pytest.mark.parametrize("method, rtol", [(method, 1e-8) for method in METHODS] + [
    (method, 1e-5) if method == "dopri5" else pytest.param(method, 1e-5, marks=pytest.mark.long)
    for method in METHODS])
def test_values_at_t_eval_against_scipy_dop853(method, rtol):
    t_eval = np.linspace(0.0, 10.0, 21)
    sol = solve_ivp(lotka, (0.0, 10.0), jnp.asarray(LOTKA_Y0), t_eval=t_eval, args=LOTKA_ARGS,
                    method=method, rtol=rtol, atol=rtol * 1e-3)
    assert int(sol.status) == 0 and bool(sol.success) and int(sol.num_points) == 21
    np.testing.assert_array_equal(sol.ts, t_eval)
    error = np.max(np.abs(np.asarray(sol.ys) - scipy_lotka(t_eval)) / (1e-3 + np.abs(scipy_lotka(t_eval))))
    # Global error within a small multiple of the local tolerance (bosh3 is 3rd order).
    assert error < (300 if method == "bosh3" else 100) * rtol


@pytest.mark.parametrize("method", METHODS)
def test_step_record_when_t_eval_is_none(method):
    sol = solve_ivp(decay, (0.0, 2.0), jnp.array([1.0, 2.0]), args=(1.3,), method=method,
                    rtol=1e-8, atol=1e-10, max_steps=500)
    n = int(sol.num_points)
    assert sol.ts.shape == (501,) and sol.ys.shape == (501, 2)
    assert n == int(sol.stats["num_accepted"]) + 1
    ts = np.asarray(sol.ts)
    assert ts[0] == 0.0 and ts[n - 1] == 2.0 and np.all(np.diff(ts[:n]) > 0)
    assert np.all(ts[n:] == np.inf)
    np.testing.assert_array_equal(np.asarray(sol.ys)[n:], np.broadcast_to(sol.ys[n - 1], (501 - n, 2)))
    exact = np.exp(-1.3 * ts[:n])[:, None] * np.array([1.0, 2.0])
    np.testing.assert_allclose(sol.ys[:n], exact, rtol=1e-7, atol=1e-10)


def test_backward_time_span_and_t_eval():
    t_eval = jnp.linspace(2.0, 0.0, 5)
    sol = solve_ivp(decay, (2.0, 0.0), jnp.array([1.0]), t_eval=t_eval, args=(0.7,), rtol=1e-10,
                    atol=1e-12)
    np.testing.assert_allclose(sol.ys[:, 0], np.exp(0.7 * (2.0 - np.asarray(t_eval))), rtol=1e-8)
    steps = solve_ivp(decay, (2.0, 0.0), jnp.array([1.0]), args=(0.7,), rtol=1e-10, atol=1e-12,
                      max_steps=200)
    n = int(steps.num_points)
    ts = np.asarray(steps.ts)
    assert ts[0] == 2.0 and ts[n - 1] == 0.0 and np.all(np.diff(ts[:n]) < 0)
    assert np.all(ts[n:] == -np.inf)


@pytest.mark.parametrize("span", [(0.0, 2.0), (2.0, 0.0)])
def test_known_and_traced_time_spans_agree_inside_jit(span):
    """A constant t_span inside jit fixes the direction at trace time (fun is
    called on the engine's own time); a traced one multiplies by the traced
    direction. Both give the exact solution, forwards and backwards, and the
    same gradient with respect to the rate."""
    t_eval = jnp.linspace(*span, 5)
    exact = np.exp(-0.7 * (np.asarray(t_eval) - span[0]))

    def known(k):
        return solve_ivp(decay, span, jnp.array([1.0]), t_eval=t_eval, args=(k,), rtol=1e-10,
                         atol=1e-12).ys[:, 0]

    def traced(k, t0, t1):
        return solve_ivp(decay, (t0, t1), jnp.array([1.0]), t_eval=t_eval, args=(k,),
                         rtol=1e-10, atol=1e-12).ys[:, 0]

    k = jnp.asarray(0.7)
    np.testing.assert_allclose(jax.jit(known)(k), exact, rtol=1e-8)
    np.testing.assert_allclose(jax.jit(traced)(k, *map(jnp.asarray, span)), exact, rtol=1e-8)
    d_exact = -(np.asarray(t_eval) - span[0]) * exact
    np.testing.assert_allclose(jax.jit(jax.jacrev(known))(k), d_exact, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(jax.jacrev(traced)(k, *map(jnp.asarray, span)), d_exact,
                               rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("t_eval, match", [(np.array([0.0, 2.0, 1.0]), "strictly increasing"),
                                           ([0.0, 20.0], "within t_span")])
def test_constant_t_eval_is_checked_at_trace_time_inside_jit(t_eval, match):
    with pytest.raises(ValueError, match=match):
        jax.jit(lambda y0: solve_ivp(decay, (0.0, 10.0), y0, t_eval=t_eval, args=(1.0,)).ys)(
            jnp.ones(1))


def test_solve_ivp_and_odeint_agree():
    t = jnp.linspace(0.0, 10.0, 11)
    ys_ivp = solve_ivp(lotka, (0.0, 10.0), jnp.asarray(LOTKA_Y0), t_eval=t, args=LOTKA_ARGS,
                       method="dopri5", rtol=1e-9, atol=1e-9).ys
    ys_odeint = odekit.odeint(lambda y, t, *a: lotka(t, y, *a), jnp.asarray(LOTKA_Y0), t,
                              *LOTKA_ARGS, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ys_ivp, ys_odeint, rtol=1e-12, atol=1e-14)


def test_pytree_state_and_first_and_max_step():
    def rotate(t, y):
        return {"x": -y["v"], "v": y["x"]}
    y0 = {"x": jnp.array(1.0), "v": jnp.array(0.0)}
    sol = solve_ivp(rotate, (0.0, 1.0), y0, t_eval=jnp.array([1.0]), rtol=1e-10, atol=1e-12,
                    first_step=1e-3, max_step=0.01, max_steps=1000)
    np.testing.assert_allclose(sol.ys["x"][0], np.cos(1.0), rtol=1e-9)
    np.testing.assert_allclose(sol.ys["v"][0], np.sin(1.0), rtol=1e-9)
    assert int(sol.stats["num_accepted"]) >= 100  # max_step=0.01 on [0, 1]


# ---------------------------------------------------------------- statistics

@pytest.mark.parametrize("method, bound", [("bosh3", 1.3), ("dopri5", 1.2), ("tsit5", 1.1),
                                           ("dopri8", 1.05)])
def test_nfev_against_scipy_at_equal_tolerance(method, bound):
    """Work bounds: at rtol=1e-8 the evaluations stay within a factor of
    SciPy's DOP853 (the best SciPy explicit method there). dopri8 is the same
    method with the same step rule: the same accepted steps (checked), its
    rejections within a few of SciPy's (a different first step)."""
    sol = solve_ivp(lotka, (0.0, 10.0), jnp.asarray(LOTKA_Y0), args=LOTKA_ARGS, method=method,
                    rtol=1e-8, atol=1e-11, max_steps=20000)
    ref = scipy.integrate.solve_ivp(lambda t, y: np.asarray(lotka(t, y, *LOTKA_ARGS)),
                                    (0.0, 10.0), LOTKA_Y0, method="DOP853", rtol=1e-8, atol=1e-11)
    stats = {k: int(v) for k, v in sol.stats.items()}
    assert stats["num_steps"] == stats["num_accepted"] + stats["num_rejected"]
    assert stats["njev"] == 0
    budget = {"bosh3": 12.0, "dopri5": 2.0, "tsit5": 2.0, "dopri8": 1.0}[method]
    assert stats["nfev"] <= bound * budget * ref.nfev, (stats, ref.nfev)
    if method == "dopri8":
        assert stats["num_accepted"] == len(ref.t) - 1, (stats, len(ref.t))


def test_nfev_counts_every_evaluation():
    calls = []

    def counted(t, y):
        jax.debug.callback(lambda: calls.append(1))
        return -y

    sol = solve_ivp(counted, (0.0, 1.0), jnp.array([1.0]), method="dopri5", rtol=1e-6)
    jax.effects_barrier()
    # Every call inside the loop runs once per evaluation; the trace-time
    # shape check is not a run-time call.
    assert len(calls) == int(sol.stats["nfev"])


# ---------------------------------------------------------------- dense output

@pytest.mark.parametrize("method", METHODS)
def test_dense_output_matches_exact_solution(method):
    sol = solve_ivp(decay, (0.0, 3.0), jnp.array([1.0, -2.0]), args=(0.9,), method=method,
                    rtol=1e-9, atol=1e-12, dense_output=True)
    t = jnp.linspace(0.0, 3.0, 97)
    exact = np.exp(-0.9 * np.asarray(t))[:, None] * np.array([1.0, -2.0])
    np.testing.assert_allclose(sol.sol(t), exact, rtol=1e-6 if method == "bosh3" else 1e-7)
    np.testing.assert_allclose(sol.sol(1.5), exact[48], rtol=1e-6)
    assert sol.sol(jnp.ones((3, 4))).shape == (3, 4, 2)


def test_dense_output_is_jittable_and_differentiable_in_t_and_parameters():
    def at(t, k):
        s = solve_ivp(decay, (0.0, 2.0), jnp.array([1.0]), args=(k,), rtol=1e-10, atol=1e-12,
                      dense_output=True)
        return s.sol(t)[0]
    value = jax.jit(at)(1.2, 0.8)
    np.testing.assert_allclose(value, np.exp(-0.96), rtol=1e-9)
    dt, dk = jax.grad(at, (0, 1))(1.2, 0.8)
    np.testing.assert_allclose(dt, -0.8 * np.exp(-0.96), rtol=1e-6)
    np.testing.assert_allclose(dk, -1.2 * np.exp(-0.96), rtol=1e-6)
    check_grads(at, (1.2, 0.8), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("method, span", [("dopri8", (5.0, 1.0)), ("dopri5", (0.0, 3.0)),
                                          ("rodas5p", (0.0, 3.0))])
def test_dense_output_at_the_steps_is_the_solution_itself(method, span):
    """sol(t_i) == y_i exactly (SciPy's test_first_step asks it to 1e-15; the
    polynomials at theta = 1 were 1.6e-15 off), while d sol/dt there stays
    the interpolant's."""
    sol = solve_ivp(lotka, span, LOTKA_Y0, args=LOTKA_ARGS, method=method, rtol=1e-3,
                    atol=1e-6, dense_output=True, first_step=0.1)
    n = int(sol.num_points)
    ts, ys = sol.ts[:n], sol.ys[:n]
    np.testing.assert_array_equal(sol.sol(ts), ys)
    slope = jax.jacfwd(sol.sol)(ts[2])
    np.testing.assert_allclose(slope, lotka(ts[2], ys[2], *LOTKA_ARGS), rtol=1e-2)


def test_dense_output_on_a_backward_solve():
    sol = solve_ivp(decay, (1.0, -1.0), jnp.array([1.0]), args=(1.0,), rtol=1e-10, atol=1e-12,
                    dense_output=True)
    np.testing.assert_allclose(sol.sol(jnp.array([0.5, -0.5]))[:, 0],
                               np.exp(-(np.array([0.5, -0.5]) - 1.0)), rtol=1e-8)


# ---------------------------------------------------------------- events

def test_falling_body_terminal_event_time_state_and_message():
    sol = solve_ivp(fall, (0.0, 10.0), jnp.array([10.0, 0.0]), args=(9.81,), events=hit_ground,
                    dense_output=True, rtol=1e-10, atol=1e-12)
    assert int(sol.status) == 1 and bool(sol.success)
    assert sol.message == "A termination event occurred."
    t_hit = np.sqrt(2 * 10.0 / 9.81)
    np.testing.assert_allclose(sol.t_events[0], t_hit, rtol=1e-13)
    assert abs(float(sol.y_events[0][0])) < 1e-12
    np.testing.assert_allclose(sol.y_events[0][1], -9.81 * t_hit, rtol=1e-12)
    n = int(sol.num_points)
    assert float(sol.ts[n - 1]) == pytest.approx(t_hit, rel=1e-13) and np.isinf(sol.ts[n])
    assert int(sol.event_counts[0]) == 1


def test_fall_time_derivatives_match_the_analytic_ones():
    def fall_time(h, g):
        y0 = jnp.stack([h, jnp.zeros_like(h)])
        return solve_ivp(fall, (0.0, 10.0), y0, args=(g,), events=hit_ground, rtol=1e-10,
                         atol=1e-12).t_events[0]
    h, g = 10.0, 9.81
    dh, dg = jax.grad(fall_time, (0, 1))(h, g)
    np.testing.assert_allclose(dh, 1.0 / np.sqrt(2 * h * g), rtol=1e-8)
    np.testing.assert_allclose(dg, -np.sqrt(2 * h) / (2 * g ** 1.5), rtol=1e-8)
    check_grads(fall_time, (h, g), rtol=1e-6, atol=1e-9)


def oscillator(t, y):
    return jnp.stack([y[1], -y[0]])


def test_non_terminal_events_with_directions_and_a_terminal_count():
    def crossing(t, y):
        return y[0]   # y = cos t crosses zero at pi/2 + k pi
    up = lambda t, y: y[0]
    up.direction = 1.0
    down = lambda t, y: y[0]
    down.direction, down.terminal = -1.0, 2
    sol = solve_ivp(oscillator, (0.0, 20.0), jnp.array([1.0, 0.0]), events=[crossing, up, down],
                    rtol=1e-10, atol=1e-12, max_steps=2000)
    # down crossings at pi/2, 5 pi/2: the second one stops the solve.
    stop = 2.5 * np.pi
    assert int(sol.status) == 1
    counts = [int(c) for c in sol.event_counts]
    assert counts == [3, 1, 2]
    np.testing.assert_allclose(sol.t_events[0][:3], [0.5 * np.pi, 1.5 * np.pi, stop], rtol=1e-11)
    np.testing.assert_allclose(sol.t_events[1][:1], [1.5 * np.pi], rtol=1e-11)
    np.testing.assert_allclose(sol.t_events[2], [0.5 * np.pi, stop], rtol=1e-11)
    assert np.all(np.isinf(sol.t_events[0][3:]))
    np.testing.assert_allclose(sol.y_events[2][:, 1], [-1.0, -1.0], rtol=1e-9)


def test_events_are_jittable_and_vmappable():
    def t_hit(h):
        return solve_ivp(fall, (0.0, 10.0), jnp.stack([h, 0.0 * h]), args=(9.81,),
                         events=hit_ground, rtol=1e-10, atol=1e-12).t_events[0]
    hs = jnp.array([1.0, 5.0, 20.0])
    np.testing.assert_allclose(jax.jit(jax.vmap(t_hit))(hs), np.sqrt(2 * np.asarray(hs) / 9.81),
                               rtol=1e-12)


def test_event_on_a_backward_solve():
    ev = lambda t, y, k: y[0] - 2.0   # y = e^{-(t - 1)} backwards from t = 1 reaches 2 at 1 - ln 2
    ev.terminal = True
    sol = solve_ivp(decay, (1.0, -5.0), jnp.array([1.0]), args=(1.0,), events=ev, rtol=1e-10,
                    atol=1e-12)
    # Located to rounding on the dense output, whose own error is ~rtol.
    np.testing.assert_allclose(sol.t_events[0], 1.0 - np.log(2.0), rtol=1e-9)


# ---------------------------------------------------------------- failures

def test_step_limit_raises_with_numbers():
    with pytest.raises(ODESolverError, match=r"maximum number of steps.*after 5 steps"):
        solve_ivp(lotka, (0.0, 10.0), jnp.asarray(LOTKA_Y0), args=LOTKA_ARGS, max_steps=5)


def test_throw_false_returns_status_and_nan_after_the_failure():
    t_eval = jnp.linspace(0.0, 10.0, 11)
    sol = solve_ivp(lotka, (0.0, 10.0), jnp.asarray(LOTKA_Y0), t_eval=t_eval, args=LOTKA_ARGS,
                    max_steps=20, throw=False)
    assert int(sol.status) == odekit.status.MAX_STEPS and not bool(sol.success)
    assert "maximum number of steps" in sol.message.lower()
    n = int(sol.num_points)
    assert 1 <= n < 11
    assert np.all(np.isfinite(sol.ys[:n])) and np.all(np.isnan(sol.ys[n:]))
    steps = solve_ivp(lotka, (0.0, 10.0), jnp.asarray(LOTKA_Y0), args=LOTKA_ARGS, max_steps=20,
                      throw=False)
    n = int(steps.num_points)
    assert np.all(np.isfinite(steps.ys[:n])) and np.all(np.isnan(steps.ys[n:]))


def test_vmap_with_throw_false_keeps_each_members_status():
    def solve(k):
        return solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.array([1.0]), args=(k,),
                         t_eval=jnp.array([0.25, 1.0]), throw=False)
    sol = jax.jit(jax.vmap(solve))(jnp.array([0.5, 2.0, -1.0]))
    status = np.asarray(sol.status)
    assert status[0] == 0 and status[1] < 0 and status[2] == 0
    np.testing.assert_allclose(sol.ys[0, :, 0], 1.0 / (1.0 - 0.5 * np.array([0.25, 1.0])), rtol=1e-5)
    np.testing.assert_allclose(sol.ys[2, :, 0], 1.0 / (1.0 + np.array([0.25, 1.0])), rtol=1e-5)
    np.testing.assert_allclose(sol.ys[1, 0, 0], 2.0, rtol=1e-5)
    assert np.isnan(sol.ys[1, 1, 0])
    assert sol.message[0].startswith("The solver successfully")


def test_vmap_with_throw_true_says_how_many_members_failed():
    def solve(k):
        return solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.array([1.0]), args=(k,),
                         t_eval=jnp.array([1.0])).ys
    with pytest.raises(Exception, match=r"2 of 3 batch members failed"):
        jax.block_until_ready(jax.vmap(solve)(jnp.array([2.0, 0.5, 3.0])))


def test_fitting_loop_gets_an_infinite_loss_instead_of_an_exception():
    t_eval = jnp.linspace(0.0, 1.0, 5)

    @jax.jit
    def loss(k):
        sol = solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.array([1.0]), args=(k,),
                        t_eval=t_eval, throw=False)
        return jnp.where(sol.success, jnp.sum(sol.ys ** 2), jnp.inf)
    assert np.isfinite(loss(0.5)) and np.isinf(loss(3.0))
    value, grad = jax.value_and_grad(loss)(3.0)
    assert np.isinf(value)


def test_gradient_of_a_failed_solve_is_nan():
    def loss(k):
        sol = solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.array([1.0]), args=(k,),
                        t_eval=jnp.array([0.5]), throw=False)
        return sol.ys[0, 0]
    assert np.isnan(jax.grad(loss)(3.0))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(t_span=(0.0,)), ValueError, "t_span must be a pair"),
    (dict(t_eval=jnp.array([0.0, 2.0, 1.0])), ValueError, "strictly increasing"),
    (dict(t_eval=jnp.array([0.0, 20.0])), ValueError, "within t_span"),
    (dict(method="rk4"), ValueError, "Unknown method"),
    (dict(method="RK45"), ValueError, "SciPy's 'RK45' corresponds to 'dopri5'"),
    (dict(method="DOP853"), ValueError, "SciPy's 'DOP853' corresponds to 'dopri8'"),
    (dict(method="Radau"), ValueError, "corresponds to 'rodas5p'"),
    (dict(method="LSODA"), ValueError, "corresponds to 'auto'"),
    (dict(rtol=-1.0), ValueError, "rtol"),
    (dict(max_steps=0), ValueError, "max_steps"),
    (dict(adjoint="magic"), ValueError, "unknown adjoint"),
    (dict(args=[1.0]), TypeError, "args must be a tuple"),
    (dict(t_span=(0.0, jnp.inf)), ValueError, "finite"),
])
def test_bad_arguments(kwargs, error, match):
    call = dict(fun=decay, t_span=(0.0, 10.0), y0=jnp.array([1.0]), args=(1.0,))
    call.update(kwargs)
    with pytest.raises(error, match=match):
        solve_ivp(**call)


def test_event_with_the_wrong_signature_is_a_clear_error():
    with pytest.raises(TypeError, match=r"g\(t, y, \*args\)"):
        solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), args=(1.0,), events=lambda t, y: y[0])


def test_fun_returning_another_structure_shape_or_complex_values():
    with pytest.raises(TypeError, match="structure of y0"):
        solve_ivp(lambda t, y: (y, y), (0.0, 1.0), jnp.ones(2))
    with pytest.raises(ValueError, match=r"shape \(3,\) where y0 has shape \(2,\)"):
        solve_ivp(lambda t, y: jnp.ones(3), (0.0, 1.0), jnp.ones(2))
    with pytest.raises(TypeError, match="complex"):
        solve_ivp(lambda t, y: y.astype(jnp.complex128), (0.0, 1.0), jnp.ones(2))


def test_fun_returning_another_structure_of_the_same_size_is_read_as_y0():
    """Issue 35.3: SciPy and jax.experimental.ode accept a list of scalars
    for an array y0; so does solve_ivp (under grad too), and an array for a
    list y0; sizes that disagree still raise."""
    def pend(t, y, b, c):
        theta, omega = y
        return [omega, -b * omega - c * jnp.sin(theta)]

    def as_array(t, y, b, c):
        return jnp.stack(pend(t, y, b, c))

    y0, ts = jnp.array([np.pi - 0.1, 0.0]), jnp.linspace(0.0, 1.0, 5)
    loss = lambda f: (lambda b: solve_ivp(f, (0.0, 1.0), y0, args=(b, 9.8), t_eval=ts,
                                          rtol=1e-10, atol=1e-10).ys.sum())
    np.testing.assert_allclose(loss(pend)(0.25), loss(as_array)(0.25), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(loss(pend))(0.25), jax.grad(loss(as_array))(0.25),
                               rtol=1e-10)
    as_list = solve_ivp(lambda t, y: jnp.stack([y[1], -y[0]]), (0.0, 1.0),
                        [jnp.array(1.0), jnp.array(0.0)], t_eval=ts, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(as_list.ys[0], np.cos(ts), rtol=1e-8)
    with pytest.raises(TypeError, match=r"structure of y0.*with 3 numbers where y0 has 2"):
        solve_ivp(lambda t, y: [y[0], y[1], y[0]], (0.0, 1.0), y0)


def test_scipy_attribute_names_point_to_odekits():
    sol = solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), args=(1.0,), t_eval=jnp.array([1.0]))
    with pytest.raises(AttributeError, match=r"sol\.ys, time-leading"):
        sol.y
    with pytest.raises(AttributeError, match=r"sol\.ts"):
        sol.t
    with pytest.raises(AttributeError, match=r"sol\.stats\['nfev'\]"):
        sol.nfev
    with pytest.raises(AttributeError, match="no attribute 'whatever'$"):
        sol.whatever
    assert not hasattr(sol, "y") and sol.ys.shape == (1, 1)


def test_odeint_argument_order_gets_a_hint():
    with pytest.raises(TypeError, match="SciPy's argument order"):
        solve_ivp(lambda y, t: jnp.stack([y[1], -y[0]]), (0.0, 1.0), jnp.array([1.0, 0.0]))


# ---------------------------------------------------------------- transformations

def test_jit_and_vmap_of_values():
    def solve(y0):
        return solve_ivp(decay, (0.0, 1.0), y0, t_eval=jnp.array([0.5, 1.0]), args=(2.0,),
                         rtol=1e-10, atol=1e-12).ys
    y0s = jnp.array([[1.0], [2.0], [3.0]])
    out = jax.jit(jax.vmap(solve))(y0s)
    np.testing.assert_allclose(out[:, :, 0], np.asarray(y0s) * np.exp(-2 * np.array([0.5, 1.0])),
                               rtol=1e-9)
    sol = jax.jit(lambda y0: solve_ivp(decay, (0.0, 1.0), y0, args=(2.0,)))(jnp.array([1.0]))
    assert int(sol.status) == 0


def test_gradients_against_finite_differences():
    t_eval = jnp.linspace(0.0, 5.0, 6)

    def at_t_eval(y0, a, b):
        return solve_ivp(lotka, (0.0, 5.0), y0, t_eval=t_eval, args=(a, b, 3.0, 1.0),
                         rtol=1e-10, atol=1e-10).ys

    check_grads(at_t_eval, (jnp.asarray(LOTKA_Y0), 1.5, 1.0), rtol=1e-5, atol=1e-7)

    # With t_eval=None the rows sit at the accepted steps, whose times move
    # with the parameters (finite differences see that, the adjoint takes the
    # times as fixed); the last row and its padding are y(t1), a fixed time.
    def final(y0, k):
        return solve_ivp(decay, (0.0, 2.0), y0, args=(k,), rtol=1e-10, atol=1e-12,
                         max_steps=300).ys[-3:]

    check_grads(final, (jnp.array([1.0]), 0.7), rtol=1e-6, atol=1e-8)


def test_gradient_with_respect_to_t_span_and_t_eval():
    def f(t0, t1, te):
        return solve_ivp(decay, (t0, t1), jnp.array([1.0]), t_eval=jnp.stack([te, t1]),
                         args=(1.0,), rtol=1e-11, atol=1e-12).ys.sum()
    d0, d1, de = jax.grad(f, (0, 1, 2))(0.0, 2.0, 1.0)
    # y(t) = e^{-(t - t0)}: d/dt0 sum = y(te) + y(t1), d/dte = -y(te), d/dt1 = -y(t1).
    np.testing.assert_allclose([d0, de, d1], [np.exp(-1) + np.exp(-2), -np.exp(-1), -np.exp(-2)],
                               rtol=1e-7)


def test_grad_of_grad_through_solve_ivp():
    def f(k):
        return solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), t_eval=jnp.array([1.0]), args=(k,),
                         rtol=1e-11, atol=1e-12).ys[0, 0]
    np.testing.assert_allclose(jax.grad(jax.grad(f))(0.5), np.exp(-0.5), rtol=1e-6)


def test_gradient_reaches_values_closed_over_by_fun_and_events():
    def f(k, h):
        fun = lambda t, y: -k * y                    # k closed over, not in args
        ev = lambda t, y: y[0] - h                   # h closed over by the event
        ev.terminal = True
        sol = solve_ivp(fun, (0.0, 5.0), jnp.array([1.0]), t_eval=jnp.array([0.5]), events=ev,
                        rtol=1e-11, atol=1e-12)
        return sol.ys[0, 0], sol.t_events[0]
    # y = e^{-k t}; the event y = h happens at t* = -ln(h) / k. Reverse and
    # forward mode, each jitted once (an eager f closes over new values, and
    # compiles again, at every call).
    for jacobian in (jax.jacrev, jax.jacfwd):
        (dy_dk, _), (dt_dk, dt_dh) = jax.jit(jacobian(f, (0, 1)))(0.7, 0.2)
        np.testing.assert_allclose(dy_dk, -0.5 * np.exp(-0.35), rtol=1e-7)
        np.testing.assert_allclose(dt_dk, np.log(0.2) / 0.49, rtol=1e-7)
        np.testing.assert_allclose(dt_dh, -1.0 / (0.2 * 0.7), rtol=1e-7)
