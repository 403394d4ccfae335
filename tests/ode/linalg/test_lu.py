"""Dense LU (odekit.ode.linalg.lu): the lax Gaussian elimination for small
systems against LAPACK's, and the stiff methods' loop in one CPU kernel."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.testing.problems import robertson_groups
from odekit.ode.engine import single_kernel
from odekit.ode.linalg import lu

RNG = np.random.default_rng(6122027)
CPU = jax.default_backend() == "cpu"
LAPACK_CALL = "custom_call_target=\"lapack_"


def random_matrix(n, dtype=np.float64, rng=RNG):
    """A well-conditioned matrix whose first column forces row swaps."""
    a = rng.standard_normal((n, n)) + n * np.eye(n)
    a[:, 0] = rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)
    return a.astype(dtype)


@pytest.mark.parametrize("n", [1, 2, 3, 6, 12, 30])
def test_elimination_matches_lapack_factors_and_pivots(n):
    a = random_matrix(n)
    factors, pivots = jax.jit(lu.eliminate)(a)
    lapack, lapack_pivots, _ = jax.lax.linalg.lu(a)
    np.testing.assert_array_equal(pivots, lapack_pivots)   # the same row swaps
    np.testing.assert_allclose(factors, lapack, rtol=0, atol=50 * n * np.finfo(float).eps
                               * np.max(np.abs(lapack)))
    order = np.arange(n)
    for k, p in enumerate(np.asarray(pivots)):
        order[[k, p]] = order[[p, k]]
    lower = np.tril(factors, -1) + np.eye(n)
    upper = np.triu(factors)
    np.testing.assert_allclose(lower @ upper, a[order], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n", [1, 3, 12, 30])
def test_substitution_solves_to_rounding(n):
    a, b = random_matrix(n), RNG.standard_normal(n)
    x = jax.jit(lambda a, b: lu.substitute(*lu.eliminate(a), b))(a, b)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-12, atol=1e-13)


def test_size_rule_chooses_the_implementation(monkeypatch):
    a, b = random_matrix(5), RNG.standard_normal(5)
    monkeypatch.setattr(lu, "LAX_MAX_SIZE", 5)
    names = {e.primitive.name for e in jax.make_jaxpr(lambda a: lu.factor(a))(a).jaxpr.eqns}
    assert "lu" not in names
    with_lax = lu.lu_solver(a)(b)
    monkeypatch.setattr(lu, "LAX_MAX_SIZE", 4)
    names = {e.primitive.name for e in jax.make_jaxpr(lambda a: lu.factor(a))(a).jaxpr.eqns}
    assert "lu" in names
    np.testing.assert_allclose(with_lax, lu.lu_solver(a)(b), rtol=1e-13)


def test_singular_matrix_gives_non_finite_solution():
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]])
    x = jax.jit(lambda a: lu.lu_solver(a)(jnp.ones(3)))(jnp.asarray(a))
    assert not np.all(np.isfinite(x))


def test_float32_and_half_precision():
    a, b = random_matrix(6, np.float32), RNG.standard_normal(6).astype(np.float32)
    x = jax.jit(lambda a, b: lu.lu_solver(a)(b))(a, b)
    assert x.dtype == jnp.float32
    np.testing.assert_allclose(x, np.linalg.solve(a.astype(float), b.astype(float)), rtol=2e-5,
                               atol=2e-5)
    half = jax.jit(lambda a, b: lu.lu_solver(a)(b))(jnp.asarray(a, jnp.bfloat16),
                                                    jnp.asarray(b, jnp.bfloat16))
    assert half.dtype == jnp.bfloat16


def test_vmap_and_gradients_match_lapack():
    a = jnp.asarray(np.stack([random_matrix(4) for _ in range(3)]))
    b = jnp.asarray(RNG.standard_normal((3, 4)))
    solve = lambda a, b: lu.substitute(*lu.eliminate(a), b)
    # each jitted: op by op, the elimination's derivatives ran ~100 small programs
    np.testing.assert_allclose(jax.jit(jax.vmap(solve))(a, b),
                               jnp.linalg.solve(a, b[..., None])[..., 0], rtol=1e-12)
    loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b)))
    ours = jax.jit(jax.grad(loss(solve), (0, 1)))(a[0], b[0])
    theirs = jax.jit(jax.grad(loss(jnp.linalg.solve), (0, 1)))(a[0], b[0])
    for x, y in zip(ours, theirs):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    tangent = lambda f: jax.jit(lambda m, d: jax.jvp(lambda m: f(m, b[0]), (m,), (d,))[1])
    np.testing.assert_allclose(tangent(solve)(a[0], a[1]), tangent(jnp.linalg.solve)(a[0], a[1]),
                               rtol=1e-10, atol=1e-12)


def test_small_dot_matches_matmul():
    a, b, v = RNG.standard_normal((4, 7)), RNG.standard_normal((7, 5)), RNG.standard_normal(7)
    np.testing.assert_allclose(lu.dot(a, b), a @ b, rtol=1e-14)
    np.testing.assert_allclose(lu.dot(v, b), v @ b, rtol=1e-14)
    np.testing.assert_allclose(lu.dot(v, v), v @ v, rtol=1e-14)
    for shapes in [((0,), (0, 3)), ((2, 0), (0, 3)), ((0,), (0,)), ((1,), (1, 4))]:
        x, y = (RNG.standard_normal(s) for s in shapes)
        assert lu.dot(x, y).shape == (x @ y).shape
        np.testing.assert_allclose(lu.dot(x, y), x @ y, rtol=1e-14)
    # no reduce and no dot_general: under vmap XLA hands large ones to library
    # kernels that a one-kernel loop cannot call
    names = {e.primitive.name for e in jax.make_jaxpr(jax.vmap(lu.dot, (None, 0)))(
        a, jnp.stack([b] * 40)).jaxpr.eqns}
    assert not names & {"reduce_sum", "dot_general"}


# --- the stiff methods on small states: one CPU kernel ----------------------

robertson = robertson_groups         # (t, y, k1, k2, k3), any number of 3-species groups


RATES = (jnp.asarray(0.04), jnp.asarray(3e7), jnp.asarray(1e4))
T_EVAL = jnp.array([1.0, 1e3, 1e5])


def solve(method, groups=2, dtype=jnp.float64, rates=RATES, field=robertson, t_eval=T_EVAL):
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0], dtype), groups)
    rates = tuple(jnp.asarray(k, dtype) for k in rates)
    atol = 1e-10 if dtype == jnp.float64 else 1e-7
    rtol = 1e-6 if dtype == jnp.float64 else 1e-4
    return odekit.solve_ivp(field, (0.0, 1e5), y0, t_eval=t_eval.astype(dtype), args=rates,
                            method=method, rtol=rtol, atol=atol)


def test_robertson_is_eligible_for_one_kernel_unless_large_or_structured(monkeypatch):
    y0, t0 = jnp.ones(6), jnp.zeros(())
    func = lambda y, t, *rates: robertson(t, y, *rates)   # the engine's argument order
    if CPU:
        assert single_kernel.stiff_linear_algebra_fits(func, y0, t0, RATES)
    matrix_product = lambda y, t: jnp.ones((6, 6)) @ y
    assert not single_kernel.stiff_linear_algebra_fits(matrix_product, y0, t0, ())
    monkeypatch.setattr(lu, "LAX_MAX_SIZE", 5)
    assert not single_kernel.stiff_linear_algebra_fits(func, y0, t0, RATES)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
@pytest.mark.parametrize("method", ["rodas5p", "kvaerno5", "bdf"])
def test_stiff_methods_in_one_kernel_agree_with_lapack_path(method, monkeypatch):
    fresh = lambda t, y, *k: robertson(t, y, *k)   # odekit's inner jit caches by the field
    run = jax.jit(lambda rates: solve(method, 2, rates=rates).ys)
    hlo = run.lower(RATES).compile().as_text()
    assert 'xla_cpu_small_call="true"' in hlo and LAPACK_CALL not in hlo
    ours = run(RATES)
    monkeypatch.setattr(lu, "LAX_MAX_SIZE", 0)   # LAPACK, kernel by kernel (segments)
    lapack = jax.jit(lambda rates: solve(method, 2, rates=rates, field=fresh).ys)
    assert LAPACK_CALL in lapack.lower(RATES).compile().as_text()
    # the segmented loop clips steps at output times: agreement to the
    # solution's accuracy, not to rounding (as tests/ode/test_single_kernel.py)
    np.testing.assert_allclose(ours, lapack(RATES), rtol=2e-5, atol=1e-9)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_one_kernel_stiff_solve_matches_lapack_to_rounding_without_segments(monkeypatch):
    """With one output time the two loops (one kernel; segments) take the same
    steps: the lax LU and LAPACK's agree to rounding."""
    fresh = lambda t, y, *k: robertson(t, y, *k)   # odekit's inner jit caches by the field
    kwargs = dict(t_eval=jnp.array([1e5]))
    ours = jax.jit(lambda r: solve("rodas5p", 1, rates=r, **kwargs).ys)(RATES)
    monkeypatch.setattr(lu, "LAX_MAX_SIZE", 0)
    lapack = jax.jit(lambda r: solve("rodas5p", 1, rates=r, field=fresh, **kwargs).ys)(RATES)
    np.testing.assert_allclose(ours, lapack, rtol=1e-9, atol=1e-14)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
@pytest.mark.parametrize("method", ["rodas5p", pytest.param("bdf", marks=pytest.mark.long)])
def test_one_kernel_stiff_solve_under_vmap_and_grad(method):
    k1s = jnp.array([0.03, 0.04, 0.05])
    one = lambda k1: solve(method, 1, rates=(k1, *RATES[1:])).ys
    batched = jax.jit(jax.vmap(one))(k1s)
    for k1, row in zip(k1s, batched):
        np.testing.assert_allclose(row, jax.jit(one)(k1), rtol=1e-12, atol=1e-16)
    loss = lambda k1: jnp.sum(one(k1)[:, 1]) * 1e4
    grad = jax.jit(jax.grad(loss))(k1s[1])
    step = 1e-4 * k1s[1]
    tight = lambda k1: jnp.sum(odekit.solve_ivp(
        robertson, (0.0, 1e5), jnp.array([1.0, 0.0, 0.0]), t_eval=T_EVAL,
        args=(k1, *RATES[1:]), method="rodas5p", rtol=1e-10, atol=1e-14).ys[:, 1]) * 1e4
    fd = (tight(k1s[1] + step) - tight(k1s[1] - step)) / (2 * step)
    np.testing.assert_allclose(grad, fd, rtol=2e-3)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_one_kernel_stiff_solve_in_float32():
    ys = jax.jit(lambda: solve("rodas5p", 2, jnp.float32).ys)()
    assert ys.dtype == jnp.float32
    reference = solve("rodas5p", 2).ys
    np.testing.assert_allclose(ys, reference, rtol=2e-3, atol=1e-6)
