"""Unknowns with float32 and float64 leaves together (a pytree x0 of mixed precision).

The default tolerance is that of the least precise leaf: the float64 unknowns
are only as accurate as the float32 residuals they can be coupled to.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

F32 = jnp.float32
X0 = {"u": jnp.ones((), F32), "v": jnp.ones((), jnp.float64)}


def two_roots(x, a):
    """u = sqrt(a) in float32 and v = cbrt(a) in float64."""
    return {"u": x["u"] ** 2 - a.astype(F32), "v": x["v"] ** 3 - a}


def two_cosines(x):
    """Both leaves converge to the Dottie number, x = cos(x)."""
    return {"u": jnp.cos(x["u"]), "v": jnp.cos(x["v"])}


@pytest.mark.parametrize("method", ["newton", "broyden"])
def test_root_with_float32_and_float64_leaves_converges(method):
    res = odekit.root(two_roots, X0, 2.0, method=method)
    assert res.x["u"].dtype == F32 and res.x["v"].dtype == jnp.float64
    np.testing.assert_allclose(res.x["u"], np.sqrt(2.0), rtol=1e-6)
    np.testing.assert_allclose(res.x["v"], np.cbrt(2.0), rtol=1e-6)


@pytest.mark.parametrize("linear_solver", ["dense", "gmres"])
def test_mixed_precision_implicit_gradient(linear_solver):
    def cbrt(a):
        return odekit.root(two_roots, X0, a, linear_solver=linear_solver).x["v"]
    np.testing.assert_allclose(jax.grad(cbrt)(2.0), 2.0 ** (-2 / 3) / 3, rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(cbrt, (2.0,), (1.0,))[1], 2.0 ** (-2 / 3) / 3, rtol=1e-6)


@pytest.mark.parametrize("method", ["iteration", "anderson"])
def test_fixed_point_with_float32_and_float64_leaves_converges(method):
    res = odekit.fixed_point(two_cosines, X0, method=method)
    np.testing.assert_allclose(res.x["u"], 0.7390851332151607, rtol=2e-5)
    np.testing.assert_allclose(res.x["v"], 0.7390851332151607, rtol=2e-5)
