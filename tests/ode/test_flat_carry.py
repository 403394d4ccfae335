"""flat_carry.while_loop behaves exactly like lax.while_loop."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit.ode import flat_carry


def _cond(carry):
    return carry["t"] < 10.0


def _body(carry):
    return {"t": carry["t"] + 1.5, "y": carry["y"] * 0.9 + carry["t"],
            "m": carry["m"] + jnp.outer(carry["y"], carry["y"])}


def _init(scale=1.0):
    return {"t": jnp.asarray(0.0), "y": jnp.arange(3.0) * scale, "m": jnp.eye(3)}


def test_same_result_as_lax_while_loop():
    expected = lax.while_loop(_cond, _body, _init())
    got = jax.jit(lambda c: flat_carry.while_loop(_cond, _body, c))(_init())
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-14)  # XLA may fuse (and round) differently


def test_vmap_matches_each_member():
    scales = jnp.array([0.5, 1.0, 2.0])
    batched = jax.vmap(lambda s: flat_carry.while_loop(_cond, _body, _init(s)))(scales)
    plain = jax.vmap(lambda s: lax.while_loop(_cond, _body, _init(s)))(scales)
    np.testing.assert_allclose(batched["m"], plain["m"], rtol=1e-14)
    for i, s in enumerate(scales):  # batched and unbatched code may round differently
        one = lax.while_loop(_cond, _body, _init(s))
        np.testing.assert_allclose(batched["m"][i], one["m"], rtol=1e-14)


def test_mixed_dtypes_fall_back_to_lax_while_loop():
    init = (jnp.asarray(0, jnp.int32), jnp.ones(2))
    out = flat_carry.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] * 2), init)
    assert out[0].dtype == jnp.int32 and int(out[0]) == 4
    np.testing.assert_array_equal(out[1], 16 * np.ones(2))
