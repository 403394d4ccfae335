"""A batched dense output: ``sol.sol`` (or the whole IVPSolution) returned
from ``jax.vmap`` and evaluated outside it (issue 27, item 18): each member
at the same times, the batch axis first, against per-member solves and the
exact solution."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

K = jnp.array([0.5, 1.0, 2.0])
T = jnp.array([0.0, 0.3, 1.1, 2.0])


def decay(t, y, k):
    return -k * y


@pytest.mark.parametrize("method", ["tsit5", "rodas5p",
                                    pytest.param("kvaerno5", marks=pytest.mark.long), "auto"])
def test_batched_sol_over_y0(method):
    y0s = jnp.array([[1.0, -2.0], [0.5, 3.0], [2.0, 0.25]])

    def solve(y0):
        return odekit.solve_ivp(decay, (0.0, 2.0), y0, args=(1.3,), method=method,
                                rtol=1e-10, atol=1e-12, dense_output=True).sol

    batched = jax.vmap(solve)(y0s)
    values = batched(T)
    assert values.shape == (3, T.shape[0], 2)
    for i in range(3):
        single = solve(y0s[i])(T)
        np.testing.assert_allclose(values[i], single, rtol=1e-12, atol=1e-14)
    exact = y0s[:, None, :] * jnp.exp(-1.3 * T)[None, :, None]
    np.testing.assert_allclose(values, exact, rtol=1e-7, atol=1e-10)


def test_batched_solution_over_args_scalar_t_and_pytree():
    def solve(k):
        y0 = {"a": jnp.array(1.0), "b": jnp.array([2.0, 3.0])}
        return odekit.solve_ivp(lambda t, y, k: jax.tree.map(lambda v: -k * v, y), (0.0, 2.0),
                                y0, args=(k,), rtol=1e-10, atol=1e-12, dense_output=True)

    sols = jax.vmap(solve)(K)
    value = sols.sol(1.1)                         # scalar t: leading axes (batch,)
    assert value["a"].shape == (3,) and value["b"].shape == (3, 2)
    np.testing.assert_allclose(value["a"], jnp.exp(-K * 1.1), rtol=1e-7)
    np.testing.assert_allclose(value["b"], jnp.array([[2.0, 3.0]]) * jnp.exp(-K * 1.1)[:, None],
                               rtol=1e-7)
    grid = sols.sol(T)["b"]
    assert grid.shape == (3, T.shape[0], 2)
    for i in range(3):
        np.testing.assert_allclose(grid[i], solve(K[i]).sol(T)["b"], rtol=1e-12, atol=1e-14)


def test_batched_sol_backward_and_nested_vmap_and_jit():
    def solve(y0, k):
        return odekit.solve_ivp(decay, (2.0, 0.0), y0, args=(k,), rtol=1e-10, atol=1e-12,
                                dense_output=True).sol

    y0s = jnp.array([1.0, 2.0])
    nested = jax.vmap(jax.vmap(solve, in_axes=(None, 0)), in_axes=(0, None))(y0s[:, None], K)
    values = jax.jit(lambda s, t: s(t))(nested, T)
    assert values.shape == (2, 3, T.shape[0], 1)
    exact = y0s[:, None, None] * jnp.exp(K[None, :, None] * (2.0 - T)[None, None, :])
    np.testing.assert_allclose(values[..., 0], exact, rtol=1e-7)
