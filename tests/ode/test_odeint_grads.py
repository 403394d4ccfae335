"""Gradients of odekit.odeint (backsolve adjoint) against finite differences.

Every check goes through odekit.testing.check_grads (central differences in
float64) on problems of the shared registry. Solves use tight tolerances so
that the adjoint's and the finite differences' discretisation errors stay far
below the comparison tolerance.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.ode import odeint as jax_odeint

from odekit import odeint
from odekit.ode.methods import EXPLICIT_METHODS
from odekit.testing import check_grads
from odekit.testing.problems import get_problem

TIGHT = dict(rtol=1e-11, atol=1e-11)
GRAD_TOL = dict(rtol=2e-5, atol=1e-7)


def _short(problem, n=4):
    """The problem's first output times, thinned: gradients need few outputs."""
    t = np.asarray(problem.t)
    return jnp.asarray(np.linspace(t[0], t[0] + 0.3 * (t[-1] - t[0]), n))


# Every explicit method steps through the same Runge-Kutta code with its own
# tableau: CI runs odeint's default (dopri5) and dopri8 (extra dense-output
# stages, a second error estimate); the others are long (tsit5's gradients run
# in CI through solve_ivp's default method).
@pytest.mark.parametrize("method", [m if m in ("dopri5", "dopri8")
                                    else pytest.param(m, marks=pytest.mark.long)
                                    for m in sorted(EXPLICIT_METHODS)])
def test_pendulum_gradient_wrt_y0_and_args_every_method(method):
    p = get_problem("pendulum")
    t = _short(p)
    loss = jax.jit(lambda y0, b, g: odeint(p.func, y0, t, b, g, method=method, **TIGHT))
    check_grads(loss, (jnp.asarray(p.y0), *map(jnp.asarray, p.args)), **GRAD_TOL)


# (a time-dependent field and a nonlinear orbit in CI; Lotka-Volterra, another
# nonlinear autonomous field, is long)
@pytest.mark.parametrize("name", ["time_dependent_linear",
                                  pytest.param("lotka_volterra", marks=pytest.mark.long), "kepler"])
def test_gradient_wrt_every_time(name):
    p = get_problem(name)
    t = _short(p, n=3)
    loss = jax.jit(lambda y0, t, *args: odeint(p.func, y0, t, *args, **TIGHT))
    check_grads(loss, (jax.tree.map(jnp.asarray, p.y0), t, *map(jnp.asarray, p.args)), **GRAD_TOL)


def test_gradient_wrt_times_matches_analytic():
    # y' = -k y: y(t_i) = y0 exp(-k (t_i - t_0)); d sum(y)/dt_i known in closed form.
    k, y0 = 0.7, 2.0
    t = jnp.array([0.2, 0.5, 1.3])
    grad_t = jax.grad(lambda t: odeint(lambda y, t, k: -k * y, jnp.array(y0), t, k, **TIGHT).sum())(t)
    values = y0 * np.exp(-k * (np.asarray(t) - 0.2))
    expected = np.concatenate([[k * values[1:].sum()], -k * values[1:]])
    np.testing.assert_allclose(grad_t, expected, rtol=1e-8)


def test_gradient_matches_analytic_decay():
    t = jnp.linspace(0.0, 2.0, 5)
    d = jax.grad(lambda k: odeint(lambda y, t, k: -k * y, jnp.array(1.5), t, k, **TIGHT)[-1])(0.8)
    np.testing.assert_allclose(d, -2.0 * 1.5 * np.exp(-1.6), rtol=1e-8)


def test_closed_over_values_get_gradients():
    p = get_problem("harmonic_oscillator")
    t = _short(p)

    def loss(omega, shift):
        func = lambda y, t: p.func(y, t, omega) + shift  # closes over tracers
        return odeint(func, jnp.asarray(p.y0), t, **TIGHT)

    check_grads(jax.jit(loss), (2.0, jnp.array([0.1, -0.2])), **GRAD_TOL)
    # closure and explicit argument agree
    g_closure = jax.grad(lambda w: loss(w, jnp.zeros(2)).sum())(2.0)
    g_arg = jax.grad(lambda w: odeint(p.func, jnp.asarray(p.y0), t, w, **TIGHT).sum())(2.0)
    np.testing.assert_allclose(g_closure, g_arg, rtol=1e-12)


def test_closed_over_array_under_jit_and_vmap():
    t = jnp.linspace(0.0, 1.0, 4)

    def final(k):
        return odeint(lambda y, t: -k * y, jnp.ones(2), t, **TIGHT)[-1, 0]

    ks = jnp.array([0.5, 1.0, 2.0])
    grads = jax.jit(jax.vmap(jax.grad(final)))(ks)
    np.testing.assert_allclose(grads, -np.exp(-np.asarray(ks)), rtol=1e-8)


def test_grad_of_grad():
    p = get_problem("time_dependent_linear")
    t = _short(p, n=3)
    loss = jax.jit(lambda y0, a: odeint(p.func, y0, t, a, rtol=1e-10, atol=1e-10))
    check_grads(loss, (jnp.asarray(p.y0), *map(jnp.asarray, p.args)), order=2, rtol=1e-4, atol=1e-6)


@pytest.mark.long   # second order in CI: test_grad_of_grad (of a jitted loss)
def test_second_derivative_matches_analytic_under_jit():
    # y(1) = exp(-k): d2/dk2 = exp(-k)
    f = lambda k: odeint(lambda y, t, k: -k * y, jnp.array(1.0), jnp.array([0.0, 1.0]), k, **TIGHT)[-1]
    np.testing.assert_allclose(jax.jit(jax.grad(jax.grad(f)))(0.6), np.exp(-0.6), rtol=1e-6)


def test_single_output_time_gradient_is_the_identity():
    # odeint(f, y0, [t0]) = y0[None]: d/dy0 = 1, d/dargs = 0, d/dt0 = 0 (also grad of grad).
    f = lambda y, t, k: -k * y * t
    loss = lambda y0, t, k: (odeint(f, y0, t, k) * jnp.array([[1.0, 2.0]])).sum()
    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(jnp.ones(2), jnp.array([0.5]), 0.7)
    np.testing.assert_allclose(grads[0], [1.0, 2.0])
    np.testing.assert_allclose(grads[1], [0.0])
    assert float(grads[2]) == 0.0
    assert float(jax.grad(jax.grad(lambda k: loss(jnp.ones(2), jnp.array([0.5]), k)))(0.7)) == 0.0


# (long: grad of grad meets its analytic value in CI)
@pytest.mark.parametrize("single_kernel", [pytest.param("1", marks=pytest.mark.long),
                                           pytest.param("0", marks=pytest.mark.long)])
def test_third_derivative_matches_analytic(single_kernel, monkeypatch):
    # y(t) = exp(-k t): d3/dk3 of y(1) + y(2) = -exp(-k) - 8 exp(-2k).
    monkeypatch.setenv("ODEKIT_SINGLE_KERNEL", single_kernel)
    f = lambda k: odeint(lambda y, t, k: -k * y, jnp.array(1.0), jnp.array([0.0, 1.0, 2.0]), k,
                         **TIGHT)[1:].sum()
    third = jax.jit(jax.grad(jax.grad(jax.grad(f))))(0.6)
    np.testing.assert_allclose(third, -np.exp(-0.6) - 8 * np.exp(-1.2), rtol=1e-6)


@pytest.mark.long   # 20 s on CI's machine; pytree states are differentiated in CI by solve_ivp's tests
def test_pytree_state_and_pytree_args():
    p = get_problem("pytree_state")
    t = _short(p)
    y0 = jax.tree.map(jnp.asarray, p.y0)
    loss = jax.jit(lambda y0, a: odeint(p.func, y0, t, a, **TIGHT))
    check_grads(loss, (y0, *map(jnp.asarray, p.args)), **GRAD_TOL)

    def dict_args(y0, params):
        return odeint(lambda y, t, d: jax.tree.map(lambda v: -d["k"] * v * jnp.sum(d["scale"][0]), y),
                      y0, t, params, **TIGHT)

    params = {"k": jnp.array(0.4), "scale": [jnp.array([1.5, 2.0])], "n": 3}
    check_grads(jax.jit(dict_args), (y0, params), **GRAD_TOL)


def test_complex_state_gradient():
    p = get_problem("complex_rotation")
    t = _short(p)
    y0 = jnp.asarray(p.y0)
    loss = jax.jit(lambda y0, w: odeint(p.func, y0, t, w, **TIGHT))
    check_grads(loss, (y0, *map(jnp.asarray, p.args)), **GRAD_TOL)


def test_float32_gradient_close_to_float64():
    p = get_problem("pendulum")
    t = _short(p)
    g = lambda y0, b: jax.grad(lambda y0, b: odeint(p.func, y0, t, b, 9.8, rtol=1e-6, atol=1e-6).sum(),
                               (0, 1))(y0, b)
    g32 = g(jnp.asarray(p.y0, jnp.float32), jnp.float32(0.25))
    g64 = g(jnp.asarray(p.y0), 0.25)
    assert g32[0].dtype == jnp.float32 and g32[1].dtype == jnp.float32
    np.testing.assert_allclose(g32[0], g64[0], rtol=1e-3)
    np.testing.assert_allclose(g32[1], g64[1], rtol=1e-3)


def test_integer_args_are_held_fixed():
    t = jnp.linspace(0.0, 1.0, 3)
    g = jax.grad(lambda y0: odeint(lambda y, t, n: -n * y, y0, t, 2, **TIGHT)[-1].sum())(jnp.ones(2))
    np.testing.assert_allclose(g, np.exp(-2.0) * np.ones(2), rtol=1e-8)


def test_vmap_of_gradient_equals_per_member_gradients():
    p = get_problem("pendulum")
    t = jnp.asarray(p.t[:21])
    grad = jax.grad(lambda y0, b: odeint(p.func, y0, t, b, 9.8).sum(), (0, 1))
    y0s = jnp.stack([jnp.array([a, 0.0]) for a in (0.5, 2.0, 3.0)])
    bs = jnp.array([0.1, 0.25, 0.6])
    batched = jax.jit(jax.vmap(grad))(y0s, bs)
    single = jax.jit(grad)
    for i in range(3):
        one = single(y0s[i], bs[i])
        np.testing.assert_allclose(batched[0][i], one[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(batched[1][i], one[1], rtol=1e-10, atol=1e-12)


def test_vmap_values_equal_unbatched():
    p = get_problem("pendulum")
    t = jnp.asarray(p.t)
    y0s = jnp.stack([jnp.array([a, 0.0]) for a in (0.1, 1.0, 3.1)])
    batched = jax.vmap(lambda y0: odeint(p.func, y0, t, *p.args))(y0s)
    for i in range(3):
        np.testing.assert_allclose(batched[i], odeint(p.func, y0s[i], t, *p.args),
                                   rtol=1e-12, atol=1e-13)


def test_gradient_agrees_with_jax_experimental_ode():
    p = get_problem("pendulum")
    t = jnp.asarray(p.t[:31])
    ours = jax.grad(lambda y0, b, g: odeint(p.func, y0, t, b, g, **TIGHT).sum(), (0, 1, 2))
    theirs = jax.grad(lambda y0, b, g: jax_odeint(p.func, y0, t, b, g, rtol=1e-11, atol=1e-11).sum(),
                      (0, 1, 2))
    args = (jnp.asarray(p.y0), 0.25, 9.8)
    for a, b in zip(jax.tree.leaves(ours(*args)), jax.tree.leaves(theirs(*args))):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_hmax_and_mxstep_pass_through_the_adjoint():
    t = jnp.linspace(0.0, 1.0, 3)
    f = lambda k: odeint(lambda y, t, k: -k * y, jnp.array(1.0), t, k, hmax=0.05, mxstep=1000, **TIGHT)[-1]
    np.testing.assert_allclose(jax.grad(f)(0.5), -np.exp(-0.5), rtol=1e-8)


# (CI: the time-dependent field; the autonomous nonlinear ones are long)
@pytest.mark.parametrize("name", [pytest.param("pendulum", marks=pytest.mark.long),
                                  pytest.param("lotka_volterra", marks=pytest.mark.long),
                                  "time_dependent_linear"])
def test_one_pass_backward_agrees_with_interval_by_interval(name):
    """First-order gradients come from the one-pass backward solve, second-order
    ones differentiate the interval-by-interval version: both solve the same
    adjoint equations, so they agree to the solver tolerance."""
    from odekit.ode.adjoints import backsolve as ab
    from odekit.ode.engine.loop import LoopConfig
    from odekit.ode.engine.solve import SolveOptions
    p = get_problem(name)
    t = jnp.asarray(p.t)
    y0 = jnp.asarray(p.y0)
    args = tuple(map(jnp.asarray, p.args))
    options = SolveOptions("dopri5", LoopConfig(1e-10, 1e-10))
    func = lambda y, s, *a: p.func(y, s, *a)
    sol = ab.solve(func, None, options, y0, t[0], t[-1], t, jnp.asarray(0.0), *args)
    ys = sol.ys_eval
    g = jnp.cos(jnp.arange(ys.size, dtype=ys.dtype)).reshape(ys.shape)
    one = ab._adjoint_one_pass(func, options, ys, t, g, sol.h, *args)
    each = ab._adjoint_by_interval(func, options, ys, t, g, sol.h, *args)
    for a, b in zip(jax.tree.leaves(one[:3]), jax.tree.leaves(each[:3])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    assert int(one[3]) == int(each[3]) == 0


def test_one_pass_backward_reports_failure():
    """A backward solve that meets a non-finite adjoint raises, naming the
    adjoint, although the forward solve is fine (d/dy sqrt(0 * y) = inf)."""
    func = lambda y, t: -y + 0.0 * jnp.sqrt(0.0 * y)
    t = jnp.linspace(0.0, 1.0, 6)
    y0 = jnp.array([1.0, 2.0])
    assert np.all(np.isfinite(odeint(func, y0, t)))
    with pytest.raises(Exception, match="adjoint"):
        jax.block_until_ready(jax.grad(lambda y: odeint(func, y, t).sum())(y0))
