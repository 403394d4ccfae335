"""The shared implicit-function-theorem rule and its linear solves, in forward
and reverse mode."""
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
    check_grads(jax.jit(sqrt), (3.0,), order=2, modes=("fwd", "rev"))
    assert float(jax.grad(sqrt, argnums=1)(2.0, 1.0)) == 0.0  # the start gets no gradient


def test_rule_in_forward_mode():
    sqrt = _sqrt_rule()
    value, tangent = jax.jvp(sqrt, (2.0,), (3.0,))
    np.testing.assert_allclose([value, tangent], [np.sqrt(2.0), 1.5 / np.sqrt(2.0)], rtol=1e-14)
    np.testing.assert_allclose(jax.jacfwd(jax.jacfwd(sqrt))(2.0), -0.25 * 2.0 ** -1.5,
                               rtol=1e-12)
    assert float(jax.jvp(sqrt, (2.0, 1.0), (0.0, 1.0))[1]) == 0.0  # nor a tangent


def test_unsuccessful_solve_gives_nan_derivatives():
    failed = _sqrt_rule(success=False)
    assert np.isnan(jax.grad(failed)(2.0))
    assert np.isnan(jax.grad(failed, argnums=1)(2.0, 1.0))  # the start too
    assert np.isnan(jax.jvp(failed, (2.0,), (1.0,))[1])
    assert np.isnan(jax.jvp(failed, (2.0, 1.0), (0.0, 1.0))[1])
    assert np.isnan(jax.jacfwd(failed, argnums=(0, 1))(2.0, 1.0)).all()
    assert np.isnan(jax.hessian(failed)(2.0))


def test_integer_parameters_are_allowed():
    def solve(x0, params):
        p, n = params
        return p / n.astype(p.dtype) + 0 * x0, jnp.bool_(True), ()

    def residual(x, params):
        p, n = params
        return n.astype(x.dtype) * x - p

    def quarter(p):
        return implicit_solve(solve, residual, "dense", 0.0, (p, jnp.int32(4)))[0]
    np.testing.assert_allclose(jax.grad(quarter)(3.0), 0.25)
    np.testing.assert_allclose(jax.jvp(quarter, (3.0,), (2.0,))[1], 0.5)


def _linear_problem():
    """fun(t) = A t + sin(t) on a two-leaf pytree; its Jacobian at ones, and b."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((6, 6)) + 6 * np.eye(6))

    def fun(t):
        flat = jnp.concatenate([t["u"], t["v"]])
        y = a @ flat + jnp.sin(flat)
        return {"u": y[:2], "v": y[2:]}
    x = {"u": jnp.ones(2), "v": jnp.ones(4)}
    b = {"u": jnp.arange(2.0), "v": jnp.arange(4.0)}
    return fun, x, b, np.asarray(a) + np.diag(np.cos(np.ones(6)))


def _flat(tree):
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(tree)])


@pytest.mark.parametrize("method", ["dense", "gmres"])
def test_solve_and_its_transpose_match_numpy(method):
    fun, x, b, jac = _linear_problem()
    solve = jax.jit(lambda x, b: linear_solve.solve_linearized(fun, x, b, method))
    np.testing.assert_allclose(_flat(solve(x, b)), np.linalg.solve(jac, _flat(b)), rtol=1e-10)
    # Reverse mode transposes the solve: the cotangent of b solves the transposed system.
    transpose = jax.jit(jax.linear_transpose(lambda b: solve(x, b), b))
    np.testing.assert_allclose(_flat(transpose(b)[0]), np.linalg.solve(jac.T, _flat(b)),
                               rtol=1e-10)


@pytest.mark.parametrize("method", ["dense", "gmres"])
def test_solve_is_differentiable_in_the_linearization_point(method):
    fun, x, b, _ = _linear_problem()
    solve = jax.jit(lambda u: linear_solve.solve_linearized(fun, {"u": u, "v": x["v"]}, b,
                                                             method)["v"])
    check_grads(solve, (x["u"],), modes=("fwd", "rev"))


def test_gmres_that_stalls_returns_nan_in_both_directions():
    # Restarted GMRES(20) makes no progress on a 50-cycle shift (Saad 2003, section 6.11).
    solve = jax.jit(lambda b: linear_solve.solve_linearized(lambda x: jnp.roll(x, 1),
                                                            jnp.zeros(50), b, "gmres"))
    b = jnp.zeros(50).at[0].set(1.0)
    assert bool(jnp.all(jnp.isnan(solve(b))))
    assert bool(jnp.all(jnp.isnan(jax.linear_transpose(solve, b)(b)[0])))


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


@jax.custom_vjp
def _cube(x):
    return x ** 3


_cube.defvjp(lambda x: (x ** 3, x), lambda x, g: (3 * x ** 2 * g,))


def test_forward_mode_is_read_from_the_jaxpr():
    assert linear_solve.has_forward_mode(jnp.sin, 1.0)
    assert linear_solve.has_forward_mode(odekit.special.expit, 1.0)  # a custom_jvp
    assert not linear_solve.has_forward_mode(_cube, 1.0)
    nested = jax.jit(lambda x: jax.lax.cond(x > 0, _cube, jnp.sin, x))  # inside jit and cond
    assert not linear_solve.has_forward_mode(nested, 1.0)


def test_jacobian_of_a_custom_vjp_comes_from_vjps():
    x = jnp.array([1.0, 2.0, 3.0])
    jac, value = jax.jit(lambda x: linear_solve.jacobian(_cube, x)[:2])(x)
    np.testing.assert_allclose(jac, np.diag(3 * np.asarray(x) ** 2))
    np.testing.assert_allclose(value, np.asarray(x) ** 3)


def test_gmres_backward_pass_matches_dense_and_supports_grad_of_grad():
    def cbrt_sum(a, solver):  # through the front end's linear_solver override
        return jnp.sum(odekit.root(lambda x, a: x ** 3 - a, jnp.ones(3), a,
                                   linear_solver=solver).x)
    a = jnp.array([1.0, 2.0, 3.0])
    grad = jax.jit(jax.grad(cbrt_sum), static_argnums=1)
    np.testing.assert_allclose(grad(a, "gmres"), grad(a, "dense"), rtol=1e-10)
    hessian = jax.jit(jax.jacrev(jax.grad(cbrt_sum)), static_argnums=1)(a, "gmres")
    np.testing.assert_allclose(jnp.diag(hessian), -2 / 9 * a ** (-5 / 3), rtol=1e-8)


def test_solve_with_float32_and_float64_leaves_matches_numpy():
    a = np.array([[3.0, 1.0], [0.5, 2.0]])

    def fun(x):  # A @ [u, v] with u in float32 and v in float64
        u, v = x["u"].astype(jnp.float64), x["v"]
        return {"u": (a[0, 0] * u + a[0, 1] * v).astype(jnp.float32),
                "v": a[1, 0] * u + a[1, 1] * v}
    x = {"u": jnp.float32(0.0), "v": jnp.float64(0.0)}
    b = {"u": jnp.float32(1.0), "v": jnp.float64(2.0)}
    for method in ["dense", "gmres"]:
        solve = lambda b: linear_solve.solve_linearized(fun, x, b, method)  # noqa: E731
        for w, want in ((solve(b), np.linalg.solve(a, [1.0, 2.0])),
                        (jax.linear_transpose(solve, b)(b)[0], np.linalg.solve(a.T, [1.0, 2.0]))):
            assert w["u"].dtype == jnp.float32 and w["v"].dtype == jnp.float64
            np.testing.assert_allclose([w["u"], w["v"]], want, rtol=1e-6, atol=1e-6)


# Forward mode through the front ends -----------------------------------------

def _coupled(x, p):
    """scipy.optimize.root's documentation example, with parameters."""
    return jnp.stack([x[0] + p[0] * (x[0] - x[1]) ** 3 - p[1],
                      p[0] * (x[1] - x[0]) ** 3 + x[1]])


SOLVERS = {
    "root newton": lambda p: odekit.root(_coupled, jnp.zeros(2), p).x,
    "root broyden": lambda p: odekit.root(_coupled, jnp.zeros(2), p, method="broyden").x,
    "root gmres": lambda p: odekit.root(_coupled, jnp.zeros(2), p, linear_solver="gmres").x,
    "root bisection": lambda p: odekit.root(lambda x, p: x ** 3 - p[0] * x - p[1], (1.0, 3.0),
                                            p, method="bisection").x,
    "fixed_point iteration": lambda p: odekit.fixed_point(
        lambda x, p: p[0] * jnp.cos(x) + p[1], jnp.zeros(3), p).x,
    "fixed_point anderson": lambda p: odekit.fixed_point(
        lambda x, p: p[0] * jnp.cos(x) + p[1], jnp.zeros(3), p, method="anderson").x,
}
P = jnp.array([0.5, 1.0])


# Broyden and Anderson differ from Newton and plain iteration in their steps
# only: the front end attaches the same implicit rule (long).
@pytest.mark.parametrize("name", [n if n not in ("root broyden", "fixed_point anderson")
                                  else pytest.param(n, marks=pytest.mark.long) for n in SOLVERS])
def test_forward_mode_matches_finite_differences_and_reverse_mode(name):
    solve = jax.jit(SOLVERS[name])
    check_grads(solve, (P,), modes=("fwd", "rev"))
    np.testing.assert_allclose(jax.jit(jax.jacfwd(solve))(P), jax.jit(jax.jacrev(solve))(P),
                               rtol=1e-12, atol=1e-14)


def _weighted_total(solve):
    return lambda p: jnp.sum(solve(p) ** 2)


@pytest.mark.parametrize("name", ["root newton", "fixed_point iteration"])
def test_hessian_matches_finite_differences(name):
    solve = SOLVERS[name]
    check_grads(jax.jit(solve), (P,), order=2, modes=("fwd", "rev"))
    total = _weighted_total(solve)
    hessian = jax.jit(jax.hessian(total))(P)  # forward over reverse
    np.testing.assert_allclose(hessian, jax.jit(jax.jacrev(jax.grad(total)))(P), rtol=1e-9)
    np.testing.assert_allclose(hessian, jax.jit(jax.jacfwd(jax.jacfwd(total)))(P), rtol=1e-9)


@pytest.mark.long
def test_gmres_hessian_matches_dense():
    hessian = jax.jit(jax.hessian(_weighted_total(SOLVERS["root gmres"])))(P)
    np.testing.assert_allclose(hessian, jax.hessian(_weighted_total(SOLVERS["root newton"]))(P),
                               rtol=1e-9)


def test_forward_mode_reaches_closed_over_values():
    def cbrt(a):  # a is closed over, not an argument
        return odekit.root(lambda x: x ** 3 - a, jnp.ones(3)).x
    a = jnp.array([1.0, 2.0, 8.0])
    np.testing.assert_allclose(jax.jacfwd(cbrt)(a), np.diag(a ** (-2 / 3) / 3), rtol=1e-10)
    check_grads(jax.jit(cbrt), (a,), order=2, modes=("fwd",))  # reverse: tests/root

    def dottie(p, q):  # a pytree unknown, closing over a scalar and an array
        def f(x):
            return {"a": jnp.cos(x["a"]) * p, "b": 0.5 * x["b"] + q * x["a"]}
        return odekit.fixed_point(f, {"a": jnp.array(1.0), "b": jnp.zeros(2)}).x
    check_grads(jax.jit(dottie), (0.9, jnp.array([1.0, 2.0])), modes=("fwd", "rev"))


def test_forward_mode_under_vmap_and_jit():
    def cbrt(a):
        return odekit.root(lambda x, a: x ** 3 - a, 1.0, a).x
    a = jnp.array([1.0, 1.5, 8.0, 1e4])  # different step counts per member
    want = a ** (-2 / 3) / 3
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.jacfwd(cbrt)))(a), want, rtol=1e-10)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(jax.vmap(cbrt)))(a), np.diag(want), rtol=1e-10)
    tangent = jax.jit(lambda a: jax.jvp(jax.vmap(cbrt), (a,), (jnp.ones(4),))[1])(a)
    np.testing.assert_allclose(tangent, want, rtol=1e-10)


def test_failed_solve_gives_nan_tangents():
    def dottie(p, x0, max_steps):
        return odekit.fixed_point(lambda x: jnp.cos(x) * p, x0, max_steps=max_steps,
                                  throw=False).x
    assert np.isfinite(jax.jvp(lambda p: dottie(p, 1.0, 256), (1.0,), (1.0,))[1])
    assert float(jax.jvp(lambda x0: dottie(1.0, x0, 256), (1.0,), (1.0,))[1]) == 0.0
    assert np.isnan(jax.jvp(lambda p: dottie(p, 1.0, 3), (1.0,), (1.0,))[1])
    assert np.isnan(jax.jvp(lambda x0: dottie(1.0, x0, 3), (1.0,), (1.0,))[1])  # the start too
    # Per member under vmap: only the member that ran out of steps is NaN.
    cbrt = jax.vmap(jax.jacfwd(lambda a: odekit.root(lambda x, a: x ** 3 - a, 1.0, a,
                                                      max_steps=4, throw=False).x))
    np.testing.assert_array_equal(np.isnan(cbrt(jnp.array([1.0, 1e6]))), [False, True])
