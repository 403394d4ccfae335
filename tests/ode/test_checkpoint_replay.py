"""The checkpointed loop's recomputation takes the steps its first run took.

A checkpointed chunk of the loop runs twice: in the forward pass and again
in the backward pass, compiled apart, where its values may differ in the
last bits (LLVM's cheap pipeline did: 5e-5 relative error in a gradient at
rtol 1e-13). A field whose values wobble by 1e-14 between calls stands in
for that here: without the recorded decisions
(:func:`odekit.ode.engine.bounded_loop.decision`) an error norm near 1
flips a step's acceptance in the recomputation and the gradient is off by
1e-4; with them it matches the loop without recomputation (``levels=1``)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit


def _wobbling_field(seed: int):
    """``tanh(W y) - y / 2`` plus a uniform wobble of 1e-14 that changes at every call."""
    rng = np.random.default_rng(seed)

    def wobble(like: jax.Array) -> jax.Array:
        draw = lambda: rng.uniform(-1.0, 1.0, like.shape).astype(like.dtype)
        return jax.lax.stop_gradient(jax.pure_callback(
            draw, jax.ShapeDtypeStruct(like.shape, like.dtype), vmap_method="broadcast_all"))

    def field(t, y, w):
        return jnp.tanh(w @ y) - 0.5 * y + 1e-14 * wobble(y)

    return field


# CI: the default two levels (each chunk recomputed once); three levels
# (recomputed within a recomputation) and bdf are long.
@pytest.mark.parametrize("method, levels", [("tsit5", 2),
                                            pytest.param("tsit5", 3, marks=pytest.mark.long),
                                            pytest.param("bdf", 2, marks=pytest.mark.long)])
def test_recomputed_chunks_take_the_recorded_steps(method, levels):
    field = _wobbling_field(0)
    w = 0.5 * jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    y0 = jnp.array([1.0, -2.0, 3.0, 0.5])

    def loss(w, levels):
        sol = odekit.solve_ivp(field, (0.0, 2.0), y0, args=(w,), t_eval=jnp.array([1.0, 2.0]),
                               method=method, rtol=1e-12, atol=1e-12,
                               adjoint=odekit.Checkpoint(max_directions=0, levels=levels))
        return jnp.sum(sol.ys ** 2)

    stored = jax.grad(loss)(w, 1)            # every block stored: nothing recomputed
    np.testing.assert_allclose(jax.grad(loss)(w, levels), stored, rtol=1e-9, atol=1e-12)


@pytest.mark.long   # 25 s on CI's machine; the unbatched replay is checked in CI
def test_a_vmapped_gradient_takes_the_recorded_steps_too():
    """The batched loop (each member its own steps, masked iterations) under
    the same wobble: jax.grad of the batch's loss with levels 2 equals levels 1."""
    field = _wobbling_field(1)
    w = 0.5 * jax.random.normal(jax.random.PRNGKey(2), (4, 4))
    y0s = jnp.array([[1.0, -2.0, 3.0, 0.5], [0.1, 0.2, -0.3, 0.4]])

    def loss(w, levels):
        def member(y0):
            sol = odekit.solve_ivp(field, (0.0, 2.0), y0, args=(w,), t_eval=jnp.array([2.0]),
                                   rtol=1e-12, atol=1e-12,
                                   adjoint=odekit.Checkpoint(max_directions=0, levels=levels))
            return jnp.sum(sol.ys ** 2)
        return jnp.sum(jax.vmap(member)(y0s))

    np.testing.assert_allclose(jax.grad(loss)(w, 2), jax.grad(loss)(w, 1), rtol=1e-9, atol=1e-12)
