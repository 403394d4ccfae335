"""Newton on 200 unknowns, x = tanh(rho A x + b) as a root (issue 32 item 3):
step counts, one Jacobian and one LU in the compiled program, the augmented
LU solve, and gradients, jit and vmap on a smaller copy of the problem."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import status
from odekit.custom import linear_solve
from odekit.testing import check_grads


def tanh_problem(n=200, seed=0):
    """As benchmarks/implicit.py: A = G G^T / |G G^T|_2, b = 0.01 z, seed 0."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n))
    a = g @ g.T
    a /= np.linalg.norm(a, 2)
    return jnp.asarray(a), jnp.asarray(0.01 * rng.standard_normal(n))


def numpy_solution(a, b, rho):
    a, b = np.asarray(a), np.asarray(b)
    x = np.zeros(len(b))
    for _ in range(30):
        t = np.tanh(rho * a @ x + b)
        x = x - np.linalg.solve(np.eye(len(b)) - (1 - t ** 2)[:, None] * rho * a, x - t)
    return x


def residual(a):
    def f(x, rho, b):
        return x - jnp.tanh(rho * (a @ x) + b)
    return f


@pytest.mark.parametrize("rho, most", [(0.995, 6), (0.999, 9)])
def test_newton_on_200_unknowns_takes_a_handful_of_steps(rho, most):
    a, b = tanh_problem()
    res = jax.jit(lambda r: odekit.root(residual(a), jnp.zeros(200), r, b))(rho)
    assert bool(res.success)
    assert int(res.num_steps) <= most  # 4 and 7 measured
    np.testing.assert_allclose(res.x, numpy_solution(a, b, rho), rtol=0, atol=1e-13)


def _primitives(jaxpr, found):
    for eqn in jaxpr.eqns:
        found.append(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _primitives(sub, found)
    return found


def test_newton_traces_one_jacobian_and_one_lu():
    # The start is evaluated by the loop's first pass, not by a copy of the
    # step outside it, and the solve forms no pivot permutation.
    a, b = tanh_problem(n=20)
    names = _primitives(jax.make_jaxpr(
        lambda r: odekit.root(residual(a), jnp.zeros(20), r, b).x)(0.9).jaxpr, [])
    assert names.count("lu") == 1
    assert "lu_pivots_to_permutation" not in names
    assert names.count("tanh") == 1


def test_step_counts_leave_out_the_evaluation_of_the_start():
    a, b = tanh_problem(n=20)
    f = residual(a)
    res = odekit.root(f, jnp.zeros(20), 0.9, b, max_steps=1, throw=False)
    assert int(res.status) == status.MAX_STEPS and int(res.num_steps) == 1
    x = odekit.root(f, jnp.zeros(20), 0.9, b).x
    np.testing.assert_allclose(x, numpy_solution(a, b, 0.9), rtol=0, atol=1e-14)
    res = odekit.root(f, x, 0.9, b, max_steps=1)  # the start is the root: no step
    assert bool(res.success) and int(res.num_steps) == 0


def test_newton_gradients_jit_and_vmap():
    a, b = tanh_problem(n=20)

    def solve(rho, b):
        return odekit.root(residual(a), jnp.zeros(20), rho, b).x
    check_grads(jax.jit(solve), (0.9, b), order=1)
    rhos = jnp.array([0.5, 0.9, 0.999])
    xs = jax.jit(jax.vmap(solve, in_axes=(0, None)))(rhos, b)
    for rho, x in zip(rhos, xs):
        np.testing.assert_allclose(x, numpy_solution(a, b, float(rho)), rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype, rtol", [(jnp.float64, 1e-12), (jnp.float32, 1e-4),
                                         (jnp.float16, 2e-2), (jnp.complex128, 1e-12)])
def test_augmented_solve_matches_numpy(dtype, rtol):
    rng = np.random.default_rng(1)
    m = rng.standard_normal((6, 6)) + 6 * np.eye(6)
    rhs = rng.standard_normal((6, 2))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        m = m + 1j * rng.standard_normal((6, 6))
    for b in (rhs[:, 0], rhs):
        x = linear_solve.augmented_solve(jnp.asarray(m, dtype), jnp.asarray(b, dtype))
        assert x.dtype == dtype and x.shape == b.shape
        np.testing.assert_allclose(np.asarray(x, np.complex128), np.linalg.solve(m, b),
                                   rtol=rtol, atol=rtol)
    batched = jax.vmap(linear_solve.augmented_solve)(jnp.stack([jnp.asarray(m, dtype)] * 2),
                                                      jnp.asarray(rhs.T, dtype))
    np.testing.assert_allclose(np.asarray(batched, np.complex128), np.linalg.solve(m, rhs).T,
                               rtol=rtol, atol=rtol)


def test_augmented_solve_of_a_singular_matrix_is_not_finite():
    x = linear_solve.augmented_solve(jnp.ones((3, 3)), jnp.ones(3))
    assert not bool(jnp.all(jnp.isfinite(x)))
    np.testing.assert_allclose(linear_solve.augmented_solve(jnp.array([[4.0]]),
                                                            jnp.array([2.0])), [0.5])
