"""Loud failure of odekit.root and odekit.fixed_point, and argument checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import status as S

# A failure found inside jit reaches the caller as JaxRuntimeError, or as
# ValueError once the jitted function has run before (see odekit.status);
# both carry the message.
COMPILED_ERRORS = (jax.errors.JaxRuntimeError, ValueError)


def cubic(x, a):
    return x ** 3 - a


def singular_2d(x):
    return jnp.stack([x[0] + x[1] - 1.0, 2 * x[0] + 2 * x[1] - 3.0])


def blocked(x):
    """Root at 2, but f is nan beyond 1: every trial step from x = 1 is rejected."""
    return jnp.where(x > 1.0, jnp.nan, x - 2.0)


FAILURES = [  # (f, x0, args, method, status, words in the message)
    (cubic, 1.0, (5.0,), "newton", S.MAX_STEPS, "the maximum number of steps was reached"),
    (cubic, 1.0, (5.0,), "broyden", S.MAX_STEPS, "the maximum number of steps was reached"),
    (lambda x: x ** 2 + 1.0, 0.0, (), "newton", S.SINGULAR, "singular Jacobian"),
    (singular_2d, jnp.zeros(2), (), "newton", S.SINGULAR, "singular Jacobian"),
    (singular_2d, jnp.zeros(2), (), "broyden", S.SINGULAR, "singular Jacobian"),
    (jnp.log, -1.0, (), "newton", S.NONFINITE, "non-finite"),
    (blocked, 0.0, (), "newton", S.NO_PROGRESS, "the line search could not reduce"),
]


@pytest.mark.parametrize("f, x0, args, method, status, words", FAILURES)
def test_root_failure_raises_or_reports(f, x0, args, method, status, words):
    kwargs = dict(method=method, max_steps=3 if status == S.MAX_STEPS else 256)
    res = odekit.root(f, x0, *args, throw=False, **kwargs)
    assert not bool(res.success) and int(res.status) == status
    assert words in res.message
    with pytest.raises(odekit.RootSolverError,
                       match=rf"odekit.root\(method='{method}'\) failed: {words}"):
        odekit.root(f, x0, *args, **kwargs)


def test_message_names_steps_and_residual():
    res = odekit.root(cubic, 1.0, 5.0, max_steps=2, throw=False)
    words = rf"after 2 steps, residual max\|f\(x\)\| = {float(res.error):.3e}"
    with pytest.raises(odekit.RootSolverError, match=words):
        odekit.root(cubic, 1.0, 5.0, max_steps=2)


def test_failure_raises_under_jit_and_passes_when_fine():
    solve = jax.jit(lambda a, n: odekit.root(lambda x, a: cubic(x, a) * n, 1.0, a).x)
    np.testing.assert_allclose(solve(8.0, 1.0), 2.0, rtol=1e-12)
    with pytest.raises(COMPILED_ERRORS, match="newton.*non-finite"):
        solve(8.0, jnp.nan).block_until_ready()


def test_failure_under_vmap_names_the_batch():
    a = jnp.arange(1.0, 9.0)
    res = jax.vmap(lambda a: odekit.root(cubic, 1.0, a, max_steps=5, throw=False))(a)
    failed = int(jnp.sum(~res.success))
    assert 0 < failed < 8 and bool(res.success[0])
    np.testing.assert_array_equal(res.status[~res.success], S.MAX_STEPS)
    solve = jax.jit(jax.vmap(lambda a: odekit.root(cubic, 1.0, a, max_steps=5).x))
    with pytest.raises(COMPILED_ERRORS, match=rf"in {failed} of 8 batch members.*after 5 steps"):
        solve(a).block_until_ready()


def test_unconverged_gradient_is_nan_not_plausible():
    def cbrt(a, throw):
        return odekit.root(cubic, 1.0, a, max_steps=2, throw=throw).x
    assert np.isnan(jax.grad(cbrt)(5.0, False))
    assert np.isnan(jax.jit(jax.grad(cbrt), static_argnums=1)(5.0, False))
    with pytest.raises(RuntimeError, match="maximum number of steps"):
        jax.grad(cbrt)(5.0, True)


def test_fixed_point_failures():
    with pytest.raises(odekit.RootSolverError,
                       match=r"fixed_point\(method='iteration'\) failed: the maximum number"):
        odekit.fixed_point(jnp.cos, 1.0, max_steps=5)
    with pytest.raises(odekit.RootSolverError,
                       match=r"fixed_point\(method='anderson'\) failed: non-finite"):
        odekit.fixed_point(lambda x: x ** 2 + 1.0, 2.0, method="anderson")
    res = odekit.fixed_point(lambda x: x ** 2 + 1.0, 2.0, throw=False)
    assert int(res.status) == S.NONFINITE and not bool(res.success)
    grad = jax.grad(lambda p: odekit.fixed_point(lambda x: jnp.cos(x) * p, 1.0, max_steps=5,
                                                 throw=False).x)
    assert np.isnan(grad(1.0))


BAD_ARGUMENTS = [  # (kwargs, positional args, error type, words)
    (dict(method="secant"), (2.0,), ValueError, "unknown method 'secant'"),
    (dict(rtol=-1.0), (2.0,), ValueError, "rtol must be"),
    (dict(atol=jnp.ones(2)), (2.0,), ValueError, "atol must be"),
    (dict(max_steps=0), (2.0,), ValueError, "max_steps must be a positive int"),
    (dict(throw="yes"), (2.0,), TypeError, "throw must be True or False"),
    (dict(linear_solver="lu"), (2.0,), ValueError, "linear_solver must be one of"),
    (dict(options={"damping": 0.5}), (2.0,), ValueError, "no option"),
    (dict(), ("two",), TypeError, r"\*args must be arrays"),
    (dict(rtol="1e-3"), (2.0,), ValueError, "rtol must be None or a non-negative"),
    (dict(atol=1j), (2.0,), ValueError, "atol must be None or a non-negative"),
    (dict(method="broyden", options=0.5), (2.0,), TypeError, "options must be a dict"),
]


@pytest.mark.parametrize("kwargs, args, error, words", BAD_ARGUMENTS)
def test_bad_arguments_raise_at_trace_time(kwargs, args, error, words):
    with pytest.raises(error, match=words):
        odekit.root(cubic, 1.0, *args, **kwargs)


def test_integer_starts_are_promoted_to_the_default_float():
    # as in SciPy and odekit.odeint: x0 = 1 means 1.0 (float64 under x64)
    res = odekit.root(cubic, 1, 2.0)
    assert res.x.dtype == jnp.float64
    np.testing.assert_allclose(res.x, 2.0 ** (1 / 3), rtol=1e-14)
    fixed = odekit.fixed_point(lambda x: {"a": jnp.cos(x["a"]), "n": 0.5 * x["n"]}, {"a": 1, "n": True})
    np.testing.assert_allclose(fixed.x["a"], 0.7390851332151607, rtol=1e-10)
    assert fixed.x["n"].dtype == jnp.float64 and abs(fixed.x["n"]) < 1e-6
    bracketed = odekit.root(lambda x: x * x - 2.0, (0, 2), method="bisection")
    np.testing.assert_allclose(bracketed.x, np.sqrt(2.0), rtol=1e-12)


def test_bad_x0_and_f_raise_at_trace_time():
    with pytest.raises(TypeError, match="complex128; split a complex unknown"):
        odekit.root(cubic, 1.0 + 0j, 2.0)
    with pytest.raises(TypeError, match="x0 must be a pytree of real floating arrays.*str"):
        odekit.root(cubic, "1.0", 2.0)
    with pytest.raises(TypeError, match="options must be a dict"):
        odekit.fixed_point(jnp.cos, 1.0, options=[("damping", 0.5)])
    with pytest.raises(ValueError, match="same structure|structure, shapes and dtypes"):
        odekit.root(lambda x: jnp.stack([x, x]), 1.0)
    with pytest.raises(TypeError, match="f must be callable"):
        odekit.fixed_point(3.0, 1.0)
    with pytest.raises(ValueError, match="rtol must be"):
        jax.jit(lambda r: odekit.root(cubic, 1.0, 2.0, rtol=r))(1e-8)


def test_unconverged_gradient_with_respect_to_the_start_is_nan():
    # x* does not depend on x0 (zero gradient), but an unconverged x does:
    # a zero would look fine, so it is NaN like every other gradient.
    def dottie(x0, max_steps):
        return odekit.fixed_point(jnp.cos, x0, max_steps=max_steps, throw=False).x
    assert float(jax.grad(dottie)(1.0, 256)) == 0.0
    assert np.isnan(jax.grad(dottie)(1.0, 3))
    grads = jax.vmap(jax.grad(lambda x0: odekit.root(cubic, x0, 8.0, max_steps=4,
                                                     throw=False).x))(jnp.array([1.9, 100.0]))
    np.testing.assert_array_equal(np.isnan(grads), [False, True])
    assert float(grads[0]) == 0.0
