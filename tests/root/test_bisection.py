"""odekit.root(method="bisection") on scalar brackets."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import status


def square_minus(x, a):
    return x ** 2 - a


def test_finds_sqrt2_to_tolerance_in_log2_steps():
    res = odekit.root(square_minus, (0.0, 2.0), 2.0, method="bisection", atol=1e-12, rtol=0.0)
    assert bool(res.success)
    assert abs(float(res.x) - np.sqrt(2.0)) <= 1e-12
    assert int(res.num_steps) == int(np.ceil(np.log2(2.0 / 1e-12))) - 1


def test_reversed_bracket_and_root_at_an_end():
    res = odekit.root(square_minus, (2.0, 0.0), 2.0, method="bisection")
    np.testing.assert_allclose(res.x, np.sqrt(2.0), rtol=1e-11)
    at_end = odekit.root(square_minus, (2.0, 5.0), 4.0, method="bisection")
    np.testing.assert_allclose(at_end.x, 2.0, rtol=1e-11)


def test_gradient_vmap_and_grad_of_grad():
    def sqrt(a):
        return odekit.root(square_minus, (0.0, 10.0), a, method="bisection").x
    a = jnp.array([0.5, 2.0, 7.0])
    np.testing.assert_allclose(jax.jit(jax.vmap(sqrt))(a), np.sqrt(a), rtol=1e-11)
    np.testing.assert_allclose(jax.vmap(jax.grad(sqrt))(a), 0.5 / np.sqrt(a), rtol=1e-9)
    np.testing.assert_allclose(jax.grad(jax.grad(sqrt))(2.0), -0.25 * 2.0 ** -1.5, rtol=1e-8)


def test_bracket_gets_zero_gradient():
    grad = jax.grad(lambda lo: odekit.root(square_minus, (lo, 3.0), 2.0, method="bisection").x)
    assert float(grad(0.5)) == 0.0


def test_no_sign_change_raises_and_reports():
    with pytest.raises(odekit.RootSolverError, match=r"bisection.*does not bracket a root"):
        odekit.root(square_minus, (2.0, 3.0), 2.0, method="bisection")
    res = odekit.root(square_minus, (2.0, 3.0), 2.0, method="bisection", throw=False)
    assert not bool(res.success) and int(res.status) == status.BAD_BRACKET
    jitted = jax.jit(lambda a: odekit.root(square_minus, (2.0, 3.0), a, method="bisection").x)
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match="does not bracket"):
        jitted(2.0).block_until_ready()


def test_nonfinite_end_is_reported():
    res = odekit.root(jnp.log, (-1.0, 2.0), method="bisection", throw=False)
    assert int(res.status) == status.NONFINITE


@pytest.mark.parametrize("x0, match", [
    (1.0, r"x0=\(lower, upper\)"),
    ((jnp.zeros(2), jnp.ones(2)), "scalars"),
    ((0j, 1.0), "real floating point"),
    (({"a": 0.0}, {"a": 2.0}), "must be scalars"),
    (("0", "2"), "pytree of real floating arrays"),
])
def test_bad_brackets_raise_at_trace_time(x0, match):
    with pytest.raises((ValueError, TypeError), match=match):
        odekit.root(square_minus, x0, 2.0, method="bisection")


def test_python_float_end_takes_the_other_ends_dtype():
    res = odekit.root(square_minus, (jnp.float32(0.0), 2.0), jnp.float32(2.0), method="bisection")
    assert res.x.dtype == jnp.float32
    np.testing.assert_allclose(res.x, np.sqrt(2.0), rtol=2e-5)
