"""Block-diagonal LU over the pattern's connected components
(odekit.ode.linalg.block_diagonal_lu), against dense solves."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit.ode.linalg.block_diagonal_lu import BlockDiagonalLU

RNG = np.random.default_rng(6122026)


def block_pattern(sizes, shuffle=True, rng=RNG):
    rows, cols, offset = [], [], 0
    for size in sizes:
        i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
        rows.append(i.ravel() + offset)
        cols.append(j.ravel() + offset)
        offset += size
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    if shuffle:
        permutation = rng.permutation(offset)
        rows, cols = permutation[rows], permutation[cols]
    return offset, rows, cols


def robertson_pattern(groups):
    """Robertson's 3-species mechanism repeated ``groups`` times: 3 x 3 blocks
    (y1' couples y1, y2, y3; y2' all; y3' only y2)."""
    local_r = np.array([0, 0, 0, 1, 1, 1, 2])
    local_c = np.array([0, 1, 2, 0, 1, 2, 1])
    base = 3 * np.arange(groups)[:, None]
    return 3 * groups, (base + local_r).ravel(), (base + local_c).ravel()


def dense(n, rows, cols, values, shift):
    a = np.zeros((n, n), dtype=np.asarray(values).dtype)
    np.add.at(a, (rows, cols), -np.asarray(values))
    return a + shift * np.eye(n, dtype=a.dtype)


def pivoting_values(s, rows, cols, rng=RNG):
    """Zero diagonal entries in components of size > 1 (with shift 0): pivoting is needed."""
    values = rng.standard_normal(rows.size)
    size = np.bincount(s.labels)[s.labels]
    values[(rows == cols) & (size[rows] > 1) & (rng.random(rows.size) < 0.6)] = 0.0
    return values


def check(s, rows, cols, values, shift, rtol=1e-9):
    a = dense(s.n, rows, cols, values, shift)
    b = RNG.standard_normal(s.n)
    expected = np.linalg.solve(a, b)
    factors = jax.jit(s.factor)(jnp.asarray(values), jnp.asarray(shift))
    x = jax.jit(s.solve)(factors, jnp.asarray(b))
    residual = a @ np.asarray(x) - b
    assert np.abs(residual).max() <= rtol * (np.abs(a).max() * np.abs(expected).max() + 1)
    cond = np.linalg.cond(a)
    np.testing.assert_allclose(np.asarray(x), expected, rtol=0,
                               atol=max(rtol, 1e-15 * cond) * np.abs(expected).max())


@pytest.mark.parametrize("sizes", [[1], [3, 3, 3], [1, 2, 5, 3, 7, 2, 1],
                                   list(range(1, 12)) + [40, 17, 9]])
def test_unequal_blocks_need_pivots(sizes):
    n, rows, cols = block_pattern(sizes)
    s = BlockDiagonalLU.build(n, rows, cols)
    assert s.num_components == len(sizes)
    shift = 0.0 if n > 1 else 1.0
    check(s, rows, cols, pivoting_values(s, rows, cols), shift)
    assert s.describe().startswith(f"block-diagonal LU: n={n}, {len(sizes)} components")


def test_grouping_rule():
    n, rows, cols = block_pattern([3, 3, 5, 5, 5])
    s = BlockDiagonalLU.build(n, rows, cols)
    assert sorted(s.group_shapes) == [(2, 3), (3, 5)]           # exact sizes, no padding
    n, rows, cols = block_pattern(list(range(1, 12)))
    s = BlockDiagonalLU.build(n, rows, cols)                   # 11 sizes: octaves
    assert sorted(c for _, c in s.group_shapes) == [1, 2, 4, 8, 11]
    assert s.padding_index.size > 0


def test_robertson_groups():
    n, rows, cols = robertson_pattern(100)
    s = BlockDiagonalLU.build(n, rows, cols)
    assert s.group_shapes == ((100, 3),) and s.padding_index.size == 0
    assert s.in_order                        # blocks in order: the solve reshapes, no gathers
    n_shuffled, r_shuffled, c_shuffled = block_pattern([3] * 5)
    assert not BlockDiagonalLU.build(n_shuffled, r_shuffled, c_shuffled).in_order
    check(s, rows, cols, RNG.standard_normal(rows.size) * 1e4, 1e3)
    # 1000 groups: checked by the residual (no dense matrix)
    n, rows, cols = robertson_pattern(1000)
    s = BlockDiagonalLU.build(n, rows, cols)
    assert s.group_shapes == ((1000, 3),)
    values = jnp.asarray(RNG.standard_normal(rows.size) * 1e4)
    shift = jnp.asarray(1e3)
    b = jnp.asarray(RNG.standard_normal(n))
    x = jax.jit(s.solve)(jax.jit(s.factor)(values, shift), b)
    residual = jax.jit(s.matvec)(values, shift, x) - b
    assert float(jnp.max(jnp.abs(residual))) < 1e-9


def test_diagonal_not_in_pattern_and_isolated_unknowns():
    n, rows, cols = block_pattern([4, 1, 2, 4])
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]                        # the 1-block vanishes
    s = BlockDiagonalLU.build(n, rows, cols)
    assert s.num_components == 4
    check(s, rows, cols, RNG.standard_normal(rows.size), 2.0)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-4), (np.complex64, 1e-4),
                                         (np.complex128, 1e-11)])
def test_dtypes(dtype, rtol):
    n, rows, cols = block_pattern([2, 3, 3, 5])
    s = BlockDiagonalLU.build(n, rows, cols)
    values = RNG.standard_normal(rows.size).astype(dtype) * 0.3
    if np.issubdtype(dtype, np.complexfloating):
        values = values + 1j * values[::-1]
    shift = np.asarray(3.0, dtype=dtype)
    b = RNG.standard_normal(n).astype(dtype)
    # one program (op by op, the solve ran ~50 small ones for each dtype)
    x = jax.jit(lambda v, sh, r: s.solve(s.factor(v, sh), r))(
        jnp.asarray(values), jnp.asarray(shift), jnp.asarray(b))
    assert x.dtype == dtype
    expected = np.linalg.solve(dense(n, rows, cols, values, shift).astype(np.complex128), b)
    np.testing.assert_allclose(np.asarray(x), expected, rtol=rtol, atol=rtol)


def test_matvec_vmap_grad_jvp():
    n, rows, cols = block_pattern([2, 3, 3, 6, 1])
    s = BlockDiagonalLU.build(n, rows, cols)
    values = jnp.asarray(RNG.standard_normal(rows.size) * 0.5)
    b = jnp.asarray(RNG.standard_normal(n))
    v = RNG.standard_normal(n)
    np.testing.assert_allclose(np.asarray(jax.jit(s.matvec)(values, jnp.asarray(2.0),
                                                            jnp.asarray(v))),
                               dense(n, rows, cols, np.asarray(values), 2.0) @ v, rtol=1e-12)

    def dense_jnp(vals, shift):
        a = jnp.zeros((n, n), vals.dtype).at[rows, cols].add(-vals)
        return a + shift * jnp.eye(n, dtype=vals.dtype)

    solve_s = lambda vals, sh, rhs: s.solve(s.factor(vals, sh), rhs)
    solve_d = lambda vals, sh, rhs: jnp.linalg.solve(dense_jnp(vals, sh), rhs)
    batch = (jnp.stack([values, -values]), jnp.asarray([3.0, 4.0]), jnp.stack([b, 2 * b]))
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(solve_s))(*batch)),
                               np.asarray(jax.jit(jax.vmap(solve_d))(*batch)), rtol=1e-10,
                               atol=1e-12)

    weights = jnp.asarray(RNG.standard_normal(n))
    shift = jnp.asarray(2.5)
    got = jax.jit(jax.grad(lambda *p: jnp.sum(weights * solve_s(*p)), argnums=(0, 1, 2)))(
        values, shift, b)
    expected = jax.jit(jax.grad(lambda *p: jnp.sum(weights * solve_d(*p)), argnums=(0, 1, 2)))(
        values, shift, b)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-9, atol=1e-12)
    tangents = (jnp.asarray(RNG.standard_normal(rows.size)), jnp.asarray(0.3),
                jnp.asarray(RNG.standard_normal(n)))
    _, t1 = jax.jit(lambda p, t: jax.jvp(solve_s, p, t))((values, shift, b), tangents)
    _, t2 = jax.jit(lambda p, t: jax.jvp(solve_d, p, t))((values, shift, b), tangents)
    np.testing.assert_allclose(np.asarray(t1), np.asarray(t2), rtol=1e-9, atol=1e-12)


def test_small_blocks_compile_without_library_calls():
    """Blocks of at most stacked_lu.MAX_BLOCK unknowns: stacks gathered, the
    LU in lax, so a stiff loop holding them may be one CPU kernel
    (odekit.ode.engine.single_kernel trusts this and does not trace them)."""
    from odekit.ode.engine import single_kernel
    from odekit.ode.linalg import linear_system, sparsity

    def primitives(fn, *args):
        names = set()

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                if eqn.primitive.name == "custom_linear_solve":
                    # lowered as its solve; forward mode adds the matvec's
                    # tangent (the transposed solve is reverse mode only,
                    # never inside the one-kernel loop)
                    walk(eqn.params["jaxprs"].solve.jaxpr)
                    walk(eqn.params["jaxprs"].matvec.jaxpr)
                    continue
                names.add(eqn.primitive.name)
                for value in eqn.params.values():
                    for sub in (value if isinstance(value, (list, tuple)) else [value]):
                        inner = getattr(sub, "jaxpr", sub)
                        if hasattr(inner, "eqns"):
                            walk(inner)
        walk(jax.make_jaxpr(fn)(*args).jaxpr)
        return names

    n, rows, cols = robertson_pattern(20)
    s = BlockDiagonalLU.build(n, rows, cols)
    assert s.in_lax
    values, b = jnp.asarray(RNG.standard_normal(rows.size)), jnp.asarray(RNG.standard_normal(n))
    names = primitives(lambda v, x: s.solve(s.factor(v, jnp.asarray(2.0)), x), values, b)
    assert names <= single_kernel.LINEAR_ALGEBRA_ALLOWED, names - single_kernel.LINEAR_ALGEBRA_ALLOWED
    # a small "dense" structured system gathers J (no scatter)
    pattern = sparsity.from_coordinates(4, np.array([0, 1, 2, 3, 0]), np.array([1, 2, 3, 0, 0]))
    system = linear_system.structured(pattern, "dense")
    names = primitives(lambda v, x: system.factor(v, jnp.asarray(2.0))(x),
                       jnp.ones(system.pattern.nnz), jnp.ones(4))
    assert names <= single_kernel.LINEAR_ALGEBRA_ALLOWED, names - single_kernel.LINEAR_ALGEBRA_ALLOWED
    n, rows, cols = block_pattern([3, 12])                       # a block of 12: LAPACK
    assert not BlockDiagonalLU.build(n, rows, cols).in_lax
