"""Banded LU after reverse Cuthill-McKee (odekit.ode.linalg.banded_lu) and the
trace-time orderings (odekit.ode.linalg.ordering), against dense solves."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit.ode.linalg import ordering
from odekit.ode.linalg.banded_lu import BandedLU, default_block_size

RNG = np.random.default_rng(20261206)


def band_pattern(n, lower, upper, density=1.0, rng=RNG):
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    mask = (j - i <= upper) & (i - j <= lower) & (rng.random((n, n)) < density)
    mask |= (j - i == upper) & (i - j <= lower)       # keep the full width
    rows, cols = np.nonzero(mask)
    return rows, cols


def brusselator_pattern(points):
    """1-D two-species reaction-diffusion, u and v interleaved (2 i, 2 i + 1):
    u_i couples u_{i-1}, u_i, u_{i+1}, v_i; v_i couples v_{i-1}, v_i, v_{i+1}, u_i."""
    rows, cols = [], []
    for species in (0, 1):
        for d in (-1, 0, 1):
            i = np.arange(max(0, -d), min(points, points - d))
            rows.append(2 * i + species)
            cols.append(2 * (i + d) + species)
        i = np.arange(points)
        rows.append(2 * i + species)
        cols.append(2 * i + 1 - species)
    return np.concatenate(rows), np.concatenate(cols)


def dense(n, rows, cols, values, shift):
    a = np.zeros((n, n), dtype=np.asarray(values).dtype)
    np.add.at(a, (rows, cols), -np.asarray(values))
    return a + shift * np.eye(n, dtype=a.dtype)


def values_needing_pivots(rows, cols, rng=RNG, dtype=np.float64):
    """Random values with zero or tiny diagonal entries (shift 0): no LU without pivoting."""
    values = rng.standard_normal(rows.size)
    if np.issubdtype(dtype, np.complexfloating):
        values = values + 1j * rng.standard_normal(rows.size)
    diagonal = rows == cols
    pick = rng.random(rows.size)
    values[diagonal & (pick < 0.4)] = 0.0
    values[diagonal & (pick >= 0.4) & (pick < 0.6)] = 1e-13
    return values.astype(dtype)


def check_solve(structure, rows, cols, values, shift, rtol):
    n = structure.n
    a = dense(n, rows, cols, values, shift)
    if np.linalg.cond(a) > 1e8:
        pytest.skip("random matrix too ill-conditioned")
    b = RNG.standard_normal(n).astype(values.dtype)
    # one program (run op by op, the factorisation's loops compiled ~80 small ones)
    solve = jax.jit(lambda v, s, r: structure.solve(structure.factor(v, s), r))
    x = np.asarray(solve(jnp.asarray(values), jnp.asarray(shift, dtype=values.dtype),
                         jnp.asarray(b)))
    expected = np.linalg.solve(a, b)
    np.testing.assert_allclose(x, expected, rtol=rtol, atol=rtol * np.abs(expected).max())
    return a


# ----------------------------------------------------------------- ordering ---

def test_rcm_recovers_a_shuffled_band():
    n = 300
    rows, cols = band_pattern(n, 2, 2)
    permutation = RNG.permutation(n)
    rows, cols = permutation[rows], permutation[cols]
    assert max(ordering.bandwidths(n, rows, cols)) > 50
    p = ordering.reverse_cuthill_mckee(n, rows, cols)
    assert sorted(p) == list(range(n))
    assert max(ordering.bandwidths(n, rows, cols, p)) <= 4
    s = BandedLU.build(n, rows, cols)
    assert max(s.lower, s.upper) <= 4


def test_rcm_recovers_a_shuffled_tridiagonal():
    n = 500
    rows, cols = band_pattern(n, 1, 1)
    permutation = RNG.permutation(n)
    rows, cols = permutation[rows], permutation[cols]
    p = ordering.reverse_cuthill_mckee(n, rows, cols)
    assert ordering.bandwidths(n, rows, cols, p) == (1, 1)


def test_bandwidths_and_components():
    rows = np.array([0, 1, 3, 4, 4])
    cols = np.array([1, 0, 4, 2, 4])
    assert ordering.bandwidths(6, rows, cols) == (2, 1)
    assert ordering.bandwidths(6, np.zeros(0, int), np.zeros(0, int)) == (0, 0)
    count, labels = ordering.connected_components(6, rows, cols)
    assert count == 3                     # {0, 1}, {2, 3, 4}, {5}
    assert labels[0] == labels[1] and labels[2] == labels[3] == labels[4] != labels[5]
    with pytest.raises(ValueError, match="rows and cols must lie"):
        ordering.bandwidths(3, np.array([3]), np.array([0]))


def test_choose():
    rows, cols = brusselator_pattern(2000)
    assert ordering.choose(4000, rows, cols) == "banded"
    blocks = np.arange(3000).reshape(1000, 3)
    r = np.repeat(blocks, 3, axis=1).ravel()
    c = np.tile(blocks, (1, 3)).ravel()
    assert ordering.choose(3000, r, c) == "block_diagonal"
    # small blocks (at most stacked_lu.MAX_BLOCK): block-diagonal at any n
    assert ordering.choose(30, r[r < 30], c[r < 30]) == "block_diagonal"
    # one component of 30: dense below 64 unknowns
    band_r, band_c = brusselator_pattern(15)
    assert ordering.choose(30, band_r, band_c) == "dense"
    full_r, full_c = np.nonzero(np.ones((200, 200)))
    assert ordering.choose(200, full_r, full_c) == "dense"


def test_default_block_size():
    assert default_block_size(1, 0) == 1
    assert default_block_size(4, 2) == 4            # n <= m: one dense block
    assert default_block_size(5, 2) == 3            # two blocks, at least the band width
    assert default_block_size(2000, 2) == 4         # MIN_BLOCK_SIZE
    for n in (9, 100, 1001, 8000):
        for b in (1, 2, 8, 30):
            m = default_block_size(n, b)
            assert m >= min(b, n) and m <= max(n, 1)


# ------------------------------------------------------------- solutions ---

@pytest.mark.parametrize("n, lower, upper, block_size", [
    (1, 0, 0, None), pytest.param(2, 1, 1, None, marks=pytest.mark.long),
    pytest.param(5, 1, 2, None, marks=pytest.mark.long),
    pytest.param(7, 2, 1, 16, marks=pytest.mark.long),   # n < m
    pytest.param(37, 2, 3, None, marks=pytest.mark.long), (37, 2, 3, 3), (64, 4, 4, 8),
    pytest.param(101, 5, 2, 6, marks=pytest.mark.long),     # n not a multiple of m
    (150, 8, 8, None), pytest.param(150, 3, 7, 12, marks=pytest.mark.long)])
def test_random_band_needing_pivots(n, lower, upper, block_size):
    rows, cols = band_pattern(n, lower, upper, density=0.9)
    s = BandedLU.build(n, rows, cols, block_size)
    assert s.num_blocks * s.block_size >= n
    values = values_needing_pivots(rows, cols)
    shift = 0.0 if n > 1 else 1.0
    check_solve(s, rows, cols, values, shift, rtol=1e-9)


def test_shuffled_band_with_shift():
    # its own generator: the module's draws depend on which tests ran before
    # in this process (xdist), and a random matrix may be ill-conditioned
    rng = np.random.default_rng(400)
    n = 400
    rows, cols = band_pattern(n, 3, 3, density=0.8, rng=rng)
    permutation = rng.permutation(n)
    rows, cols = permutation[rows], permutation[cols]
    s = BandedLU.build(n, rows, cols)
    assert max(s.lower, s.upper) <= 8
    values = rng.standard_normal(rows.size)
    check_solve(s, rows, cols, values, 3.0, rtol=1e-10)


@pytest.mark.parametrize("points", [1, 3, 50, pytest.param(333, marks=pytest.mark.long)])
def test_brusselator_pattern(points):
    n = 2 * points
    rows, cols = brusselator_pattern(points)
    s = BandedLU.build(n, rows, cols)
    assert max(s.lower, s.upper) <= 2
    values = values_needing_pivots(rows, cols)
    check_solve(s, rows, cols, values, 0.5, rtol=1e-9)
    assert "banded LU: n=%d" % n in s.describe() and "block size" in s.describe()


def test_the_diagonal_need_not_be_in_the_pattern():
    n = 60
    rows, cols = band_pattern(n, 2, 2)
    off = rows != cols
    rows, cols = rows[off], cols[off]
    s = BandedLU.build(n, rows, cols)
    values = RNG.standard_normal(rows.size)
    check_solve(s, rows, cols, values, 0.0, rtol=1e-9)
    check_solve(s, rows, cols, values, 2.0, rtol=1e-10)


def test_duplicate_entries_are_summed():
    n = 20
    rows, cols = band_pattern(n, 1, 1)
    rows2, cols2 = np.concatenate([rows, rows]), np.concatenate([cols, cols])
    s = BandedLU.build(n, rows2, cols2)
    values = RNG.standard_normal(rows2.size)
    check_solve(s, rows2, cols2, values, 4.0, rtol=1e-10)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-4), (np.float64, 1e-10),
                                         (np.complex64, 2e-4), (np.complex128, 1e-10)])
def test_dtypes(dtype, rtol):
    n = 90
    rows, cols = band_pattern(n, 2, 3)
    s = BandedLU.build(n, rows, cols, 8)
    values = (RNG.standard_normal(rows.size) * 0.3).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        values = values + 1j * values[::-1]
    shift = np.asarray(4.0, dtype=dtype)
    b = RNG.standard_normal(n).astype(dtype)
    factors, x = jax.jit(lambda v, sh, r: (lambda f: (f, s.solve(f, r)))(s.factor(v, sh)))(
        jnp.asarray(values), jnp.asarray(shift), jnp.asarray(b))
    assert factors.forward.dtype == dtype
    assert x.dtype == dtype
    expected = np.linalg.solve(dense(n, rows, cols, values, shift).astype(np.complex128), b)
    np.testing.assert_allclose(np.asarray(x), expected, rtol=rtol, atol=rtol)


def test_matvec_against_dense():
    n = 70
    rows, cols = band_pattern(n, 3, 1)
    s = BandedLU.build(n, rows, cols)
    values = RNG.standard_normal(rows.size)
    v = RNG.standard_normal(n)
    w = jax.jit(s.matvec)(jnp.asarray(values), jnp.asarray(1.5), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(w), dense(n, rows, cols, values, 1.5) @ v, rtol=1e-12,
                               atol=1e-12)


def test_block_size_below_the_band_is_an_error():
    rows, cols = band_pattern(40, 5, 5)
    with pytest.raises(ValueError, match="smaller than the band width"):
        BandedLU.build(40, rows, cols, block_size=3)
    s = BandedLU.build(40, rows, cols)
    with pytest.raises(ValueError, match="values must have shape"):
        s.factor(jnp.zeros(3), jnp.asarray(1.0))


# ------------------------------------------------- jit, vmap, derivatives ---

def setup_small(n=45, lower=2, upper=2, block_size=8):
    rows, cols = band_pattern(n, lower, upper)
    s = BandedLU.build(n, rows, cols, block_size)
    values = jnp.asarray(RNG.standard_normal(rows.size) * 0.5)
    b = jnp.asarray(RNG.standard_normal(n))
    return s, rows, cols, values, b


def dense_jnp(s, values, shift):
    a = jnp.zeros((s.n, s.n), values.dtype).at[s.rows, s.cols].add(-values)
    return a + shift * jnp.eye(s.n, dtype=values.dtype)


def test_jit_and_vmap():
    s, rows, cols, values, b = setup_small()
    solve = jax.jit(lambda v, sh, rhs: s.solve(s.factor(v, sh), rhs))
    batch_values = jnp.stack([values, 2 * values, -values])
    shifts = jnp.asarray([3.0, 4.0, 5.0])
    bs = jnp.stack([b, 2 * b, b[::-1]])
    x = jax.vmap(solve)(batch_values, shifts, bs)
    for k in range(3):
        expected = np.linalg.solve(dense(s.n, rows, cols, np.asarray(batch_values[k]),
                                         float(shifts[k])), np.asarray(bs[k]))
        np.testing.assert_allclose(np.asarray(x[k]), expected, rtol=1e-10, atol=1e-12)
    # factor once, solve a batch of right-hand sides
    factors = jax.jit(s.factor)(values, jnp.asarray(3.0))
    xs = jax.jit(jax.vmap(s.solve, in_axes=(None, 0)))(factors, bs)
    a = dense(s.n, rows, cols, np.asarray(values), 3.0)
    np.testing.assert_allclose(np.asarray(xs), np.linalg.solve(a, np.asarray(bs).T).T,
                               rtol=1e-10, atol=1e-12)


def test_grad_and_jvp_agree_with_dense():
    s, rows, cols, values, b = setup_small()
    weights = jnp.asarray(RNG.standard_normal(s.n))

    def banded_loss(v, sh, rhs):
        return jnp.sum(weights * s.solve(s.factor(v, sh), rhs))

    def dense_loss(v, sh, rhs):
        return jnp.sum(weights * jnp.linalg.solve(dense_jnp(s, v, sh), rhs))

    shift = jnp.asarray(2.5)
    got = jax.jit(jax.grad(banded_loss, argnums=(0, 1, 2)))(values, shift, b)
    expected = jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2)))(values, shift, b)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-9, atol=1e-12)

    tangents = (jnp.asarray(RNG.standard_normal(values.shape)), jnp.asarray(0.7),
                jnp.asarray(RNG.standard_normal(s.n)))
    solve_b = lambda v, sh, rhs: s.solve(s.factor(v, sh), rhs)
    solve_d = lambda v, sh, rhs: jnp.linalg.solve(dense_jnp(s, v, sh), rhs)
    (x1, t1) = jax.jit(lambda p, t: jax.jvp(solve_b, p, t))((values, shift, b), tangents)
    (x2, t2) = jax.jit(lambda p, t: jax.jvp(solve_d, p, t))((values, shift, b), tangents)
    np.testing.assert_allclose(np.asarray(x1), np.asarray(x2), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(t1), np.asarray(t2), rtol=1e-9, atol=1e-12)


def test_grad_through_pivoting():
    n = 40
    rows, cols = band_pattern(n, 2, 2)
    s = BandedLU.build(n, rows, cols, 6)
    values = jnp.asarray(values_needing_pivots(rows, cols))
    b = jnp.asarray(RNG.standard_normal(n))
    if np.linalg.cond(dense(n, rows, cols, np.asarray(values), 0.0)) > 1e6:
        pytest.skip("random matrix too ill-conditioned")
    loss_b = lambda v: jnp.sum(s.solve(s.factor(v, jnp.asarray(0.0)), b) ** 2)
    loss_d = lambda v: jnp.sum(jnp.linalg.solve(dense_jnp(s, v, jnp.asarray(0.0)), b) ** 2)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss_b))(values)),
                               np.asarray(jax.jit(jax.grad(loss_d))(values)), rtol=1e-7, atol=1e-9)


# ------------------------------------------------------------------ scale ---

def test_large_narrow_band_is_fast_and_linear_in_memory():
    """n = 200000, band width 2: a dense LU would need 320 GB; this is O(n m)."""
    points = 100_000
    n = 2 * points
    rows, cols = brusselator_pattern(points)
    s = BandedLU.build(n, rows, cols)
    values = jnp.asarray(RNG.standard_normal(rows.size))
    b = jnp.asarray(RNG.standard_normal(n))
    shift = jnp.asarray(10.0)
    factor, solve = jax.jit(s.factor), jax.jit(s.solve)
    start = time.perf_counter()
    factors = jax.block_until_ready(factor(values, shift))
    x = jax.block_until_ready(solve(factors, b))
    elapsed = time.perf_counter() - start                  # includes compilation
    stored = sum(leaf.size for leaf in jax.tree_util.tree_leaves(factors))
    assert stored <= 8 * n * s.block_size                  # O(n m), not O(n^2)
    residual = jax.jit(s.matvec)(values, shift, x) - b
    assert float(jnp.max(jnp.abs(residual))) < 1e-10 * float(jnp.max(jnp.abs(b))) * 10
    assert elapsed < 60.0, f"factor + solve took {elapsed:.1f} s"
