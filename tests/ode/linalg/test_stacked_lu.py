"""LU of a stack of small matrices in lax (odekit.ode.linalg.stacked_lu)
against LAPACK's batched getrf and NumPy's solve."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit.ode.linalg import stacked_lu

RNG = np.random.default_rng(7122026)


def stack(k, c, dtype=np.float64, rng=RNG):
    """K well-conditioned c x c matrices whose first column forces row swaps."""
    a = rng.standard_normal((k, c, c)) + c * np.eye(c)
    a[:, :, 0] = rng.standard_normal((k, c)) * 10 ** rng.uniform(-3, 3, (k, c))
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.standard_normal((k, c, c))
    return a.astype(dtype)


@pytest.mark.parametrize("c", [1, 2, 3, 5, 8])
def test_factors_and_permutation_equal_lapacks(c):
    a = stack(7, c)
    lu, permutation = jax.jit(stacked_lu.factor)(a)
    lapack, _, lapack_permutation = jax.lax.linalg.lu(jnp.asarray(a))
    np.testing.assert_array_equal(permutation, lapack_permutation)   # the same pivots
    np.testing.assert_allclose(lu, lapack, rtol=0,
                               atol=50 * c * np.finfo(float).eps * np.max(np.abs(lapack)))
    lower = np.tril(np.asarray(lu), -1) + np.eye(c)
    upper = np.triu(np.asarray(lu))
    permuted = np.take_along_axis(a, np.asarray(permutation)[:, :, None], axis=1)
    np.testing.assert_allclose(lower @ upper, permuted, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-4),
                                         (np.complex128, 1e-12), (np.complex64, 2e-4)])
def test_solves_match_numpy(dtype, rtol):
    a = stack(5, 4, dtype)
    b = RNG.standard_normal((5, 4)).astype(dtype)
    x = jax.jit(lambda a, b: stacked_lu.solve(*stacked_lu.factor(a), b))(a, b)
    assert x.dtype == dtype
    expected = np.linalg.solve(a.astype(np.complex128), b.astype(np.complex128)[..., None])[..., 0]
    np.testing.assert_allclose(x, expected, rtol=rtol, atol=rtol)


def test_singular_block_gives_non_finite_solution_there_only():
    a = stack(3, 3)
    a[1] = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]]
    x = np.asarray(jax.jit(lambda a, b: stacked_lu.solve(*stacked_lu.factor(a), b))(
        jnp.asarray(a), jnp.ones((3, 3))))
    assert not np.all(np.isfinite(x[1]))
    assert np.all(np.isfinite(x[[0, 2]]))


def test_vmap_grad_and_jvp_match_jnp_linalg_solve():
    a = jnp.asarray(stack(4, 3))
    b = jnp.asarray(RNG.standard_normal((4, 3)))
    ours = lambda a, b: stacked_lu.solve(*stacked_lu.factor(a), b)
    theirs = lambda a, b: jnp.linalg.solve(a, b[..., None])[..., 0]
    batch = (jnp.stack([a, 2 * a]), jnp.stack([b, -b]))
    np.testing.assert_allclose(jax.jit(jax.vmap(ours))(*batch),
                               jax.jit(jax.vmap(theirs))(*batch), rtol=1e-12)
    # jitted: op by op, the unrolled elimination's derivatives ran ~100 small programs
    loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b)))
    for x, y in zip(jax.jit(jax.grad(loss(ours), (0, 1)))(a, b),
                    jax.jit(jax.grad(loss(theirs), (0, 1)))(a, b)):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    direction = jnp.asarray(RNG.standard_normal(a.shape))
    tangent = lambda f: jax.jit(lambda m, d: jax.jvp(lambda m: f(m, b), (m,), (d,))[1])
    np.testing.assert_allclose(tangent(ours)(a, direction), tangent(theirs)(a, direction),
                               rtol=1e-10, atol=1e-12)


def test_program_is_elementwise_static_slices_and_reductions():
    """No library call, scatter or traced-index gather: what the one-kernel
    loop can compile (odekit.ode.engine.single_kernel)."""
    a, b = jnp.asarray(stack(2, 5)), jnp.ones((2, 5))
    names = {e.primitive.name for e in jax.make_jaxpr(
        lambda a, b: stacked_lu.solve(*stacked_lu.factor(a), b))(a, b).jaxpr.eqns}
    assert not names & {"lu", "triangular_solve", "scatter", "scatter-add", "dot_general",
                        "custom_call"}


def test_tall_panels_match_lapack():
    a = RNG.standard_normal((4, 6, 3))
    lu, permutation = jax.jit(stacked_lu.factor)(jnp.asarray(a))
    lapack, _, lapack_permutation = jax.lax.linalg.lu(jnp.asarray(a))
    np.testing.assert_array_equal(permutation, lapack_permutation)
    np.testing.assert_allclose(lu, lapack, rtol=1e-12, atol=1e-12)
    lower = np.tril(np.asarray(lu), -1) + np.eye(6, 3)
    upper = np.triu(np.asarray(lu)[:, :3])
    permuted = np.take_along_axis(a, np.asarray(permutation)[:, :, None], axis=1)
    np.testing.assert_allclose(lower @ upper, permuted, rtol=1e-12, atol=1e-12)
