"""The checkpointed loop's cost follows the steps taken, not its bound.

Counts are exact, not timings: the number of evaluations of the field in one
reverse-mode gradient (a host callback counts them) and XLA's memory for the
compiled gradient. A neural-ODE field with many weights checks the values
the field closes over are kept once, not once per iteration (they used to be
stacked per chunk: memory and time grew with the bound).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.ode.engine import bounded_loop

TS = jnp.linspace(0.0, 6.0, 12)
Y0 = jnp.array([1.0, 0.5])


def mlp(width, seed=0):
    """Weights of a 2 -> width -> width -> 2 tanh network."""
    sizes = [2, width, width, 2]
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return [(jax.random.normal(k, (a, b)) / np.sqrt(a), 0.1 * jnp.ones(b))
            for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def field(y, params):
    h = y
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return h - 0.1 * y


def loss(adjoint, fun=None):
    fun = fun or (lambda t, y, p: field(y, p))

    def value(params):
        sol = odekit.solve_ivp(fun, (0.0, 6.0), Y0, t_eval=TS, args=(params,), rtol=1e-6,
                               atol=1e-6, adjoint=adjoint)
        return jnp.sum(sol.ys ** 2)
    return value


def test_field_evaluations_do_not_depend_on_the_bound():
    calls = [0]

    def counted(t, y, p):
        jax.debug.callback(lambda _: calls.__setitem__(0, calls[0] + 1), t)
        return field(y, p)

    params = mlp(48)     # 2,594 weights, 20 KiB: the loop takes its head
    counts = {}
    for bound in (64, 4096):
        grad = jax.jit(jax.grad(loss(odekit.Checkpoint(max_steps=bound, max_directions=0),
                                     counted)))
        jax.block_until_ready(grad(params))
        calls[0] = 0
        jax.block_until_ready(grad(params))
        counts[bound] = calls[0]
    steps = int(odekit.solve_ivp(lambda t, y, p: field(y, p), (0.0, 6.0), Y0, t_eval=TS,
                                 args=(params,), rtol=1e-6, atol=1e-6).stats["num_steps"])
    assert counts[64] == counts[4096], counts
    # A solve within the loop's head: two forward passes over the steps taken
    # (tsit5: 6 new stages a step; the first run and each block's
    # recomputation with its residuals), each rounded up to a block of BLOCK
    # iterations; the nest of checkpointed levels behind the head is skipped.
    assert steps + 2 <= bounded_loop.HEAD_BLOCKS * bounded_loop.BLOCK
    assert 8 * 2594 >= bounded_loop.HEAD_MIN_CLOSED_BYTES
    per_pass = 6 * (steps + bounded_loop.BLOCK + 2)
    assert counts[4096] <= 2 * per_pass + 20, (counts, steps)


@pytest.mark.long   # the field evaluations' independence of the bound is checked in CI
def test_memory_of_a_wide_network_does_not_grow_with_the_bound():
    params = mlp(64)        # 4,482 weights
    memory = {}
    for bound in (64, 4096):
        grad = jax.jit(jax.grad(loss(odekit.Checkpoint(max_steps=bound, max_directions=0))))
        analysis = grad.lower(params).compile().memory_analysis()
        memory[bound] = analysis.temp_size_in_bytes
    weights_bytes = 8 * sum(w.size + b.size for w, b in params)
    # The bound changes the number of stored carries (16 + 2 sqrt(bound / 4)), not
    # the copies of the weights: far less than one copy of them per chunk.
    assert memory[4096] - memory[64] < 8 * weights_bytes, (memory, weights_bytes)


@pytest.mark.long   # 20 s on CI's machine; the cost properties below stay in CI
def test_wide_network_gradient_matches_central_differences_and_backsolve():
    params = mlp(16)
    value = loss("checkpoint")
    grad = jax.jit(jax.grad(value))(params)
    reference = jax.jit(jax.grad(loss("backsolve")))(params)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    g = jax.flatten_util.ravel_pytree(grad)[0]
    np.testing.assert_allclose(g, jax.flatten_util.ravel_pytree(reference)[0],
                               rtol=2e-3, atol=2e-5)
    tight = jax.jit(lambda x: value(unravel(x)))
    for seed in range(3):
        direction = jax.random.normal(jax.random.PRNGKey(seed), flat.shape)
        eps = 1e-5
        difference = (tight(flat + eps * direction) - tight(flat - eps * direction)) / (2 * eps)
        np.testing.assert_allclose(g @ direction, difference, rtol=1e-6)


@pytest.mark.long
def test_gradient_under_vmap_is_each_members_gradient():
    params = mlp(8)
    scales = jnp.array([0.5, 1.0, 2.0])    # members of different step counts

    def member(scale):
        fun = lambda t, y, p: scale * field(y, p)
        return jax.grad(loss(odekit.Checkpoint(max_directions=0), fun))(params)

    batched = jax.jit(jax.vmap(member))(scales)
    alone = jax.jit(member)
    for i, scale in enumerate(scales):
        for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(alone(scale))):
            np.testing.assert_allclose(a[i], b, rtol=1e-9, atol=1e-12)
