"""Stiff solves whose Jacobian splits into small blocks (jac_sparsity):
the block-diagonal LU in lax keeps the whole loop in one CPU kernel
(odekit.ode.linalg.stacked_lu, odekit.ode.engine.single_kernel), with the
same steps and values as the dense path, and derivatives through it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.sparse

import odekit
from odekit.testing.problems import robertson_groups
from odekit.ode.linalg import ordering

CPU = jax.default_backend() == "cpu"
LAPACK_CALL = 'custom_call_target="lapack_'
ONE_KERNEL = 'xla_cpu_small_call="true"'
GROUPS = 4
RATES = (jnp.asarray(0.04), jnp.asarray(3e7), jnp.asarray(1e4))
T_EVAL = jnp.array([1.0, 1e3, 1e5])


robertson = robertson_groups         # (t, y, k1, k2, k3), any number of 3-species groups


def pattern(groups):
    block = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 0]])
    return scipy.sparse.block_diag([block] * groups, format="csr")


def solve(method, rates=RATES, groups=GROUPS, **options):
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), groups)
    return odekit.solve_ivp(robertson, (0.0, 1e5), y0, t_eval=T_EVAL, args=rates,
                            method=method, rtol=1e-6, atol=1e-10, **options)


def test_small_independent_blocks_choose_the_block_diagonal_solver():
    matrix = scipy.sparse.coo_array(pattern(GROUPS))
    assert ordering.choose(3 * GROUPS, matrix.row, matrix.col) == "block_diagonal"
    one = scipy.sparse.coo_array(pattern(1))
    assert ordering.choose(3, one.row, one.col) == "dense"


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
@pytest.mark.parametrize("method, sparsity", [
    ("rodas5p", "auto"), pytest.param("bdf", "given", marks=pytest.mark.long),
    pytest.param("kvaerno5", "auto", marks=pytest.mark.long),
    pytest.param("bdf", "auto", marks=pytest.mark.long),
    pytest.param("rodas5p", "given", marks=pytest.mark.long)])
def test_block_diagonal_solve_is_one_kernel_and_equals_the_dense_one(method, sparsity):
    given = "auto" if sparsity == "auto" else pattern(GROUPS)
    run = jax.jit(lambda rates: solve(method, rates, jac_sparsity=given)).lower(RATES).compile()
    hlo = run.as_text()
    assert ONE_KERNEL in hlo and LAPACK_CALL not in hlo
    ours, dense = run(RATES), jax.jit(lambda rates: solve(method, rates))(RATES)
    assert int(ours.stats["num_steps"]) == int(dense.stats["num_steps"])
    np.testing.assert_allclose(ours.ys, dense.ys, rtol=1e-10, atol=1e-16)
    reference = scipy.integrate.solve_ivp(
        lambda t, y: np.asarray(robertson(t, jnp.asarray(y), *RATES)), (0.0, 1e5),
        [1.0, 0.0, 0.0], method="Radau", t_eval=np.asarray(T_EVAL), rtol=1e-10, atol=1e-14).y.T
    np.testing.assert_allclose(ours.ys.reshape(3, GROUPS, 3),
                               np.repeat(reference[:, None, :], GROUPS, axis=1),
                               rtol=2e-4, atol=1e-10)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_a_wrong_given_pattern_still_fails_loudly():
    wrong = pattern(GROUPS).tolil()
    wrong[1, 0] = 0                                           # y2' depends on y1
    with pytest.raises(odekit.ODESolverError, match="jac_sparsity"):
        solve("bdf", jac_sparsity=wrong.tocsr()).ys.block_until_ready()
    # d y2'/d y3 = -k3 y2 is zero at y0 (y2 = 0): caught at the nearby state
    later = pattern(GROUPS).tolil()
    later[1, 2] = 0
    with pytest.raises(odekit.ODESolverError, match="jac_sparsity"):
        solve("rodas5p", jac_sparsity=later.tocsr()).ys.block_until_ready()


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
@pytest.mark.parametrize("method", [pytest.param("kvaerno5", marks=pytest.mark.long), "bdf"])
def test_gradients_and_forward_sensitivities_through_the_kernel(method):
    """Reverse (checkpoint) and forward mode through the one-kernel loop on the
    dense and the block-diagonal path. The dense 12-state case once failed to
    compile ("Fusion kind not implemented on CPU": a vmapped stage
    combination became a YNNPACK fusion inside the kernel)."""
    def ys(k1, adjoint, **options):
        return solve(method, (k1, *RATES[1:]), adjoint=adjoint, **options).ys[:, 1::3]

    k1 = RATES[0]
    tight = lambda k: odekit.solve_ivp(
        robertson, (0.0, 1e5), jnp.array([1.0, 0.0, 0.0]), t_eval=T_EVAL, args=(k, *RATES[1:]),
        method="rodas5p", rtol=1e-10, atol=1e-15).ys[:, 1]
    step = 1e-4 * k1
    fd = (tight(k1 + step) - tight(k1 - step)) / (2 * step)            # (3,) per group
    for options in ({}, {"jac_sparsity": "auto"}):
        grad = jax.jit(jax.grad(lambda k: jnp.sum(ys(k, "checkpoint", **options)) * 1e4))(k1)
        np.testing.assert_allclose(grad, GROUPS * 1e4 * jnp.sum(fd), rtol=2e-3)
        jac = jax.jit(jax.jacfwd(lambda k: ys(k, "forward", **options)))(k1)
        np.testing.assert_allclose(jac, np.tile(np.asarray(fd)[:, None], (1, GROUPS)),
                                   rtol=2e-3, atol=1e-12)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_vmap_over_rates_equals_each_solve():
    k1s = jnp.array([0.03, 0.04, 0.05])
    one = lambda k1: solve("bdf", (k1, *RATES[1:]), jac_sparsity="auto").ys
    batched = jax.jit(jax.vmap(one))(k1s)
    for k1, row in zip(k1s, batched):
        np.testing.assert_allclose(row, jax.jit(one)(k1), rtol=1e-12, atol=1e-16)
