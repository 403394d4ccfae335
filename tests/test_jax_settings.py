"""odekit under every JAX setting a user turns on (DESIGN section 2).

Each setting is a context manager (``jax.numpy_dtype_promotion("strict")``,
``jax.numpy_rank_promotion("raise")``, ``jax.debug_nans(True)``,
``jax.debug_infs(True)``, ``jax.disable_jit()``; all restore the previous
value on exit). Each :class:`Case` is a scalar function of a scalar checked
for its value and derivative, eagerly, under ``jit`` and under ``vmap``, and
by ``odekit.testing.check_grads``. x32 (``jax_enable_x64=False``) runs the
cases in a subprocess, since the test session runs with x64 (this module
switches x64 off at import when ``ODEKIT_TEST_X32=1``).

To add a solver, append a :class:`Case` to :data:`CASES`.
"""
import contextlib
import os
import subprocess
import sys
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import odekit
from odekit.testing import check_grads

X32 = os.environ.get("ODEKIT_TEST_X32") == "1"
if X32:
    jax.config.update("jax_enable_x64", False)

SETTINGS = {
    "strict_dtype_promotion": lambda: jax.numpy_dtype_promotion("strict"),
    "rank_promotion_raise": lambda: jax.numpy_rank_promotion("raise"),
    "debug_nans": lambda: jax.debug_nans(True),
    "debug_infs": lambda: jax.debug_infs(True),
    "disable_jit": jax.disable_jit,
    "debug_nans_and_infs": lambda: _both(jax.debug_nans(True), jax.debug_infs(True)),
}


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


class Case(NamedTuple):
    """A scalar function with float64 NumPy references for it and its derivative."""

    name: str
    fun: Callable[[jax.Array], jax.Array]
    x: tuple          # points to evaluate at
    value: Callable   # NumPy reference of fun
    grad: Callable    # NumPy reference of fun'


class SquaredReLU(odekit.custom.Function):
    @staticmethod
    def forward(ctx, x):
        y = jax.nn.relu(x)
        ctx.save_for_backward(y)
        return y * y

    @staticmethod
    def backward(ctx, dy):
        y, = ctx.saved_tensor()
        return dy * 2 * y


def cube_root(method):
    return lambda a: odekit.root(lambda x, a: x ** 3 - a, 1.0, a, method=method).x


def square_root(a):
    return odekit.root(lambda x, a: x * x - a, (0.0, 30.0), a, method="bisection").x


def dottie(method):
    """The fixed point of ``x = a cos(x)``; ``x* = a cos(x*)``."""
    return lambda a: odekit.fixed_point(lambda x, a: a * jnp.cos(x), 0.0, a, method=method).x


# Fixed points x* of x = a cos(x) at a = x* / cos(x*); dx*/da = cos x* / (1 + a sin x*).
DOTTIE_X = np.array([0.3, 0.5, 0.6])
DOTTIE_A = DOTTIE_X / np.cos(DOTTIE_X)


def dottie_value(a):
    return DOTTIE_X[np.searchsorted(DOTTIE_A, a)]


def dottie_grad(a):
    x = dottie_value(a)
    return np.cos(x) / (1 + a * np.sin(x))


WIDE = (-800.0, -30.0, -1.0, 0.0, 2.5, 40.0, 800.0)
CASES = [
    Case("root_newton", cube_root("newton"), (0.5, 2.0, 27.0),
         np.cbrt, lambda a: np.cbrt(a) ** -2 / 3),
    Case("root_broyden", cube_root("broyden"), (0.5, 2.0, 27.0),
         np.cbrt, lambda a: np.cbrt(a) ** -2 / 3),
    Case("root_bisection", square_root, (0.5, 2.0, 27.0), np.sqrt, lambda a: 0.5 / np.sqrt(a)),
    Case("fixed_point_iteration", dottie("iteration"), tuple(DOTTIE_A), dottie_value, dottie_grad),
    Case("fixed_point_anderson", dottie("anderson"), tuple(DOTTIE_A), dottie_value, dottie_grad),
    Case("expit", odekit.special.expit, WIDE,
         scipy.special.expit, lambda x: scipy.special.expit(x) * scipy.special.expit(-x)),
    Case("log_expit", odekit.special.log_expit, WIDE,
         scipy.special.log_expit, lambda x: scipy.special.expit(-x)),
    Case("softplus", odekit.special.softplus, WIDE,
         lambda x: np.logaddexp(0.0, x), scipy.special.expit),
    Case("logit", odekit.special.logit, (1e-30, 1e-3, 0.5, 0.9, 1 - 2 ** -20),
         scipy.special.logit, lambda p: 1 / (p * (1 - p))),
    Case("custom_function", SquaredReLU.apply, (-2.0, -0.5, 0.5, 3.0),
         lambda x: np.maximum(x, 0) ** 2, lambda x: 2 * np.maximum(x, 0)),
]


def assert_close(actual, expected, dtype):
    rtol = 10 * float(jnp.finfo(dtype).eps) ** 0.75
    assert actual.dtype == dtype
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol,
                               atol=float(jnp.finfo(dtype).tiny))


def check_case(case: Case, with_check_grads: bool = True) -> None:
    """Value and derivative of ``case``: eager, under jit, under vmap."""
    dtype = jnp.result_type(float)
    x = jnp.asarray(case.x, dtype=dtype)
    ref = np.asarray(case.x, np.float64)
    value, grad = case.value(ref), case.grad(ref)
    assert_close(case.fun(x[1]), value[1], dtype)
    assert_close(jax.grad(case.fun)(x[1]), grad[1], dtype)
    assert_close(jax.jit(jax.vmap(case.fun))(x), value, dtype)
    assert_close(jax.vmap(jax.grad(case.fun))(x), grad, dtype)
    assert_close(jax.jit(jax.grad(case.fun))(x[-1]), grad[-1], dtype)
    if with_check_grads:  # at a middle point, where a finite difference step of
        check_grads(case.fun, (x[len(x) // 2],), order=1)  # ~1e-5 resolves curvature


# The suite runs under strict dtype promotion and rank promotion "raise"
# (tests/conftest.py), so CI sets those two again only in the long run. The
# NaN and Inf checks only watch (a case computes the same numbers with
# either on), so CI turns both on at once ("debug_nans_and_infs": a case
# that passes with both passes with each); each alone in the long run.
LONG_ONLY = ("strict_dtype_promotion", "rank_promotion_raise", "debug_nans", "debug_infs")


# Under disable_jit Broyden and plain iteration run the loops Newton and
# Anderson run (their own steps aside): those two pairs are long there.
LONG_UNDER_DISABLE_JIT = ("root_broyden", "fixed_point_iteration")


@pytest.mark.parametrize("setting, case", [
    (setting, case) if setting not in LONG_ONLY and not (
        setting == "disable_jit" and case.name in LONG_UNDER_DISABLE_JIT)
    else pytest.param(setting, case, marks=pytest.mark.long)
    for setting in SETTINGS for case in CASES],
    ids=[f"{setting}-{case.name}" for setting in SETTINGS for case in CASES])
def test_under_setting(setting, case):
    with SETTINGS[setting]():
        check_case(case, with_check_grads=not X32)


def _raises(fun: Callable, error: type) -> bool:
    try:
        fun()
    except error:
        return True
    return False


def _branch_on_value(x):
    return x if float(x) > 0 else -x  # a tracer error under jit, fine when eager


# Probes that are True when a setting is on, to show each context really turns it on.
PROBES = {
    "strict_dtype_promotion": lambda: _raises(
        lambda: jnp.ones(2, jnp.float32) + jnp.ones(2, jnp.float64), jax.dtypes.TypePromotionError),
    "rank_promotion_raise": lambda: _raises(lambda: jnp.ones(2) + jnp.ones((3, 1)), ValueError),
    "debug_nans": lambda: _raises(lambda: jnp.log(-jnp.ones(())), FloatingPointError),
    "debug_infs": lambda: _raises(lambda: jnp.log(jnp.zeros(())), FloatingPointError),
    "disable_jit": lambda: not _raises(lambda: jax.jit(_branch_on_value)(1.0),
                                       jax.errors.ConcretizationTypeError),
}
PROBES["debug_nans_and_infs"] = lambda: PROBES["debug_nans"]() and PROBES["debug_infs"]()


@pytest.mark.parametrize("setting", SETTINGS)
def test_setting_is_on_inside_its_context(setting):
    with SETTINGS[setting]():
        assert PROBES[setting]()


@pytest.mark.skipif(X32, reason="already the x32 subprocess")
def test_under_x32():
    """The cases again in a fresh interpreter with ``jax_enable_x64=False``:
    results and derivatives in float32 (Newton, Anderson, expit / log_expit
    and custom.Function in CI; every case with ODEKIT_LONG_TESTS=1)."""
    long = os.environ.get("ODEKIT_LONG_TESTS") == "1"
    # The strict_dtype_promotion variants are marked long (tests/conftest.py
    # skips them): the subprocess runs long tests, and -k picks the cases.
    env = dict(os.environ, ODEKIT_TEST_X32="1", ODEKIT_LONG_TESTS="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
         "-k", "(test_under_setting and strict_dtype_promotion"
               + ("" if long else
                  " and (root_newton or fixed_point_anderson or expit or custom_function)")
               + ") or really_runs"],
        capture_output=True, text=True, env=env, timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    # every selected case ran, none skipped: in CI 5 (-k expit picks log_expit too) and the
    # float32 check
    expected = f"{len(CASES) + 1 if long else 6} passed"
    assert "skipped" not in summary and expected in summary, summary


def test_x32_subprocess_really_runs_in_float32():
    if X32:
        assert jnp.result_type(float) == jnp.float32
    else:
        assert jnp.result_type(float) == jnp.float64
