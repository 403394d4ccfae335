"""adjoint="checkpoint": the derivative of the discrete solution (issue 14).

Checked against central finite differences (odekit.testing.check_grads) in
forward and reverse mode, against the backsolve adjoint, through jit and
vmap, to second order, through events and dense output, and on the problem
where backsolve's backward integration is unstable.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.ode.engine import bounded_loop
from odekit.testing import check_grads
from odekit.testing.problems import falling_body, get_problem

TIGHT = dict(rtol=1e-11, atol=1e-11)
GRAD_TOL = dict(rtol=2e-5, atol=1e-7)


def _short(problem, n=4):
    t = np.asarray(problem.t)
    return jnp.asarray(np.linspace(t[0], t[0] + 0.3 * (t[-1] - t[0]), n))


# (Lotka-Volterra, another nonlinear 2-state field, is long)
@pytest.mark.parametrize("name", ["pendulum", pytest.param("lotka_volterra",
                                                           marks=pytest.mark.long)])
def test_gradients_match_finite_differences_in_both_modes(name):
    p = get_problem(name)
    t = _short(p)
    loss = jax.jit(lambda y0, t, *args: odekit.odeint(p.func, y0, t, *args, adjoint="checkpoint",
                                                       **TIGHT))
    check_grads(loss, (jnp.asarray(p.y0), t, *map(jnp.asarray, p.args)), modes=("fwd", "rev"),
                **GRAD_TOL)


def test_agrees_with_backsolve_and_closed_over_values_get_gradients():
    p = get_problem("pendulum")
    t = _short(p)

    def loss(adjoint, b, shift):
        func = lambda y, s, g: p.func(y, s, b, g) + shift      # closes over b and shift
        return odekit.odeint(func, jnp.asarray(p.y0), t, p.args[1], adjoint=adjoint, **TIGHT).sum()

    args = (jnp.asarray(p.args[0]), jnp.array([0.1, -0.2]))
    g_check = jax.grad(lambda *a: loss("checkpoint", *a), argnums=(0, 1))(*args)
    g_back = jax.grad(lambda *a: loss("backsolve", *a), argnums=(0, 1))(*args)
    for a, b in zip(jax.tree.leaves(g_check), jax.tree.leaves(g_back)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    check_grads(jax.jit(lambda *a: loss("checkpoint", *a)), args, modes=("fwd", "rev"), **GRAD_TOL)


def _second_order_problem():
    """A jitted loss of (y0, a) through the checkpointed loop, and its point."""
    p = get_problem("time_dependent_linear")
    t = _short(p, n=3)
    loss = jax.jit(lambda y0, a: odekit.odeint(p.func, y0, t, a,
                                              adjoint=odekit.Checkpoint(levels=2, max_steps=512),
                                              rtol=1e-10, atol=1e-10).sum())
    return loss, jnp.asarray(p.y0), jnp.asarray(p.args[0])


def test_second_order_reverse_over_reverse():
    loss, y0, a = _second_order_problem()
    # second order by reverse over reverse against differences of the gradient;
    # forward over reverse is the hessian (the long variant below)
    check_grads(loss, (y0, a), order=2, modes=("rev",), rtol=1e-4, atol=1e-6)


def test_grad_of_grad_of_the_checkpointed_loop_is_finite_on_a_nonlinear_field():
    """The loop's idle iterations have h = 0, and the output rows' theta =
    (t_out - t) / h there was inf: discarded by a select, but its second
    derivative's 0 * inf made grad of grad NaN (dopri5, tsit5, bosh3 on the
    pendulum, any tolerance)."""
    p = get_problem("pendulum")
    loss = lambda b: odekit.odeint(p.func, jnp.asarray(p.y0), jnp.array([0.0, 0.3]), b,
                                   p.args[1], adjoint=odekit.Checkpoint(max_directions=0),
                                   **TIGHT)[-1].sum()
    gradient = jax.jit(jax.grad(loss))
    b, step = jnp.asarray(p.args[0]), 1e-3
    second = jax.jit(jax.grad(jax.grad(loss)))(b)
    assert np.isfinite(second)
    np.testing.assert_allclose(second, (gradient(b + step) - gradient(b - step)) / (2 * step),
                               rtol=1e-4, atol=1e-7)


@pytest.mark.long
def test_hessian_and_jacfwd_against_jacrev():
    loss, y0, a = _second_order_problem()
    np.testing.assert_allclose(jax.jacfwd(loss, argnums=1)(y0, a), jax.jacrev(loss, argnums=1)(y0, a),
                               rtol=1e-10)
    hess = jax.hessian(loss, argnums=0)(y0, a)
    assert hess.shape == y0.shape * 2 and bool(jnp.all(jnp.isfinite(hess)))
    np.testing.assert_allclose(hess, jax.jacrev(jax.grad(loss))(y0, a), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("levels", [1, pytest.param(2, marks=pytest.mark.long), 3])
def test_levels_change_memory_not_the_gradient(levels):
    p = get_problem("pendulum")
    t = _short(p)
    grad = jax.grad(lambda b: odekit.odeint(p.func, jnp.asarray(p.y0), t, b, p.args[1],
                                            adjoint=odekit.Checkpoint(levels=levels,
                                                                      max_directions=0),
                                            **TIGHT).sum())
    reference = jax.grad(lambda b: odekit.odeint(p.func, jnp.asarray(p.y0), t, b, p.args[1],
                                                 **TIGHT).sum())
    np.testing.assert_allclose(grad(p.args[0]), reference(p.args[0]), rtol=1e-6)


@pytest.mark.parametrize("directions", [0, 16])    # the checkpointed loop, the Jacobian
def test_vmap_of_grad_and_jit(directions):
    p = get_problem("pendulum")
    t = _short(p)
    # under vmap every member runs the bound
    adjoint = odekit.Checkpoint(max_steps=256, max_directions=directions)
    grad = jax.jit(jax.vmap(jax.grad(lambda y0: odekit.odeint(p.func, y0, t, *p.args,
                                                              adjoint=adjoint).sum())))
    y0s = jnp.stack([jnp.asarray(p.y0) * s for s in (0.5, 1.0)])
    one = jax.grad(lambda y0: odekit.odeint(p.func, y0, t, *p.args, adjoint=adjoint).sum())
    np.testing.assert_allclose(grad(y0s), jnp.stack([one(y) for y in y0s]), rtol=1e-10)


def test_the_problem_where_backsolve_fails():
    """y' = [[-k, 1], [0, -10]] y, y0 = [1, 1] on [0, 20]: d sum(y(20)) / dk at
    k = 1 is -4.578e-8 (closed form below); backsolve's backward integration
    of the -10 mode grows like exp(10 t)."""
    def func(y, t, k):
        return jnp.stack([-k * y[0] + y[1], -10.0 * y[1]])

    T, k = 20.0, 1.0
    exact = (-T * np.exp(-k * T)
             + (-T * np.exp(-k * T) * (10 - k) + np.exp(-k * T) - np.exp(-10 * T)) / (10 - k) ** 2)
    grad = jax.grad(lambda k: odekit.odeint(func, jnp.ones(2), jnp.array([0.0, T]), k,
                                            adjoint="checkpoint", rtol=1e-10, atol=1e-14)[-1].sum())
    assert abs(float(grad(k)) - exact) < 1e-4 * abs(exact)
    a = jnp.array([[-1.0, 1.0], [0.0, -10.0]])
    grad_a = jax.grad(lambda a: odekit.odeint(lambda y, t, a: a @ y, jnp.ones(2),
                                              jnp.array([0.0, T]), a, adjoint="checkpoint",
                                              rtol=1e-10, atol=1e-14)[-1].sum())(a)
    assert float(jnp.max(jnp.abs(grad_a))) < 1e-6        # truth ~5e-8 (backsolve: ~1e68)
    np.testing.assert_allclose(grad_a[0, 0], -exact, rtol=1e-4)   # a[0, 0] = -k


# Long for both: solve_ivp's default (checkpoint) differentiates event times,
# dense output and the recorded rows in CI in tests/ode/test_solve_ivp.py
# (test_gradient_reaches_values_closed_over_by_fun_and_events,
# test_dense_output_is_jittable_and_differentiable_in_t_and_parameters,
# test_gradients_against_finite_differences).
@pytest.mark.parametrize("adjoint, derivative", [
    pytest.param("checkpoint", jax.grad, marks=pytest.mark.long),
    pytest.param("forward", jax.jacfwd, marks=pytest.mark.long)])
def test_solve_ivp_events_dense_output_and_record(adjoint, derivative):
    fall, hit = falling_body()
    kw = dict(adjoint=adjoint, rtol=1e-10, atol=1e-10)
    fall_time = lambda g: odekit.solve_ivp(fall, (0.0, 10.0), jnp.array([10.0, 0.0]), args=(g,),
                                           events=hit, **kw).t_events[0]
    np.testing.assert_allclose(derivative(fall_time)(9.81), -0.5 * np.sqrt(20.0 / 9.81 ** 3),
                               rtol=1e-8)
    height = lambda g: odekit.solve_ivp(fall, (0.0, 1.0), jnp.array([10.0, 0.0]), args=(g,),
                                        dense_output=True, **kw).sol(0.5)[0]
    np.testing.assert_allclose(derivative(height)(9.81), -0.125, rtol=1e-8)
    np.testing.assert_allclose(jax.jacfwd(height)(9.81), -0.125, rtol=1e-8)
    last = lambda g: odekit.solve_ivp(fall, (0.0, 1.0), jnp.array([10.0, 0.0]), args=(g,),
                                      **kw).ys[-1, 0]
    np.testing.assert_allclose(derivative(last)(9.81), -0.5, rtol=1e-8)


def test_a_differentiated_solve_beyond_the_bound_fails_loudly():
    # max_directions=0: the checkpointed loop, whose bound is max_steps
    p = get_problem("pendulum")
    loss = lambda b, adjoint: odekit.odeint(p.func, jnp.asarray(p.y0), jnp.asarray(p.t), b,
                                            p.args[1], adjoint=adjoint).sum()
    looped = odekit.Checkpoint(max_steps=20, max_directions=0)
    assert np.isfinite(float(loss(p.args[0], looped)))             # the plain solve has no bound
    with pytest.raises(odekit.ODESolverError, match="maximum number of steps.*Checkpoint"):
        jax.grad(loss)(p.args[0], looped)
    # one perturbed number: the forward-mode Jacobian, which needs no bound
    few = jax.grad(loss)(p.args[0], odekit.Checkpoint(max_steps=20))
    np.testing.assert_allclose(few, jax.grad(loss)(p.args[0], "checkpoint"), rtol=1e-12)


@pytest.mark.parametrize("directions", [0, 16])
def test_the_jacobian_and_the_loop_give_the_same_gradient(directions):
    # (y0, b, g): 4 perturbed numbers, so 16 takes the Jacobian and 0 the loop
    p = get_problem("pendulum")
    t = _short(p)
    adjoint = odekit.Checkpoint(max_directions=directions)
    loss = lambda y0, b, g: odekit.odeint(p.func, y0, t, b, g, adjoint=adjoint, **TIGHT).sum()
    args = (jnp.asarray(p.y0), *map(jnp.asarray, p.args))
    reference = jax.grad(lambda *a: odekit.odeint(p.func, a[0], t, *a[1:], adjoint="backsolve",
                                                  **TIGHT).sum(), argnums=(0, 1, 2))(*args)
    for a, b in zip(jax.grad(loss, argnums=(0, 1, 2))(*args), reference):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)


def test_a_long_output_grid_fits_the_bound_of_the_solve():
    # The differentiated loop stops at every 8th output time: 800 outputs add
    # 100 steps to a solve of ~10 steps, and max_steps=40 must still hold.
    t_eval = jnp.linspace(0.0, 1.0, 800)
    loss = lambda k: odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), jnp.ones(1), args=(k,),
                                      t_eval=t_eval, max_steps=40, rtol=1e-8, atol=1e-10,
                                      adjoint="checkpoint").ys.sum()
    exact = -np.sum(np.asarray(t_eval) * np.exp(-1.5 * np.asarray(t_eval)))
    np.testing.assert_allclose(jax.grad(loss)(1.5), exact, rtol=1e-6)


def test_invalid_adjoints_are_trace_time_errors():
    with pytest.raises(ValueError, match="unknown adjoint 'adjoint'"):
        odekit.odeint(lambda y, t: -y, 1.0, jnp.array([0.0, 1.0]), adjoint="adjoint")
    with pytest.raises(ValueError, match="levels must be a positive int"):
        odekit.Checkpoint(levels=0)
    with pytest.raises(ValueError, match="max_directions must be a non-negative int"):
        odekit.Checkpoint(max_directions=-1)


def test_bounded_loop_base_and_trip_count():
    assert bounded_loop.base_for(4096, 2) == 64 and bounded_loop.base_for(4097, 2) == 65
    assert bounded_loop.base_for(1000, 3) == 10 and bounded_loop.base_for(1, 4) == 1
    count = bounded_loop.bounded_while_loop(lambda c: c < 37, lambda c: c + 1, jnp.int32(0), 100, 2)
    assert int(count) == 37
    # reverse mode through it: d/dx of x * 1.1^37
    grad = jax.grad(lambda x: bounded_loop.bounded_while_loop(
        lambda c: c[0] < 37, lambda c: (c[0] + 1, c[1] * 1.1), (jnp.int32(0), x), 100, 3)[1])(1.0)
    np.testing.assert_allclose(grad, 1.1 ** 37, rtol=1e-12)


# CI: every block stored (levels 1, no head) and the default levels behind
# the head (members in it and in the nest past it); long: the default levels
# without a head and three levels behind it.
@pytest.mark.parametrize("levels, closed", [(1, 1), pytest.param(2, 1, marks=pytest.mark.long),
                                            (2, 4096),
                                            pytest.param(3, 4096, marks=pytest.mark.long)])
def test_bounded_loop_in_its_head_and_past_it_under_vmap(levels, closed):
    """Members that end inside the head (64 iterations), at its last block and
    in the nest behind it, batched: each member's value and derivatives, in
    both modes, are its own (x a^n in x and a, the carried product's
    derivative through every iteration). The body closes over ``closed``
    copies of ``a``: 4096 (32 KiB) takes the head, 1 does not."""
    head = bounded_loop.HEAD_BLOCKS * bounded_loop.BLOCK
    trips = jnp.array([3, head - 1, head, head + 1, 5 * head + 7], dtype=jnp.int32)
    assert (8 * closed >= bounded_loop.HEAD_MIN_CLOSED_BYTES) == (closed == 4096)

    def power(x, a, n):
        copies = jnp.full(closed, a)
        return bounded_loop.bounded_while_loop(
            lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * jnp.mean(copies)),
            (jnp.int32(0), x), 8 * head, levels)[1]

    a = 1.0 + 1.0 / (4.0 * head)
    x = jnp.linspace(0.5, 1.5, trips.shape[0])
    n = np.asarray(trips, dtype=float)
    values = jax.jit(jax.vmap(power, (0, None, 0)))(x, a, trips)
    np.testing.assert_allclose(values, np.asarray(x) * a ** n, rtol=1e-11)
    dx, da = jax.jit(jax.vmap(jax.grad(power, argnums=(0, 1)), (0, None, 0)))(x, a, trips)
    np.testing.assert_allclose(dx, a ** n, rtol=1e-11)
    np.testing.assert_allclose(da, np.asarray(x) * n * a ** (n - 1), rtol=1e-11)
    tangent = jax.vmap(lambda x, n: jax.jvp(lambda a: power(x, a, n), (a,), (1.0,))[1])(x, trips)
    np.testing.assert_allclose(tangent, da, rtol=1e-11)
    # second derivatives: reverse over reverse and forward over reverse
    d2 = jax.jit(jax.vmap(jax.grad(jax.grad(power, 1), 1), (0, None, 0)))(x, a, trips)
    np.testing.assert_allclose(d2, np.asarray(x) * n * (n - 1) * a ** (n - 2), rtol=1e-10)
    d2_fwd = jax.vmap(lambda x, n: jax.jvp(lambda a: jax.grad(power, 1)(x, a, n), (a,),
                                           (1.0,))[1])(x, trips)
    np.testing.assert_allclose(d2_fwd, d2, rtol=1e-10)


def _shared_weights_loss(adjoint, events=None, dense=False):
    """A batched neural-ODE loss: 20 shared weights (W 4x4, b 4) over a batch
    of initial states, whose members take different numbers of steps."""
    t_eval = jnp.linspace(0.0, 2.0, 5)

    def field(t, y, w, b):
        return jnp.tanh(w @ y + b) - 0.5 * y

    def member(params, y0):
        sol = odekit.solve_ivp(field, (0.0, 2.0), y0, args=params, t_eval=t_eval,
                               events=events, dense_output=dense, adjoint=adjoint,
                               rtol=1e-9, atol=1e-9, throw=False)
        loss = jnp.sum(sol.ys[:3] ** 2)     # t <= 1: before any terminal event
        if events is not None:
            loss = loss + sum(times[0] for times in sol.t_events)  # each fires once
        if dense:
            loss = loss + jnp.sum(sol.sol(1.3))
        return loss

    def batch(params, y0s):
        return jnp.sum(jax.vmap(member, (None, 0))(params, y0s))

    w = 0.5 * jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    b = 0.1 * jnp.arange(4.0)
    y0s = jax.random.normal(jax.random.PRNGKey(1), (3, 4)) * jnp.array([[0.1], [1.0], [3.0]])
    return member, batch, (w, b), y0s


@pytest.mark.parametrize("adjoint", [
    pytest.param(odekit.Checkpoint(), marks=pytest.mark.long), odekit.Checkpoint(max_directions=0)],
                         ids=["20-of-16-directions", "max_directions-0"])
def test_grad_of_a_vmapped_solve_through_the_checkpointed_loop(adjoint):
    """Issue 27 item 12: jax.grad of a vmapped solve (the batched loss) went
    through the checkpointed loop, whose member-by-member guard vmap turned
    into a select with a stop_gradient on tangents: "Transpose rule for
    'stop_gradient'". It is the per-member gradients summed."""
    member, batch, params, y0s = _shared_weights_loss(adjoint)
    grad = jax.grad(batch)(params, y0s)
    summed = jax.tree.map(lambda *g: sum(g), *[jax.grad(member)(params, y0) for y0 in y0s])
    for a, b in zip(grad, summed):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    check_grads(lambda w, b: batch((w, b), y0s), params, modes=("rev",), rtol=1e-5, atol=1e-7)


@pytest.mark.long      # 100 s on 2 cores; the vmapped-loop gradient itself runs in CI above
def test_grad_of_a_vmapped_solve_with_events_and_dense_output():
    """The branches inside a step (event location, a terminal event's stop)
    under a batched predicate: the same failure, the same answer."""
    def crossing(t, y, w, b):       # near t = 1 in every member
        return t - 1.0 - 0.1 * y[0]

    stop = lambda t, y, w, b: t - 1.7 - 0.1 * y[1]    # from t = 1.48 to 1.73
    stop.terminal = True
    for events in ([crossing], [crossing, stop]):
        member, batch, params, y0s = _shared_weights_loss(odekit.Checkpoint(max_directions=0),
                                                          events=events, dense=True)
        grad = jax.grad(batch)(params, y0s)
        summed = jax.tree.map(lambda *g: sum(g), *[jax.grad(member)(params, y0) for y0 in y0s])
        for a, b in zip(grad, summed):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
