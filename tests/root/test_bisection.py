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


@pytest.mark.parametrize("f, bracket", [
    (lambda x: 1.0 / x, (-1.0, 2.0)),                       # a pole
    (jnp.tan, (1.0, 2.0)),                                   # a pole at pi/2
    (lambda x: jnp.where(x < 0.3, -1.0, 2.0 + x), (0.0, 1.0)),   # a jump
])
def test_sign_change_that_is_no_root_fails(f, bracket):
    """Issue 27.7: bisection closes on a pole or jump as on a root; |f| there
    does not shrink with the bracket, so it is NOT_A_ROOT, not success."""
    with pytest.raises(odekit.RootSolverError, match=r"sign change of f that is not a root "
                                                     r"\(a pole or a discontinuity\)"):
        odekit.root(f, bracket, method="bisection")
    res = odekit.root(f, bracket, method="bisection", throw=False)
    assert not bool(res.success) and int(res.status) == status.NOT_A_ROOT

    def member(shift):
        return odekit.root(lambda x: f(x - shift), (bracket[0] + shift, bracket[1] + shift),
                           method="bisection", throw=False)
    batch = jax.jit(jax.vmap(member))(jnp.array([0.0, 0.25]))
    assert not np.any(np.asarray(batch.success))
    assert np.all(np.asarray(batch.status) == status.NOT_A_ROOT)
    jitted = jax.jit(lambda: odekit.root(f, bracket, method="bisection").x)
    with pytest.raises(status.ERRORS, match="not a root"):
        jitted().block_until_ready()


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("f, bracket, root", [
    (lambda x: x ** 3 - 1e-12, (-1.0, 2.0), 1e-4),
    (lambda x: x ** 3 - 1e-12, (-1e-3, 1e-3), 1e-4),
    (lambda x: jnp.tanh(1e6 * x), (-1.0, 2.0), 0.0),
    (lambda x: x ** 3, (-1.0, 2.0), 0.0),                    # a triple root
    (lambda x: (x - 0.3) * 1e10 * x * (1 - x), (1e-20, 1 - 1e-16), 0.3),  # tiny ends, steep root
    (jnp.cos, (0.0, 3.0), np.pi / 2),
])
def test_steep_and_flat_roots_still_succeed(f, bracket, root, dtype):
    lo, hi = (dtype(b) for b in bracket)
    res = odekit.root(f, (lo, hi), method="bisection", throw=False)
    assert bool(res.success), int(res.status)
    tol = 1e-10 if dtype == jnp.float64 else 2e-5
    assert abs(float(res.x) - root) <= tol * max(1.0, abs(root))
    both = jax.vmap(lambda s: odekit.root(lambda x: f(x) * s, (lo, hi), method="bisection",
                                          throw=False).success)(jnp.array([1.0, -3.0], dtype))
    assert np.all(np.asarray(both))


def test_roots_at_the_rounding_limit_succeed():
    res = odekit.root(square_minus, (0.0, 2.0), 2.0, method="bisection", atol=0.0, rtol=1e-16)
    assert bool(res.success) and abs(float(res.x) - np.sqrt(2.0)) <= 4e-16
