"""odekit._sealed_jvp: a JVP rule kept through partial evaluation.

The example: a square root by Newton's method in a ``while_loop`` (no
reverse mode of its own) whose rule calls itself for the primal, so that
the rule can be differentiated again, the pattern of the solvers' rules.
Checked against the closed form in every second-order mode inside
``fori_loop`` (where jax 0.10's scan linearisation drops a custom_jvp's
rule), under jit and vmap, with integer outputs and pytrees.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from odekit._sealed_jvp import sealed_jvp


def _newton_sqrt(a):
    return lax.while_loop(lambda x: jnp.abs(x * x - a) > 1e-14 * a, lambda x: 0.5 * (x + a / x), a)


@sealed_jvp
def sqrt(a):
    return _newton_sqrt(a)


@sqrt.defjvp
def _sqrt_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    s = sqrt(a)
    return s, da / (2 * s)


def _looped(a):
    return lax.fori_loop(0, 2, lambda i, x: sqrt(x + a), jnp.zeros_like(a))


def _exact(a):
    return jnp.sqrt(jnp.sqrt(a) + a)


def test_every_second_order_mode_inside_fori_loop():
    a = jnp.asarray(2.0)
    exact = jax.grad(jax.grad(_exact))(a)
    np.testing.assert_allclose(jax.grad(_looped)(a), jax.grad(_exact)(a), rtol=1e-13)
    np.testing.assert_allclose(jax.jit(jax.grad(jax.grad(_looped)))(a), exact, rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(jax.grad(_looped), (a,), (1.0,))[1], exact, rtol=1e-12)
    np.testing.assert_allclose(jax.hessian(_looped)(a), exact, rtol=1e-12)
    # third order, reverse over reverse over reverse
    np.testing.assert_allclose(jax.grad(jax.grad(jax.grad(_looped)))(a),
                               jax.grad(jax.grad(jax.grad(_exact)))(a), rtol=1e-10)


def test_vmap_keeps_the_rule_and_batches_the_value():
    a = jnp.array([2.0, 3.0, 5.0])
    np.testing.assert_allclose(jax.vmap(sqrt)(a), jnp.sqrt(a), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.hessian(_looped)))(a),
                               jax.vmap(jax.hessian(_exact))(a), rtol=1e-12)
    # a batched argument next to an unbatched one
    scaled = sealed_jvp(lambda a, c: _newton_sqrt(a) * c)
    scaled.defjvp(lambda primals, tangents: (scaled(*primals),
                                             tangents[0] * primals[1] / (2 * jnp.sqrt(primals[0]))
                                             + tangents[1] * jnp.sqrt(primals[0])))
    c = jnp.asarray(3.0)
    np.testing.assert_allclose(jax.vmap(jax.grad(scaled, (0, 1)), (0, None))(a, c),
                               (c / (2 * jnp.sqrt(a)), jnp.sqrt(a)), rtol=1e-12)


def test_pytrees_nondiff_arguments_and_integer_outputs():
    def solve(scale, x):
        root = _newton_sqrt(x["a"]) * scale
        return root, jnp.asarray(7, jnp.int32)

    sealed = sealed_jvp(solve, nondiff_argnums=(0,))

    @sealed.defjvp
    def _(scale, primals, tangents):
        (x,), (dx,) = primals, tangents
        root, count = sealed(scale, x)
        return (root, count), (scale * dx["a"] / (2 * jnp.sqrt(x["a"])),
                               np.zeros((), jax.dtypes.float0))

    x = {"a": jnp.asarray(4.0)}
    root, count = sealed(2.0, x)
    assert float(root) == pytest.approx(4.0) and int(count) == 7
    grad = jax.grad(lambda x: sealed(2.0, x)[0])(x)
    np.testing.assert_allclose(grad["a"], 0.5, rtol=1e-14)


def test_a_rule_with_mismatched_outputs_is_refused():
    bad = sealed_jvp(lambda a: (a, a))
    bad.defjvp(lambda primals, tangents: ((primals[0], primals[0]), (tangents[0],)))
    with pytest.raises(TypeError, match="one array per primal output"):
        jax.jvp(bad, (1.0,), (1.0,))


def test_a_function_closing_over_traced_values_is_refused():
    def outer(c):
        closing = sealed_jvp(lambda a: a * c)
        closing.defjvp(lambda primals, tangents: (closing(*primals), tangents[0] * c))
        return closing(jnp.asarray(2.0))
    with pytest.raises(TypeError, match="closes over traced values"):
        jax.grad(outer)(jnp.asarray(3.0))
