"""Every failure path of odekit.odeint is loud (DESIGN section 2)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit import odeint
from odekit.ode.engine import controller
from odekit import ODESolverError
from odekit.ode.methods import EXPLICIT_METHODS, get_tableau

TS = jnp.linspace(0.0, 10.0, 3)


def decay(y, t):
    return -y


def robertson(y, t):
    y1, y2, y3 = y
    return jnp.stack([-0.04 * y1 + 1e4 * y2 * y3,
                      0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2 ** 2,
                      3e7 * y2 ** 2])


# ---------------------------------------------------------------- solver stops

def test_mxstep_raises_eagerly_with_numbers():
    # jax.experimental.ode returns y(10) = 213.6 here without a word.
    with pytest.raises(ODESolverError, match=r"maximum number of steps.*t=0\.\d+ before the output "
                                             r"time t=5 after 3 attempted steps"):
        odeint(decay, jnp.ones(1), TS, mxstep=3)


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad", "jit_grad"])
def test_mxstep_raises_under_transformations(transform):
    solve = lambda y0: odeint(decay, y0, TS, mxstep=3)
    if transform == "jit":
        call = lambda: jax.jit(solve)(jnp.ones(1))
    elif transform == "vmap":
        call = lambda: jax.vmap(solve)(jnp.ones((4, 1)))
    elif transform == "grad":
        call = lambda: jax.grad(lambda y0: solve(y0).sum())(jnp.ones(1))
    else:
        call = lambda: jax.jit(jax.grad(lambda y0: solve(y0).sum()))(jnp.ones(1))
    with pytest.raises(Exception, match="maximum number of steps was reached") as info:
        jax.block_until_ready(call())
    assert "attempted steps" in str(info.value)


def test_vmap_failure_names_the_member():
    y0 = jnp.array([[1.0], [1e3]])
    fast = lambda y, t, k: -k * y
    with pytest.raises(Exception, match="batch member 1 of 2"):
        jax.block_until_ready(jax.vmap(lambda k: odeint(fast, jnp.ones(1), TS, k, mxstep=40))(
            jnp.array([1.0, 1e3])))
    del y0


def test_stiff_robertson_raises_instead_of_extrapolating():
    # jax.experimental.ode stops at t=390 of 1e5 and extrapolates to 1e24.
    with pytest.raises(ODESolverError, match='appears to be stiff.*Pass method="rodas5p"'):
        odeint(robertson, jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1e5]))


@pytest.mark.parametrize("single_kernel", ["1", "0"])
@pytest.mark.parametrize("wrap", ["jit", "vmap"])
def test_stiffness_verdict_at_the_same_step_with_and_without_the_single_kernel(
        monkeypatch, single_kernel, wrap):
    # One kernel tests the stages of the step attempted when a probe is due;
    # the kernel-per-operation loop takes a separate trial step. Both must
    # reach the verdict at the same attempt: the first probe is due at 500
    # attempted steps; once one says stiff, every attempt is probed, and 15
    # stiff probes in a row give the verdict (odekit.ode.engine.loop).
    monkeypatch.setenv("ODEKIT_SINGLE_KERNEL", single_kernel)
    solve = lambda s: odeint(robertson, jnp.array([s, 0.0, 0.0]), jnp.array([0.0, 1e5]))
    run = jax.jit(solve) if wrap == "jit" else jax.vmap(solve)
    arg = jnp.float64(1.0) if wrap == "jit" else jnp.array([1.0, 0.9])
    with pytest.raises(Exception, match="appears to be stiff") as caught:
        jax.block_until_ready(run(arg))
    steps = int(re.search(r"after (\d+) attempted steps", str(caught.value)).group(1))
    assert 500 + 14 <= steps <= 500 + 20


def test_step_size_underflow_at_a_pole():
    pole = lambda y, t: 1.0 / (1.0 - t) ** 2 + 0.0 * y
    with pytest.raises(ODESolverError, match=r"step size underflowed.*Stopped at t=1 "):
        odeint(pole, jnp.ones(1), jnp.array([0.0, 2.0]))


def test_nonfinite_initial_derivative():
    with pytest.raises(ODESolverError, match=r"non-finite.*Stopped at t=0 .*after 0 attempted"):
        odeint(lambda y, t: jnp.sqrt(y - 2.0), jnp.ones(1), jnp.array([0.0, 2.0]))


def test_finite_time_blow_up_is_not_called_stiff():
    with pytest.raises(ODESolverError, match="non-finite|underflowed"):
        odeint(lambda y, t: y ** 2, jnp.ones(1), jnp.array([0.0, 2.0]))


def test_backward_solve_failure_raises():
    # Forward is fine (y' = 0), but d sqrt(p)/dp is infinite at p = 0.
    func = lambda y, t, p: -jnp.sqrt(p) * y
    loss = lambda p: odeint(func, jnp.ones(2), TS, p).sum()
    assert np.isfinite(loss(0.0))
    with pytest.raises(Exception, match="backward \\(adjoint\\) solve.*non-finite"):
        jax.block_until_ready(jax.grad(loss)(0.0))


def test_successful_solve_under_jit_is_untouched_by_the_check():
    ys = jax.jit(lambda y0: odeint(decay, y0, TS))(jnp.ones(2))
    np.testing.assert_allclose(ys[:, 0], np.exp(-np.asarray(TS)), rtol=1e-7, atol=1e-8)


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("t, error, match", [
    (jnp.arange(3), TypeError, "t must be an array of floats"),
    (jnp.array([0.0, 2.0, 1.0]), ValueError, r"strictly increasing.*t\[1\]=2.0"),
    (jnp.array([0.0, 0.0]), ValueError, "strictly increasing"),
    (jnp.ones((2, 2)), ValueError, "1-D"),
])
def test_bad_times(t, error, match):
    with pytest.raises(error, match=match):
        odeint(decay, jnp.ones(1), t)


def test_non_array_args():
    with pytest.raises(TypeError, match=r"\*args must be arrays or numbers, got str"):
        odeint(lambda y, t, s: -y, jnp.ones(1), TS, "abc")
    with pytest.raises(TypeError, match="function"):
        odeint(lambda y, t, g: g(y), jnp.ones(1), TS, jnp.sin)


def test_func_returning_wrong_structure_or_shape():
    with pytest.raises(TypeError, match="structure of y0"):
        odeint(lambda y, t: (y, y), jnp.ones(2), TS)
    with pytest.raises(ValueError, match=r"shape \(3,\) where y0 has shape \(2,\)"):
        odeint(lambda y, t: jnp.ones(3), jnp.ones(2), TS)
    with jax.numpy_dtype_promotion("standard"), pytest.raises(TypeError, match="complex"):
        odeint(lambda y, t: 1j * y, jnp.ones(2), TS)   # 1j * y itself needs standard promotion


def test_func_returning_another_structure_of_the_same_size_is_read_as_y0():
    """Issue 27 (JAX's own odeint tests) and 35.3: jax.experimental.ode ravels
    func's output, so test_pend_grads' list of scalars for an array y0 (and
    an array for a list y0) works there; a drop-in accepts it, under grad."""
    from jax.experimental.ode import odeint as jax_odeint

    def pend(y, t, b, c):          # JAX's tests/ode_test.py, test_pend_grads
        theta, omega = y
        return [omega, -b * omega - c * jnp.sin(theta)]

    y0, ts = jnp.array([np.pi - 0.1, 0.0]), jnp.linspace(0.0, 1.0, 11)
    loss = lambda solver: (lambda y0, b, c: solver(pend, y0, ts, b, c).sum())
    got = jax.grad(loss(odeint), (0, 1, 2))(y0, 0.25, 9.8)
    want = jax.grad(loss(jax_odeint), (0, 1, 2))(y0, 0.25, 9.8)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)

    def swing(y, t):               # test_weird_time_pendulum_grads: an array for a list y0
        return jnp.stack([y[1], -jnp.sin(y[0])])

    y0_list = [jnp.array(1.0), jnp.array(0.0)]
    ys = odeint(swing, y0_list, ts)
    assert isinstance(ys, list) and ys[0].shape == (11,)
    np.testing.assert_allclose(ys[0], jax_odeint(swing, y0_list, ts)[0], rtol=1e-6)
    # What disagrees in size or kind still raises, saying why.
    with pytest.raises(TypeError, match=r"structure of y0.*with 1 numbers where y0 has 2"):
        odeint(lambda y, t: [y[0]], y0, ts)
    with jax.numpy_dtype_promotion("standard"), pytest.raises(
            TypeError, match="structure of y0.*complex values for a real y0"):
        odeint(lambda y, t: [1j * y[0], y[1]], y0, ts)


@pytest.mark.parametrize("kwargs, match", [
    ({"rtol": -1.0}, "rtol must be a non-negative"),
    ({"atol": float("nan")}, "atol must be a non-negative"),
    ({"rtol": 0.0, "atol": 0.0}, "cannot both be zero"),
    ({"mxstep": 0}, "mxstep must be >= 1"),
    ({"hmax": 0.0}, "hmax > 0"),
    ({"method": "rk45"}, "Unknown method 'rk45'; choose one of"),
    ({"adjoint": "magic"}, "unknown adjoint 'magic'"),
    ({"rtol": "tight"}, "rtol must be a number"),
])
def test_bad_options(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        odeint(decay, jnp.ones(1), TS, **kwargs)


def test_traced_tolerance_is_rejected():
    with pytest.raises(TypeError, match="concrete number"):
        jax.jit(lambda r: odeint(decay, jnp.ones(1), TS, rtol=r))(1e-6)


def test_empty_y0():
    with pytest.raises(ValueError, match="no array leaves"):
        odeint(lambda y, t: y, {}, TS)


@pytest.mark.parametrize("method", ["bosh3", "dopri5", "dopri8"])
def test_stiffness_probe_has_no_false_alarm_on_long_non_stiff_solves(method):
    # Thousands of steps (several probes) at a loose tolerance on an oscillator.
    omega = 20.0
    func = lambda y, t: jnp.stack([y[1], -omega ** 2 * y[0]])
    t = jnp.linspace(0.0, 200.0, 5)
    ys = odeint(func, jnp.array([1.0, 0.0]), t, rtol=1e-4, atol=1e-6, method=method)
    assert np.all(np.isfinite(np.asarray(ys)))


def test_stiffness_detected_for_every_method_with_a_stage_pair_or_not():
    for method in ["bosh3", "tsit5", "dopri8"]:
        with pytest.raises(ODESolverError, match="appears to be stiff"):
            odeint(robertson, jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1e5]), method=method)


@pytest.mark.parametrize("method", sorted(EXPLICIT_METHODS))
def test_nan_appearing_mid_solve_is_never_returned_as_success(method):
    func = lambda y, t: jnp.where(t > 0.5, jnp.nan, -y)
    with pytest.raises(ODESolverError, match="non-finite|underflowed"):
        odeint(func, jnp.ones(2), jnp.array([0.0, 1.0, 2.0]), method=method)


@pytest.mark.parametrize("method", sorted(EXPLICIT_METHODS))
def test_error_norm_propagates_nan_and_zero(method):
    tab = get_tableau(method)
    tol = controller.Tolerance(1e-6, 1e-6)
    second = (lambda v: v) if tab.b_error_secondary is not None else (lambda v: None)
    y = jnp.ones(3)
    nan_err = controller.error_norm(jnp.full(3, jnp.nan), second(jnp.full(3, jnp.nan)), y, y, tol)
    zero_err = controller.error_norm(jnp.zeros(3), second(jnp.zeros(3)), y, y, tol)
    assert np.isnan(nan_err) and zero_err == 0.0


@pytest.mark.parametrize("t", [np.array([0.0, 2.0, 1.0]), [0.0, 2.0, 1.0], (0.0, np.inf)])
def test_constant_times_are_checked_at_trace_time_inside_jit(t):
    """A constant (NumPy, list, tuple) output grid is known when jit traces:
    it is checked then, as outside jit, although jnp.asarray of it is a tracer."""
    with pytest.raises(ValueError, match="strictly increasing|finite"):
        jax.jit(lambda y0: odeint(decay, y0, t))(jnp.ones(1))


def test_traced_non_increasing_times_raise_at_run_time():
    solve = jax.jit(lambda t: odeint(decay, jnp.ones(1), t))
    np.testing.assert_allclose(solve(jnp.array([0.0, 1.0]))[1], np.exp(-1.0), rtol=1e-7)
    with pytest.raises(Exception, match="not strictly (increasing|monotonic)"):
        jax.block_until_ready(solve(jnp.array([0.0, 2.0, 1.0])))


@pytest.mark.parametrize("single_kernel", ["1", "0"])
def test_vmap_over_a_closed_over_value_fails_loudly_for_the_member_that_blows_up(
        single_kernel, monkeypatch):
    # y' = k y^2, y(0) = 1 blows up at t = 1/k: member 1 (k = 2) at t = 0.5.
    monkeypatch.setenv("ODEKIT_SINGLE_KERNEL", single_kernel)
    solve = lambda k: odeint(lambda y, t: k * y ** 2, 1.0, jnp.linspace(0.0, 1.0, 3))
    with pytest.raises(Exception, match=r"batch member 1 of 2.*(non-finite|underflowed).*t=0\.5"):
        jax.block_until_ready(jax.vmap(solve)(jnp.array([0.5, 2.0])))


def test_known_value_is_what_the_caller_passed_when_known_at_trace_time():
    from odekit.ode.arguments import known_value
    np.testing.assert_array_equal(known_value([0.0, 1.0]), [0.0, 1.0])
    np.testing.assert_array_equal(known_value(jnp.arange(3.0)), [0.0, 1.0, 2.0])
    assert known_value(2.5) == 2.5

    def inside(x):
        assert known_value(x) is None                # a tracer
        assert known_value([0.0, x]) is None         # a list holding one
        np.testing.assert_array_equal(known_value(np.ones(2)), [1.0, 1.0])  # a constant
        return x
    jax.jit(inside)(1.0)


@pytest.mark.parametrize("adjoint", ["backsolve", pytest.param("interpolate", marks=pytest.mark.long)])
def test_forward_mode_through_a_reverse_only_adjoint_names_the_ones_that_work(adjoint):
    """Issue 27.21: jax.jacfwd / jax.jvp through backsolve or interpolate (custom_vjp
    rules) used to give JAX's generic custom_vjp message."""
    import odekit

    def through_odeint(k):
        return odeint(lambda y, t, k: -k * y, jnp.ones(2), jnp.array([0.0, 1.0]), k,
                      adjoint=adjoint)[-1]

    def through_solve_ivp(k):
        return odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), jnp.ones(2), args=(k,),
                                adjoint=adjoint).ys[-1]

    match = (rf"adjoint='{adjoint}' is a reverse-mode rule.*forward mode.*"
             r"adjoint='checkpoint'.*adjoint='forward'")
    for f in (through_odeint, through_solve_ivp):
        with pytest.raises(TypeError, match=match):
            jax.jacfwd(f)(1.0)
        with pytest.raises(TypeError, match=match):
            jax.jvp(f, (1.0,), (1.0,))
        np.testing.assert_allclose(jax.jacrev(f)(1.0), -np.exp(-1.0) * np.ones(2), rtol=1e-5)
