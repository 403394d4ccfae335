"""odekit.testing.check_grads must pass right derivatives and catch wrong ones.

Every gradient test of odekit relies on it, so it is itself tested on
functions whose derivatives are known to be right (jax's own rules) and on
custom rules that are wrong on purpose: in the first derivative, only in the
second, only in forward or only in reverse mode.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit.testing import check_grads, default_tolerance


def _cube_with_frozen_second_derivative():
    """x**3 whose JVP rule is right but not differentiable: d2/dx2 comes out 0."""
    @jax.custom_jvp
    def cube(x):
        return x ** 3

    @cube.defjvp
    def _(primals, tangents):
        (x,), (dx,) = primals, tangents
        return cube(x), 3 * jax.lax.stop_gradient(x) ** 2 * dx

    return cube


def _sin_with_wrong_vjp(scale):
    """sin(x) whose reverse rule multiplies the cotangent by ``scale * cos(x)``."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (scale * jnp.cos(x) * g,))
    return f


# order 3 runs the order 1 and order 2 checks first (the same rows, the same
# seed): orders 1 and 2 alone in the long run.
@pytest.mark.parametrize("order", [pytest.param(1, marks=pytest.mark.long),
                                   pytest.param(2, marks=pytest.mark.long), 3])
def test_right_derivatives_pass_in_both_modes(order):
    f = lambda x, y: jnp.sin(x) * y + jnp.exp(0.1 * x * y)
    check_grads(f, (jnp.array([0.3, -1.2, 2.0]), jnp.array([1.5, 0.4, -0.7])), order=order,
                modes=("fwd", "rev"))


def test_pytree_complex_and_integer_arguments():
    def f(params, z, n):
        return {"a": params["w"] * jnp.cos(params["b"]) ** n,
                "c": (jnp.abs(z) ** 2).astype(z.dtype) + z * z}
    params = {"w": jnp.array([0.5, 2.0]), "b": 0.3}
    check_grads(f, (params, jnp.array([1.0 + 2.0j, -0.5j]), 3), order=2, modes=("fwd", "rev"))


def test_wrong_first_derivative_fails_with_a_table_naming_the_argument():
    f = _sin_with_wrong_vjp(1.01)
    with pytest.raises(AssertionError) as info:
        check_grads(lambda a, x: a * f(x), (2.0, jnp.array([0.1, 0.7])))
    text = str(info.value)
    assert "1 of 2 derivative checks missed" in text
    failing = [line for line in text.splitlines() if "FAIL" in line]
    assert len(failing) == 1 and "arg leaf 1 (2,)" in failing[0]


def test_small_errors_pass_within_the_tolerance_and_fail_outside():
    nearly = _sin_with_wrong_vjp(1.0 + 1e-9)
    check_grads(nearly, (jnp.array([0.4, 1.1]),))
    with pytest.raises(AssertionError):
        check_grads(nearly, (jnp.array([0.4, 1.1]),), rtol=1e-12, atol=0.0)


def test_wrong_second_derivative_is_caught_only_at_order_two():
    cube = _cube_with_frozen_second_derivative()
    x = (jnp.array([0.5, -1.5]),)
    check_grads(cube, x, order=1, modes=("fwd", "rev"))
    for mode in ("fwd", "rev"):
        with pytest.raises(AssertionError, match="order 2"):
            check_grads(cube, x, order=2, modes=(mode,))


def test_each_mode_checks_its_own_rule():
    f = _sin_with_wrong_vjp(2.0)            # its jvp is jax's (from the primal): right
    x = (jnp.array([0.2, 0.9]),)
    with pytest.raises(AssertionError):
        check_grads(f, x, modes=("rev",))
    with pytest.raises(TypeError):          # custom_vjp functions have no forward mode
        check_grads(f, x, modes=("fwd",))

    @jax.custom_jvp
    def g(x):
        return jnp.sin(x)
    g.defjvp(lambda p, t: (g(p[0]), 1.5 * jnp.cos(p[0]) * t[0]))
    with pytest.raises(AssertionError):
        check_grads(g, x, modes=("fwd",))


def test_nan_derivative_fails():
    f = _sin_with_wrong_vjp(jnp.nan)
    with pytest.raises(AssertionError, match="FAIL"):
        check_grads(f, (jnp.array([0.3]),))


def test_float32_inputs_use_the_float32_tolerance():
    assert default_tolerance(jnp.float32) == (2e-3, 1e-4)
    assert default_tolerance(jnp.float64) == (1e-6, 1e-9)
    f = lambda x: jnp.tanh(x) * x
    check_grads(f, (jnp.array([0.3, -2.0], jnp.float32),), order=2, modes=("fwd", "rev"))
    # An error of 1e-3 relative passes at float32 tolerance and fails at float64.
    wrong = _sin_with_wrong_vjp(1.0 + 1e-3)
    check_grads(wrong, (jnp.array([0.3, 1.0], jnp.float32),))
    with pytest.raises(AssertionError):
        check_grads(wrong, (jnp.array([0.3, 1.0]),))


def test_jitted_and_vmapped_functions():
    f = jax.jit(jax.vmap(lambda x, y: jnp.sin(x * y)))
    check_grads(f, (jnp.linspace(0.1, 1.0, 4), jnp.linspace(-1.0, 1.0, 4)), order=2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"order": 0}, ValueError, "order must be >= 1"),
    ({"modes": ("sideways",)}, ValueError, "unknown mode"),
])
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        check_grads(jnp.sin, (jnp.array([0.3]),), **kwargs)


def test_no_floating_argument_is_an_error():
    with pytest.raises(ValueError, match="no floating-point argument"):
        check_grads(lambda n: n * 2.0, (np.arange(3),))


def test_needs_float64():
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(RuntimeError, match="float64"):
            check_grads(jnp.sin, (np.array([0.3]),))
    finally:
        jax.config.update("jax_enable_x64", True)
