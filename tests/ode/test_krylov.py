"""linear_solver="krylov": restarted GMRES (odekit.ode.linalg.gmres) with a
block-Jacobi preconditioner (odekit.ode.linalg.krylov), alone and inside the
stiff methods, against NumPy, the matrix exponential and central differences."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from odekit import solve_ivp
from odekit.ode.linalg import gmres, krylov, linear_system, sparsity
from odekit.testing import check_grads

GRID = 6                    # 6 x 6 grid points, two species: state 72
RATE = 2.0                  # exchange between the species


def exchange_diffusion(t, y, diffusion):
    """Two species on a periodic GRID x GRID grid (interleaved per point),
    diffusing and exchanging: a' = D lap a - k a + k b, b' = D lap b + k a - k b."""
    ab = y.reshape(GRID, GRID, 2)
    h2 = (1.0 / GRID) ** 2
    lap = (jnp.roll(ab, 1, 0) + jnp.roll(ab, -1, 0) + jnp.roll(ab, 1, 1) + jnp.roll(ab, -1, 1)
           - 4 * ab) / h2
    a, b = ab[..., 0], ab[..., 1]
    swap = RATE * (b - a)
    return (diffusion * lap + jnp.stack([swap, -swap], axis=-1)).reshape(-1)


# the field at each unit vector, one program for every diffusion
_FIELD_AT_ROWS = jax.jit(jax.vmap(exchange_diffusion, in_axes=(None, 0, None)))


def field_matrix(diffusion):
    """The (72, 72) matrix of the linear field (NumPy, for the reference)."""
    eye = jnp.eye(2 * GRID * GRID)
    return np.asarray(_FIELD_AT_ROWS(0.0, eye, jnp.asarray(diffusion, jnp.float64))).T


def initial_state():
    x = np.linspace(0.0, 1.0, GRID, endpoint=False)
    a = 1.0 + np.sin(2 * np.pi * x)[:, None] * np.cos(2 * np.pi * x)[None, :]
    return jnp.asarray(np.stack([a, 0.5 * np.ones_like(a)], axis=-1).reshape(-1))


def test_gmres_reaches_its_tolerance_real_and_complex():
    rng = np.random.default_rng(0)
    n = 120
    matrix = 3 * np.eye(n) + rng.normal(size=(n, n)) / np.sqrt(n)
    b = rng.normal(size=n)
    result = jax.jit(lambda b: gmres.solve(lambda v: matrix @ v, lambda r: r / 3, b, 1e-11, 8,
                                           40))(b)
    assert bool(result.converged) and int(result.iterations) > 8    # restarted at least once
    np.testing.assert_allclose(result.x, np.linalg.solve(matrix, b), rtol=1e-9)
    complex_matrix = matrix + 1j * rng.normal(size=(n, n)) / np.sqrt(n)
    complex_b = b + 1j * rng.normal(size=n)
    result = gmres.solve(lambda v: complex_matrix @ v, lambda r: r, jnp.asarray(complex_b),
                         1e-11, 30, 10)
    assert bool(result.converged)
    np.testing.assert_allclose(result.x, np.linalg.solve(complex_matrix, complex_b), rtol=1e-9)


def test_gmres_zero_right_hand_side_breakdown_and_no_convergence():
    ones = jnp.ones(5)
    zero = gmres.solve(lambda v: 2 * v, lambda r: r, jnp.zeros(5), 1e-12, 10, 3)
    assert bool(zero.converged) and np.all(np.asarray(zero.x) == 0) and int(zero.iterations) == 0
    diagonal = jnp.arange(1.0, 6.0)     # the Krylov space holds the solution after 5 steps
    exact = gmres.solve(lambda v: diagonal * v, lambda r: r, ones, 1e-13, 10, 2)
    assert bool(exact.converged) and int(exact.iterations) == 5
    np.testing.assert_allclose(exact.x, 1 / diagonal, rtol=1e-12)
    starved = gmres.solve(lambda v: diagonal * v, lambda r: r, ones, 1e-13, 2, 1)
    assert not bool(starved.converged)


def test_gmres_with_a_huge_or_non_finite_right_hand_side():
    """|b| would overflow for entries near 1e200 (its target became inf and
    x = 0 passed for converged, a rodas5p step then kept garbage): the
    iteration runs on b / max|b|. A non-finite b or x never converges."""
    diagonal = jnp.arange(1.0, 6.0)
    huge = jnp.array([1e200, -3e214, 2e214, 5.0, 0.0])
    result = gmres.solve(lambda v: diagonal * v, lambda r: r, huge, 1e-12, 10, 2)
    assert bool(result.converged) and int(result.iterations) > 0
    # |b - A x| <= 1e-12 |b|: each entry to 1e-12 |b| (A's smallest singular value is 1)
    np.testing.assert_allclose(result.x, huge / diagonal, rtol=0, atol=1e-12 * 3.7e214)
    overflowing = gmres.solve(lambda v: 1e-200 * v, lambda r: r, huge, 1e-12, 10, 2)
    assert not bool(overflowing.converged)                    # x = b / 1e-200 is inf
    for bad in (jnp.inf, jnp.nan):
        result = gmres.solve(lambda v: diagonal * v, lambda r: r, jnp.ones(5).at[2].set(bad),
                             1e-12, 10, 2)
        assert not bool(result.converged)
    empty = gmres.solve(lambda v: v, lambda r: r, jnp.zeros(0), 1e-12, 10, 2)
    assert bool(empty.converged) and empty.x.shape == (0,)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_rodas5p_krylov_rejects_a_step_whose_stages_overflow(dtype):
    """Robertson from y0 at rtol 1e-4: the first attempted step is far too long,
    its stages grow past 1e200 and the step must be rejected (as with the LU),
    never kept with the zero stages an overflowed norm let through."""
    def robertson(t, y):
        a, b, c = y[0], y[1], y[2]
        return jnp.stack([-0.04 * a + 1e4 * b * c, 0.04 * a - 1e4 * b * c - 3e7 * b ** 2,
                          3e7 * b ** 2])

    kwargs = dict(t_eval=jnp.array([40.0]), rtol=1e-4, atol=1e-7, method="rodas5p",
                  jac_sparsity="auto")
    y0 = jnp.array([1.0, 0.0, 0.0], dtype)
    sol = solve_ivp(robertson, (0.0, 40.0), y0, linear_solver="krylov", **kwargs)
    lu = solve_ivp(robertson, (0.0, 40.0), y0, linear_solver="dense", **kwargs)
    assert int(sol.status) == 0 and int(sol.stats["num_rejected"]) > 0
    reference = [0.7158270687, 9.185534764e-06, 0.2841637457]    # SciPy Radau, rtol 1e-12
    np.testing.assert_allclose(sol.ys[-1], reference, rtol=2e-4 if dtype == jnp.float64 else 1e-3)
    np.testing.assert_allclose(sol.ys[-1], lu.ys[-1], rtol=1e-3)


def _system(diffusion):
    y0 = initial_state()
    pattern = sparsity.as_pattern(np.abs(field_matrix(diffusion)) > 0, y0.shape[0])
    system = linear_system.structured(pattern, "krylov")
    field = lambda v, t: exchange_diffusion(t, v, diffusion)
    values = jax.jit(lambda y, t: sparsity.compressed_jacobian(
        field, y, t, system.pattern, system.coloring, False))(y0, jnp.zeros(()))
    return system, values


def test_krylov_solve_and_its_transpose_against_numpy():
    system, values = _system(0.05)
    assert system.solver == "krylov" and "GMRES" in system.describe(72)
    shift = jnp.asarray(7.0)
    w = 7.0 * np.eye(72) - field_matrix(0.05)
    b = np.cos(np.arange(72.0))
    solve = jax.jit(lambda v, b: system.factor(v, shift)(b))
    np.testing.assert_allclose(solve(values, b), np.linalg.solve(w, b), rtol=1e-8, atol=1e-12)
    solve_transposed = jax.jit(lambda v, c: system.lu.solve_transposed(
        system.lu.factor(v, shift), c))
    np.testing.assert_allclose(solve_transposed(values, jnp.asarray(b)),
                               np.linalg.solve(w.T, b), rtol=1e-8, atol=1e-12)
    # derivatives of the solve in J's values: reverse mode (the transposed
    # GMRES); forward mode too with ODEKIT_LONG_TESTS=1 (CI time)
    modes = ("fwd", "rev") if os.environ.get("ODEKIT_LONG_TESTS") == "1" else ("rev",)
    check_grads(lambda v: solve(v, b), (values,), order=1, modes=modes, rtol=1e-6, atol=1e-9)


def test_an_unconverged_solve_is_nan_never_an_inexact_answer(monkeypatch):
    system, values = _system(0.05)
    monkeypatch.setattr(krylov, "RESTART", 2)
    monkeypatch.setattr(krylov, "MAX_CYCLES", 1)
    x = jax.jit(lambda v: system.factor(v, jnp.asarray(0.5))(jnp.ones(72)))(values)
    assert np.all(np.isnan(np.asarray(x)))


@pytest.mark.parametrize("method", ["rodas5p", pytest.param("bdf", marks=pytest.mark.long),
                                    pytest.param("kvaerno5", marks=pytest.mark.long)])
def test_stiff_methods_with_krylov_against_the_matrix_exponential(method):
    """Under jit and vmap over the diffusion (one program for the batch): each
    member against its matrix exponential and its own dense-LU solve."""
    diffusions, t_eval = jnp.array([0.05, 0.02]), jnp.array([0.1, 0.5, 1.0])
    y0 = initial_state()

    def solve(diffusion, **linear):
        return solve_ivp(exchange_diffusion, (0.0, 1.0), y0, t_eval=t_eval, args=(diffusion,),
                         method=method, rtol=1e-7, atol=1e-10, **linear)

    sols = jax.jit(jax.vmap(lambda d: solve(d, jac_sparsity="auto", linear_solver="krylov")))(
        diffusions)
    np.testing.assert_array_equal(sols.status, 0)
    for i, diffusion in enumerate(diffusions):
        ys, stats = sols.ys[i], {key: int(value[i]) for key, value in sols.stats.items()
                                 if key != "order_counts"}
        matrix = field_matrix(float(diffusion))
        exact = np.stack([scipy.linalg.expm(t * matrix) @ np.asarray(y0)
                          for t in np.asarray(t_eval)])
        np.testing.assert_allclose(ys, exact, rtol=2e-5, atol=1e-8)
        dense = solve(diffusion)
        # the same steps as the dense LU's to the Krylov tolerance (rodas5p needs
        # exact solves for its order; a looser solve would show here)
        assert stats["num_steps"] == int(dense.stats["num_steps"])
        assert stats["nlinsolve"] == int(dense.stats["nlinsolve"]) > 0   # GMRES runs
        # each GMRES run makes at least one and at most RESTART * MAX_CYCLES
        # iterations; an LU makes none
        solves, iterations = stats["nlinsolve"], stats["nliniter"]
        assert solves < iterations <= krylov.RESTART * krylov.MAX_CYCLES * solves
        assert int(dense.stats["nliniter"]) == 0
        np.testing.assert_allclose(ys, dense.ys, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("method", ["rodas5p", "kvaerno5", "bdf"])
def test_gmres_iterations_in_the_stats_with_an_exact_preconditioner(method):
    """sol.stats["nliniter"]: with at most PRECONDITIONER_BLOCK unknowns the
    block-Jacobi preconditioner is W itself, so every solve converges in one
    GMRES iteration: the count equals the solves' (nonzero right-hand sides
    only: Robertson's), also per member under vmap."""
    def robertson(t, y, k1):
        a, b, c = y
        return jnp.stack([-k1 * a + 1e4 * b * c, k1 * a - 1e4 * b * c - 3e7 * b ** 2, 3e7 * b ** 2])

    def stats(k1):
        sol = solve_ivp(robertson, (0.0, 100.0), jnp.array([1.0, 0.0, 0.0]), args=(k1,),
                        method=method, rtol=1e-6, atol=1e-10, jac_sparsity="auto",
                        linear_solver="krylov")
        return sol.stats, sol.status

    batched, status = jax.jit(jax.vmap(stats))(jnp.array([0.04, 0.4]))
    np.testing.assert_array_equal(status, 0)
    np.testing.assert_array_equal(batched["nliniter"], batched["nlinsolve"])
    assert np.all(np.asarray(batched["nlinsolve"]) > 0)
    assert int(batched["nlinsolve"][0]) != int(batched["nlinsolve"][1])   # per member


@pytest.mark.long   # 40 s on CI's machine; the solve's own derivative is checked in CI
def test_rodas5p_krylov_gradient_against_central_differences():
    def loss(diffusion, scale):
        sol = solve_ivp(exchange_diffusion, (0.0, 0.5), scale * initial_state(), args=(diffusion,),
                        method="rodas5p", rtol=1e-9, atol=1e-12, jac_sparsity="auto",
                        linear_solver="krylov")
        return jnp.sum(sol.ys[-1] ** 2)

    check_grads(jax.jit(loss), (jnp.asarray(0.05), jnp.asarray(1.0)), order=1,
                modes=("rev",), rtol=1e-5, atol=1e-8)


@pytest.mark.long
def test_bdf_krylov_forward_sensitivity_against_central_differences():
    def loss(diffusion, adjoint):
        sol = solve_ivp(exchange_diffusion, (0.0, 0.3), initial_state(), args=(diffusion,),
                        method="bdf", rtol=1e-8, atol=1e-11, jac_sparsity="auto",
                        linear_solver="krylov", adjoint=adjoint)
        return jnp.sum(sol.ys[-1] ** 2)      # (the plain sum is conserved)

    forward = jax.jit(jax.jacfwd(lambda d: loss(d, "forward")))(0.05)
    step = 1e-5
    central = (loss(0.05 + step, "checkpoint") - loss(0.05 - step, "checkpoint")) / (2 * step)
    np.testing.assert_allclose(forward, central, rtol=1e-5)


# (long: the Krylov path under jit and vmap, against the matrix exponential, is
# in CI: test_stiff_methods_with_krylov_against_the_matrix_exponential[rodas5p])
@pytest.mark.long
def test_jit_and_vmap_over_the_diffusion():
    diffusions = jnp.array([0.02, 0.05, 0.08])

    def final(diffusion):
        return solve_ivp(exchange_diffusion, (0.0, 0.5), initial_state(), args=(diffusion,),
                         method="rodas5p", rtol=1e-8, atol=1e-11, jac_sparsity="auto",
                         linear_solver="krylov").ys[-1]

    batched = jax.jit(jax.vmap(final))(diffusions)
    for d, row in zip(diffusions, batched):
        expected = scipy.linalg.expm(0.5 * field_matrix(float(d))) @ np.asarray(initial_state())
        np.testing.assert_allclose(row, expected, rtol=1e-6, atol=1e-9)


def test_a_grid_no_dense_or_banded_lu_could_afford():
    """100 x 100 points, two species: n = 20,000 (a dense J would hold 3.2 GB;
    the band after RCM is about 200 wide). Against the exact solution by FFT:
    s = a + b diffuses, d = a - b diffuses and decays at 2 k."""
    grid, diffusion, rate, t_end = 100, 1e-3, RATE, 0.2

    def field(t, y, diffusion):
        ab = y.reshape(grid, grid, 2)
        lap = (jnp.roll(ab, 1, 0) + jnp.roll(ab, -1, 0) + jnp.roll(ab, 1, 1)
               + jnp.roll(ab, -1, 1) - 4 * ab) * grid ** 2
        swap = rate * (ab[..., 1] - ab[..., 0])
        return (diffusion * lap + jnp.stack([swap, -swap], axis=-1)).reshape(-1)

    x = np.arange(grid) / grid
    a0 = 1 + 0.5 * np.sin(2 * np.pi * x)[:, None] * np.cos(4 * np.pi * x)[None, :]
    b0 = 1 + 0.5 * np.cos(2 * np.pi * x)[:, None] ** 2 * np.sin(2 * np.pi * x)[None, :]
    sol = jax.jit(lambda y0: solve_ivp(field, (0.0, t_end), y0, t_eval=jnp.array([t_end]),
                                       args=(diffusion,), method="rodas5p", rtol=1e-6,
                                       atol=1e-9, jac_sparsity="auto",
                                       linear_solver="krylov"))(
        jnp.asarray(np.stack([a0, b0], axis=-1).reshape(-1)))
    assert int(sol.status) == 0
    waves = 2 * np.pi * np.fft.fftfreq(grid, 1.0 / grid)
    laplacian = (2 * np.cos(waves / grid)[:, None] + 2 * np.cos(waves / grid)[None, :] - 4) * grid ** 2
    evolve = lambda v, decay: np.real(np.fft.ifft2(
        np.exp((diffusion * laplacian - decay) * t_end) * np.fft.fft2(v)))
    s, d = evolve(a0 + b0, 0.0), evolve(a0 - b0, 2 * rate)
    exact = np.stack([(s + d) / 2, (s - d) / 2], axis=-1).reshape(-1)
    np.testing.assert_allclose(sol.ys[0], exact, rtol=1e-5, atol=1e-8)


def _exact_at_half(diffusion):
    return scipy.linalg.expm(0.5 * field_matrix(diffusion)) @ np.asarray(initial_state())


@pytest.mark.long   # GMRES's complex arithmetic is checked in CI (first test above)
def test_a_complex_state_with_krylov():
    diffusion, t_eval = 0.05, jnp.array([0.5])
    y0 = initial_state()
    exact = _exact_at_half(diffusion)
    complex_y0 = (1 + 0.5j) * y0.astype(jnp.complex128)
    sol = solve_ivp(exchange_diffusion, (0.0, 0.5), complex_y0, t_eval=t_eval, args=(diffusion,),
                    method="rodas5p", rtol=1e-8, atol=1e-11, jac_sparsity="auto",
                    linear_solver="krylov")
    np.testing.assert_allclose(sol.ys[0], (1 + 0.5j) * exact, rtol=1e-6, atol=1e-9)


@pytest.mark.long
def test_a_float32_state_with_krylov():
    diffusion, t_eval = 0.05, jnp.array([0.5])
    y0 = initial_state()
    exact = _exact_at_half(diffusion)
    single = solve_ivp(exchange_diffusion, (0.0, 0.5), y0.astype(jnp.float32), t_eval=t_eval,
                       args=(jnp.float32(diffusion),), method="bdf", rtol=1e-4, atol=1e-6,
                       jac_sparsity="auto", linear_solver="krylov")
    assert single.ys.dtype == jnp.float32 and int(single.status) == 0
    np.testing.assert_allclose(single.ys[0], exact, rtol=2e-3, atol=1e-4)
