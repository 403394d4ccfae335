"""adjoint="forward": forward sensitivities carried along the steps (issue 14 item 3).

Checked against central finite differences (forward mode), analytic
derivatives, and the checkpoint adjoint (the same derivative of the same
discrete solution); through jit and vmap, to second order in forward mode,
for a stiff method, with and without the single CPU kernel; reverse mode is
a clear error naming the checkpoint adjoint. Events and dense output: in
tests/ode/test_adjoint_checkpoint.py, parametrized over both adjoints.
"""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.testing import check_grads
from odekit.testing.problems import get_problem

TIGHT = dict(rtol=1e-10, atol=1e-10)


def _pendulum(adjoint, **kw):
    p = get_problem("pendulum")
    t = jnp.linspace(0.0, 3.0, 7)
    return lambda y0, b, g: odekit.odeint(p.func, y0, t, b, g, adjoint=adjoint, **{**TIGHT, **kw})


def _pendulum_args():
    p = get_problem("pendulum")
    return (jnp.asarray(p.y0), jnp.asarray(p.args[0]), jnp.asarray(p.args[1]))


def test_jacfwd_equals_checkpoint_and_finite_differences():
    args = _pendulum_args()
    forward = jax.jit(jax.jacfwd(_pendulum("forward"), argnums=(0, 1, 2)))(*args)
    checkpoint = jax.jacfwd(_pendulum("checkpoint"), argnums=(0, 1, 2))(*args)
    for a, b in zip(jax.tree.leaves(forward), jax.tree.leaves(checkpoint)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    check_grads(jax.jit(_pendulum("forward")), args, modes=("fwd",), rtol=2e-5, atol=1e-7)


def test_linear_problem_against_the_exact_sensitivities():
    # y' = -k y: dy(t)/dk = -t y0 exp(-k t), dy(t)/dy0 = exp(-k t)
    t = jnp.array([0.0, 0.5, 1.0, 2.0])
    f = lambda y0, k: odekit.odeint(lambda y, s, k: -k * y, y0, t, k, adjoint="forward", **TIGHT)
    d_y0, d_k = jax.jacfwd(f, argnums=(0, 1))(2.0, 0.7)
    np.testing.assert_allclose(d_y0, np.exp(-0.7 * t), rtol=1e-8)
    np.testing.assert_allclose(d_k, -t * 2.0 * np.exp(-0.7 * t), rtol=1e-8, atol=1e-14)
    primal, tangent = jax.jvp(f, (2.0, 0.7), (1.0, 0.0))
    np.testing.assert_allclose(primal, 2.0 * np.exp(-0.7 * t), rtol=1e-8)
    np.testing.assert_allclose(tangent, np.exp(-0.7 * t), rtol=1e-8)


@pytest.mark.parametrize("transform", ["grad", "jacrev", "vjp", "hessian"])
def test_reverse_mode_is_a_clear_error_naming_checkpoint(transform):
    loss = lambda b: _pendulum("forward")(_pendulum_args()[0], b, 9.8).sum()
    call = {"grad": lambda: jax.grad(loss)(0.25),
            "jacrev": lambda: jax.jacrev(loss)(0.25),
            "vjp": lambda: jax.vjp(loss, 0.25)[1](1.0),
            "hessian": lambda: jax.hessian(loss)(0.25)}[transform]
    with pytest.raises(ValueError, match="adjoint='forward' computes forward sensitivities only"
                                         ".*adjoint='checkpoint'"):
        call()


def test_second_order_forward_over_forward():
    # y' = -k y: d2 y(t) / dk2 = t^2 y0 exp(-k t)
    t = jnp.array([0.0, 0.5, 1.0, 2.0])
    f = lambda k: odekit.odeint(lambda y, s, k: -k * y, 2.0, t, k, adjoint="forward", **TIGHT)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(jax.jacfwd(f)))(0.7),
                               t ** 2 * 2.0 * np.exp(-0.7 * t), rtol=1e-7, atol=1e-14)
    # jvp of (value, tangent): the value's derivative is kept beside the tangent's
    pair = lambda k: jax.jvp(f, (k,), (1.0,))
    (_, _), (d_value, d_tangent) = jax.jvp(pair, (0.7,), (1.0,))
    np.testing.assert_allclose(d_value, -t * 2.0 * np.exp(-0.7 * t), rtol=1e-7, atol=1e-14)
    np.testing.assert_allclose(d_tangent, t ** 2 * 2.0 * np.exp(-0.7 * t), rtol=1e-7, atol=1e-14)


def test_vmap_of_jacfwd_equals_each_member():
    args = _pendulum_args()
    jac = jax.jacfwd(_pendulum("forward"), argnums=1)
    bs = jnp.array([0.1, 0.25, 0.4])
    batched = jax.jit(jax.vmap(jac, in_axes=(None, 0, None)))(args[0], bs, args[2])
    for i, b in enumerate(bs):
        np.testing.assert_allclose(batched[i], jac(args[0], b, args[2]), rtol=1e-12, atol=1e-15)


def test_closed_over_values_pytree_state_and_times():
    # closed-over parameter, a dict state, and the tangent of the end time
    def solve(scale, t_end):
        field = lambda t, y: {"x": -scale * y["x"], "v": y["x"] - y["v"]}
        sol = odekit.solve_ivp(field, (0.0, t_end), {"x": jnp.array(1.0), "v": jnp.array(0.0)},
                               t_eval=jnp.stack([0.5 * t_end, t_end]), adjoint="forward",
                               **TIGHT)
        return sol.ys["x"][-1] + sol.ys["v"][-1]
    check_grads(jax.jit(solve), (jnp.array(0.8), jnp.array(1.5)), modes=("fwd",), rtol=2e-5,
                atol=1e-8)


def test_a_stiff_method_matches_checkpoint():
    def robertson(t, y, k1, k2, k3):
        return jnp.stack([-k1 * y[0] + k3 * y[1] * y[2],
                          k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                          k2 * y[1] ** 2])
    ks = (jnp.array(0.04), jnp.array(3e7), jnp.array(1e4))
    final = lambda adjoint: lambda k1: odekit.solve_ivp(
        robertson, (0.0, 100.0), jnp.array([1.0, 0.0, 0.0]), args=(k1, *ks[1:]),
        method="rodas5p", adjoint=adjoint, rtol=1e-8, atol=1e-12).ys[-1]
    np.testing.assert_allclose(jax.jacfwd(final("forward"))(ks[0]),
                               jax.jacfwd(final("checkpoint"))(ks[0]), rtol=1e-7, atol=1e-14)


def test_a_failed_solve_has_nan_tangents():
    blow_up = lambda t, y, c: c * y ** 2          # y = 1 / (1 - c t): infinite at t = 1 / c
    solve = lambda c: odekit.solve_ivp(blow_up, (0.0, 2.0), jnp.array([1.0]), args=(c,),
                                       adjoint="forward", throw=False,
                                       t_eval=jnp.array([0.5, 2.0]))
    assert int(solve(1.0).status) < 0
    tangent = jax.jacfwd(lambda c: solve(c).ys)(1.0)
    assert bool(jnp.isnan(tangent[0, 0]))     # reached before the failure: still not trusted
    assert bool(jnp.isnan(solve(1.0).ys[1, 0]))


@pytest.mark.long
def test_without_the_single_kernel_the_same():
    code = """
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import odekit
from odekit.testing.problems import get_problem
p = get_problem("pendulum")
f = lambda b: odekit.odeint(p.func, jnp.asarray(p.y0), jnp.linspace(0., 3., 7), b, p.args[1],
                            adjoint="forward", rtol=1e-10, atol=1e-10)
print(repr(np.asarray(jax.jacfwd(f)(0.25)).tolist()))
"""
    runs = []
    for switch in ("0", "1"):
        env = {**os.environ, "ODEKIT_SINGLE_KERNEL": switch}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300, check=True)
        runs.append(np.array(eval(out.stdout)))
    # Without the single kernel the loop runs in segments that clip steps at
    # output times: another step sequence, so the two agree to the solutions'
    # accuracy (rtol 1e-10 times the sensitivities' growth), not to rounding.
    # Measured 4.6e-10 in the 2-norm (1.4e-9 element-wise, where rtol=1e-8
    # left a margin of 7): allow 200 rtol relative to the Jacobian's norm.
    error = np.linalg.norm(runs[0] - runs[1]) / np.linalg.norm(runs[1])
    assert error < 2e-8, (error, runs)
