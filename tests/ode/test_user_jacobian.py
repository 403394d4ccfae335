"""solve_ivp(..., jac=...): a user Jacobian for the stiff methods (issue 15
item 1), in place of forward mode: the same solution and gradients as
without it, its evaluation counted in njev, and clear errors for a jac that
cannot be used."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.testing import check_grads


def robertson(t, y, k1, k2, k3):
    return jnp.stack([-k1 * y[0] + k3 * y[1] * y[2],
                      k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2], k2 * y[1] ** 2])


def robertson_jac(t, y, k1, k2, k3):
    """df_i/dy_j of robertson, by hand."""
    return jnp.array([[-k1, k3 * y[2], k3 * y[1]],
                      [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
                      [0.0 * k1, 2 * k2 * y[1], 0.0 * k1]])


Y0 = jnp.array([1.0, 0.0, 0.0])
RATES = (jnp.asarray(0.04), jnp.asarray(3e7), jnp.asarray(1e4))
T_EVAL = jnp.array([1.0, 1e2, 1e5])


def test_the_hand_jacobian_is_right():
    y = jnp.array([0.7, 2e-5, 0.3])
    np.testing.assert_allclose(jax.jit(robertson_jac)(0.0, y, *RATES),
                               jax.jit(jax.jacfwd(robertson, 1))(0.0, y, *RATES), rtol=1e-15)


@pytest.mark.parametrize("method", ["rodas5p", "kvaerno5", "auto"])
def test_same_solution_as_forward_mode_and_counted(method):
    calls = []

    def jac(t, y, *rates):
        calls.append(1)   # traced once: the solve compiles it
        return robertson_jac(t, y, *rates)

    kw = dict(args=RATES, t_eval=T_EVAL, method=method, rtol=1e-6, atol=1e-10)
    mine = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, jac=jac, **kw)
    forward = odekit.solve_ivp(robertson, (0.0, 1e5), Y0, **kw)
    assert calls, "jac was never called"
    # the same J up to rounding: the same steps, values to rounding
    np.testing.assert_allclose(mine.ys, forward.ys, rtol=1e-9, atol=1e-15)
    assert int(mine.stats["num_steps"]) == int(forward.stats["num_steps"])
    assert int(mine.stats["njev"]) == int(forward.stats["njev"]) > 0


def test_gradients_through_the_users_jacobian_match_finite_differences():
    def solve(k1, k2, k3):
        sol = odekit.solve_ivp(robertson, (0.0, 2.0), Y0, t_eval=jnp.array([0.5, 2.0]),
                               args=(k1, k2, k3), method="rodas5p", rtol=1e-9, atol=1e-13,
                               max_steps=256, jac=robertson_jac)
        return sol.ys * jnp.array([[1.0, 1e4, 1.0]])

    check_grads(jax.jit(solve), RATES, modes=("rev",), rtol=1e-5, atol=1e-9)


def test_a_jacobian_closing_over_a_parameter_gets_its_gradient():
    def final(k1):
        fun = lambda t, y: robertson(t, y, k1, *RATES[1:])
        jac = lambda t, y: robertson_jac(t, y, k1, *RATES[1:])
        return odekit.solve_ivp(fun, (0.0, 1.0), Y0, method="rodas5p", rtol=1e-8, atol=1e-12,
                                t_eval=jnp.array([1.0]), jac=jac).ys[0, 0]

    # jitted (k1 a tracer the closures hold, as under grad): one program for the
    # finite-difference points, where each new closure compiled a new solve
    check_grads(jax.jit(final), (0.04,), modes=("rev",), rtol=1e-5, atol=1e-9)


def test_jit_and_vmap_over_rate_constants_match_single_solves():
    def final(k1):
        return odekit.solve_ivp(robertson, (0.0, 1e2), Y0, args=(k1, *RATES[1:]),
                                method="rodas5p", rtol=1e-6, atol=1e-10, t_eval=jnp.array([1e2]),
                                jac=robertson_jac).ys[0]

    ks = jnp.array([0.03, 0.04, 0.05])
    batched = jax.jit(jax.vmap(final))(ks)
    np.testing.assert_allclose(batched, np.stack([final(k) for k in ks]), rtol=1e-10, atol=1e-16)


def _call(**kw):
    return odekit.solve_ivp(robertson, (0.0, 1.0), kw.pop("y0", Y0), args=RATES, **kw)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(jac=robertson_jac, method="tsit5"), ValueError, "takes no Jacobian"),
    (dict(jac="not a function", method="rodas5p"), TypeError, "jac must be callable"),
    (dict(jac=lambda t, y, *a: jnp.eye(2), method="rodas5p"), ValueError, r"\(3, 3\) array"),
    (dict(jac=lambda t, y: jnp.eye(3), method="rodas5p"), TypeError, "same arguments as fun"),
    (dict(jac=lambda t, y, *a: jnp.eye(3, dtype=jnp.complex128), method="rodas5p"), TypeError,
     "complex"),
])
def test_unusable_jacobians_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        _call(**kwargs)


def test_a_pytree_state_needs_a_flat_one_for_jac():
    with pytest.raises(TypeError, match="1-D array"):
        odekit.solve_ivp(lambda t, y: {"a": -y["a"]}, (0.0, 1.0), {"a": jnp.ones(2)},
                         method="rodas5p", jac=lambda t, y: -jnp.eye(2))
