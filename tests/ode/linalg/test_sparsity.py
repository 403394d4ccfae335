"""Compressed (colored) forward-mode Jacobians on a static sparsity pattern:
patterns from every accepted input, the greedy distance-2 coloring, the
compressed Jacobian against ``jax.jacfwd`` (jit, vmap, grad, complex state,
time derivative), the wrong-pattern check, and a block-diagonal system with
n = 100000 that never forms an n x n array."""
from __future__ import annotations

import time

import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse

from odekit.ode.linalg.sparsity import (Coloring, Pattern, as_pattern, color_columns,
                                        compressed_jacobian, pattern_mismatch, sparse_matvec,
                                        with_diagonal)


# -- test problems ------------------------------------------------------------

def robertson(y, t):
    """ngroups independent Robertson systems, state (a_0, b_0, c_0, a_1, ...)."""
    z = y.reshape(-1, 3)
    a, b, c = z[:, 0], z[:, 1], z[:, 2]
    da = -0.04 * a + 1e4 * b * c
    db = 0.04 * a - 1e4 * b * c - 3e7 * b ** 2
    dc = 3e7 * b ** 2
    return jnp.stack([da, db, dc], axis=1).reshape(-1)


def robertson_pattern(n):
    block = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 0]], bool)
    return as_pattern(scipy.sparse.block_diag([block] * (n // 3)), n)


def brusselator(y, t):
    """1-D Brusselator (Hairer & Wanner), interleaved state (u_0, v_0, u_1, v_1, ...)."""
    u, v = y[0::2], y[1::2]
    c = 0.02 * (u.shape[0] + 1) ** 2
    one, three = jnp.ones(1, y.dtype), 3 * jnp.ones(1, y.dtype)
    lap = lambda w, b: jnp.concatenate([b, w[:-1]]) - 2 * w + jnp.concatenate([w[1:], b])  # noqa: E731
    du = 1 + u * u * v - 4 * u + c * lap(u, one)
    dv = 3 * u - u * u * v + c * lap(v, three)
    return jnp.stack([du, dv], axis=1).reshape(-1)


def brusselator_pattern(n):
    rows, cols = [], []
    for i in range(n // 2):
        for r, cs in ((2 * i, [2 * i - 2, 2 * i, 2 * i + 2, 2 * i + 1]),
                      (2 * i + 1, [2 * i, 2 * i - 1, 2 * i + 1, 2 * i + 3])):
            for c in cs:
                if 0 <= c < n:
                    rows.append(r)
                    cols.append(c)
    a = scipy.sparse.coo_array((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    return as_pattern(a, n)


def laplacian_2d(m):
    """The 5-point Laplacian on an m x m grid (zero Dirichlet) plus a reaction."""
    def field(y, t):
        u = y.reshape(m, m)
        p = jnp.pad(u, 1)
        lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u
        return (lap + u * (1 - u)).reshape(-1)
    one = scipy.sparse.eye_array(m)
    d = scipy.sparse.diags_array([np.ones(m - 1), np.ones(m), np.ones(m - 1)], offsets=[-1, 0, 1])
    return field, as_pattern(scipy.sparse.kron(d, one) + scipy.sparse.kron(one, d), m * m)


def banded(y, t):
    """Lower band 1, upper band 2 (bandwidth 3): needs exactly 4 colors."""
    z = jnp.concatenate([jnp.zeros(1, y.dtype), y, jnp.zeros(2, y.dtype)])
    return jnp.sin(z[:-3]) + y * z[2:-1] + z[3:] ** 2 - 2 * z[1:-2] * t


def banded_pattern(n):
    return as_pattern(scipy.sparse.diags_array([np.ones(n - 1), np.ones(n), np.ones(n - 1),
                                                np.ones(n - 2)], offsets=[-1, 0, 1, 2]), n)


# The checks below run jitted: op by op, a Jacobian, a mismatch or a gradient
# compiled 30 to 100 small programs each.

def dense_jacobian(field, y, t):
    return np.asarray(jax.jit(jax.jacfwd(field))(y, t))


def mismatch(field, y, t, pattern, values):
    return float(jax.jit(lambda y, t, v: pattern_mismatch(field, y, t, pattern, v))(y, t, values))


def assert_valid_coloring(pattern: Pattern, coloring: Coloring):
    colors = coloring.colors[pattern.cols]
    keys = pattern.rows * coloring.num_colors + colors
    assert np.unique(keys).size == keys.size, "two columns sharing a row share a color"
    assert coloring.colors.min() >= 0 and coloring.colors.max() == coloring.num_colors - 1


CASES = {
    "banded": (banded, banded_pattern, 40, 4),
    "robertson": (robertson, robertson_pattern, 3000, 3),
    "brusselator": (brusselator, brusselator_pattern, 200, None),
}


# -- patterns -----------------------------------------------------------------

def test_as_pattern_inputs_agree():
    rng = np.random.default_rng(3)
    dense = rng.random((7, 7)) < 0.3
    expected = np.argwhere(dense)
    for source in (dense, dense.astype(float), dense.astype(int), dense.tolist(),
                   scipy.sparse.csr_array(dense), scipy.sparse.csc_matrix(dense),
                   scipy.sparse.coo_array(dense.astype(float)), jnp.asarray(dense)):
        p = as_pattern(source, 7)
        assert p.rows.dtype == np.int64 and p.cols.dtype == np.int64
        np.testing.assert_array_equal(np.stack([p.rows, p.cols], axis=1), expected)
    p = as_pattern(dense, 7)
    assert as_pattern(p, 7) is p
    np.testing.assert_array_equal(p.to_scipy().toarray(), dense)


def test_scipy_explicit_zeros_and_duplicates():
    # SciPy's num_jac reads jac_sparsity with scipy.sparse.find, which drops
    # explicitly stored zeros; duplicates are summed.
    a = scipy.sparse.coo_array((np.array([1.0, 0.0, 1.0, 1.0]),
                                (np.array([2, 0, 1, 2]), np.array([0, 1, 1, 0]))), shape=(3, 3))
    p = as_pattern(a, 3)
    np.testing.assert_array_equal(p.rows, [1, 2])
    np.testing.assert_array_equal(p.cols, [1, 0])


def test_with_diagonal():
    p = with_diagonal(as_pattern(np.array([[0, 1, 0], [0, 1, 0], [1, 0, 0]]), 3))
    np.testing.assert_array_equal(p.to_scipy().toarray(),
                                  [[1, 1, 0], [0, 1, 0], [1, 0, 1]])
    assert np.all(np.diff(p.rows * 3 + p.cols) > 0)


@pytest.mark.parametrize("bad, match", [
    (np.ones((3, 4)), r"shape \(3, 4\), expected \(3, 3\)"),
    (np.ones((2, 2)), r"expected \(3, 3\)"),
    (np.ones(3), r"must be 2-D"),
    (np.ones((3, 3, 1)), r"must be 2-D"),
    (np.array([[1.0, np.nan, 0], [0, 1, 0], [0, 0, 1]]), "NaN"),
    (scipy.sparse.csr_array(np.array([[1.0, np.nan, 0], [0, 1, 0], [0, 0, 1]])), "NaN"),
    (scipy.sparse.eye_array(4), r"expected \(3, 3\)"),
    (np.array([["a"] * 3] * 3), "dtype"),
])
def test_as_pattern_errors(bad, match):
    with pytest.raises(ValueError, match=match) as info:
        as_pattern(bad, 3)
    assert "scipy.sparse" in str(info.value)  # says what to pass


def test_as_pattern_rejects_traced_and_wrong_n():
    with pytest.raises(ValueError, match="static"):
        jax.jit(lambda s: as_pattern(s, 3) and s)(jnp.eye(3))
    with pytest.raises(ValueError, match="n = 4"):
        as_pattern(as_pattern(np.eye(4), 4), 3)


# -- coloring -----------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_coloring_counts(name):
    _, make, n, colors = CASES[name]
    pattern = make(n)
    coloring = color_columns(pattern)
    assert_valid_coloring(pattern, coloring)
    if colors is not None:
        assert coloring.num_colors == colors
    else:  # the interleaved 1-D Brusselator: band 2 on each side
        assert coloring.num_colors <= 5


@pytest.mark.parametrize("k", [1, 2, 5])
def test_coloring_block_diagonal_and_bands(k):
    n = 60
    blocks = as_pattern(scipy.sparse.block_diag([np.ones((k, k))] * (n // k)), n)
    assert color_columns(blocks).num_colors == k
    band = as_pattern(scipy.sparse.diags_array([np.ones(n - abs(d)) for d in range(-k, k + 1)],
                                               offsets=list(range(-k, k + 1))), n)
    assert color_columns(band).num_colors == 2 * k + 1


def test_coloring_random_patterns_are_valid():
    rng = np.random.default_rng(0)
    for n, density in ((1, 1.0), (5, 0.0), (30, 0.1), (50, 0.3), (40, 1.0)):
        pattern = as_pattern(rng.random((n, n)) < density, n)
        coloring = color_columns(pattern)
        assert coloring.colors.shape == (n,)
        if pattern.nnz:
            assert_valid_coloring(pattern, coloring)
        assert coloring.num_colors <= n


# -- compressed Jacobian ------------------------------------------------------

def check_values(field, y, t, pattern, values, rtol=1e-12):
    jac = dense_jacobian(field, y, t)
    np.testing.assert_allclose(values, jac[pattern.rows, pattern.cols], rtol=rtol, atol=1e-12)
    outside = jac.copy()
    outside[pattern.rows, pattern.cols] = 0
    assert not outside.any(), "the test pattern misses a nonzero"


@pytest.mark.parametrize("name", list(CASES))
def test_compressed_equals_jacfwd(name):
    field, make, n, _ = CASES[name]
    pattern = make(n)
    coloring = color_columns(pattern)
    y = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, n))
    t = jnp.asarray(0.3)
    values = jax.jit(lambda y: compressed_jacobian(field, y, t, pattern, coloring, False))(y)
    assert values.shape == (pattern.nnz,)
    check_values(field, y, t, pattern, values)
    assert mismatch(field, y, t, pattern, values) < 1e-13


def test_laplacian_2d():
    field, pattern = laplacian_2d(12)
    coloring = color_columns(pattern)
    assert_valid_coloring(pattern, coloring)
    assert coloring.num_colors <= 9
    y = jnp.asarray(np.random.default_rng(2).normal(size=144))
    values = jax.jit(lambda y: compressed_jacobian(field, y, 0.0, pattern, coloring))(y)
    check_values(field, y, 0.0, pattern, values)


def test_time_derivative():
    pattern = banded_pattern(30)
    coloring = color_columns(pattern)
    y = jnp.asarray(np.random.default_rng(4).normal(size=30))
    t = jnp.asarray(0.7)
    values, f_t = jax.jit(lambda y, t: compressed_jacobian(banded, y, t, pattern, coloring,
                                                           time_derivative=True))(y, t)
    check_values(banded, y, t, pattern, values)
    expected = jax.jit(lambda t: jax.jvp(lambda s: banded(y, s), (t,), (jnp.ones_like(t),))[1])(t)
    np.testing.assert_allclose(f_t, expected, rtol=1e-14)


def test_vmap_over_states():
    pattern = brusselator_pattern(40)
    coloring = color_columns(pattern)
    ys = jnp.asarray(np.random.default_rng(5).uniform(0.5, 2, (3, 40)))
    ts = jnp.asarray([0.0, 0.5, 1.0])
    values, f_t = jax.jit(jax.vmap(lambda y, t: compressed_jacobian(brusselator, y, t, pattern,
                                                                    coloring, True)))(ys, ts)
    assert values.shape == (3, pattern.nnz) and f_t.shape == (3, 40)
    for k in range(3):
        check_values(brusselator, ys[k], ts[k], pattern, values[k])
    mismatches = jax.jit(jax.vmap(lambda y, v: pattern_mismatch(brusselator, y, 0.0, pattern, v)))(
        ys, values)
    assert float(jnp.max(mismatches)) < 1e-13


def test_complex_state():
    n = 24
    pattern = banded_pattern(n)
    coloring = color_columns(pattern)

    def field(y, t):
        z = jnp.concatenate([jnp.zeros(1, y.dtype), y, jnp.zeros(2, y.dtype)])
        return 1j * z[:-3] + y * z[2:-1] + z[3:] ** 2

    rng = np.random.default_rng(6)
    y = jnp.asarray(rng.normal(size=n) + 1j * rng.normal(size=n))
    values = jax.jit(lambda y: compressed_jacobian(field, y, 0.0, pattern, coloring))(y)
    assert values.dtype == jnp.complex128
    expected = jax.jit(jax.jacfwd(lambda v: field(v, 0.0), holomorphic=True))(y)
    np.testing.assert_allclose(values, np.asarray(expected)[pattern.rows, pattern.cols],
                               rtol=1e-14)
    assert mismatch(field, y, 0.0, pattern, values) < 1e-13


def test_gradient_through_compressed_jacobian():
    pattern = robertson_pattern(9)
    coloring = color_columns(pattern)
    y0 = jnp.asarray(np.random.default_rng(7).uniform(0.1, 1, 9))

    def loss_sparse(scale):
        return jnp.sum(compressed_jacobian(lambda y, t: scale * robertson(y, t), y0 * scale, 0.0,
                                           pattern, coloring) ** 2)

    def loss_dense(scale):
        j = jax.jacfwd(lambda y: scale * robertson(y, 0.0))(y0 * scale)
        return jnp.sum(j ** 2)

    s = jnp.asarray(0.9)
    dense = jax.jit(jax.grad(loss_dense))(s)
    np.testing.assert_allclose(jax.jit(jax.grad(loss_sparse))(s), dense, rtol=1e-12)
    tangent = jax.jit(lambda s: jax.jvp(loss_sparse, (s,), (jnp.ones_like(s),))[1])(s)
    np.testing.assert_allclose(tangent, dense, rtol=1e-12)


def test_sparse_matvec():
    pattern = brusselator_pattern(20)
    values = jnp.asarray(np.random.default_rng(8).normal(size=pattern.nnz))
    v = jnp.asarray(np.random.default_rng(9).normal(size=20))
    dense = np.zeros((20, 20))
    dense[pattern.rows, pattern.cols] = values
    np.testing.assert_allclose(sparse_matvec(pattern, values, v), dense @ np.asarray(v),
                               rtol=1e-13, atol=1e-13)


def test_mismatch_flags_a_wrong_pattern():
    n = 30
    right = brusselator_pattern(n)
    # Drop the couplings of u_i to u_{i+1}: a nonzero outside the pattern.
    keep = ~((right.rows % 2 == 0) & (right.cols == right.rows + 2))
    wrong = Pattern(n=n, rows=right.rows[keep], cols=right.cols[keep])
    y = jnp.asarray(np.random.default_rng(10).uniform(0.5, 1.5, n))
    for pattern, small in ((right, True), (wrong, False)):
        coloring = color_columns(pattern)
        values = jax.jit(lambda y: compressed_jacobian(brusselator, y, 0.0, pattern, coloring))(y)
        found = mismatch(brusselator, y, 0.0, pattern, values)
        assert (found < 1e-13) if small else (found > 1e-2), found
    # A single missing entry of a block-diagonal system is seen too.
    full = robertson_pattern(9)
    drop = (full.rows == 3) & (full.cols == 4)
    wrong = Pattern(n=9, rows=full.rows[~drop], cols=full.cols[~drop])
    y = jnp.asarray(np.random.default_rng(11).uniform(0.5, 1.5, 9))
    coloring = color_columns(wrong)
    values = jax.jit(lambda y: compressed_jacobian(robertson, y, 0.0, wrong, coloring))(y)
    assert mismatch(robertson, y, 0.0, wrong, values) > 1e-6


def _largest_array(closed) -> int:
    """The most elements of any variable in a jaxpr, nested jaxprs included."""
    biggest = 0

    def walk(jaxpr):
        nonlocal biggest
        for eqn in jaxpr.eqns:
            for v in list(eqn.invars) + list(eqn.outvars):
                biggest = max(biggest, int(np.prod(getattr(v.aval, "shape", ()))))
            for sub in jcore.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(closed.jaxpr)
    return biggest


def test_block_diagonal_n_100000():
    n = 99_999
    start = time.perf_counter()
    pattern = robertson_pattern(n)
    coloring = color_columns(pattern)
    structural = time.perf_counter() - start
    assert coloring.num_colors == 3
    assert structural < 20.0, structural  # ~0.3 s measured; generous for a loaded CI
    y = jnp.asarray(np.random.default_rng(12).uniform(0.5, 1.5, n))
    fun = jax.jit(lambda y: compressed_jacobian(robertson, y, 0.0, pattern, coloring, True))
    closed = jax.make_jaxpr(fun)(y)
    # The largest arrays are the seeds (3 + 1, n) and the nnz values: never n x n.
    assert _largest_array(closed) <= max(4 * n, pattern.nnz)
    values, f_t = fun(y)
    assert values.shape == (pattern.nnz,) and f_t.shape == (n,)
    # Check a few blocks against jacfwd of one group.
    block_jacobian = jax.jit(jax.jacfwd(lambda z: robertson(z, 0.0)))
    for g in (0, 1234, n // 3 - 1):
        block = block_jacobian(y[3 * g:3 * g + 3])
        sel = (pattern.rows // 3) == g
        np.testing.assert_allclose(values[sel], np.asarray(block)[pattern.rows[sel] - 3 * g,
                                                                  pattern.cols[sel] - 3 * g],
                                   rtol=1e-13)
    assert mismatch(robertson, y, 0.0, pattern, values) < 1e-13
