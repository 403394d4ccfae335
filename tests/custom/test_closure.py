"""odekit.custom.closure.closure_convert: every closed-over tracer becomes an
explicit argument, and a function closing over no tracer is converted once
(so the jit caches of the solvers keep hitting)."""
import jax
import jax.numpy as jnp
import numpy as np

import odekit
from odekit.custom.closure import closure_convert


def test_no_tracer_closed_over_converts_to_the_same_function_each_time():
    scale = np.array([2.0, 3.0])
    fun = lambda x, t: scale * jnp.sin(x) + t
    x = jnp.array([0.1, 0.2])
    first, consts = closure_convert(fun, x, 0.5)
    again, _ = closure_convert(fun, x, 0.5)
    assert first is again
    np.testing.assert_allclose(first(x, 0.5, *consts), fun(x, 0.5), rtol=1e-15)


def test_batch_tracers_are_hoisted_under_a_plain_vmap():
    def per_member(k):
        fun = lambda x: {"y": k * x ** 2}
        converted, consts = closure_convert(fun, jnp.ones(3))
        assert len(consts) == 1                        # k, which jax.closure_convert leaves inside
        return converted(jnp.arange(3.0), *consts)["y"]
    ks = jnp.array([1.0, -2.0])
    np.testing.assert_allclose(jax.vmap(per_member)(ks), np.asarray(ks)[:, None] * np.arange(3.0) ** 2)


def test_hoisted_values_get_gradients_through_the_solvers():
    # d/dk of the root of x^3 = k (closed over) under vmap, and of y(1) for y' = -k y
    ks = jnp.array([1.0, 8.0])
    cbrt = jax.vmap(jax.grad(lambda k: odekit.root(lambda x: x ** 3 - k, 1.0).x))(ks)
    np.testing.assert_allclose(cbrt, ks ** (-2 / 3) / 3, rtol=1e-10)
    decay = jax.vmap(jax.grad(lambda k: odekit.odeint(lambda y, t: -k * y, 1.0,
                                                      jnp.array([0.0, 1.0]))[-1]))(ks)
    np.testing.assert_allclose(decay, -np.exp(-np.asarray(ks)), rtol=1e-6, atol=1e-8)
    values = jax.vmap(lambda k: odekit.root(lambda x: x ** 3 - k, 1.0).x)(ks)
    np.testing.assert_allclose(values, np.cbrt(ks), rtol=1e-12)
