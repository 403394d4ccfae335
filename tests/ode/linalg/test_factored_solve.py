"""Solves by a factorisation with their own derivative rule
(odekit.ode.linalg.factored_solve): dense (lax elimination and LAPACK),
banded and block-diagonal, against central differences at first and second
order, in both modes, under jit and vmap, and without differentiating the
factorisation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit.ode.linalg import linear_system, lu, sparsity
from odekit.testing import check_grads

RNG = np.random.default_rng(20261207)


def random_matrix(n, dtype=np.float64):
    """Well conditioned, with a first column that forces row swaps."""
    a = RNG.standard_normal((n, n)) + n * np.eye(n)
    a[:, 0] = RNG.standard_normal(n) * 10 ** RNG.uniform(-2, 2, n)
    return a.astype(dtype)


def band_system(n, solver):
    rows, cols = zip(*[(i, j) for i in range(n) for j in range(max(0, i - 2), min(n, i + 2))])
    pattern = sparsity.from_coordinates(n, np.array(rows), np.array(cols))
    return linear_system.structured(pattern, solver)


def block_system(blocks, size):
    rows, cols = zip(*[(k * size + i, k * size + j) for k in range(blocks)
                       for i in range(size) for j in range(size)])
    pattern = sparsity.from_coordinates(blocks * size, np.array(rows), np.array(cols))
    return linear_system.structured(pattern, "block_diagonal")


@pytest.mark.parametrize("n", [5, lu.LAX_MAX_SIZE + 2])      # lax elimination, LAPACK
def test_dense_solve_values_and_derivatives(n):
    a, b = random_matrix(n), RNG.standard_normal(n)
    # jitted once: op by op, every finite-difference point ran ~100 small programs
    solve = jax.jit(lambda m, r: lu.lu_solver(m)(r))
    np.testing.assert_allclose(solve(a, b), np.linalg.solve(a, b), rtol=1e-12)
    check_grads(solve, (jnp.asarray(a), jnp.asarray(b)), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("solver", ["banded", "block_diagonal"])
def test_structured_solve_values_and_derivatives(solver):
    system = band_system(20, "banded") if solver == "banded" else block_system(6, 3)
    assert system.solver == solver
    n, nnz = system.pattern.n, system.pattern.nnz
    values, b, shift = RNG.standard_normal(nnz), RNG.standard_normal(n), 3.0
    solve = jax.jit(lambda v, s, r: system.factor(v, s)(r))
    w = shift * np.eye(n)
    np.add.at(w, (system.pattern.rows, system.pattern.cols), -values)
    np.testing.assert_allclose(solve(values, shift, b), np.linalg.solve(w, b), rtol=1e-11)
    check_grads(solve, (jnp.asarray(values), jnp.asarray(shift), jnp.asarray(b)), order=2,
                modes=("fwd", "rev"))


def test_complex_dense_solve_derivatives():
    n = 6
    a = random_matrix(n) + 1j * RNG.standard_normal((n, n))
    b = RNG.standard_normal(n) + 1j * RNG.standard_normal(n)
    check_grads(jax.jit(lambda m, r: lu.lu_solver(m)(r)), (jnp.asarray(a), jnp.asarray(b)),
                modes=("fwd", "rev"))


def test_half_precision_solves_in_float32():
    a = random_matrix(4).astype(jnp.bfloat16)
    b = jnp.ones(4, jnp.bfloat16)
    x = jax.jit(lambda m: lu.lu_solver(m)(b))(jnp.asarray(a))
    assert x.dtype == jnp.bfloat16
    g = jax.jit(jax.grad(lambda m: jnp.sum(lu.lu_solver(m)(b).astype(jnp.float32))))(
        jnp.asarray(a))
    assert g.dtype == jnp.bfloat16
    exact = np.linalg.solve(np.asarray(a, np.float64), np.ones(4))
    np.testing.assert_allclose(np.asarray(x, np.float64), exact, rtol=2e-2, atol=2e-2)


def test_jit_vmap_and_both_modes_agree():
    batch, n = 4, 5
    a = jnp.asarray(np.stack([random_matrix(n) for _ in range(batch)]))
    b = jnp.asarray(RNG.standard_normal((batch, n)))
    solve = lambda m, r: lu.lu_solver(m)(r)
    x = jax.jit(jax.vmap(solve))(a, b)
    np.testing.assert_allclose(x, np.linalg.solve(np.asarray(a), np.asarray(b)[..., None])[..., 0],
                               rtol=1e-12)
    forward = jax.jit(jax.vmap(jax.jacfwd(solve)))(a, b)
    reverse = jax.jit(jax.vmap(jax.jacrev(solve)))(a, b)
    np.testing.assert_allclose(forward, reverse, rtol=1e-12, atol=1e-14)


def _count(jaxpr, name):
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (list, tuple)) else [value]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    total += _count(inner, name)
    return total


def test_the_factorisation_is_not_differentiated():
    """One LAPACK getrf in the gradient's program: the primal's (the
    derivative of getrf would add triangular solves and products with the
    factors for every solve; reverse mode solves with the transpose)."""
    n = lu.LAX_MAX_SIZE + 4
    a, b = jnp.asarray(random_matrix(n)), jnp.asarray(RNG.standard_normal(n))
    loss = lambda m, r: jnp.sum(lu.lu_solver(m)(r) ** 2)
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(a, b).jaxpr
    assert _count(jaxpr, "lu") == 1
    jaxpr = jax.make_jaxpr(lambda m, r, dm: jax.jvp(lambda x: lu.lu_solver(x)(r), (m,), (dm,)))(
        a, b, a).jaxpr
    assert _count(jaxpr, "lu") == 1


@pytest.mark.parametrize("n", [1, 3, lu.UNROLL_MAX + 4, lu.LAX_MAX_SIZE + 3])
def test_transposed_solves(n):
    """W^-T c from the same factors, unrolled, as fori_loop passes and by LAPACK."""
    a = random_matrix(n) + 1j * RNG.standard_normal((n, n))
    c = RNG.standard_normal(n) + 1j * RNG.standard_normal(n)
    factors = lu.factor(jnp.asarray(a))
    x = jax.jit(lu.solve_factored_transposed)(*factors, jnp.asarray(c))
    np.testing.assert_allclose(x, np.linalg.solve(a.T, c), rtol=1e-12, atol=1e-14)


def test_structured_matvec_against_dense():
    """W v by row gathers (similar rows) and by a segment sum (one long row)."""
    arrow_rows = np.r_[np.zeros(30, int), np.arange(30), np.arange(1, 30)]
    arrow_cols = np.r_[np.arange(30), np.arange(30), np.zeros(29, int)]
    arrow = linear_system.structured(sparsity.from_coordinates(30, arrow_rows, arrow_cols),
                                     "dense")
    systems = [band_system(20, "banded"), block_system(4, 3), arrow]
    assert systems[0].row_entries is not None and arrow.row_entries is None
    for system in systems:
        n, nnz = system.pattern.n, system.pattern.nnz
        values, v = RNG.standard_normal(nnz), RNG.standard_normal(n)
        w = 2.5 * np.eye(n)
        np.add.at(w, (system.pattern.rows, system.pattern.cols), -values)
        np.testing.assert_allclose(jax.jit(system.matvec)(values, 2.5, v), w @ v, rtol=1e-13)
