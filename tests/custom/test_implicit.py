"""The shared implicit-function-theorem rule and its linear solves."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.custom import linear_solve
from odekit.custom.implicit import implicit_solve
from odekit.testing import check_grads


def _sqrt_rule(success=True):
    """x = sqrt(p) as the root of x**2 - p, with a closed-form 'solver'."""
    def solve(x0, p):
        return jnp.sqrt(p) + 0 * x0, jnp.bool_(success), ()

    def residual(x, p):
        return x ** 2 - p
    return lambda p, x0=1.0: implicit_solve(solve, residual, "auto", x0, p)[0]


def test_rule_gives_implicit_gradient_and_grad_of_grad():
    sqrt = _sqrt_rule()
    np.testing.assert_allclose(jax.grad(sqrt)(2.0), 0.5 / np.sqrt(2.0), rtol=1e-14)
    np.testing.assert_allclose(jax.grad(jax.grad(sqrt))(2.0), -0.25 * 2.0 ** -1.5, rtol=1e-12)
    check_grads(jax.jit(sqrt), (3.0,), order=2)
    assert float(jax.grad(sqrt, argnums=1)(2.0, 1.0)) == 0.0  # the start gets no gradient


def test_unsuccessful_solve_gives_nan_gradient():
    assert np.isnan(jax.grad(_sqrt_rule(success=False))(2.0))
    assert np.isnan(jax.grad(_sqrt_rule(success=False), argnums=1)(2.0, 1.0))  # the start too


def test_integer_parameters_are_allowed():
    def solve(x0, params):
        p, n = params
        return p / n.astype(p.dtype) + 0 * x0, jnp.bool_(True), ()

    def residual(x, params):
        p, n = params
        return n.astype(x.dtype) * x - p
    grad = jax.grad(lambda p: implicit_solve(solve, residual, "dense", 0.0, (p, jnp.int32(4)))[0])
    np.testing.assert_allclose(grad(3.0), 0.25)


@pytest.mark.parametrize("method", ["dense", "gmres"])
def test_solve_transpose_matches_numpy(method):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((6, 6)) + 6 * np.eye(6))
    x = {"u": jnp.ones(2), "v": jnp.ones(4)}
    b = {"u": jnp.arange(2.0), "v": jnp.arange(4.0)}

    def fun(t):
        y = a @ jnp.concatenate([t["u"], t["v"]]) + jnp.sin(jnp.concatenate([t["u"], t["v"]]))
        return {"u": y[:2], "v": y[2:]}
    jac = np.asarray(a) + np.diag(np.cos(np.ones(6)))
    expected = np.linalg.solve(jac.T, np.arange(2.0).tolist() + np.arange(4.0).tolist())
    w = jax.jit(lambda x, b: linear_solve.solve_transpose(fun, x, b, method))(x, b)
    np.testing.assert_allclose(np.concatenate([w["u"], w["v"]]), expected, rtol=1e-10)


def test_gmres_that_stalls_returns_nan():
    # Restarted GMRES(20) makes no progress on a 50-cycle shift (Saad 2003, section 6.11).
    solve = jax.jit(lambda b: linear_solve.solve_transpose(lambda x: jnp.roll(x, 1),
                                                           jnp.zeros(50), b, "gmres"))
    w = solve(jnp.zeros(50).at[0].set(1.0))
    assert bool(jnp.all(jnp.isnan(w)))


def test_dense_solve_small_and_singular():
    np.testing.assert_allclose(linear_solve.dense_solve(jnp.array([[4.0]]), jnp.array([2.0])),
                               [0.5])
    assert not bool(jnp.all(jnp.isfinite(linear_solve.dense_solve(
        jnp.array([[1.0, 2.0], [2.0, 4.0]]), jnp.array([1.0, 0.0])))))


def test_auto_choice_by_size_and_bad_name():
    assert linear_solve.choose("auto", jnp.zeros(linear_solve.DENSE_MAX_SIZE)) == "dense"
    assert linear_solve.choose("auto", jnp.zeros(linear_solve.DENSE_MAX_SIZE + 1)) == "gmres"
    assert linear_solve.choose("gmres", jnp.zeros(3)) == "gmres"
    with pytest.raises(ValueError, match="linear_solver must be one of"):
        linear_solve.choose("cholesky", jnp.zeros(3))


def test_gmres_backward_pass_matches_dense_and_supports_grad_of_grad():
    def cbrt_sum(a, solver):  # through the front end's linear_solver override
        return jnp.sum(odekit.root(lambda x, a: x ** 3 - a, jnp.ones(3), a,
                                   linear_solver=solver).x)
    a = jnp.array([1.0, 2.0, 3.0])
    grad = jax.jit(jax.grad(cbrt_sum), static_argnums=1)
    np.testing.assert_allclose(grad(a, "gmres"), grad(a, "dense"), rtol=1e-10)
    hessian = jax.jit(jax.jacrev(jax.grad(cbrt_sum)), static_argnums=1)(a, "gmres")
    np.testing.assert_allclose(jnp.diag(hessian), -2 / 9 * a ** (-5 / 3), rtol=1e-8)


def test_gmres_with_float32_and_float64_leaves_matches_numpy():
    a = np.array([[3.0, 1.0], [0.5, 2.0]])

    def fun(x):  # A @ [u, v] with u in float32 and v in float64
        u, v = x["u"].astype(jnp.float64), x["v"]
        return {"u": (a[0, 0] * u + a[0, 1] * v).astype(jnp.float32),
                "v": a[1, 0] * u + a[1, 1] * v}
    x = {"u": jnp.float32(0.0), "v": jnp.float64(0.0)}
    b = {"u": jnp.float32(1.0), "v": jnp.float64(2.0)}
    want = np.linalg.solve(a.T, [1.0, 2.0])
    for method in ["dense", "gmres"]:
        w = linear_solve.solve_transpose(fun, x, b, method)
        assert w["u"].dtype == jnp.float32 and w["v"].dtype == jnp.float64
        np.testing.assert_allclose([w["u"], w["v"]], want, rtol=1e-6)
