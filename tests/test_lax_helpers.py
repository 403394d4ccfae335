"""odekit._lax: the helpers the solver loops use instead of jax.numpy (dtype
handling without promotion, Python numbers, complex values, indexing)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit import _lax as ops


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64, jnp.bfloat16])
def test_cast_gives_python_numbers_and_arrays_the_dtype_of_the_other_operand(dtype):
    x = jnp.ones(3, dtype)
    assert ops.cast(0.5, x).dtype == dtype
    assert ops.cast(jnp.float64(2.0), x).dtype == dtype
    assert ops.cast(jnp.arange(3), x).dtype == dtype
    assert jax.lax.add(x, ops.cast(1, x)).dtype == dtype


def test_select_and_minimum_take_python_numbers():
    x = jnp.array([1.0, -2.0, 3.0], jnp.float32)
    np.testing.assert_array_equal(ops.select(x > 0, x, 0.0), [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(ops.select(jnp.bool_(False), 7.0, x), x)
    assert ops.select(x > 0, x, 0.0).dtype == jnp.float32
    np.testing.assert_array_equal(ops.minimum(x, 0.5), [0.5, -2.0, 0.5])
    np.testing.assert_array_equal(ops.minimum(0.5, x), [0.5, -2.0, 0.5])
    assert ops.minimum(0.5, x).dtype == jnp.float32


def test_reductions_over_every_axis_and_scalars():
    x = jnp.arange(6.0).reshape(2, 3)
    assert ops.total(x) == 15.0 and ops.total(jnp.float64(2.0)) == 2.0
    assert bool(ops.all_of(x >= 0)) and not bool(ops.all_of(x > 0))
    assert bool(ops.any_of(x > 4)) and not bool(ops.any_of(jnp.bool_(False)))


def test_finite_and_squared_magnitude_of_complex_values():
    z = jnp.array([3 + 4j, complex(np.inf, 0), complex(0, np.nan)], jnp.complex128)
    np.testing.assert_array_equal(ops.is_finite(z), [True, False, False])
    assert ops.abs_squared(z[:1]).dtype == jnp.float64
    np.testing.assert_allclose(ops.abs_squared(z[:1]), [25.0])
    np.testing.assert_allclose(ops.abs_squared(jnp.array([-3.0])), [9.0])


def test_row_and_put_row_with_a_traced_index():
    x = jnp.arange(12.0).reshape(4, 3)

    @jax.jit
    def f(i, v):
        return ops.row(x, i), ops.put_row(x, v, i)

    row, new = f(jnp.int32(2), jnp.array([-1.0, -2.0, -3.0]))
    np.testing.assert_array_equal(row, x[2])
    np.testing.assert_array_equal(new, x.at[2].set(jnp.array([-1.0, -2.0, -3.0])))
    np.testing.assert_array_equal(jax.vmap(lambda i: ops.row(x, i))(jnp.arange(4)), x)
