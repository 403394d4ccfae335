"""odekit.root with Newton and Broyden: accuracy, pytrees, jit/vmap, gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import odekit
from odekit import status
from odekit.custom.result import default_tolerances
from odekit.testing import check_grads

METHODS = ["newton", "broyden"]


def cubic(x, a):
    return x ** 3 - a


def scipy_example(x, p):
    """The example system of scipy.optimize.root's documentation, with parameters."""
    return jnp.stack([x[0] + p[0] * (x[0] - x[1]) ** 3 - p[1],
                      p[0] * (x[1] - x[0]) ** 3 + x[1]])


@pytest.mark.parametrize("method", METHODS)
def test_vector_of_cubics_is_exact(method):
    a = jnp.linspace(1.0, 8.0, 20)
    res = odekit.root(cubic, jnp.ones(20), a, method=method)
    assert bool(res.success) and int(res.status) == 0 and res.message == "success"
    rtol, _ = default_tolerances(jnp.float64)  # the next step is below it, so is the error
    np.testing.assert_allclose(res.x, np.cbrt(np.asarray(a)), rtol=5 * rtol)
    assert float(res.error) <= 1e-10 and 0 < int(res.num_steps) < 40


@pytest.mark.parametrize("method", METHODS)
def test_coupled_system_matches_scipy(method):
    p = jnp.array([0.5, 1.0])
    res = odekit.root(scipy_example, jnp.zeros(2), p, method=method)
    ref = scipy.optimize.root(lambda x: np.asarray(scipy_example(x, p)), [0.0, 0.0], tol=1e-14)
    assert ref.success
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method, order", [("newton", 2), ("broyden", 1)])
def test_coupled_system_gradients(method, order):
    solve = jax.jit(lambda p: odekit.root(scipy_example, jnp.zeros(2), p, method=method).x)
    check_grads(solve, (jnp.array([0.5, 1.0]),), order=order)


def test_issue_example_gradients_are_analytic():
    def cbrt(a):
        return odekit.root(cubic, 1.0, a).x
    a = jnp.arange(1.0, 9.0)
    np.testing.assert_allclose(jax.vmap(jax.grad(cbrt))(a), a ** (-2 / 3) / 3, rtol=1e-10)
    np.testing.assert_allclose(jax.grad(jax.grad(cbrt))(2.0), -2 / 9 * 2.0 ** (-5 / 3), rtol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_pytree_unknowns(method):
    def f(x, p):
        return {"a": x["a"] ** 3 - p, "b": x["b"] - jnp.sin(x["a"])}
    x0 = {"a": jnp.array(1.0), "b": jnp.ones(3)}
    res = odekit.root(f, x0, 2.0, method=method)
    np.testing.assert_allclose(res.x["a"], np.cbrt(2.0), rtol=1e-12)
    np.testing.assert_allclose(res.x["b"], np.full(3, np.sin(np.cbrt(2.0))), rtol=1e-12)
    grad = jax.jit(jax.grad(lambda p: odekit.root(f, x0, p, method=method).x["a"]))
    np.testing.assert_allclose(grad(2.0), 2.0 ** (-2 / 3) / 3, rtol=1e-10)


def test_closed_over_parameters_get_gradients():
    def cbrt_closure(a):
        return odekit.root(lambda x: x ** 3 - a, 1.0).x
    a = 3.0
    np.testing.assert_allclose(jax.jit(jax.grad(cbrt_closure))(a), a ** (-2 / 3) / 3, rtol=1e-10)
    np.testing.assert_allclose(jax.grad(jax.grad(cbrt_closure))(a), -2 / 9 * a ** (-5 / 3),
                               rtol=1e-10)
    check_grads(jax.jit(cbrt_closure), (a,), order=2)


def test_vmap_over_problems_with_different_step_counts():
    a = jnp.array([1.0, 1.5, 8.0, 100.0, 1e4])
    batched = jax.jit(jax.vmap(lambda a: odekit.root(cubic, 1.0, a)))(a)
    singles = [odekit.root(cubic, 1.0, ai) for ai in a]
    steps = [int(s.num_steps) for s in singles]
    assert len(set(steps)) > 2
    np.testing.assert_array_equal(batched.num_steps, steps)
    np.testing.assert_allclose(batched.x, np.cbrt(np.asarray(a)), rtol=1e-12)
    assert bool(jnp.all(batched.success))


def test_jit_matches_eager():
    p = jnp.array([0.5, 1.0])
    eager = odekit.root(scipy_example, jnp.zeros(2), p)
    jitted = jax.jit(lambda p: odekit.root(scipy_example, jnp.zeros(2), p))(p)
    np.testing.assert_allclose(jitted.x, eager.x, rtol=1e-14)
    assert int(jitted.num_steps) == int(eager.num_steps)


@pytest.mark.parametrize("method", METHODS)
def test_line_search_keeps_arctan_from_running_off(method):
    # Undamped Newton on arctan diverges from |x0| > 1.39.
    res = odekit.root(jnp.arctan, 2.0, method=method)
    assert abs(float(res.x)) < 1e-10


def _counting(counter):
    """x**3 - a whose JVP rule counts its runtime evaluations."""
    @jax.custom_jvp
    def f(x, a):
        return x ** 3 - a

    @f.defjvp
    def f_jvp(primals, tangents):
        (x, a), (dx, da) = primals, tangents
        jax.debug.callback(lambda: counter.append(1))
        return f(x, a), 3 * x ** 2 * dx - da
    return f


def test_broyden_evaluates_one_jacobian_and_newton_one_per_step():
    for method in METHODS:
        counter = []
        res = odekit.root(_counting(counter), 1.0, 5.0, method=method)
        jax.effects_barrier()
        assert bool(res.success)
        expected = 1 if method == "broyden" else int(res.num_steps) + 1
        assert len(counter) == expected, (method, len(counter))


def test_float32_uses_dtype_tolerances():
    a = jnp.linspace(1.0, 8.0, 5, dtype=jnp.float32)
    res = odekit.root(cubic, jnp.ones(5, jnp.float32), a)
    assert res.x.dtype == jnp.float32 and res.error.dtype == jnp.float32
    np.testing.assert_allclose(res.x, np.cbrt(np.asarray(a)), rtol=1e-5)
    rtol, atol = default_tolerances(jnp.float32)
    assert rtol == atol == pytest.approx(float(np.finfo(np.float32).eps) ** 0.75)


@pytest.mark.parametrize("method", ["newton", pytest.param("broyden", marks=pytest.mark.long)])
def test_shooting_through_odeint_has_implicit_gradients(method):
    # y'' = -y, y(0) = 0, y'(0) = v: y(1) = v sin(1). Shooting for y(1) = a
    # gives v = a / sin(1). odeint is a custom_vjp (no forward mode), so the
    # dense Jacobian is built from VJPs; a enters outside it, so the implicit
    # rule has forward mode in a.
    def miss(v, a):
        return odekit.odeint(lambda y, t: jnp.stack([y[1], -y[0]]), jnp.stack([0.0, v]),
                             jnp.array([0.0, 1.0]), rtol=1e-11, atol=1e-11)[-1, 0] - a

    shoot = lambda a: odekit.root(miss, 0.5, a, method=method).x
    np.testing.assert_allclose(jax.jit(shoot)(2.0), 2.0 / np.sin(1.0), rtol=1e-9)
    np.testing.assert_allclose(jax.grad(shoot)(2.0), 1.0 / np.sin(1.0), rtol=1e-8)
    np.testing.assert_allclose(jax.grad(jax.grad(shoot))(2.0), 0.0, atol=1e-8)
    np.testing.assert_allclose(jax.jvp(shoot, (2.0,), (1.0,))[1], 1.0 / np.sin(1.0), rtol=1e-8)


@pytest.mark.parametrize("method", METHODS)
def test_start_at_an_exact_double_root_succeeds(method):
    # f(0) = 0 exactly but J(0) = 0: x0 is the answer, not a singular failure.
    res = odekit.root(lambda x: x ** 2, 0.0, method=method)
    assert bool(res.success) and float(res.x) == 0.0 and int(res.num_steps) == 0
    batch = jax.vmap(lambda a: odekit.root(cubic, 0.0, a, method=method, throw=False))
    res = batch(jnp.array([0.0, 8.0]))  # J(0) = 0 for both; only a = 0 is solved there
    np.testing.assert_array_equal(res.success, [True, False])
    np.testing.assert_array_equal(res.status, [status.SUCCESS, status.SINGULAR])
