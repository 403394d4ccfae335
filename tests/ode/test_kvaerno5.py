"""The stiff method kvaerno5 (an ESDIRK: simplified Newton per stage with one
Jacobian and one LU per step): its coefficients, measured orders, stiff
problems against SciPy's Radau (rtol 1e-10, atol 1e-14), statistics,
transformations (gradients: test_stiff_gradients.py).

Order conditions of a Runge-Kutta method (Butcher): for every rooted tree t,
sum_i b_i Phi_i(t) = 1 / gamma(t), with Phi_i(leaf) = 1 and
Phi_i([t_1, ..., t_m]) = prod_k (A Phi(t_k))_i. The dense output's weights
are b(theta) = d(theta) @ A (it combines the stage values Y_i - y0 = (A k)_i),
with right-hand side theta^|t| / gamma(t).
"""
import dataclasses

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.ode.engine import controller
from odekit.ode.methods.esdirk_tableaux import KVAERNO5
from odekit.ode.methods import get_method
from odekit.testing import get_problem, reference_solution, rooted_trees

TOL = 1e-12    # residual of an order condition satisfied in float64
FAIL = 1e-7    # a residual this large means the condition fails
THETAS = (0.1, 0.5, 0.9)
METHOD = get_method("kvaerno5")
ROBERTSON = get_problem("robertson")


# --- coefficients -------------------------------------------------------------

def _phi(tree):
    if not tree:
        return np.ones(KVAERNO5.num_stages)
    return np.prod([KVAERNO5.a @ _phi(child) for child in tree], axis=0)


def _residuals(weights, orders, theta=1.0):
    """Max |w . Phi(t) - theta^|t| / gamma(t)| per tree order."""
    return {n: max(abs(weights @ _phi(t) - theta**n / rooted_trees.density(t))
                   for t in rooted_trees.trees(n)) for n in orders}


def _dense_weights(theta):
    d = sum(theta**(r + 1) * row for r, row in enumerate(KVAERNO5.dense))
    return d @ KVAERNO5.a


def _stability(weights, z):
    """R(z) = 1 + z w^T (I - z A)^-1 1 for y' = lambda y, z = h lambda."""
    s = KVAERNO5.num_stages
    return 1 + z * weights @ np.linalg.solve(np.eye(s) - z * KVAERNO5.a, np.ones(s))


def test_kvaerno5_has_order_5_embedded_order_4_dense_order_4():
    res = _residuals(KVAERNO5.b, range(1, 7))
    assert max(res[n] for n in range(1, 6)) < TOL and res[6] > FAIL, res
    res = _residuals(KVAERNO5.b_hat, range(1, 6))
    assert max(res[n] for n in range(1, 5)) < TOL and res[5] > FAIL, res
    for theta in THETAS:
        res = _residuals(_dense_weights(theta), range(1, 6), theta)
        assert max(res[n] for n in range(1, 5)) < TOL and res[5] > FAIL, (theta, res)
    np.testing.assert_allclose(_dense_weights(1.0), KVAERNO5.b, atol=1e-13)


def test_kvaerno5_is_stiffly_accurate_with_an_explicit_first_stage():
    a = KVAERNO5.a
    assert np.all(a[0] == 0) and KVAERNO5.c[0] == 0
    assert KVAERNO5.gamma == 0.26 and np.all(np.diag(a)[1:] == KVAERNO5.gamma)
    np.testing.assert_array_equal(KVAERNO5.b, a[-1])           # y1 = Y_7
    np.testing.assert_allclose(KVAERNO5.b_hat, a[-2], atol=1e-15)   # y1_hat = Y_6
    assert KVAERNO5.c[-1] == KVAERNO5.c[-2] == 1.0
    np.testing.assert_allclose(a.sum(1), KVAERNO5.c, atol=1e-15)
    assert np.all(KVAERNO5.dense[:, 0] == 0)    # the dense output never weighs h f(y0)


def test_kvaerno5_is_l_stable_and_its_embedded_method_a_stable():
    """|R| <= 1 on the imaginary and the negative real axis for y1 and for the
    embedded solution; R(z) -> 0 as z -> -inf for y1 (like 6.5 / |z|), while
    the embedded solution's R tends to -0.748 (A- but not L-stable: its
    error estimate stays bounded on stiff components). The dense output
    stays bounded there too."""
    for weights in (KVAERNO5.b, KVAERNO5.b_hat):
        assert max(abs(_stability(weights, 1j * y)) for y in np.logspace(-3, 6, 200)) <= 1 + 1e-12
        assert max(abs(_stability(weights, -x)) for x in np.logspace(-3, 8, 200)) <= 1 + 1e-12
    assert abs(_stability(KVAERNO5.b, -1e6)) < 1e-5
    assert abs(_stability(KVAERNO5.b_hat, -1e8) + 0.748) < 1e-3
    assert abs(_stability(KVAERNO5.b, -0.1) - np.exp(-0.1)) < 1e-9   # order 5: ~1.2e-4 z^6
    for theta in np.linspace(0.05, 1.0, 20):
        assert abs(_stability(_dense_weights(theta), -1e10)) < 1.0


def test_inconsistent_esdirk_tableau_is_rejected():
    a = np.array(KVAERNO5.a)
    a[3, 1] += 1e-3
    with pytest.raises(ValueError, match="row sums of a"):
        dataclasses.replace(KVAERNO5, a=a)
    with pytest.raises(ValueError, match="stiffly accurate"):
        dataclasses.replace(KVAERNO5, b=KVAERNO5.b_hat, b_error=np.zeros(7))


# --- measured orders ------------------------------------------------------------

def test_measured_local_orders_of_step_and_dense_output():
    """One step of y' = -2 t y^2 (y = 1 / (1 + t^2)) from t0 = 0.5: the local
    errors of y1 and of the dense output at theta = 0.5 fall like h^6 and h^5."""
    func = lambda y, t: -2.0 * t * y**2
    exact = lambda t: 1.0 / (1.0 + t**2)
    t0, y0 = jnp.array(0.5), jnp.array([exact(0.5)])

    @jax.jit
    def errors(h):
        step = METHOD.step(func, t0, y0, func(y0, t0), h)
        mid = METHOD.dense_eval(METHOD.dense_prepare(func, t0, y0, h, step), jnp.array([0.5]))[0]
        return jnp.abs(step.y1 - exact(t0 + h))[0], jnp.abs(mid - exact(t0 + 0.5 * h))[0]

    hs = np.array([0.2, 0.1, 0.05, 0.025])
    errs = np.array([errors(jnp.asarray(h)) for h in hs])
    slopes = [np.polyfit(np.log(hs), np.log(errs[:, k]), 1)[0] for k in range(2)]
    assert 5.5 < slopes[0] < 6.8 and 4.5 < slopes[1] < 5.8, slopes


def test_measured_global_order_on_a_smooth_linear_problem():
    """Fixed steps on y' = cos(t) y to t = 2: the global error of y1 falls like
    h^5, and that of the embedded solution like h^4."""
    problem = get_problem("time_dependent_linear")
    func = lambda y, t: problem.func(y, t, jnp.array(1.0))
    t_end = 2.0
    exact = np.asarray(problem.exact(jnp.array([t_end]), jnp.array(1.0)))[0]

    @jax.jit      # one program for every step count, y1 and the embedded solution
    def integrate(num, h):
        def body(i, ys):
            t = i.astype(h.dtype) * h
            steps = [METHOD.step(func, t, y, func(y, t), h) for y in ys]
            return steps[0].y1, steps[1].y1 - steps[1].error
        y0 = jnp.asarray(problem.y0)
        return jax.lax.fori_loop(0, num, body, (y0, y0))

    nums = np.array([4, 8, 16, 32])   # at 64 steps the Newton tolerance (1e-10) shows
    finals = [integrate(jnp.asarray(n), jnp.asarray(t_end / n)) for n in nums]
    for embedded, (low, high) in ((False, (4.6, 5.6)), (True, (3.6, 4.6))):
        errs = [float(np.max(np.abs(np.asarray(final[embedded]) - exact))) for final in finals]
        slope = -np.polyfit(np.log(nums), np.log(errs), 1)[0]
        assert low < slope < high, (embedded, slope, errs)


# --- stiff problems against Radau ---------------------------------------------

def _error_in_tolerances(ys, ref, rtol, atol):
    return float(np.max(np.abs(np.asarray(ys, np.float64) - ref) / (atol + rtol * np.abs(ref))))


def _robertson(t, y, k1, k2, k3):
    return ROBERTSON.func(y, t, k1, k2, k3)


def test_robertson_to_1e5_matches_radau_with_few_steps_and_counts():
    rtol, atol = 1e-6, 1e-10
    times = np.concatenate([[0.0], np.logspace(-5.0, 5.0, 9)])
    sol = odekit.solve_ivp(_robertson, (0.0, 1e5), jnp.asarray(ROBERTSON.y0),
                           t_eval=jnp.asarray(times), args=tuple(map(jnp.asarray, ROBERTSON.args)),
                           method="kvaerno5", rtol=rtol, atol=atol)
    ref = reference_solution(ROBERTSON, times)
    # kvaerno5 lands its steps on the output times (measured 1.5 tolerances):
    # its dense output is of order 2 on stiff components, where y2 at t = 17.8
    # was off by 4.9 tolerances (100 at rtol 1e-8) when interpolated
    assert METHOD.lands_on_outputs
    assert _error_in_tolerances(sol.ys, ref, rtol, atol) < 5
    assert float(jnp.max(jnp.abs(jnp.sum(sol.ys, axis=1) - 1.0))) < 1e-13
    stats = {k: int(v) for k, v in sol.stats.items()}
    # measured 2026-12-05: 77 attempted steps (rodas5p 110; tsit5 is refused as stiff)
    assert stats["num_steps"] <= 100, stats
    assert stats["njev"] == stats["nlu"] == stats["num_steps"], stats
    # per step: one evaluation per Newton iteration of 6 implicit stages (1 to
    # 8 each) and f(t1, y1); 2 to start (f(y0) and the first step's estimate)
    assert 7 * stats["num_steps"] + 2 <= stats["nfev"] <= 49 * stats["num_steps"] + 2, stats


def test_hires_matches_radau_with_steps_far_below_tsit5():
    problem = get_problem("hires")
    fun = lambda t, y, k: problem.func(y, t, k)
    rtol, atol = 1e-6, 1e-10
    solve = partial(odekit.solve_ivp, fun, (problem.t[0], problem.t[-1]), jnp.asarray(problem.y0),
                    t_eval=problem.t, args=tuple(map(jnp.asarray, problem.args)), rtol=rtol,
                    atol=atol, max_steps=20_000)
    sol = solve(method="kvaerno5")
    assert _error_in_tolerances(sol.ys, reference_solution(problem), rtol, atol) < 5  # measured 3.7
    steps = int(sol.stats["num_steps"])
    explicit = int(solve(method="tsit5").stats["num_steps"])
    assert steps < 200 and 50 * steps < explicit, (steps, explicit)   # measured 139 and 9946


def test_failed_newton_iteration_rejects_the_step_and_shrinks_h():
    """A step far too long for the frozen Jacobian: the iteration diverges or
    runs out, the step returns y0 and an infinite error, and the controller
    shrinks h by its smallest factor."""
    func = lambda y, t: -1e3 * y**3
    y0 = jnp.array([1.0, 2.0])
    step = jax.jit(METHOD.step, static_argnums=0)(func, jnp.array(0.0), y0, func(y0, 0.0),
                                                  jnp.array(10.0))
    assert bool(jnp.all(step.y1 == y0)) and not bool(jnp.all(jnp.isfinite(step.error)))
    @jax.jit     # one program (op by op, ~30 small ones)
    def proposed(step):
        err = controller.error_norm(step.error, None, y0, step.y1,
                                    controller.Tolerance(1e-6, 1e-9))
        return controller.propose_step(jnp.array(10.0), err, jnp.array(1.0),
                                       METHOD.controller_order, jnp.bool_(False),
                                       jnp.bool_(False))
    h = proposed(step)
    assert float(h) == pytest.approx(10.0 * controller.DFACTOR)
    # and the solve itself gets through by shrinking
    sol = odekit.solve_ivp(lambda t, y: func(y, t), (0.0, 10.0), y0, method="kvaerno5",
                           first_step=10.0, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sol.ys[-1], y0 / jnp.sqrt(1 + 2e3 * 10.0 * y0**2), rtol=1e-5)


# --- transformations, statistics, kernels ---------------------------------------

def test_dense_output_between_steps_is_accurate_on_a_smooth_problem():
    """sol.sol(t) between steps (order 4) on a non-stiff problem: within a few
    times the solution's own global error (measured 44 tolerances between
    steps; 9.3 at step ends, rodas5p 4.9)."""
    problem = get_problem("time_dependent_linear")
    rtol, atol = 1e-8, 1e-10
    sol = odekit.solve_ivp(lambda t, y, a: problem.func(y, t, a), (0.0, 10.0),
                           jnp.asarray(problem.y0), args=(jnp.array(1.0),), method="kvaerno5",
                           rtol=rtol, atol=atol, dense_output=True)
    times = np.linspace(0.05, 9.95, 23)
    values = jax.jit(lambda dense, t: dense(t))(sol.sol, jnp.asarray(times))
    exact = np.asarray(problem.exact(jnp.asarray(times), jnp.array(1.0)))
    assert _error_in_tolerances(values, exact, rtol, atol) < 60


def test_jit_and_vmap_over_rate_constants_match_single_solves():
    t_eval = jnp.array([1.0, 100.0, 1e4])

    @jax.jit
    def final(k1):
        sol = odekit.solve_ivp(_robertson, (0.0, 1e4), jnp.array([1.0, 0.0, 0.0]), t_eval=t_eval,
                               args=(k1, jnp.array(1e4), jnp.array(3e7)), method="kvaerno5",
                               rtol=1e-7, atol=1e-11)
        return sol.ys, sol.stats["njev"]

    k1s = jnp.array([0.02, 0.04, 0.08])
    batched, njev = jax.vmap(final)(k1s)
    for i, k1 in enumerate(k1s):
        ys, n = final(k1)
        # batched products round differently, which can move a Newton iteration
        # across its stopping test: agreement to the Newton tolerance (1e-10)
        np.testing.assert_allclose(batched[i], ys, rtol=1e-9, atol=1e-16)
        assert int(njev[i]) == int(n) > 0
    assert not np.allclose(batched[0], batched[2])


def test_record_counts_one_jacobian_and_one_lu_and_is_never_one_kernel():
    assert METHOD.jacobians_per_step == METHOD.factorizations_per_step == 1
    assert METHOD.is_stiff is None and METHOD.order == 5 and METHOD.controller_order == 5
    sol = odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(2), method="kvaerno5")
    stats = {k: int(v) for k, v in sol.stats.items()}
    assert stats["njev"] == stats["nlu"] == stats["num_steps"] > 0, stats
    np.testing.assert_allclose(sol.ys[-1], np.exp(-1.0) * np.ones(2), rtol=1e-5)
