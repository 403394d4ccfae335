"""The continuous adjoint of a linearly implicit system ``M y' = f(y, t)``.

With a constant mass matrix M, possibly singular (an index-1 DAE; the null
spaces ``U_0^T M = 0``, ``M V_0 = 0`` of
:mod:`odekit.ode.linalg.mass_matrix`), the adjoint of a loss L with
cotangents ``g_i = dL/dy(t_i)`` at the output times obeys, between them,

    M^T lambda' = -J^T lambda,          J = df/dy at y(t),
    dL/dp       = int lambda^T df/dp dt  +  (the direct terms below),
    dL/dy0      = M^T lambda(t0),

because ``d/dt (lambda^T M dy) = lambda^T f_p dp`` along a perturbation
``dy`` of the solution (``M dy' = J dy + f_p dp``). The adjoint is itself an
index-1 DAE, of mass matrix ``M^T``, whose algebraic equations are
``V_0^T J^T lambda = 0``, solved backwards by the same stiff method
(:meth:`MassMatrix.for_adjoint` adds the quadratures of dL/dp).

At an output time the perturbation of the solution is consistent: the
algebraic components follow the differential ones, ``U_0^T (J dy + f_p
dp) = 0``. With ``G = U_0^T J V_0`` (m, m; nonsingular at index 1) and the
projection ``P = I - V_0 G^-1 U_0^T J`` onto consistent directions, ``dy =
P dw - V_0 G^-1 U_0^T f_p dp``, so ``g_i`` splits into (:func:`jump`)

    M^T (lambda jump) = P^T g_i = g_i - J^T U_0 w,     w = G^-T V_0^T g_i,
    dL/dp            += -(U_0 w)^T f_p                  (one vjp of f with U_0 w),

and the jump ``(M^T)^+ P^T g_i + U_0 mu``, ``mu = -G^-T V_0^T J^T (M^T)^+
P^T g_i``, keeps lambda consistent with its algebraic equations (Cao, Li,
Petzold & Serban, "Adjoint sensitivity analysis for differential-algebraic
equations", SIAM J. Sci. Comput. 24 (2003), the index-1 case). A moved
output time moves the value by the consistent slope: ``dL/dt_i = g_i .
y'(t_i)`` (:meth:`MassMatrix.slope`), ``dL/dt0 = -lambda(t0) . f(y0, t0)``
(``lambda^T M y' = lambda^T f``). Rows at t0 itself hold the input y0:
their cotangents go to y0 as they are.

For ``M = I`` these are the ODE's adjoint equations
(:mod:`odekit.ode.adjoints.continuous`). Cost per jump: m forward-mode
products with J, two vector-Jacobian products and two m x m solves.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from odekit._tree import tree_ravel
from odekit.ode.adjoints import continuous
from odekit.ode.linalg import linear_system
from odekit.ode.linalg.mass_matrix import MassMatrix

Pytree = Any


def mass_of(func: Callable) -> MassMatrix | None:
    """The mass matrix the forward field's linear system carries, or None."""
    return getattr(linear_system.of(func), "mass", None)


@dataclasses.dataclass(frozen=True)
class FieldWithMass:
    """A backward field ``field(z, s, *args)`` that carries the linear system
    of its mass matrix (the engine reads ``linear_system``)."""

    field: Callable
    linear_system: Any

    def __call__(self, *operands: Any) -> Any:
        return self.field(*operands)


def with_adjoint_mass(field: Callable, mass: MassMatrix, size: int) -> FieldWithMass:
    """The flat backward field of ``size`` numbers (lambda's n first, then the
    quadratures) with the mass matrix ``blockdiag(M^T, I)``."""
    return FieldWithMass(field, linear_system.Dense(mass=mass.for_adjoint(size - mass.size)))


def _work_dtype(dtype: Any) -> Any:
    """The dtype of the small m x m algebra: float32 at least (no LU takes float16)."""
    return jnp.dtype(jnp.float32) if jnp.finfo(dtype).bits < 32 else jnp.dtype(dtype)


def jump(func: Callable, mass: MassMatrix, y: Pytree, t: jax.Array, args: tuple,
         g: Pytree) -> tuple[Pytree, list]:
    """``(lambda jump, dL/dp terms)`` of the cotangent ``g`` (like ``y``) of
    the value ``y`` at ``t`` (see the module docstring): a pytree like y and
    a list like the inexact leaves of ``args``."""
    y_flat, unravel = tree_ravel(y)
    work = _work_dtype(y_flat.dtype)
    g_flat = tree_ravel(g)[0].astype(work)
    diff_args, _ = continuous.split_args(args)
    if mass.num_algebraic == 0:
        lam = mass.transpose_pseudo_inverse_times(g_flat)
        return unravel(lam.astype(y_flat.dtype)), [jnp.zeros_like(a) for a in diff_args]
    left = jnp.asarray(mass.left_null, work)
    right = jnp.asarray(mass.right_null, work)
    flat_f = lambda v: tree_ravel(func(unravel(v), t, *args))[0].astype(y_flat.dtype)
    jv = jax.vmap(lambda c: jax.jvp(flat_f, (y_flat,), (c.astype(y_flat.dtype),))[1],
                  in_axes=1, out_axes=1)(right).astype(work)             # (n, m) = J V_0
    coupling = left.T @ jv                                               # G = U_0^T J V_0
    w = jnp.linalg.solve(coupling.T, right.T @ g_flat)
    _, a_y, a_args = continuous.adjoint_field(func, y, unravel((left @ w).astype(y_flat.dtype)),
                                              t, args)
    projected = g_flat - tree_ravel(a_y)[0].astype(work)                # P^T g
    lam = mass.transpose_pseudo_inverse_times(projected)
    lam = lam - left @ jnp.linalg.solve(coupling.T, jv.T @ lam)
    return unravel(lam.astype(y_flat.dtype)), [-a for a in a_args]


def slope(func: Callable, mass: MassMatrix, y: Pytree, t: jax.Array, args: tuple) -> Pytree:
    """The consistent y'(t) at a value ``y`` of the solution (like ``y``)."""
    y_flat, unravel = tree_ravel(y)
    work = _work_dtype(y_flat.dtype)
    flat_f = lambda v, s: tree_ravel(func(unravel(v), s, *args))[0].astype(y_flat.dtype)
    f0 = flat_f(y_flat, t).astype(work)
    jac_times = lambda v: jax.jvp(lambda u: flat_f(u, t), (y_flat,),
                                  (v.astype(y_flat.dtype),))[1].astype(work)
    f_t = jax.jvp(lambda s: flat_f(y_flat, s), (t,), (jnp.ones_like(t),))[1].astype(work)
    return unravel(mass.slope(f0, jac_times, f_t).astype(y_flat.dtype))


def time_cotangents(func: Callable, mass: MassMatrix, ys: Pytree, ts: jax.Array, g: Pytree,
                    lam0: Pytree, g_at_start: Pytree, args: tuple) -> jax.Array:
    """dL/dt_i = g_i . y'(t_i) for rows i >= 1 and dL/dt_0 = -lambda(t0) .
    f(y0, t0) - g_0 . y'(t0), with ``g_at_start`` the cotangents of the rows
    at t0 (which reach y0 directly, not through lambda; their rows' time
    cotangents go to t0 too and cancel that last term, as in the ODE)."""
    slopes = jax.vmap(lambda y, t: slope(func, mass, y, t, args))(ys, ts)
    t_bar = jax.vmap(partial(continuous.dot_real, dtype=ts.dtype))(slopes, g)
    y0 = continuous.at(ys, 0)
    t0_bar = (-continuous.dot_real(lam0, func(y0, ts[0], *args), ts.dtype)
              - continuous.dot_real(g_at_start, continuous.at(slopes, 0), ts.dtype))
    return jnp.concatenate([t0_bar[None], t_bar[1:]]).astype(ts.dtype)


def initial_cotangent(mass: MassMatrix, lam0: Pytree, g_at_start: Pytree) -> Pytree:
    """dL/dy0 = M^T lambda(t0) plus the cotangents of the rows at t0."""
    flat, unravel = tree_ravel(lam0)
    return jax.tree.map(jnp.add, unravel(mass.transpose_times(flat)), g_at_start)
