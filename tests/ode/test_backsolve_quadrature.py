"""adjoint="backsolve" with many parameters: their cotangents as a quadrature.

With more parameter numbers than the backward loop carries (y, a and the
departure monitor) and an explicit method, the backward solve integrates
(y, a) alone, records its steps, and sums the parameters' cotangents over
those steps taken again (odekit/ode/adjoints/quadrature.py). The models
here are small, so the fixture lowers the threshold (256 parameters by
default); values are checked against central differences, the checkpoint
adjoint and the layout carrying the cotangents.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.ode.adjoints import backsolve as adjoint_backsolve
from odekit.ode.adjoints import quadrature
from odekit.testing import check_grads

RAISED = (odekit.SolverError, jax.errors.JaxRuntimeError, ValueError)


def _coupled(t, y, matrix, bias):
    return jnp.tanh(matrix @ y + bias) - 0.1 * y


def _loss(matrix, bias, y0, t0, t1, adjoint="backsolve", max_steps=None):
    """Rows at t0, inside and at t1 (twice: t_eval and the final state)."""
    sol = odekit.solve_ivp(_coupled, (t0, t1), y0, args=(matrix, bias), method="tsit5",
                           adjoint=adjoint, rtol=1e-10, atol=1e-10, max_steps=max_steps,
                           t_eval=jnp.stack([t0, 0.7, 1.9, t1]))
    return jnp.sum(sol.ys * jnp.array([[0.3, -0.2], [1.0, 0.5], [-0.4, 0.8], [0.6, 1.1]]))


_INPUTS = (jnp.array([[0.5, -1.2], [0.9, 0.2]]), jnp.array([0.1, -0.3]),
           jnp.array([1.0, 0.5]), jnp.asarray(0.1), jnp.asarray(3.0))
_ALL = (0, 1, 2, 3, 4)


@pytest.fixture
def quadrature_for_few_parameters(monkeypatch):
    """The quadrature path for a model of 6 parameters."""
    monkeypatch.setattr(quadrature, "MIN_PARAMETERS", 1)


def test_the_quadrature_applies_from_more_parameters_than_the_loop_carries():
    tsit5, rodas5p = (adjoint_backsolve.get_method(m) for m in ("tsit5", "rodas5p"))
    assert quadrature.applies(tsit5, 5, 4482, True, 16390)
    assert not quadrature.applies(tsit5, 5, 100, True, 16390)       # too few to pay
    assert not quadrature.applies(tsit5, 5, 4482, False, 16390)     # mixed dtypes
    assert not quadrature.applies(tsit5, 5, 4482, True, 2 ** 22)    # record too large
    assert not quadrature.applies(rodas5p, 5, 4482, True, 100)      # factorizations


@pytest.mark.parametrize("max_steps", [None, 400])
def test_gradients_match_central_differences(max_steps, quadrature_for_few_parameters):
    """Every input (matrix, bias, y0, t0, t1); without a step limit (record
    sized for 4096 forward steps) and with one (record sized to it)."""
    loss = jax.jit(lambda *x: _loss(*x, max_steps=max_steps))
    check_grads(loss, _INPUTS, order=1, modes=("rev",), rtol=1e-6, atol=1e-9)


def test_same_gradient_as_carrying_the_cotangents(monkeypatch, quadrature_for_few_parameters):
    """Equal to the joint integration of (y, a, args_bar) to the tolerance
    (the steps differ: the error norm no longer sees args_bar), and to
    the checkpoint adjoint's."""
    grad = lambda adjoint="backsolve": jax.grad(_loss, argnums=_ALL)(*_INPUTS, adjoint=adjoint)
    summed = grad()
    monkeypatch.setattr(quadrature, "RECORD_LIMIT", 0)
    carried = grad()
    reference = grad("checkpoint")
    for q, c, r in zip(summed, carried, reference):
        np.testing.assert_allclose(np.asarray(q), np.asarray(c), rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(np.asarray(q), np.asarray(r), rtol=1e-7, atol=1e-9)


def test_a_backward_solve_longer_than_the_record_is_redone_carrying_them(
        monkeypatch, quadrature_for_few_parameters):
    """Without a step limit the record holds 4 x UNLIMITED_RECORD steps; a
    longer backward solve takes the path carrying the cotangents (same
    gradient as with a record long enough), never a truncated sum."""
    grad = lambda: jax.grad(_loss, argnums=(0, 1))(*_INPUTS)
    long_enough = grad()
    monkeypatch.setattr(adjoint_backsolve, "UNLIMITED_RECORD", 1)
    overflowed = grad()
    for a, b in zip(long_enough, overflowed):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("adjoint", ["backsolve",
                                     pytest.param("interpolate", marks=pytest.mark.long)])
def test_under_vmap_and_jit(adjoint, quadrature_for_few_parameters):
    def grad_bias(bias):
        return jax.grad(lambda b: _loss(_INPUTS[0], b, *_INPUTS[2:], adjoint=adjoint))(bias)
    biases = jnp.stack([_INPUTS[1], _INPUTS[1] + 0.2])
    batched = jax.jit(jax.vmap(grad_bias))(biases)
    for b, row in zip(biases, batched):
        np.testing.assert_allclose(np.asarray(row), np.asarray(grad_bias(b)), rtol=1e-9)


@pytest.mark.long
def test_second_derivatives_match_the_checkpoint_adjoint(quadrature_for_few_parameters):
    """The backward pass's own derivative (interval by interval) is unchanged."""
    def hessian_diagonal(adjoint):
        loss = lambda b: _loss(_INPUTS[0], b, *_INPUTS[2:], adjoint=adjoint)
        return jax.jacrev(jax.grad(loss))(_INPUTS[1])
    np.testing.assert_allclose(np.asarray(hessian_diagonal("backsolve")),
                               np.asarray(hessian_diagonal("checkpoint")), rtol=1e-6, atol=1e-8)


def test_an_unreliable_backward_solve_still_fails_loudly(quadrature_for_few_parameters):
    """The departure monitor rides in the quadrature's backward loop: y' =
    [[-1, 1], [0, -10]] y (and 8 parameters w it ignores) on [0, 20] comes
    back multiplied by e^{200} (test_backsolve_failure.py)."""
    def loss(a, w):
        sol = odekit.solve_ivp(lambda t, y, a, w: a @ y + 0.0 * jnp.sum(w), (0.0, 20.0),
                               jnp.ones(2), args=(a, w), method="tsit5", adjoint="backsolve",
                               rtol=1e-10, atol=1e-14, t_eval=jnp.array([20.0]))
        return jnp.sum(sol.ys)
    with pytest.raises(RAISED, match="adjoint='backsolve' is not reliable"):
        jax.block_until_ready(jax.grad(loss)(jnp.array([[-1.0, 1.0], [0.0, -10.0]]),
                                             jnp.zeros(8)))


@pytest.mark.long
@pytest.mark.parametrize("adjoint", ["backsolve", "interpolate"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex128])
def test_float32_and_complex_states(dtype, adjoint, quadrature_for_few_parameters):
    """State and parameters of one dtype take the quadrature path (both
    continuous adjoints): the gradient agrees with the checkpoint adjoint's
    to the tolerance."""
    matrix, bias, y0 = (x.astype(dtype) for x in _INPUTS[:3])

    def loss(m, b, adjoint):
        ys = odekit.solve_ivp(_coupled, (0.0, 2.0), y0, args=(m, b), method="tsit5",
                              adjoint=adjoint, rtol=1e-6, atol=1e-6,
                              t_eval=jnp.array([1.0, 2.0])).ys
        return jnp.sum(jnp.real(ys * jnp.conj(ys)))

    grads = [jax.grad(loss, argnums=(0, 1))(matrix, bias, a) for a in (adjoint, "checkpoint")]
    for q, c in zip(*grads):
        assert q.dtype == dtype
        assert float(jnp.max(jnp.abs(q - c)) / jnp.max(jnp.abs(c))) < 1e-4
