"""The Anderson safeguard: a bad proposal falls back to the plain step and restarts;
memory m keeps m + 1 pairs (m differences, Walker & Ni's Anderson(m)); on
x = tanh(rho A x + b) with n = 200 Anderson(m) takes the steps of Walker &
Ni's Algorithm AA."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.custom.result import default_tolerances
from odekit.fixed_point import anderson
from odekit.fixed_point.iteration import point
from odekit.testing import check_grads

OPTIONS = {"history": 3, "damping": 1.0, "regularization": 1e-10}


def test_rejected_proposal_falls_back_and_restarts():
    fun = jnp.cos
    it, history = anderson._init(fun, jnp.array(1.0), OPTIONS)
    # Poison the history so that the proposal lands far from the fixed point.
    history = history._replace(points=history.points.at[0].set(50.0))
    new, history = anderson._step(fun, it, history, OPTIONS)
    np.testing.assert_allclose(new.x, np.cos(1.0))  # the plain step from x = 1
    np.testing.assert_array_equal(history.used, [True, False, False, False])
    assert int(history.slot) == 1


def test_accepted_proposal_extends_the_history():
    fun = jnp.cos
    it, history = anderson._init(fun, jnp.array(1.0), OPTIONS)
    for expected_used in ([True, True, False, False], [True, True, True, False]):
        it, history = anderson._step(fun, it, history, OPTIONS)
        np.testing.assert_array_equal(history.used, expected_used)
    plain = point(fun, jnp.cos(jnp.cos(1.0)))  # two plain iterations
    assert abs(float(it.residual)) < abs(float(plain.residual)) / 5


# --- x = tanh(rho A x + b), n = 200 (issue 32 item 3; the benchmark's problem) ---
RTOL, ATOL = default_tolerances(jnp.float64)


def tanh_problem(n=200, seed=0):
    """As benchmarks/implicit.py: A = G G^T / |G G^T|_2, b = 0.01 z, seed 0."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n))
    a = g @ g.T
    a /= np.linalg.norm(a, 2)
    return jnp.asarray(a), jnp.asarray(0.01 * rng.standard_normal(n))


def textbook_steps(a, b, rho, history, max_steps=5000):
    """Walker & Ni (2011), Algorithm AA, difference form solved by lstsq, with
    odekit's stopping test: the literature's Anderson(m), step for step."""
    a, b = np.asarray(a), np.asarray(b)
    x = np.zeros(len(b))
    r = np.tanh(rho * a @ x + b) - x
    dx, dr = [], []
    for k in range(max_steps):
        if np.all(np.abs(r) <= ATOL + RTOL * np.abs(x)):
            return k
        new = x + r
        if dx:
            gamma = np.linalg.lstsq(np.array(dr).T, r, rcond=None)[0]
            new = new - (np.array(dx).T + np.array(dr).T) @ gamma
        new_r = np.tanh(rho * a @ new + b) - new
        dx, dr = (dx + [new - x])[-history:], (dr + [new_r - r])[-history:]
        x, r = new, new_r
    return max_steps


def tanh_map(a, b):
    def f(x, rho):
        return jnp.tanh(rho * (a @ x) + b)
    return f


@pytest.mark.parametrize("rho", [0.995, 0.999])
def test_anderson_matches_walker_ni_and_beats_plain_iteration(rho):
    a, b = tanh_problem()
    f = tanh_map(a, b)
    x0 = jnp.zeros(200)
    plain = odekit.fixed_point(f, x0, rho, max_steps=20000)
    assert int(plain.num_steps) > 3000  # 3116 and 5018: the rate is close to rho
    for history, most in ((5, 240), (20, 52)):  # 228/127 and 49/47 measured
        res = odekit.fixed_point(f, x0, rho, method="anderson", options={"history": history})
        book = textbook_steps(a, b, rho, history)
        assert bool(res.success)
        assert abs(int(res.num_steps) - book) <= max(2, book // 20), (history, res.num_steps, book)
        assert int(res.num_steps) <= most
        assert 10 * int(res.num_steps) < int(plain.num_steps)
        np.testing.assert_allclose(res.x, plain.x, rtol=0, atol=1e-9)


def test_anderson_on_the_tanh_problem_gradients_jit_and_vmap():
    a, b = tanh_problem(n=20)

    def solve(rho, b):
        return odekit.fixed_point(lambda x, r, c: jnp.tanh(r * (a @ x) + c), jnp.zeros(20),
                                  rho, b, method="anderson").x
    check_grads(jax.jit(solve), (0.9, b), order=1)
    rhos = jnp.array([0.5, 0.9, 0.999])
    xs = jax.jit(jax.vmap(solve, in_axes=(0, None)))(rhos, b)
    for rho, x in zip(rhos, xs):
        np.testing.assert_allclose(x, solve(float(rho), b), rtol=0, atol=1e-12)
