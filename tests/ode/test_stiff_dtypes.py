"""Stiff methods (rodas5p, kvaerno5, auto) on states of other dtypes (issue
27, item 15): float16/bfloat16 (their linear algebra in float32), a mixed
float32 + float64 pytree under strict promotion (the Jacobian and LU on the
flattened state in the widest dtype, each leaf cast back) and complex states
(kvaerno5 builds its Jacobian as rodas5p does, by forward mode over the unit
directions, which takes complex states), each against the exact solution."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

STIFF = ["rodas5p", "kvaerno5", "auto"]
T = np.array([0.0, 0.05, 0.3, 1.0, 2.0])


def relaxation(t, y):
    """y' = -50 (y - cos t): stiff, exact solution below."""
    return -50 * (y - jnp.cos(t).astype(y.dtype))


def relaxation_exact(t):
    a, b = 2500 / 2501, 50 / 2501
    return a * np.cos(t) + b * np.sin(t) - a * np.exp(-50 * t)


def solve_quietly(*args, **kwargs):
    with warnings.catch_warnings():   # tolerances raised to the state's precision
        warnings.simplefilter("ignore", UserWarning)
        return odekit.solve_ivp(*args, **kwargs)


HALF = {jnp.float16: 1e-2, jnp.bfloat16: 5e-2}    # the tolerance of each


# float16 and bfloat16 take one path (the step's linear algebra in float32):
# in CI each method with one of them, the other pairings long
@pytest.mark.parametrize("method, dtype", [
    ("rodas5p", jnp.bfloat16), ("kvaerno5", jnp.float16), ("auto", jnp.float16),
    pytest.param("rodas5p", jnp.float16, marks=pytest.mark.long),
    pytest.param("kvaerno5", jnp.bfloat16, marks=pytest.mark.long),
    pytest.param("auto", jnp.bfloat16, marks=pytest.mark.long)])
def test_half_precision_stiff(method, dtype):
    tol = HALF[dtype]
    sol = solve_quietly(relaxation, (0.0, 2.0), jnp.zeros((2,), dtype), method=method,
                        t_eval=T, rtol=1e-2, atol=1e-3)
    assert int(sol.status) == 0
    assert sol.ys.dtype == dtype
    reference = solve_quietly(relaxation, (0.0, 2.0), jnp.zeros((2,), jnp.float64),
                              method=method, t_eval=T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(reference.ys[:, 0], relaxation_exact(T), atol=1e-8)
    values = np.asarray(sol.ys.astype(jnp.float32), np.float64)
    np.testing.assert_allclose(values, np.asarray(reference.ys), atol=tol)


# (long: float16, which the stiff auto case above takes through tsit5 first)
@pytest.mark.parametrize("dtype, tol", [pytest.param(jnp.float16, 2e-2, marks=pytest.mark.long),
                                        (jnp.bfloat16, 8e-2)])
def test_half_precision_auto_nonstiff(dtype, tol):
    sol = solve_quietly(lambda t, y: -y, (0.0, 1.0), jnp.array([1.0, 2.0], dtype),
                        method="auto", t_eval=T[T <= 1], rtol=1e-2, atol=1e-3)
    assert int(sol.status) == 0
    exact = np.exp(-T[T <= 1])[:, None] * np.array([[1.0, 2.0]])
    np.testing.assert_allclose(np.asarray(sol.ys.astype(jnp.float32), np.float64), exact,
                               rtol=tol)


@pytest.mark.parametrize("method", ["rodas5p", "kvaerno5", pytest.param("auto", marks=pytest.mark.long)])
def test_mixed_float32_float64_pytree(method):
    def field(t, y, k):
        return {"a": -k.astype(jnp.float32) * y["a"], "b": -2 * k * y["b"] + y["a"].astype(jnp.float64)}

    def solve(k):
        y0 = {"a": jnp.array([1.0], jnp.float32), "b": jnp.array([1.0], jnp.float64)}
        return odekit.solve_ivp(field, (0.0, 2.0), y0, args=(k,), method=method, t_eval=T,
                                rtol=1e-6, atol=1e-8)

    sol = solve(jnp.float64(1.0))
    assert int(sol.status) == 0
    assert sol.ys["a"].dtype == jnp.float32 and sol.ys["b"].dtype == jnp.float64
    # a = e^-t, b' = -2 b + a: b = e^-t
    np.testing.assert_allclose(sol.ys["a"][:, 0], np.exp(-T), rtol=1e-5)
    np.testing.assert_allclose(sol.ys["b"][:, 0], np.exp(-T), rtol=1e-5)
    # and its derivative: d a(t)/dk = -t e^-kt at k = 1
    grad = jax.jit(jax.grad(lambda k: solve(k).ys["a"][-1, 0].astype(jnp.float64)))(
        jnp.float64(1.0))
    np.testing.assert_allclose(grad, -2 * np.exp(-2.0), rtol=1e-4)


# (long: kvaerno5, whose complex steps are in CI below; its dense output combines
# the stages linearly, as for a real state)
@pytest.mark.parametrize("method", ["rodas5p", pytest.param("kvaerno5", marks=pytest.mark.long),
                                    "auto"])
def test_complex_state(method):
    # y' = -i y: exact exp(-i t)
    sol = odekit.solve_ivp(lambda t, y: -1j * y, (0.0, 2.0), jnp.array([1.0 + 0j, 2.0j]),
                           method=method, t_eval=T, rtol=1e-9, atol=1e-11, dense_output=True)
    assert int(sol.status) == 0
    exact = np.exp(-1j * T)[:, None] * np.array([[1.0, 2.0j]])
    np.testing.assert_allclose(sol.ys, exact, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(sol.sol(0.7), np.exp(-0.7j) * np.array([1.0, 2.0j]), rtol=1e-6)


@pytest.mark.parametrize("method", ["rodas5p", "kvaerno5", pytest.param("auto", marks=pytest.mark.long)])
def test_complex_stiff_and_gradient(method):
    lam = -50.0 + 3.0j

    def final(k):
        sol = odekit.solve_ivp(lambda t, y, k: (k * lam) * y, (0.0, 0.1), jnp.array([1.0 + 0j]),
                               args=(k,), method=method, rtol=1e-9, atol=1e-12)
        return sol.ys[sol.num_points - 1, 0], sol.status

    value, status = final(1.0)
    assert int(status) == 0
    np.testing.assert_allclose(value, np.exp(lam * 0.1), rtol=1e-6)
    # d Re y(0.1) / dk = Re(lam 0.1 exp(lam 0.1)) at k = 1
    grad = jax.jit(jax.grad(lambda k: jnp.real(final(k)[0])))(1.0)
    np.testing.assert_allclose(grad, np.real(lam * 0.1 * np.exp(lam * 0.1)), rtol=1e-5, atol=1e-12)
