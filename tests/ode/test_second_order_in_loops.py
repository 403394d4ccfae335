"""Second derivatives of solves, event times and roots inside ``lax.fori_loop``.

Reverse mode of a scan partially evaluates its primal body with the carry
unknown (jax 0.10's loop-invariant hoisting), and that drops the rule of
every ``jax.custom_jvp`` called there: the few-inputs Jacobian of the
checkpoint adjoint, the implicit event time and the implicit root were then
differentiated a second time through their primal loops. Found: jax.hessian
and jvp of grad of a stiff solve came out 0 (the single kernel's operands
travel as bytes), an event time's second derivative 0.0011 against -0.0075,
and grad of grad failed to trace ("Reverse-mode differentiation does not work
for lax.while_loop"). Those rules are now primitives that partial evaluation
keeps (:mod:`odekit._sealed_jvp`). Every case here is checked against central
differences of its own gradient, in both second-order modes.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import odekit
from odekit.ode.engine import single_kernel

TIGHT = dict(rtol=1e-10, atol=1e-10)
Y0 = jnp.array([2.0, 0.5])
B = jnp.asarray(0.3)


def pendulum(y, t, b):
    return jnp.stack([y[1], -b * y[1] - 9.8 * jnp.sin(y[0])])


def _odeint(**options):
    return lambda y, b: odekit.odeint(pendulum, y, jnp.array([0.0, 0.3]), b, **TIGHT,
                                      **options)[-1]


def _event_time(y, b):
    crossing = lambda t, y, b: y[0] - 1.0
    crossing.terminal = True
    sol = odekit.solve_ivp(lambda t, y, b: pendulum(y, t, b), (0.0, 2.0), y, args=(b,),
                           events=crossing, **TIGHT)
    return y * sol.t_events[0].reshape(-1)[0]


def _root(y, b):
    x = odekit.root(lambda x, b: x ** 3 + b * x - y[0], jnp.asarray(1.0), b)
    return y * x.x


def _fixed_point(y, b):
    x = odekit.fixed_point(lambda x, b: jnp.cos(b * x) + 0.1 * y[0], jnp.asarray(0.5), b)
    return y * x.x


STEPS = {
    "rodas5p": _odeint(method="rodas5p"),
    "kvaerno5": _odeint(method="kvaerno5"),
    "bdf": _odeint(method="bdf"),
    "dopri5, checkpointed loop": _odeint(adjoint=odekit.Checkpoint(max_directions=0)),
    "event time": _event_time,
    "root": _root,
    "fixed point": _fixed_point,
}
# the few-inputs Jacobian (a stiff method's default), the event time and the
# root in CI; the other rules' paths are the same code (long)
IN_CI = {"rodas5p", "event time", "root"}


def _loop(step):
    return lambda b: jnp.sum(lax.fori_loop(0, 2, lambda i, y: step(y, b), Y0))


@pytest.mark.parametrize("name", [name if name in IN_CI
                                  else pytest.param(name, marks=pytest.mark.long)
                                  for name in STEPS])
def test_second_derivatives_inside_fori_loop(name):
    total = _loop(STEPS[name])
    gradient = jax.jit(jax.grad(total))
    second = jax.jit(lambda b: (jax.grad(jax.grad(total))(b),
                                jax.jvp(jax.grad(total), (b,), (jnp.ones_like(b),))[1]))
    step = 1e-3
    difference = (gradient(B + step) - gradient(B - step)) / (2 * step)
    reverse_over_reverse, forward_over_reverse = second(B)
    assert abs(float(difference)) > 1e-3          # a derivative that zero would not pass
    np.testing.assert_allclose(reverse_over_reverse, difference, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(forward_over_reverse, difference, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("switch", [pytest.param("1", marks=pytest.mark.long), "0"])
def test_backsolve_grad_of_grad_inside_fori_loop(switch, monkeypatch):
    """The continuous adjoint's second order inside a loop, kernel by kernel
    too ("0": every platform but the CPU), where its residual t_eval, kept as
    the input itself, once came back with the wrong shape ("Incompatible
    shapes for broadcasting" in adjoints/continuous.py)."""
    monkeypatch.setenv(single_kernel.ENV_SWITCH, switch)
    total = _loop(_odeint())
    gradient = jax.jit(jax.grad(total))
    step = 1e-3
    difference = (gradient(B + step) - gradient(B - step)) / (2 * step)
    np.testing.assert_allclose(jax.jit(jax.grad(jax.grad(total)))(B), difference,
                               rtol=1e-4, atol=1e-6)


def test_hessian_inside_fori_loop_under_vmap():
    """jax.hessian (forward over reverse) of a stiff solve in a loop, batched:
    the rule's primitive is batched as itself."""
    total = _loop(STEPS["rodas5p"])
    bs = jnp.array([0.3, 0.5])
    hessians = jax.jit(jax.vmap(jax.hessian(total)))(bs)
    gradient = jax.jit(jax.vmap(jax.grad(total)))
    step = 1e-3
    np.testing.assert_allclose(hessians, (gradient(bs + step) - gradient(bs - step)) / (2 * step),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("adjoint", ["checkpoint", pytest.param("forward", marks=pytest.mark.long)])
def test_mixed_second_derivative_through_a_solve_the_first_did_not_reach(adjoint):
    """d/db of d/da where the solve depends on b only: the first derivative
    leaves the solve in the loop's primal body with no tangent, where JAX's
    partial evaluation inlined its primal (a single-kernel loop, whose
    derivative came out 0 for the stiff method, silently)."""
    def f(a, b):
        def body(i, carry):
            x, y = carry
            y_next = odekit.odeint(pendulum, y, jnp.array([0.0, 0.3]), b, method="rodas5p",
                                   adjoint=adjoint, **TIGHT)[-1]
            return x * a + jnp.sum(y), y_next
        return lax.fori_loop(0, 3, body, (jnp.asarray(1.0), Y0))[0]

    a = jnp.asarray(0.7)
    grad_a = jax.jit(jax.grad(f, 0))
    step = 1e-4
    difference = (grad_a(a, B + step) - grad_a(a, B - step)) / (2 * step)
    assert abs(float(difference)) > 1e-2
    forward_over_reverse = jax.jit(lambda b: jax.jvp(lambda b: jax.grad(f, 0)(a, b), (b,),
                                                     (jnp.ones_like(b),))[1])(B)
    np.testing.assert_allclose(forward_over_reverse, difference, rtol=1e-5)
    if adjoint == "checkpoint":
        np.testing.assert_allclose(jax.jit(jax.grad(lambda b: jax.grad(f, 0)(a, b)))(B),
                                   difference, rtol=1e-5)
