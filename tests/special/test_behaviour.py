"""Limits, non-finite inputs, dtypes, transformations and higher derivatives."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import special
from odekit.special import _elementary
from odekit.testing import check_grads

INF = np.inf

# (function, input, expected value, expected first derivative)
LIMITS = [
    ("expit", -INF, 0.0, 0.0), ("expit", INF, 1.0, 0.0), ("expit", 0.0, 0.5, 0.25),
    ("expit", "max", 1.0, 0.0), ("expit", "-max", 0.0, 0.0),
    ("log_expit", -INF, -INF, 1.0), ("log_expit", INF, 0.0, 0.0), ("log_expit", "max", 0.0, 0.0),
    ("log_expit", "-max", "-max", 1.0),
    ("softplus", -INF, 0.0, 0.0), ("softplus", INF, INF, 1.0), ("softplus", "max", "max", 1.0),
    ("softplus", "-max", 0.0, 0.0), ("softplus", 0.0, np.log(2.0), 0.5),
    ("logit", 0.0, -INF, INF), ("logit", 1.0, INF, INF), ("logit", 0.5, 0.0, 4.0),
]


def _resolve(v, dtype):
    if isinstance(v, str):
        big = float(np.finfo(dtype).max)
        return -big if v.startswith("-") else big
    return v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,x,value,slope", LIMITS)
def test_limits_and_extremes(name, x, value, slope, dtype):
    f = getattr(special, name)
    x = jnp.asarray(_resolve(x, dtype), dtype)
    for g in (f, jax.jit(f)):
        np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(_resolve(value, dtype), dtype))
    for g in (jax.grad(f), jax.jit(jax.grad(f))):
        np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(slope, dtype))


@pytest.mark.parametrize("name", ["expit", "log_expit", "softplus"])
def test_never_nan_on_the_whole_line(name):
    """Values and the first two derivatives are finite wherever the truth is."""
    f = getattr(special, name)
    for dtype in (np.float32, np.float64):
        info = np.finfo(dtype)
        mags = np.append(np.geomspace(float(info.tiny), float(info.max) / 4, 2000), info.max)
        x = jnp.asarray(np.concatenate([-mags, [0.0], mags]), dtype)
        for g in (f, jax.grad(f), jax.grad(jax.grad(f))):
            out = np.asarray(jax.jit(jax.vmap(g))(x))
            finite = np.isfinite(out)
            if name == "softplus" and g is f:
                finite |= out == np.inf                   # softplus(max) = max, no overflow
            assert finite.all(), f"{name} non-finite at {np.asarray(x)[~finite][:4]}"


def test_derivative_does_not_underflow_where_jax_does():
    x = jnp.asarray([20.0, 40.0, 80.0], jnp.float32)
    ours = np.asarray(jax.vmap(jax.grad(special.expit))(x))
    np.testing.assert_allclose(ours, np.exp(-np.asarray(x, np.float64)), rtol=1e-6)
    theirs = np.asarray(jax.vmap(jax.grad(jax.scipy.special.expit))(x))
    assert (theirs == 0).all()          # the defect the issue describes


@pytest.mark.parametrize("name", ["expit", "log_expit", "softplus", "logit"])
def test_nan_and_out_of_domain(name):
    f = getattr(special, name)
    assert np.isnan(f(jnp.nan))
    if name == "logit":
        assert np.isnan(f(-0.5)) and np.isnan(f(1.5))


@pytest.mark.parametrize("name", ["expit", "log_expit", "softplus", "logit"])
def test_dtypes(name):
    f = getattr(special, name)
    x = 0.25
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        out = f(jnp.asarray(x, dtype))
        assert out.dtype == dtype
        np.testing.assert_allclose(float(out), float(f(jnp.float64(x))), rtol=1e-2)
        assert jax.grad(f)(jnp.asarray(x, dtype)).dtype == dtype
    assert f(jnp.asarray([0, 1])).dtype == jnp.float64        # integers are promoted
    assert f(0.25).dtype == jnp.float64
    with pytest.raises(TypeError, match="real floating"):
        f(jnp.asarray(0.25 + 1j))


@pytest.mark.parametrize("name", ["expit", "log_expit", "softplus", "logit"])
def test_grad_of_grad_against_finite_differences(name):
    f = getattr(special, name)
    points = [0.2, 0.5, 0.9] if name == "logit" else [-30.0, -3.0, -0.1, 0.0, 0.7, 4.0, 25.0]
    x = jnp.asarray(points)
    check_grads(jax.vmap(f), (x,), order=2, modes=("fwd", "rev"))


def test_third_derivative_is_finite_and_consistent():
    d3 = jax.grad(jax.grad(jax.grad(special.expit)))
    x = 1.3
    s = float(special.expit(x))
    want = s * (1 - s) * (1 - 6 * s + 6 * s * s)
    np.testing.assert_allclose(float(d3(x)), want, rtol=1e-12)
    assert np.isfinite(float(d3(700.0)))


def test_shapes_vmap_and_jit_agree():
    x = jnp.linspace(-6, 6, 24).reshape(2, 3, 4)
    for name in ("expit", "log_expit", "softplus"):
        f = getattr(special, name)
        eager = np.asarray(f(x))
        # fused (jit) and op-by-op code may round differently: allow 4 eps
        np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), eager, rtol=4 * 2.0 ** -52)
        np.testing.assert_allclose(np.asarray(jax.vmap(jax.vmap(f))(x)), eager, rtol=4 * 2.0 ** -52)
        assert eager.shape == (2, 3, 4)


def test_inverse_pair_and_identities():
    x = jnp.linspace(-20, 2, 221)           # expit(x) near 1 keeps too few bits above 2
    np.testing.assert_allclose(np.asarray(special.logit(special.expit(x))), np.asarray(x),
                               rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(np.asarray(special.log_expit(x)), np.asarray(-special.softplus(-x)),
                               rtol=0, atol=0)


def test_top_level_reexports():
    assert odekit.expit is special.expit and odekit.logit is special.logit
    assert isinstance(special.expit, jax.custom_jvp)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exact_split_survives_jit(dtype):
    """XLA rewrites (1 + e) - 1 to e under jit; the split used must keep its low part."""
    e = jnp.asarray(np.linspace(0.0, 1.0, 1001), dtype)
    for split in (_elementary.one_plus, jax.jit(_elementary.one_plus)):
        hi, lo = split(e)
        exact = (np.asarray(hi, np.float64) - 1) + np.asarray(lo, np.float64)
        np.testing.assert_array_equal(exact, np.asarray(e, np.float64))
        assert np.count_nonzero(np.asarray(lo)) > 100


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logit_derivatives_are_nan_outside_the_unit_interval(dtype):
    """logit is nan outside [0, 1], so its slope cannot be a finite number there."""
    p = jnp.asarray([-0.5, -1e-3, 1.001, 1.5, -INF, INF], dtype)
    for g in (jax.grad(special.logit), jax.grad(jax.grad(special.logit))):
        for fun in (jax.vmap(g), jax.jit(jax.vmap(g))):
            out = np.asarray(fun(p))
            assert out.dtype == dtype and np.isnan(out).all(), out
    assert np.isnan(np.asarray(special.logit(p))).all()
    # the analytic slope 1 / (p (1 - p)) inside, inf at the ends
    inside = jnp.asarray([0.0, 0.25, 0.5, 1.0], dtype)
    np.testing.assert_allclose(np.asarray(jax.vmap(jax.grad(special.logit))(inside)),
                               np.asarray([INF, 16 / 3, 4.0, INF], dtype), rtol=1e-7)
