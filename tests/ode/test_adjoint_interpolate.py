"""adjoint="interpolate": the continuous adjoint with y(t) from the recorded
forward steps (issue 14 item 2).

Checked against central finite differences (odekit.testing.check_grads),
against the other adjoints, against closed forms (the Frechet derivative of
the matrix exponential) on the problems where backsolve fails, through jit,
vmap, events and dense output, and for its loud limits: second order and
the step bound.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import odekit
from odekit.ode.adjoints import interpolate as adjoint_interpolate
from odekit.ode.adjoints import quadrature
from odekit.testing import check_grads
from odekit.testing.problems import PROBLEMS, STIFF, falling_body, get_problem

TIGHT = dict(rtol=1e-11, atol=1e-11)
GRAD_TOL = dict(rtol=2e-5, atol=1e-7)


def _short(problem, n=4):
    t = np.asarray(problem.t)
    return jnp.asarray(np.linspace(t[0], t[0] + 0.3 * (t[-1] - t[0]), n))


# The other problems: test_all_adjoints_agree_on_the_registry (backsolve and
# checkpoint are checked against finite differences in their own files).
@pytest.mark.parametrize("name", ["time_dependent_linear"])
def test_gradients_match_finite_differences(name):
    p = get_problem(name)
    t = _short(p)
    loss = jax.jit(lambda y0, t, *args: odekit.odeint(p.func, y0, t, *args,
                                                       adjoint="interpolate", **TIGHT))
    check_grads(loss, (jnp.asarray(p.y0), t, *map(jnp.asarray, p.args)), order=1,
                modes=("rev",), **GRAD_TOL)


def test_steps_replayed_when_their_dense_data_would_be_too_large(monkeypatch):
    """Past PREPARED_LIMIT numbers of dense data the backward pass replays the
    step holding t at every evaluation: the same gradient."""
    p = get_problem("pendulum")
    t = _short(p)
    grad = lambda: jax.grad(lambda args: odekit.odeint(p.func, jnp.asarray(p.y0), t, *args,
                                                       adjoint="interpolate", **TIGHT).sum())(
        tuple(map(jnp.asarray, p.args)))
    prepared = grad()
    monkeypatch.setattr(adjoint_interpolate, "PREPARED_LIMIT", 0)
    replayed = grad()
    np.testing.assert_allclose(replayed, prepared, rtol=1e-13)


NON_STIFF = [name for name in PROBLEMS if name not in STIFF and name != "robertson"]
# One of each kind of state and field (the real vector fields exponential
# decay, harmonic oscillator, pendulum and Lotka-Volterra add compile time,
# not cases): a pytree state, a complex state, a time-dependent field, an
# orbit integrated over several periods.
DISTINCT = ["pytree_state", "complex_rotation", "time_dependent_linear", "kepler"]
assert set(DISTINCT) <= set(NON_STIFF)


def _squared_norm(tree) -> jax.Array:
    return sum(jnp.sum(jnp.real(leaf * jnp.conj(leaf))) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", DISTINCT[:2] + [pytest.param(n, marks=pytest.mark.long)
                                                   for n in DISTINCT[2:]])
def test_all_adjoints_agree_on_the_registry(name):
    """d |y(t)|^2 / d(y0, args) by backsolve, interpolate and checkpoint
    agree on one registry problem of each kind (pytree and complex states)."""
    p = get_problem(name)
    t = _short(p)
    args = jax.tree.map(jnp.asarray, tuple(p.args))
    y0 = jax.tree.map(jnp.asarray, p.y0)

    def grad(adjoint):
        loss = lambda y0, args: _squared_norm(odekit.odeint(p.func, y0, t, *args,
                                                            adjoint=adjoint, **TIGHT))
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(y0, args)

    reference = grad("interpolate")
    # Three adjoints, three approximations of one gradient: each is off by
    # O(rtol = 1e-11) times the gradient's scale, so the absolute part of the
    # bound is scaled by the largest entry. An entry whose exact value is 0
    # (complex_rotation's d/dw: |y| does not depend on w) is all error: it
    # measured -9e-11 (interpolate), -3.5e-10 (backsolve) against a scale of
    # 11, which the former atol=1e-9 passed by 4x only. Measured elsewhere:
    # 4.3e-8 element-wise (kepler), 1.5e-10 in the 2-norm.
    scale = max(float(np.max(np.abs(leaf))) for leaf in jax.tree.leaves(reference))
    # one checkpointing level: the same rule as the default, cheaper to compile
    for adjoint in (odekit.Checkpoint(levels=1, max_steps=2048), "backsolve"):
        for a, b in zip(jax.tree.leaves(grad(adjoint)), jax.tree.leaves(reference)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * scale)


def test_closed_over_values_get_gradients():
    p = get_problem("pendulum")
    t = _short(p)

    def loss(b, shift):
        func = lambda y, s, g: p.func(y, s, b, g) + shift
        return odekit.odeint(func, jnp.asarray(p.y0), t, p.args[1], adjoint="interpolate",
                             **TIGHT).sum()

    check_grads(loss, (jnp.asarray(p.args[0]), jnp.array([0.1, -0.2])), order=1,
                modes=("rev",), **GRAD_TOL)


def _frechet_gradient(a: np.ndarray, T: float) -> np.ndarray:
    """d/da of sum(expm(T a) @ ones): the Frechet derivative of expm along
    each unit matrix (exact to rounding; scipy.linalg.expm_frechet)."""
    n = a.shape[0]
    out = np.zeros_like(a)
    for i in range(n):
        for j in range(n):
            e = np.zeros_like(a)
            e[i, j] = T
            out[i, j] = scipy.linalg.expm_frechet(T * a, e, compute_expm=False).sum()
    return out


@pytest.mark.parametrize("a, T, kw", [
    ([[-1.0, 1.0], [0.0, -10.0]], 20.0, dict(rtol=1e-10, atol=1e-16)),
    pytest.param([[-1000.0, 999.0], [0.0, -1.0]], 0.05, dict(rtol=1e-10, atol=1e-12),
                 marks=pytest.mark.long),
])
def test_the_problems_where_backsolve_fails(a, T, kw):
    """Issue 14: backsolve returned entries of ~1e68 (truth ~5e-8) on the
    first and a relative error of 6e11 on the second; it now raises."""
    a = jnp.asarray(a)
    loss = lambda adjoint: lambda a: odekit.odeint(lambda y, t, a: a @ y, jnp.ones(2),
                                                   jnp.array([0.0, T]), a, adjoint=adjoint,
                                                   **kw)[-1].sum()
    exact = _frechet_gradient(np.asarray(a), T)
    np.testing.assert_allclose(jax.grad(loss("interpolate"))(a), exact,
                               rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    with pytest.raises(odekit.status.ERRORS, match="interpolate"):
        jax.grad(loss("backsolve"))(a)


@pytest.mark.long   # in CI as the entry a[0, 0] = -k of the matrix's gradient above
def test_the_rate_constant_of_the_issue_14_failure():
    def func(y, t, k):
        return jnp.stack([-k * y[0] + y[1], -10.0 * y[1]])

    T, k = 20.0, 1.0
    exact = (-T * np.exp(-k * T)
             + (-T * np.exp(-k * T) * (10 - k) + np.exp(-k * T) - np.exp(-10 * T)) / (10 - k) ** 2)
    grad = jax.grad(lambda k: odekit.odeint(func, jnp.ones(2), jnp.array([0.0, T]), k,
                                            adjoint="interpolate", rtol=1e-10,
                                            atol=1e-14)[-1].sum())
    assert abs(float(grad(k)) - exact) < 1e-4 * abs(exact)


def test_vmap_of_grad_and_jit():
    p = get_problem("pendulum")
    t = _short(p)
    one = jax.grad(lambda y0: odekit.odeint(p.func, y0, t, *p.args, adjoint="interpolate").sum())
    y0s = jnp.stack([jnp.asarray(p.y0) * s for s in (0.5, 1.0)])
    np.testing.assert_allclose(jax.jit(jax.vmap(one))(y0s), jnp.stack([one(y) for y in y0s]),
                               rtol=1e-10)


def test_solve_ivp_events_dense_output_record_and_t_eval():
    fall, hit = falling_body()
    kw = dict(adjoint="interpolate", rtol=1e-10, atol=1e-10)
    y0 = jnp.array([10.0, 0.0])
    fall_time = lambda g: odekit.solve_ivp(fall, (0.0, 10.0), y0, args=(g,), events=hit,
                                           **kw).t_events[0]
    np.testing.assert_allclose(jax.grad(fall_time)(9.81), -0.5 * np.sqrt(20.0 / 9.81 ** 3),
                               rtol=1e-8)

    def outputs(g):   # dense output, the last value and t_eval rows of one solve
        sol = odekit.solve_ivp(fall, (0.0, 1.0), y0, args=(g,), dense_output=True,
                               t_eval=jnp.array([0.25, 1.0]), max_steps=64, **kw)
        return jnp.stack([sol.sol(0.5)[0], sol.ys[:, 0].sum()])
    np.testing.assert_allclose(jax.jacrev(outputs)(9.81), [-0.125, -0.5 * (0.0625 + 1.0)],
                               rtol=1e-8)
    # without t_eval: the rows are the recorded steps
    last = lambda g: odekit.solve_ivp(fall, (0.0, 1.0), y0, args=(g,), max_steps=64,
                                      **kw).ys[-1, 0]
    np.testing.assert_allclose(jax.grad(last)(9.81), -0.5, rtol=1e-8)


def test_time_runs_backwards_in_solve_ivp():
    # y' = -k y from t = 1 down to t = 0: y(0) = exp(k), dy(0)/dk = exp(k).
    end = lambda k: odekit.solve_ivp(lambda t, y, k: -k * y, (1.0, 0.0), jnp.ones(1), args=(k,),
                                     adjoint="interpolate", rtol=1e-10, atol=1e-12).ys[-1, 0]
    np.testing.assert_allclose(jax.grad(end)(0.7), np.exp(0.7), rtol=1e-8)


def test_higher_orders_are_refused_clearly():
    loss = lambda k: odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), jnp.ones(2), args=(k,),
                                      adjoint="interpolate").ys[-1].sum()
    with pytest.raises(TypeError, match="first derivatives only.*checkpoint"):
        jax.grad(jax.grad(loss))(1.0)
    with pytest.raises(TypeError, match="first derivatives only"):
        jax.hessian(loss)(1.0)


def test_the_step_bound_of_odeint_is_loud():
    # 4096 recorded steps for odeint; a solve that needs more fails under grad
    # (the plain solve has no bound), and Interpolate(max_steps) raises the bound.
    func = lambda y, t, w: jnp.stack([y[1], -w ** 2 * y[0]])
    t = jnp.array([0.0, 60.0])      # about 4,800 steps
    loss = lambda w: odekit.odeint(func, jnp.array([1.0, 0.0]), t, w, adjoint="interpolate",
                                   rtol=1e-10, atol=1e-10)[-1, 0]
    assert np.isfinite(float(loss(3.0)))
    with pytest.raises(odekit.status.ERRORS, match="maximum number of steps.*interpolate"):
        jax.grad(loss)(3.0)
    longer = lambda w: odekit.odeint(func, jnp.array([1.0, 0.0]), t, w,
                                     adjoint=odekit.Interpolate(max_steps=10000),
                                     rtol=1e-10, atol=1e-10)[-1, 0]
    np.testing.assert_allclose(jax.grad(longer)(3.0), -60.0 * np.sin(180.0), rtol=1e-4)


@pytest.mark.parametrize("adjoint", [odekit.Interpolate(max_steps=10),
                                     odekit.Checkpoint(max_steps=10, max_directions=0)])
def test_a_too_small_adjoint_step_bound_names_the_adjoints_option(adjoint):
    """Issue 27.19: the bound hit is Interpolate's (Checkpoint's) max_steps,
    not solve_ivp's; the message says which option to raise."""
    def loss(k):
        return odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 10.0), jnp.ones(3), args=(k,),
                                t_eval=jnp.array([10.0]), adjoint=adjoint).ys[-1].sum()
    assert np.isfinite(float(loss(jnp.ones(3))))    # the plain solve has solve_ivp's bound
    name = type(adjoint).__name__
    with pytest.raises(odekit.status.ERRORS) as caught:
        jax.grad(loss)(jnp.ones(3))
    text = odekit.status.failure_message(caught.value)
    assert f"odekit.{name}(max_steps=...)" in text and "after 10 steps" in text, text
    assert "Raise max_steps" not in text
    # solve_ivp's own max_steps still gets its own hint.
    with pytest.raises(odekit.ODESolverError, match="Raise max_steps or loosen"):
        odekit.solve_ivp(lambda t, y: -y, (0.0, 10.0), jnp.ones(3), max_steps=5, adjoint=adjoint)


def test_invalid_specs_are_errors():
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        odekit.Interpolate(max_steps=0)
    with pytest.raises(ValueError, match="unknown adjoint.*interpolate"):
        odekit.odeint(lambda y, t: -y, 1.0, jnp.array([0.0, 1.0]), adjoint="interp")


# (checkpoint, solve_ivp's default: long; tests/ode/test_solve_ivp.py has it in CI)
@pytest.mark.parametrize("adjoint", ["interpolate", pytest.param("checkpoint",
                                                                 marks=pytest.mark.long),
                                     "backsolve"])
def test_gradient_of_a_failed_solve_is_nan(adjoint):
    # y' = 3 y^2 blows up at t = 1/3, before the output time 0.5.
    def loss(k):
        return odekit.solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.array([1.0]),
                                args=(k,), t_eval=jnp.array([0.2, 0.5]), throw=False,
                                adjoint=adjoint).ys[0, 0]
    assert np.isnan(jax.grad(loss)(3.0))


def _coupled(t, y, matrix, bias):
    return jnp.tanh(matrix @ y + bias) - 0.1 * y


def _quadrature_loss(matrix, bias, y0, t0, t1, adjoint="interpolate"):
    """More parameters (6) than states (2): adjoint="interpolate" integrates
    their cotangents as a quadrature over the backward steps taken again.
    Rows at t0, inside and at t1 (twice: t_eval and the final state)."""
    sol = odekit.solve_ivp(_coupled, (t0, t1), y0, args=(matrix, bias), method="tsit5",
                           adjoint=adjoint, rtol=1e-10, atol=1e-10,
                           t_eval=jnp.stack([t0, 0.7, 1.9, t1]))
    return jnp.sum(sol.ys * jnp.array([[0.3, -0.2], [1.0, 0.5], [-0.4, 0.8], [0.6, 1.1]]))


_QUADRATURE_INPUTS = (jnp.array([[0.5, -1.2], [0.9, 0.2]]), jnp.array([0.1, -0.3]),
                      jnp.array([1.0, 0.5]), jnp.asarray(0.1), jnp.asarray(3.0))


@pytest.fixture
def quadrature_for_few_parameters(monkeypatch):
    """The quadrature path for this small model (by default from 256 parameters)."""
    monkeypatch.setattr(quadrature, "MIN_PARAMETERS", 1)


def test_parameter_cotangents_as_a_quadrature_match_finite_differences(
        quadrature_for_few_parameters):
    assert adjoint_interpolate._separate_quadrature(
        adjoint_interpolate.get_method("tsit5"), jnp.zeros((5, 2)),
        [jnp.zeros((2, 2)), jnp.zeros(2)], 100)
    check_grads(jax.jit(_quadrature_loss), _QUADRATURE_INPUTS, order=1, modes=("rev",),
                rtol=1e-6, atol=1e-9)


@pytest.mark.long
def test_the_quadrature_gives_the_gradient_of_the_augmented_backward_state(
        monkeypatch, quadrature_for_few_parameters):
    """The same gradient as integrating (a, args_bar) together (the layout
    used when the parameters are few)."""
    grad = lambda: jax.grad(_quadrature_loss, argnums=(0, 1))(*_QUADRATURE_INPUTS)
    summed = grad()
    monkeypatch.setattr(quadrature, "RECORD_LIMIT", 0)
    together = grad()
    for q, t in zip(summed, together):
        np.testing.assert_allclose(np.asarray(q), np.asarray(t), rtol=1e-8, atol=1e-11)
