"""The known failure of the backsolve adjoint is loud (issue 14, item 4).

Backsolve re-integrates y backwards; a mode that decays fast forward in time
grows backwards, and the gradient comes out wrong. At every output time the
backward pass compares its y with the stored forward value and fails with
BACKSOLVE_UNSTABLE when the departure exceeds DEPARTURE_LIMIT times the
tolerance: odeint raises; solve_ivp raises, or with throw=False gives NaN
gradients (as for any failed backward solve).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import odeint, solve_ivp, status
from odekit.ode.adjoints import backsolve as adjoint_backsolve
from odekit.ode import adjoints
from odekit.ode.engine import single_kernel
from odekit.testing.problems import PROBLEMS

# What a failure inside a compiled function reaches the caller as (odekit.status).
RAISED = (odekit.SolverError, jax.errors.JaxRuntimeError, ValueError)
REMEDY = "adjoint='checkpoint'"

# y' = [[-k, 1], [0, -10]] y, y0 = [1, 1] on [0, 20]: y2 = e^{-10 t}, y1 =
# e^{-k t} + (e^{-k t} - e^{-10 t}) / (10 - k); d sum(y(20)) / dk at k = 1.
TRUE_DK = -4.5777967490950e-08


def kinetics(y, t, k, rate=10.0):
    return jnp.stack([-k * y[0] + y[1], -rate * y[1]])


def linear(y, t, a):
    return a @ y


def _sum_at_end_dk(k, **kwargs):
    return odeint(kinetics, jnp.ones(2), jnp.array([0.0, 20.0]), k, **kwargs)[-1].sum()


def _sum_at_end_da(a, end):
    return odeint(linear, jnp.ones(2), jnp.array([0.0, end]), a)[-1].sum()


def test_the_analytic_gradient():
    """The closed form above, and the true value, by central differences of it."""
    def total(k):
        e_k, e_10 = np.exp(-20.0 * k), np.exp(-200.0)
        return e_k + (e_k - e_10) / (10.0 - k) + e_10
    # Central differences are off by h^2 f'''/6 relative (~400 h^2 / 6 here:
    # 6.7e-9 at h = 1e-5, 1.5x inside rtol) plus rounding eps f / (h f') ~ 5e-12
    # at h = 1e-6: h = 1e-6 leaves both ~100x below the bound.
    h = 1e-6
    np.testing.assert_allclose((total(1 + h) - total(1 - h)) / (2 * h), TRUE_DK, rtol=1e-8)


def test_wrong_gradient_wrt_k_raises_and_names_the_remedy():
    """At rtol=1e-10, atol=1e-14 backsolve returned -1.74e-8 (62% off) silently."""
    with pytest.raises(RAISED, match="adjoint='backsolve' is not reliable") as info:
        jax.block_until_ready(jax.grad(_sum_at_end_dk)(1.0, rtol=1e-10, atol=1e-14))
    text = str(info.value)
    assert REMEDY in text and "tighten rtol/atol" in text
    assert f"more than the {adjoint_backsolve.DEPARTURE_LIMIT:g} allowed" in text


@pytest.mark.parametrize("a, end", [([[-1.0, 1.0], [0.0, -10.0]], 20.0),
                                    ([[-1000.0, 999.0], [0.0, -1.0]], 0.05)])
def test_wrong_gradient_wrt_the_matrix_raises(a, end):
    """Silently ~1e68 (truth ~5e-8), and 6e11 relative error, before."""
    with pytest.raises(RAISED, match=REMEDY):
        jax.block_until_ready(jax.grad(_sum_at_end_da)(jnp.array(a), end))


def test_the_failure_is_caught_under_jit_and_on_the_segmented_path(monkeypatch):
    """Both ways the backward loop runs: one kernel (the default here) and in
    segments (ODEKIT_SINGLE_KERNEL=0, read at the first trace)."""
    grad = lambda k: jax.grad(_sum_at_end_dk)(k, rtol=1e-10, atol=1e-14)
    for switch in ("1", "0"):
        monkeypatch.setenv(single_kernel.ENV_SWITCH, switch)
        with pytest.raises(RAISED, match=REMEDY):
            jax.block_until_ready(jax.jit(grad)(1.0))


def test_intermediate_output_times_are_checked():
    """With many output times each backward interval is short, yet the
    departure at the rows (not only at t0) exceeds the limit."""
    t = jnp.linspace(0.0, 20.0, 5)
    loss = lambda k: odeint(kinetics, jnp.ones(2), t, k, rtol=1e-10, atol=1e-14).sum()
    with pytest.raises(RAISED, match=REMEDY):
        jax.block_until_ready(jax.grad(loss)(1.0))


def test_slow_decay_keeps_a_right_gradient():
    """The same system with a slow second mode: no failure, and the gradient is right."""
    rate = 0.5
    def total(k):   # closed form for y2 = e^{-rate t}
        return (np.exp(-20.0 * k) + (np.exp(-20.0 * k) - np.exp(-20.0 * rate)) / (rate - k)
                + np.exp(-20.0 * rate))
    h = 1e-6
    expected = (total(1 + h) - total(1 - h)) / (2 * h)
    loss = lambda k: odeint(kinetics, jnp.ones(2), jnp.array([0.0, 20.0]), k, rate,
                            rtol=1e-10, atol=1e-14)[-1].sum()
    np.testing.assert_allclose(jax.grad(loss)(1.0), expected, rtol=1e-6)


def test_solve_ivp_throw_false_gives_nan_gradient():
    """A failed backward solve with throw=False: NaN gradients (the convention
    for every failed backward solve); throw=True raises."""
    def loss(k, throw):
        sol = solve_ivp(lambda t, y, k: kinetics(y, t, k), (0.0, 20.0), jnp.ones(2), args=(k,),
                        t_eval=jnp.array([20.0]), rtol=1e-10, atol=1e-14, throw=throw,
                        adjoint="backsolve")
        return sol.ys[-1].sum()
    assert np.isnan(jax.grad(loss)(1.0, False))
    assert np.isnan(jax.jit(jax.grad(loss), static_argnums=1)(1.0, False))
    with pytest.raises(RAISED, match=REMEDY):
        jax.block_until_ready(jax.grad(loss)(1.0, True))


def test_vmap_one_member_fails():
    """throw=False: the failing member's gradient is NaN, the other's is right;
    odeint (always throws) raises and says how many members failed."""
    rates = jnp.array([0.5, 10.0])

    def ivp_loss(k, rate):
        sol = solve_ivp(lambda t, y, k, r: kinetics(y, t, k, r), (0.0, 20.0), jnp.ones(2),
                        args=(k, rate), rtol=1e-10, atol=1e-14, throw=False,
                        t_eval=jnp.array([20.0]), adjoint="backsolve")
        return sol.ys[-1].sum()

    grads = jax.vmap(jax.grad(ivp_loss), (None, 0))(1.0, rates)
    ok = jax.grad(lambda k: odeint(kinetics, jnp.ones(2), jnp.array([0.0, 20.0]), k, 0.5,
                                   rtol=1e-10, atol=1e-14)[-1].sum())(1.0)
    np.testing.assert_allclose(grads[0], ok, rtol=1e-6)
    assert np.isnan(grads[1])

    def odeint_loss(k, rate):
        return odeint(kinetics, jnp.ones(2), jnp.array([0.0, 20.0]), k, rate,
                      rtol=1e-10, atol=1e-14)[-1].sum()
    with pytest.raises(RAISED, match=r"\(1 of 2 batch members\)"):
        jax.block_until_ready(jax.vmap(jax.grad(odeint_loss), (None, 0))(1.0, rates))


def test_the_grad_of_grad_path_reports_the_same_departure():
    """The interval-by-interval backward pass (what grad of grad differentiates)
    measures the same departure and status as the one-pass version."""
    from odekit.ode.engine.loop import LoopConfig
    from odekit.ode.engine.solve import SolveOptions
    options = SolveOptions("dopri5", LoopConfig(1e-10, 1e-14))
    t, k = jnp.array([0.0, 20.0]), jnp.asarray(1.0)
    sol = adjoint_backsolve.solve(kinetics, None, options, jnp.ones(2), t[0], t[-1], t,
                                  jnp.asarray(0.0), k)
    g = jnp.ones_like(sol.ys_eval)
    one = adjoint_backsolve._adjoint_one_pass(kinetics, options, sol.ys_eval, t, g, sol.h, k)
    each = adjoint_backsolve._adjoint_by_interval(kinetics, options, sol.ys_eval, t, g, sol.h, k)
    assert int(one[3]) == int(each[3]) == status.BACKSOLVE_UNSTABLE
    assert float(one[4]) > 1e6 * adjoint_backsolve.DEPARTURE_LIMIT
    np.testing.assert_allclose(float(one[4]), float(each[4]), rtol=1e-3)


def test_the_message_names_only_adjoints_that_exist():
    text = adjoint_backsolve._backward_message(np.array(status.BACKSOLVE_UNSTABLE),
                                               np.array(3e12))
    named = {name for name in ("checkpoint", "interpolate", "forward") if f"'{name}'" in text}
    assert named and named <= set(adjoints.NAMES)
    assert "3e+12 times the tolerance" in text


def test_the_departure_measure():
    """Normwise per leaf, scaled by atol + rtol max(max |y|, max |y_from|);
    exact agreement is 0; the worst leaf counts."""
    d = adjoint_backsolve._departure(jnp.array([1.0 + 3e-6, 0.0]), jnp.array([1.0, 0.0]),
                                     jnp.array([0.5, 0.0]), 1e-6, 1e-9)
    np.testing.assert_allclose(d, 3e-6 / (1e-9 + 1e-6), rtol=1e-8)
    d = adjoint_backsolve._departure(
        {"a": jnp.array([1e-3, 0.0]), "b": jnp.ones(2)}, {"a": jnp.array([0.0, 0.0]), "b": jnp.ones(2)},
        {"a": jnp.array([2.0, 0.0]), "b": jnp.ones(2)}, 1e-3, 0.0)
    np.testing.assert_allclose(d, 0.5, rtol=1e-12)
    assert float(adjoint_backsolve._departure(jnp.ones(2), jnp.ones(2), jnp.ones(2), 1e-3, 0.0)) == 0
    assert float(adjoint_backsolve._departure(jnp.array([1e-300]), jnp.array([0.0]),
                                              jnp.array([0.0]), 1e-3, 0.0)) == np.finfo(float).max


NON_STIFF = sorted(name for name, p in PROBLEMS.items() if not p.stiff)
# (method, rtol, atol, output times): loose, default and tight tolerances, all
# output times and the two-point span (where the whole span is one interval).
# (benchmarks/backsolve_departure.py runs every method at five tolerances.)
SETTINGS = [("bosh3", 1e-3, 1e-6, "all"), ("dopri5", 1.4e-8, 1.4e-8, "two-point"),
            ("tsit5", 1e-10, 1e-12, "two-point")]
# CI checks each problem once and each CI setting on four problems: the
# tight two-point solves (the longest backward interval) on the nonlinear
# and oscillating problems, the loose one with every output time on the
# others; every other pair (and dopri5's default tolerances) is long.
TIGHT_IN_CI = ("complex_rotation", "kepler", "lotka_volterra", "pendulum")
assert set(TIGHT_IN_CI) < set(NON_STIFF)


def _in_ci(name, method):
    return method == ("tsit5" if name in TIGHT_IN_CI else "bosh3")


@pytest.mark.parametrize("name, method, rtol, atol, grid", [
    (name, *setting) if _in_ci(name, setting[0])
    else pytest.param(name, *setting, marks=pytest.mark.long)
    for setting in SETTINGS for name in NON_STIFF])
def test_well_behaved_problems_never_trip_it(name, method, rtol, atol, grid):
    p = PROBLEMS[name]
    t = jnp.asarray(p.t if grid == "all" else p.t[[0, -1]])
    y0, args = jax.tree.map(jnp.asarray, p.y0), tuple(map(jnp.asarray, p.args))

    def loss(y0, *args):
        ys = odeint(p.func, y0, t, *args, rtol=rtol, atol=atol, method=method)
        return sum(jnp.sum(jnp.real(leaf)) for leaf in jax.tree.leaves(ys))
    grads = jax.grad(loss, tuple(range(1 + len(args))))(y0, *args)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(grads))
