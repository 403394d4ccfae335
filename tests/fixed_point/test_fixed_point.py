"""odekit.fixed_point: iteration and Anderson, values, gradients, jit/vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import status
from odekit.testing import check_grads

METHODS = ["iteration", "anderson"]
DOTTIE = 0.7390851332151607  # the root of x = cos(x)


def newton_sqrt_map(x, a):
    return 0.5 * (x + a / x)


def test_issue_example_newton_sqrt():
    def newton_sqrt(a):
        return odekit.fixed_point(newton_sqrt_map, a, a).x
    np.testing.assert_allclose(newton_sqrt(2.0), np.sqrt(2.0), rtol=1e-14)
    np.testing.assert_allclose(jax.grad(newton_sqrt)(2.0), 0.5 / np.sqrt(2.0), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(jax.grad(newton_sqrt))(2.0), -0.25 * 2.0 ** -1.5,
                               rtol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_dottie_number(method):
    res = odekit.fixed_point(jnp.cos, 1.0, method=method)
    assert bool(res.success) and float(res.error) <= 1e-11
    np.testing.assert_allclose(res.x, DOTTIE, rtol=1e-11)
    np.testing.assert_allclose(jax.grad(lambda p: odekit.fixed_point(
        lambda x, p: jnp.cos(p * x), 1.0, p, method=method).x)(1.0),
        -DOTTIE * np.sin(DOTTIE) / (1 + np.sin(DOTTIE)), rtol=1e-9)


def test_anderson_solves_what_iteration_cannot():
    rates = jnp.linspace(0.5, 0.99, 10)

    def f(x):
        return rates * x + 1.0
    exact = 1.0 / (1.0 - np.asarray(rates))
    plain = odekit.fixed_point(f, jnp.zeros(10), throw=False)
    assert not bool(plain.success) and int(plain.status) == status.MAX_STEPS
    res = odekit.fixed_point(f, jnp.zeros(10), method="anderson")
    assert int(res.num_steps) < 200
    np.testing.assert_allclose(res.x, exact, rtol=1e-9)
    deep = odekit.fixed_point(f, jnp.zeros(10), method="anderson", options={"history": 11})
    assert int(deep.num_steps) <= 20  # with history > n, Anderson on a linear map ~ GMRES


def test_damping_tames_an_expanding_map():
    # x = 1 - 1.5 x diverges under plain iteration; averaging with 0.5 contracts (rate 0.25).
    def f(x):
        return 1.0 - 1.5 * x
    diverged = odekit.fixed_point(f, 0.0, throw=False)
    assert not bool(diverged.success)
    for method in METHODS:
        res = odekit.fixed_point(f, 0.0, method=method, options={"damping": 0.5})
        np.testing.assert_allclose(res.x, 0.4, rtol=1e-11)


@pytest.mark.parametrize("method, order", [("iteration", 2), ("anderson", 1)])
def test_nonlinear_system_gradients(method, order):
    # The implicit rule does not depend on the method, so grad-of-grad is checked once.
    m = jnp.array([[0.3, 0.1, 0.0], [0.0, 0.2, 0.2], [0.1, 0.0, 0.4]])

    def solve(b):
        return odekit.fixed_point(lambda x, b: jnp.tanh(m @ x) + b, jnp.zeros(3), b,
                                  method=method).x
    check_grads(jax.jit(solve), (jnp.array([0.5, -0.2, 0.1]),), order=order)


def test_pytree_and_closed_over_parameters():
    def solve(p, q):
        def f(x):
            return {"a": jnp.cos(x["a"]) * p, "b": 0.5 * x["b"] + q * x["a"]}
        return odekit.fixed_point(f, {"a": jnp.array(1.0), "b": jnp.zeros(2)}).x
    x = solve(1.0, jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(x["a"], DOTTIE, rtol=1e-11)
    np.testing.assert_allclose(x["b"], 2 * DOTTIE * np.array([1.0, 2.0]), rtol=1e-11)
    check_grads(jax.jit(solve), (0.9, jnp.array([1.0, 2.0])), order=1)


def test_vmap_over_problems_with_different_step_counts_and_closures():
    a = jnp.array([1.0, 2.0, 50.0, 1e4])

    def solve(a):
        return odekit.fixed_point(lambda x: newton_sqrt_map(x, a), a)
    batched = jax.jit(jax.vmap(solve))(a)
    steps = [int(solve(ai).num_steps) for ai in a]
    assert len(set(steps)) == len(steps)
    np.testing.assert_array_equal(batched.num_steps, steps)
    np.testing.assert_allclose(batched.x, np.sqrt(a), rtol=1e-13)
    grads = jax.jit(jax.vmap(jax.grad(lambda a: solve(a).x)))(a)
    np.testing.assert_allclose(grads, 0.5 / np.sqrt(a), rtol=1e-10)


def test_float32():
    res = odekit.fixed_point(jnp.cos, jnp.float32(1.0), method="anderson")
    assert res.x.dtype == jnp.float32
    np.testing.assert_allclose(res.x, DOTTIE, rtol=2e-5)


@pytest.mark.parametrize("options, words", [
    ({"damping": 0.0}, "damping must be a float in"),
    ({"history": 0}, "history must be a positive int"),
    ({"regularization": -1.0}, "regularization must be"),
    ({"memory": 3}, "no option"),
])
def test_bad_options(options, words):
    with pytest.raises(ValueError, match=words):
        odekit.fixed_point(jnp.cos, 1.0, method="anderson", options=options)


@pytest.mark.parametrize("method", ["iteration", pytest.param("anderson", marks=pytest.mark.long)])
def test_fixed_point_of_an_odeint_map(method):
    # x = 0.5 x exp(-a) + 1 (the decay flow over one time unit): x = 1 / (1 - q),
    # q = exp(-a) / 2, dx/da = -q / (1 - q)^2. The implicit rule's Jacobian of
    # the map comes from VJPs (odeint is a custom_vjp).
    def step(x, a):
        return 0.5 * odekit.odeint(lambda y, t, a: -a * y, x, jnp.array([0.0, 1.0]), a,
                                   rtol=1e-11, atol=1e-11)[-1] + 1.0

    solve = lambda a: odekit.fixed_point(step, jnp.ones(2), a, method=method).x
    q = 0.5 * np.exp(-0.5)
    np.testing.assert_allclose(jax.jit(solve)(0.5), np.full(2, 1 / (1 - q)), rtol=1e-9)
    np.testing.assert_allclose(jax.grad(lambda a: solve(a).sum())(0.5), -2 * q / (1 - q) ** 2,
                               rtol=1e-7)


def test_numpy_scalars_as_options():
    options = {"history": np.int64(3), "damping": np.float32(0.5), "regularization": np.float64(0)}
    res = odekit.fixed_point(jnp.cos, 1.0, method="anderson", options=options)
    np.testing.assert_allclose(res.x, DOTTIE, rtol=1e-10)
