"""The stiff method rodas5p: its coefficients, measured orders, stiff problems
against SciPy's Radau (rtol 1e-10, atol 1e-14), statistics and
transformations (gradients: test_stiff_gradients.py).

Order conditions of a Rosenbrock method (Hairer & Wanner, Solving ODEs II,
Sec. IV.7) in the standard form (alpha, Gamma, b): for every rooted tree t,
sum_i b_i Phi_i(t) = 1 / gamma(t), where Phi_i(leaf) = 1, a vertex with one
child multiplies by B = alpha + Gamma (Gamma with its diagonal), a vertex
with several by alpha for each child. Dense output: b(theta), theta^|t|.
"""
import dataclasses


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import ODESolverError
from odekit.ode.methods import get_method
from odekit.ode.methods.rosenbrock_tableaux import RODAS5P
from odekit.testing import get_problem, reference_solution, rooted_trees

TOL = 1e-12    # residual of an order condition satisfied in float64
FAIL = 1e-7    # a residual this large means the condition fails
THETAS = (0.1, 0.5, 0.9)


# --- coefficients -------------------------------------------------------------

def _phi(alpha, big_b, tree):
    if not tree:
        return np.ones(alpha.shape[0])
    if len(tree) == 1:
        return big_b @ _phi(alpha, big_b, tree[0])
    return np.prod([alpha @ _phi(alpha, big_b, child) for child in tree], axis=0)


def _residuals(weights, orders, theta=1.0):
    """Max |w . Phi(t) - theta^|t| / gamma(t)| per tree order, for RODAS5P."""
    alpha, big_gamma, _, _ = RODAS5P.standard_form()
    weight = lambda t: weights @ _phi(alpha, alpha + big_gamma, t)
    return {n: max(abs(weight(t) - theta**n / rooted_trees.density(t))
                   for t in rooted_trees.trees(n)) for n in orders}


def _dense_weights(theta):
    """Standard-form weights of y(t0 + theta h) - y0 (the dense output)."""
    _, big_gamma, _, _ = RODAS5P.standard_form()
    poly = sum(theta**r * row for r, row in enumerate(RODAS5P.dense))
    return (theta * RODAS5P.b + theta * (1 - theta) * poly) @ big_gamma


def test_rodas5p_has_order_5_embedded_order_4_dense_order_4():
    _, _, b, b_hat = RODAS5P.standard_form()
    res = _residuals(b, range(1, 7))
    assert max(res[n] for n in range(1, 6)) < TOL and res[6] > FAIL, res
    res = _residuals(b_hat, range(1, 6))
    assert max(res[n] for n in range(1, 5)) < TOL and res[5] > FAIL, res
    for theta in THETAS:
        res = _residuals(_dense_weights(theta), range(1, 6), theta)
        assert max(res[n] for n in range(1, 5)) < TOL and res[5] > FAIL, (theta, res)


def test_rodas5p_is_l_stable():
    """R(z) = 1 + z b^T (I - z B)^-1 1: |R| <= 1 on the imaginary axis and
    R(z) -> 0 as z -> -inf (stiffly accurate)."""
    alpha, big_gamma, b, _ = RODAS5P.standard_form()
    big_b, ones = alpha + big_gamma, np.ones(RODAS5P.num_stages)
    r = lambda z: 1 + z * b @ np.linalg.solve(np.eye(len(b)) - z * big_b, ones)
    assert max(abs(r(1j * y)) for y in np.logspace(-3, 6, 200)) <= 1 + 1e-12
    assert abs(r(-1e10)) < 1e-8 and abs(r(-1.0) - np.exp(-1.0)) < 1e-4


def test_inconsistent_rosenbrock_tableau_is_rejected():
    a = np.array(RODAS5P.a)
    a[2, 0] += 1e-3
    with pytest.raises(ValueError, match="row sums of alpha"):
        dataclasses.replace(RODAS5P, a=a)


def test_measured_orders_of_step_estimate_and_dense_output():
    """One step of y' = -2 t y^2 (y = 1 / (1 + t^2)) from t0 = 0.5: the local
    errors of y1, of the embedded solution and of the dense output at theta =
    0.5 fall like h^6, h^5 and h^5."""
    method = get_method("rodas5p")
    func = lambda y, t: -2.0 * t * y**2
    exact = lambda t: 1.0 / (1.0 + t**2)
    t0, y0 = jnp.array(0.5), jnp.array([exact(0.5)])

    @jax.jit
    def errors(h):
        step = method.step(func, t0, y0, func(y0, t0), h)
        mid = method.dense_eval(method.dense_prepare(func, t0, y0, h, step), jnp.array([0.5]))[0]
        embedded = step.y1 - step.error
        return (jnp.abs(step.y1 - exact(t0 + h))[0], jnp.abs(embedded - exact(t0 + h))[0],
                jnp.abs(mid - exact(t0 + 0.5 * h))[0])

    hs = np.array([0.2, 0.1, 0.05, 0.025])
    errs = np.array([errors(jnp.asarray(h)) for h in hs])
    slopes = [np.polyfit(np.log(hs), np.log(errs[:, k]), 1)[0] for k in range(3)]
    assert 5.5 < slopes[0] < 6.8 and 4.5 < slopes[1] < 5.8 and 4.5 < slopes[2] < 5.8, slopes


# --- stiff problems against Radau ---------------------------------------------

ROBERTSON = get_problem("robertson")


def _robertson(t, y, k1, k2, k3):
    return ROBERTSON.func(y, t, k1, k2, k3)


def _solve(problem, fun, rtol, atol, dtype=jnp.float64, **options):
    args = tuple(jnp.asarray(a, dtype) for a in problem.args)
    return odekit.solve_ivp(fun, (problem.t[0], problem.t[-1]), jnp.asarray(problem.y0, dtype),
                            t_eval=problem.t, args=args, method="rodas5p", rtol=rtol, atol=atol,
                            **options)


def _error_in_tolerances(ys, ref, rtol, atol):
    return float(np.max(np.abs(np.asarray(ys, np.float64) - ref) / (atol + rtol * np.abs(ref))))


# (long: to 1e5; the same checks over the longer span in CI)
@pytest.mark.parametrize("t_end, rtol, max_steps", [
    pytest.param(1e5, 1e-6, 150, marks=pytest.mark.long), (1e11, 1e-8, 650)])
def test_robertson_matches_radau_and_conserves_mass(t_end, rtol, max_steps):
    atol = 1e-4 * rtol
    times = np.concatenate([[0.0], np.logspace(-5.0, np.log10(t_end), 9)])
    sol = odekit.solve_ivp(_robertson, (0.0, t_end), jnp.asarray(ROBERTSON.y0),
                           t_eval=jnp.asarray(times), args=tuple(map(jnp.asarray, ROBERTSON.args)),
                           method="rodas5p", rtol=rtol, atol=atol)
    ref = reference_solution(ROBERTSON, times)
    assert _error_in_tolerances(sol.ys, ref, rtol, atol) < 5
    assert float(jnp.max(jnp.abs(jnp.sum(sol.ys, axis=1) - 1.0))) < 1e-13
    stats = {k: int(v) for k, v in sol.stats.items()}
    # measured 2026-12-05: 110 and 533 attempted steps (tsit5 is refused as stiff)
    assert stats["num_steps"] <= max_steps, stats
    assert stats["njev"] == stats["nlu"] == stats["num_steps"], stats
    # 8 evaluations per step (7 stages + f(t1, y1)) and 2 to start
    assert stats["nfev"] == 8 * stats["num_steps"] + 2, stats
    assert stats["nlinsolve"] == 8 * stats["num_steps"], stats    # one solve per stage


def test_the_count_of_linear_solves():
    """sol.stats["nlinsolve"]: solves with the iteration matrix W. rodas5p one
    per stage (8 a step); kvaerno5 and bdf one per Newton iteration, each of
    which is also one evaluation (kvaerno5 evaluates f(t1, y1) besides, bdf
    does not); none for explicit methods; the same under vmap."""
    args = tuple(map(jnp.asarray, ROBERTSON.args))

    def stats(method, k1=args[0]):
        sol = odekit.solve_ivp(_robertson, (0.0, 1e3), jnp.asarray(ROBERTSON.y0),
                               args=(k1,) + args[1:], method=method, rtol=1e-6, atol=1e-10)
        return sol.stats

    start = 2      # evaluations before the first step (f(t0) and the first step's guess)
    rodas = {k: int(v) for k, v in stats("rodas5p").items()}
    assert rodas["nlinsolve"] == 8 * rodas["num_steps"]
    kvaerno = {k: int(v) for k, v in stats("kvaerno5").items()}
    assert kvaerno["nlinsolve"] == kvaerno["nfev"] - kvaerno["num_steps"] - start
    assert kvaerno["nlinsolve"] >= 6 * kvaerno["num_steps"]      # 6 implicit stages
    bdf = {k: int(v) for k, v in stats("bdf").items() if k != "order_counts"}
    assert bdf["nlinsolve"] == bdf["nfev"] - start and bdf["nlinsolve"] >= bdf["num_steps"]
    explicit = odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(2), method="tsit5").stats
    assert int(explicit["nlinsolve"]) == 0 and int(explicit["num_steps"]) > 0
    batched = jax.jit(jax.vmap(lambda k1: stats("rodas5p", k1)))(jnp.array([0.04, 0.05]))
    np.testing.assert_array_equal(batched["nlinsolve"], 8 * batched["num_steps"])


# get_problem("van_der_pol") (mu = 1000, y0 = (2, 0)) at its times 0, 500, ...,
# 3000 by scipy.integrate.solve_ivp(method="Radau", rtol=1e-10, atol=1e-14)
# with the exact Jacobian, as reference_solution computes it (10 s: stored here).
VDP_REFERENCE = np.array([
    [2.0, 0.0], [1.596768951058915, -0.001030391187811729],
    [-1.8636462548130457, 0.0007535430865812361], [-1.3547459194894367, 0.001621788727530399],
    [1.706167732159918, -0.0008928097010328267], [-1.9465395177830678, 0.0006979303891708512],
    [-1.5106069367440522, 0.0011783800007310594]])


def test_van_der_pol_mu_1000_on_0_3000_matches_radau():
    problem = get_problem("van_der_pol")
    rtol = atol = 1e-6
    sol = _solve(problem, lambda t, y, mu: problem.func(y, t, mu), rtol, atol)
    assert _error_in_tolerances(sol.ys, VDP_REFERENCE, rtol, atol) < 5
    assert int(sol.stats["num_steps"]) < 1000, sol.stats   # measured: 676


def test_hires_matches_radau():
    problem = get_problem("hires")
    rtol, atol = 1e-6, 1e-10
    sol = _solve(problem, lambda t, y, k: problem.func(y, t, k), rtol, atol)
    assert _error_in_tolerances(sol.ys, reference_solution(problem), rtol, atol) < 5
    assert int(sol.stats["num_steps"]) < 300, sol.stats   # measured: 222


def test_heat_equation_takes_few_steps_where_tsit5_is_refused_with_a_pointer_to_rodas5p():
    problem = get_problem("heat_equation")
    fun = lambda t, y, kappa: problem.func(y, t, kappa)
    rtol, atol = 1e-6, 1e-9
    sol = _solve(problem, fun, rtol, atol)
    assert _error_in_tolerances(sol.ys, reference_solution(problem), rtol, atol) < 5
    assert int(sol.stats["num_steps"]) < 80, sol.stats   # measured: 45
    # With a step limit, tsit5's stiffness verdict refuses the span it cannot
    # finish within it (with t_eval and no limit, max_steps=None, it would go
    # on at its stability limit for up to 100,000 steps, as odeint does).
    with pytest.raises(ODESolverError, match='appears to be stiff.*method="rodas5p"'):
        odekit.solve_ivp(fun, (0.0, 0.5), jnp.asarray(problem.y0), args=(jnp.array(1.0),),
                         t_eval=problem.t, method="tsit5", rtol=rtol, atol=atol, max_steps=4096)


def test_dense_output_between_the_steps():
    problem = get_problem("heat_equation")
    rtol, atol = 1e-7, 1e-10
    sol = odekit.solve_ivp(lambda t, y, kappa: problem.func(y, t, kappa), (0.0, 0.5),
                           jnp.asarray(problem.y0), args=(jnp.array(1.0),), method="rodas5p",
                           rtol=rtol, atol=atol, dense_output=True, max_steps=100)
    times = np.array([1e-4, 3e-3, 0.011, 0.07, 0.23, 0.41])
    values = jax.jit(lambda dense, t: dense(t))(sol.sol, jnp.asarray(times))
    assert _error_in_tolerances(values, reference_solution(problem, times), rtol, atol) < 20


# --- transformations, pytrees, dtypes, statistics ------------------------------

def test_jit_and_vmap_over_rate_constants_match_single_solves():
    t_eval = jnp.array([1.0, 100.0, 1e4])

    @jax.jit
    def final(k1):
        sol = odekit.solve_ivp(_robertson, (0.0, 1e4), jnp.array([1.0, 0.0, 0.0]), t_eval=t_eval,
                               args=(k1, jnp.array(1e4), jnp.array(3e7)), method="rodas5p",
                               rtol=1e-7, atol=1e-11)
        return sol.ys

    k1s = jnp.array([0.02, 0.04, 0.08])
    batched = jax.vmap(final)(k1s)
    for i, k1 in enumerate(k1s):
        # batched LU solves and products round differently (measured 8e-14 on
        # y2, 12x inside the former rtol=1e-12); should that flip a step's
        # acceptance, y moves by O(the solve's rtol 1e-7, atol 1e-11): allow 10
        # of them (members mixed up would be off by O(1))
        np.testing.assert_allclose(batched[i], final(k1), rtol=1e-6, atol=1e-10)
    assert not np.allclose(batched[0], batched[2])


def test_pytree_state_through_odeint_matches_radau():
    def split(y, t, k1, k2, k3):
        a, bc = y["a"], y["bc"]
        full = ROBERTSON.func(jnp.concatenate([a[None], bc]), t, k1, k2, k3)
        return {"a": full[0], "bc": full[1:]}

    ts = np.array([0.0, 1.0, 40.0])
    rtol, atol = 1e-8, 1e-12
    tree = odekit.odeint(split, {"a": jnp.array(1.0), "bc": jnp.zeros(2)}, jnp.asarray(ts),
                         *map(jnp.asarray, ROBERTSON.args), method="rodas5p", rtol=rtol, atol=atol)
    ys = jnp.concatenate([tree["a"][:, None], tree["bc"]], axis=1)
    assert _error_in_tolerances(ys, reference_solution(ROBERTSON, ts), rtol, atol) < 5


def test_float32_degrades_gracefully():
    """float32 Robertson: float32 results, finite, within a few tolerances,
    or a loud failure; never confident wrong numbers."""
    rtol, atol = 1e-4, 1e-8
    sol = _solve(ROBERTSON, _robertson, rtol, atol, dtype=jnp.float32)
    assert sol.ys.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(sol.ys)))
    assert _error_in_tolerances(sol.ys, reference_solution(ROBERTSON), rtol, atol) < 5
    assert float(jnp.max(jnp.abs(jnp.sum(sol.ys, axis=1) - 1.0))) < 1e-5


def test_explicit_methods_count_no_jacobians_or_lus():
    sol = odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(2), method="tsit5")
    assert int(sol.stats["njev"]) == 0 and int(sol.stats["nlu"]) == 0


@pytest.mark.parametrize("method", ["rodas5p", "kvaerno5", "bdf"])
def test_an_empty_state(method):
    """A state of no numbers: an empty solution and a zero gradient (the
    stiff methods' LU once failed with a slicing TypeError at trace time)."""
    def total(k):
        sol = odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), jnp.zeros(0), args=(k,),
                               method=method, t_eval=jnp.array([0.5, 1.0]))
        assert sol.ys.shape == (2, 0)
        return jnp.sum(sol.ys) + 0.0 * k
    assert float(jax.jit(jax.grad(total))(2.0)) == 0.0
    # with a structure asked for: the same empty solve (there is nothing to
    # structure), and a pattern of the wrong shape is still refused
    for pattern, solver in (("auto", "auto"), (np.zeros((0, 0), bool), "krylov")):
        sol = odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.zeros(0), method=method,
                               t_eval=jnp.array([1.0]), jac_sparsity=pattern,
                               linear_solver=solver)
        assert int(sol.status) == 0 and sol.ys.shape == (1, 0)
    with pytest.raises(ValueError, match="solve_ivp"):
        odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.zeros(0), method=method,
                         jac_sparsity=np.ones((2, 2), bool))
