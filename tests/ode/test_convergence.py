"""Measured convergence orders of the explicit methods (slopes, not spot values).

* Fixed-step global error at T = 1.5 on Kepler's eccentric orbit (e = 0.6,
  from pericentre to just before apocentre; nonlinear, exact solution from
  Kepler's equation): the slope of log(error) against log(h) must be within
  0.3 of ``tableau.order`` for the propagated solution and of
  ``tableau.error_order`` for the embedded one (y1 - error, propagated on its
  own). The step ranges start where the error is asymptotic and stop before
  rounding (~1e-15) matters; slopes measured with them (numbers of steps in
  ``STEPS`` / ``EMBEDDED_STEPS``):

  ========  ==========  ===========  ====================
  method    order       embedded     dense (local, p + 1)
  ========  ==========  ===========  ====================
  bosh3     2.98 (3)    1.98 (2)     3.92 (3 + 1)
  dopri5    5.24 (5)    4.10 (4)     4.89 (4 + 1)
  tsit5     5.24 (5)    4.10 (4)     4.96 (4 + 1)
  dopri8    8.19 (8)    5.11 (5)     7.7 (7 + 1)
  ========  ==========  ===========  ====================

* Dense output: one step of size h from a point of the exact solution,
  evaluated at theta = 0.2, 0.5, 0.8 inside the step. An interpolant of order
  p has local error O(h^(p + 1)); the slope must be at least p + 0.5, which
  excludes order p - 1.

* Tolerance sweep: odeint's error decreases monotonically (by more than 10x
  per step of the sweep) as rtol = atol decreases, and stays within a
  constant of it.

Each fixed-step sweep is one jitted, vmapped ``lax.fori_loop`` over the
numbers of steps, so a method costs one compilation.
"""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from odekit.ode.methods import interpolation
from odekit.ode.odeint import odeint
from odekit.ode.methods.rk_step import rk_step
from odekit.ode.methods.explicit_tableaux import TABLEAUX
from odekit.testing.problems import get_problem, reference_solution

METHODS = ("bosh3", "dopri5", "tsit5", "dopri8")
KEPLER = get_problem("kepler")
T_END = 1.5
ORDER_MARGIN = 0.3

# Numbers of fixed steps over [0, T_END] in each method's asymptotic range.
STEPS = {
    "bosh3": (64, 128, 256, 512, 1024),
    "dopri5": (64, 128, 256, 512),
    "tsit5": (64, 128, 256, 512),
    "dopri8": (16, 24, 32, 48, 64),
}
EMBEDDED_STEPS = {
    "bosh3": (128, 256, 512, 1024),
    "dopri5": (48, 96, 192, 384, 768),
    "tsit5": (48, 96, 192, 384, 768),
    "dopri8": (24, 48, 96, 192),
}
# Step sizes of the one-step dense-output test (dopri8 reaches rounding sooner).
DENSE_STEPS = {m: 0.1 * 2.0 ** (-np.arange(7) / 2) for m in ("bosh3", "dopri5", "tsit5")}
DENSE_STEPS["dopri8"] = 0.1 * 2.0 ** (-np.arange(4) / 2)
THETAS = np.array([0.2, 0.5, 0.8])


def kepler_field(y, t):
    return KEPLER.func(y, t, *KEPLER.args)


def fitted_slope(step_sizes, errors) -> float:
    """Least-squares slope of log(error) against log(step size)."""
    return float(np.polyfit(np.log(step_sizes), np.log(errors), 1)[0])


@partial(jax.jit, static_argnums=0)
def fixed_step_solutions(method: str, num_steps: jax.Array):
    """y(T_END) by ``num_steps`` fixed steps (vmapped over the (m,) counts):
    the propagated solution y1 and, separately, the embedded one y1 - error."""
    tableau = TABLEAUX[method]
    y0 = jnp.asarray(KEPLER.y0)

    def one(n):
        h = T_END / n.astype(jnp.float64)

        def body(i, carry):
            y, y_hat = carry
            t = i.astype(h.dtype) * h
            step = rk_step(kepler_field, tableau, t, y, kepler_field(y, t), h)
            hat = rk_step(kepler_field, tableau, t, y_hat, kepler_field(y_hat, t), h)
            return step.y1, jax.tree.map(jnp.subtract, hat.y1, hat.error)

        return lax.fori_loop(0, n, body, (y0, y0))

    return jax.vmap(one)(num_steps)


@pytest.fixture(scope="module")
def kepler_end():
    return reference_solution(KEPLER, [0.0, T_END])[1]


@pytest.mark.parametrize("method", METHODS)
def test_fixed_step_orders(method, kepler_end):
    tableau = TABLEAUX[method]
    counts = sorted(set(STEPS[method]) | set(EMBEDDED_STEPS[method]))
    propagated, embedded = fixed_step_solutions(method, jnp.asarray(counts))
    error = dict(zip(counts, np.max(np.abs(np.asarray(propagated) - kepler_end), axis=1)))
    error_hat = dict(zip(counts, np.max(np.abs(np.asarray(embedded) - kepler_end), axis=1)))

    def slope(which, errors):
        return fitted_slope([T_END / n for n in which], [errors[n] for n in which])

    order = slope(STEPS[method], error)
    embedded_order = slope(EMBEDDED_STEPS[method], error_hat)
    assert abs(order - tableau.order) <= ORDER_MARGIN, (method, order, error)
    assert abs(embedded_order - tableau.error_order) <= ORDER_MARGIN, (method, embedded_order)
    # the ranges stay clear of rounding
    assert min(error[n] for n in STEPS[method]) > 1e-13


@pytest.mark.parametrize("method", METHODS)
def test_dense_output_order(method):
    tableau = TABLEAUX[method]
    t0 = 0.5
    y0 = jnp.asarray(reference_solution(KEPLER, [t0])[0])
    step_sizes = DENSE_STEPS[method]

    @jax.jit
    @jax.vmap
    def interpolate(h):
        step = rk_step(kepler_field, tableau, t0, y0, kepler_field(y0, t0), h)
        stages = interpolation.extend_stages(kepler_field, tableau, t0, y0, h, step.stages)
        return interpolation.evaluate(tableau, y0, h, stages, jnp.asarray(THETAS))

    values = np.asarray(interpolate(jnp.asarray(step_sizes)))
    times = t0 + step_sizes[:, None] * THETAS[None, :]
    exact = reference_solution(KEPLER, times.ravel()).reshape(values.shape)
    errors = np.max(np.abs(values - exact), axis=(1, 2))
    assert np.all(np.diff(errors) < 0)
    slope = fitted_slope(step_sizes, errors)
    assert slope >= tableau.dense_order + 0.5, (method, slope, errors)


@pytest.mark.parametrize("method", ["dopri5", "dopri8"])
def test_error_decreases_with_tolerance(method):
    """odeint's error over Kepler's two orbits for rtol = atol = 1e-6, 1.4e-8
    (the default, whose compilation the value tests share) and 1e-10."""
    tolerances = (1e-6, 1.4e-8, 1e-10)
    reference = reference_solution(KEPLER)
    errors = []
    for tol in tolerances:
        ys = odeint(KEPLER.func, jnp.asarray(KEPLER.y0), jnp.asarray(KEPLER.t), *KEPLER.args,
                    rtol=tol, atol=tol, method=method)
        errors.append(float(np.max(np.abs(np.asarray(ys) - reference))))
    assert all(later < 0.1 * earlier for earlier, later in zip(errors, errors[1:])), errors
    # within a constant of the tolerance (Kepler's constant of test_odeint_values)
    assert all(e <= 1500 * tol for e, tol in zip(errors, tolerances)), errors
