"""solve_ivp with jac_sparsity / linear_solver / lband, uband (issue 28): the
stiff methods on J's nonzeros (colored forward mode) and a structured LU
(banded after RCM, block-diagonal, or dense from the colored values), against
the dense path and SciPy; jit, vmap, gradients, events and dense output on
the sparse path; a wrong pattern fails loudly; a size the dense path could
not hold."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest
import scipy.integrate
import scipy.sparse

import odekit
from odekit.testing.problems import brusselator_1d
from odekit import status as codes
from odekit.testing import check_grads

PARAMS = jnp.array([1.0, 3.0, 1.0 / 50.0])     # Brusselator's A, B, alpha


brusselator = brusselator_1d


def initial_state(n):
    x = np.arange(1, n + 1) / (n + 1)
    return jnp.asarray(np.stack([1 + np.sin(2 * np.pi * x), np.full(n, 3.0)], axis=1).ravel())


def band(size, width=2):
    offsets = list(range(-width, width + 1))
    return scipy.sparse.diags_array([np.ones(size - abs(k)) for k in offsets], offsets=offsets,
                                    shape=(size, size))


def robertson_groups(t, y, k):
    """ngroups independent Robertson systems, y (3 * ngroups,)."""
    g = y.reshape(-1, 3)
    r1, r2, r3 = k[0] * g[:, 0], k[1] * g[:, 1] ** 2, k[2] * g[:, 1] * g[:, 2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2], axis=1).reshape(-1)


RATES = jnp.array([0.04, 3e7, 1e4])
N = 40                        # grid points: state 80
Y0 = initial_state(N)
T_EVAL = jnp.array([1.0, 5.0, 10.0])


def scipy_reference(fun, y0, t_eval, t_end, args, rtol=1e-10, atol=1e-12):
    jitted = jax.jit(fun)
    field = lambda t, y: np.asarray(jitted(t, jnp.asarray(y), *args))
    jac = jax.jit(jax.jacfwd(fun, argnums=1))
    sol = scipy.integrate.solve_ivp(field, (0.0, t_end), np.asarray(y0), method="Radau",
                                    t_eval=np.asarray(t_eval), rtol=rtol, atol=atol,
                                    jac=lambda t, y: np.asarray(jac(t, jnp.asarray(y), *args)))
    return sol.y.T


@pytest.fixture(scope="module")
def brusselator_reference():
    return scipy_reference(brusselator, Y0, T_EVAL, 10.0, (PARAMS,))


@pytest.mark.parametrize("method, sparsity, solver", [
    ("rodas5p", "auto", "auto"), ("kvaerno5", "given", "banded"), ("rodas5p", "auto", "dense"),
    ("kvaerno5", "lband", "auto")])
def test_sparse_paths_match_the_dense_one_and_scipy(method, sparsity, solver,
                                                     brusselator_reference):
    kw = dict(t_eval=T_EVAL, args=(PARAMS,), method=method, rtol=1e-7, atol=1e-10)
    if sparsity == "lband":
        structure = dict(lband=2, uband=2)
    else:
        structure = dict(jac_sparsity=band(2 * N) if sparsity == "given" else sparsity)
    sparse = odekit.solve_ivp(brusselator, (0.0, 10.0), Y0, linear_solver=solver,
                              **structure, **kw)
    dense = odekit.solve_ivp(brusselator, (0.0, 10.0), Y0, **kw)
    # the same J to rounding: the same steps
    assert int(sparse.stats["num_steps"]) == int(dense.stats["num_steps"])
    np.testing.assert_allclose(sparse.ys, dense.ys, rtol=1e-8, atol=1e-10)
    scale = np.abs(brusselator_reference) * 1e-7 + 1e-10
    assert np.max(np.abs(sparse.ys - brusselator_reference) / scale) < 100


def test_block_diagonal_groups_match_one_group():
    groups = 50
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), groups)
    t_eval = jnp.array([1.0, 1e2, 1e5])
    kw = dict(t_eval=t_eval, args=(RATES,), method="rodas5p", rtol=1e-6, atol=1e-10)
    many = odekit.solve_ivp(robertson_groups, (0.0, 1e5), y0, jac_sparsity="auto", **kw)
    reference = scipy_reference(robertson_groups, y0[:3], t_eval, 1e5, (RATES,))
    ys = np.asarray(many.ys).reshape(3, groups, 3)
    for g in (0, groups - 1):
        np.testing.assert_allclose(ys[:, g], reference, rtol=1e-4, atol=1e-9)
    assert int(many.stats["njev"]) > 0


def test_the_structure_chosen():
    from odekit.ode.linalg import linear_system
    from odekit.ode import linear_options
    system, _ = linear_options.system_for(robertson_groups, jnp.zeros(()), jnp.ones(300),
                                          (RATES,), "rodas5p", "auto", "auto", None, None, "t")
    assert system.solver == "block_diagonal" and system.coloring.num_colors == 3
    system, _ = linear_options.system_for(brusselator, jnp.zeros(()), initial_state(200),
                                          (PARAMS,), "rodas5p", "auto", "auto", None, None, "t")
    assert system.solver == "banded" and system.coloring.num_colors == 4   # u_i: u_{i+-1}, v_i
    assert isinstance(system, linear_system.Structured)


def test_a_wrong_pattern_fails_loudly():
    wrong = band(2 * N, width=1)          # misses the u_i - u_{i+1} coupling
    kw = dict(t_eval=T_EVAL, args=(PARAMS,), method="rodas5p", jac_sparsity=wrong)
    with pytest.raises(odekit.ODESolverError, match="jac_sparsity"):
        odekit.solve_ivp(brusselator, (0.0, 10.0), Y0, **kw)
    # throw=False, traced y0 (inside jit): checked when the program runs
    sol = jax.jit(lambda y: odekit.solve_ivp(brusselator, (0.0, 10.0), y, throw=False, **kw))(Y0)
    assert int(sol.status) == codes.BAD_SPARSITY and not bool(sol.success)
    # found before the first step: no step on the wrong Jacobian, no values
    assert int(sol.stats["num_steps"]) == 0
    assert np.all(np.isnan(np.asarray(sol.ys)))
    # an empty pattern (the stiff method would step like an explicit one, for
    # millions of steps) stops there too
    empty = odekit.solve_ivp(brusselator, (0.0, 10.0), Y0, throw=False,
                             **dict(kw, jac_sparsity=np.zeros((2 * N, 2 * N), bool)))
    assert int(empty.status) == codes.BAD_SPARSITY and int(empty.stats["num_steps"]) == 0


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="linear_solver"):
        odekit.solve_ivp(brusselator, (0.0, 1.0), Y0, args=(PARAMS,), method="rodas5p",
                         linear_solver="lapack")
    with pytest.raises(ValueError, match="stiff methods"):
        odekit.solve_ivp(brusselator, (0.0, 1.0), Y0, args=(PARAMS,), method="tsit5",
                         jac_sparsity="auto")
    with pytest.raises(ValueError, match="shape|\\(80, 80\\)|n = 80|80"):
        odekit.solve_ivp(brusselator, (0.0, 1.0), Y0, args=(PARAMS,), method="rodas5p",
                         jac_sparsity=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="lband"):
        odekit.solve_ivp(brusselator, (0.0, 1.0), Y0, args=(PARAMS,), method="rodas5p",
                         lband=2, uband=2, jac_sparsity="auto")
    with pytest.raises(ValueError, match="interpolate"):
        odekit.solve_ivp(brusselator, (0.0, 1.0), Y0, args=(PARAMS,), method="rodas5p",
                         jac_sparsity="auto", adjoint="interpolate")
    with pytest.raises(TypeError, match="lband"):
        odekit.solve_ivp(brusselator, (0.0, 1.0), Y0, args=(PARAMS,), method="rodas5p", ml=2)


def test_jit_and_vmap_over_parameters():
    def final(params):
        return odekit.solve_ivp(brusselator, (0.0, 5.0), Y0, t_eval=jnp.array([5.0]),
                                args=(params,), method="rodas5p", rtol=1e-7, atol=1e-10,
                                jac_sparsity="auto").ys[0]

    batch = jnp.stack([PARAMS, PARAMS * jnp.array([1.0, 1.1, 1.0]),
                       PARAMS * jnp.array([0.9, 1.0, 2.0])])
    together = jax.jit(jax.vmap(final))(batch)
    for i in range(batch.shape[0]):
        np.testing.assert_allclose(together[i], final(batch[i]), rtol=1e-7, atol=1e-10)


# (long: the forward adjoint, and the checkpointed loop (max_directions=0), which
# test_kvaerno5_reverse_through_the_checkpointed_loop[auto] takes through a
# structured LU in CI)
@pytest.mark.parametrize("adjoint", [
    "checkpoint", pytest.param("forward", marks=pytest.mark.long),
    pytest.param(odekit.Checkpoint(max_directions=0), marks=pytest.mark.long, id="scanned")])
def test_gradients_through_the_banded_path(adjoint):
    y0 = initial_state(8)

    def loss(params):
        sol = odekit.solve_ivp(brusselator, (0.0, 2.0), y0, t_eval=jnp.array([1.0, 2.0]),
                               args=(params,), method="rodas5p", rtol=1e-10, atol=1e-12,
                               jac_sparsity="auto", linear_solver="banded", adjoint=adjoint)
        return sol.ys

    modes = ("fwd",) if adjoint == "forward" else ("rev",)
    check_grads(jax.jit(loss), (PARAMS,), modes=modes, rtol=2e-5, atol=1e-8)


def test_kvaerno5_gradient_through_the_block_diagonal_path():
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), 4)

    def loss(log_rates):     # log scale: one finite-difference step fits all three
        return odekit.solve_ivp(robertson_groups, (0.0, 10.0), y0, t_eval=jnp.array([10.0]),
                                args=(jnp.exp(log_rates),), method="kvaerno5", rtol=1e-10,
                                atol=1e-14, jac_sparsity="auto").ys[0, :3] * jnp.array(
                                    [1.0, 1e4, 1.0])

    check_grads(jax.jit(loss), (jnp.log(RATES),), modes=("rev",), rtol=2e-5, atol=1e-9)


def test_events_and_dense_output_on_the_sparse_path():
    def u_mid_drops(t, y, params):
        return y[N] - 1.0          # u at the middle of the domain
    u_mid_drops.terminal = True
    kw = dict(args=(PARAMS,), method="rodas5p", rtol=1e-8, atol=1e-11, events=u_mid_drops,
              dense_output=True)
    sparse = odekit.solve_ivp(brusselator, (0.0, 10.0), Y0, jac_sparsity="auto", **kw)
    dense = odekit.solve_ivp(brusselator, (0.0, 10.0), Y0, **kw)
    assert int(sparse.status) == int(dense.status)
    np.testing.assert_allclose(sparse.t_events, dense.t_events, rtol=1e-9)
    t_mid = 0.5 * float(sparse.t_events[0])
    np.testing.assert_allclose(sparse.sol(t_mid), dense.sol(t_mid), rtol=1e-8, atol=1e-10)


def test_pytree_state_with_a_found_pattern():
    def split(t, y, params):
        flat = jnp.stack([y["u"], y["v"]], axis=1).reshape(-1)
        out = brusselator(t, flat, params).reshape(-1, 2)
        return {"u": out[:, 0], "v": out[:, 1]}

    y0 = {"u": Y0[0::2], "v": Y0[1::2]}
    kw = dict(t_eval=jnp.array([2.0]), args=(PARAMS,), method="rodas5p", rtol=1e-7, atol=1e-10)
    tree = odekit.solve_ivp(split, (0.0, 2.0), y0, jac_sparsity="auto", **kw)
    flat = odekit.solve_ivp(brusselator, (0.0, 2.0), Y0, **kw)
    np.testing.assert_allclose(tree.ys["u"][0], flat.ys[0, 0::2], rtol=1e-8)


def test_complex_and_float32_states(brusselator_reference):
    # y' = (i - 1) L y for a tridiagonal L: a complex banded system
    n = 100
    lap = lambda y: jnp.concatenate([y[1:], jnp.zeros(1, y.dtype)]) + jnp.concatenate(
        [jnp.zeros(1, y.dtype), y[:-1]]) - 2 * y
    fun = lambda t, y: (1j - 1.0) * 200.0 * lap(y)
    y0 = jnp.asarray(np.sin(np.pi * np.arange(1, n + 1) / (n + 1)), jnp.complex128)
    kw = dict(t_eval=jnp.array([0.1]), method="rodas5p", rtol=1e-8, atol=1e-10)
    sparse = odekit.solve_ivp(fun, (0.0, 0.1), y0, jac_sparsity="auto", **kw)
    dense = odekit.solve_ivp(fun, (0.0, 0.1), y0, **kw)
    np.testing.assert_allclose(sparse.ys, dense.ys, rtol=1e-8, atol=1e-12)
    # the exact solution: the lowest sine mode decays at 200 (i - 1) lambda_1
    lam = -4 * np.sin(np.pi / (2 * (n + 1))) ** 2
    np.testing.assert_allclose(sparse.ys[0], y0 * np.exp((1j - 1.0) * 200.0 * lam * 0.1),
                               rtol=1e-6, atol=1e-8)
    y32 = initial_state(N).astype(jnp.float32)
    single = odekit.solve_ivp(brusselator, (0.0, 10.0), y32, t_eval=jnp.array([10.0]),
                              args=(PARAMS.astype(jnp.float32),), method="rodas5p", rtol=1e-4,
                              atol=1e-6, jac_sparsity="auto")
    assert single.ys.dtype == jnp.float32
    np.testing.assert_allclose(single.ys, brusselator_reference[-1:], rtol=2e-3, atol=1e-4)


def test_a_size_the_dense_path_could_not_hold():
    """State 30,000 (a dense J: 7.2 GB): block-diagonal, no n x n array."""
    groups = 10_000
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), groups)
    sol = odekit.solve_ivp(robertson_groups, (0.0, 1e3), y0, t_eval=jnp.array([1e3]),
                           args=(RATES,), method="rodas5p", rtol=1e-6, atol=1e-10,
                           jac_sparsity="auto")
    reference = scipy_reference(robertson_groups, y0[:3], jnp.array([1e3]), 1e3, (RATES,))
    np.testing.assert_allclose(np.asarray(sol.ys[0]).reshape(-1, 3)[[0, -1]],
                               np.repeat(reference, 2, axis=0), rtol=1e-4, atol=1e-9)


# (long: the banded path at a size the dense one could not hold is in CI in
# test_dae.py, 20,001 unknowns, and tests/ode/linalg/test_banded_lu.py)
@pytest.mark.long
def test_a_banded_size_the_dense_path_could_not_hold():
    """State 60,000 (the Brusselator on 30,000 points): banded, no n x n array."""
    n = 30_000
    big = odekit.solve_ivp(brusselator, (0.0, 0.05), initial_state(n), t_eval=jnp.array([0.05]),
                           args=(PARAMS,), method="rodas5p", rtol=1e-5, atol=1e-8,
                           jac_sparsity="auto")
    assert bool(big.success) and np.all(np.isfinite(big.ys))


def test_a_coupling_that_starts_later_is_in_the_found_pattern():
    """'auto' takes t as unknown: a coupling switched on at t = 1 is found at t0 = 0."""
    def fun(t, y):
        coupled = jnp.where(t > 1.0, 50.0 * (jnp.roll(y, 7) - y), jnp.zeros_like(y))
        return -100.0 * y + coupled + 1.0

    y0 = jnp.linspace(0.0, 1.0, 80)
    kw = dict(t_eval=jnp.array([2.0]), method="rodas5p", rtol=1e-8, atol=1e-10)
    found = odekit.solve_ivp(fun, (0.0, 2.0), y0, jac_sparsity="auto", **kw)
    dense = odekit.solve_ivp(fun, (0.0, 2.0), y0, **kw)
    np.testing.assert_allclose(found.ys, dense.ys, rtol=1e-9)
    assert odekit.ode.jacobian_sparsity(fun, 0.0, y0).nnz == 160


@pytest.mark.parametrize("sparsity", [pytest.param(None, marks=pytest.mark.long), "auto"])
def test_kvaerno5_reverse_through_the_checkpointed_loop(sparsity):
    """The stage's tangent solve stays linear in its right-hand side (its
    singularity guard reads the matrix only), so reverse mode transposes it:
    an AssertionError in select's transpose rule before."""
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), 2)

    def final(rates):
        return odekit.solve_ivp(robertson_groups, (0.0, 10.0), y0, t_eval=jnp.array([10.0]),
                                args=(rates,), method="kvaerno5", rtol=1e-8, atol=1e-12,
                                jac_sparsity=sparsity,
                                adjoint=odekit.Checkpoint(max_directions=0)).ys[0, 0]

    np.testing.assert_allclose(jax.jit(jax.grad(final))(RATES), jax.jit(jax.jacfwd(final))(RATES),
                               rtol=1e-9)
