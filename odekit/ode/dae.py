"""Consistent initial values of ``M y' = f(t, y)`` with a singular mass matrix.

With the null spaces of M (:mod:`odekit.ode.linalg.mass_matrix`): ``U_0``
(n, m), ``U_0^T M = 0``, and ``V_0`` (n, m), ``M V_0 = 0``, the DAE holds the
m algebraic equations ``g(t, y) = U_0^T f(t, y) = 0`` at every time, so an
initial value must satisfy them too (*consistency*). The m algebraic
components are the coordinates ``z`` of ``y = y_0 + V_0 z``; the rest of
``y_0`` (its differential part) is what the user prescribes.

Check (:func:`consistency`, always made at ``t0``): one Newton step for ``z``
from ``z = 0``,

    G = U_0^T J V_0           (m, m),  J = df/dy(t0, y0)
    delta = -V_0 G^-1 g(t0, y0)        (n,)

``y0`` is consistent when that correction is within the solve's tolerance,
``max_i |delta_i| / (atol_i + rtol |y0_i|) <= 1`` (units of y, not of f: an
equation's residual is judged by the change of y that would remove it, as
IDA's IDACalcIC judges its Newton iterates, Hindmarsh et al. 2005, Sec. 2.1).
The DAE has index 1 at ``y0`` when G is nonsingular (Hairer & Wanner, Solving
ODEs II, Sec. VII.1; Brenan, Campbell & Petzold, Sec. 2.2); a singular G (the
constraint does not involve the algebraic components, e.g. ``0 = y1 - sin t``
for ``y1' = y2``) means index 2 or more, which the stiff methods cannot
solve: the solve refuses it and suggests index reduction.

Initialization (:func:`initialize`, ``solve_ivp(..., dae_initialize=True)``):
``z`` from ``odekit.root`` (Newton) on ``z -> g(t0, y0 + V_0 z)`` from
``z = 0``, the differential part held fixed (IDA's ``IDA_YA_YDP_INIT`` case:
differential components given, algebraic ones computed). Its derivatives with
respect to the parameters come from the implicit function theorem (root's
custom rule).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from odekit.ode.engine.controller import per_leaf
from odekit.ode.linalg.mass_matrix import MassMatrix
from odekit.root import root

Pytree = Any


class Consistency(NamedTuple):
    """The check of an initial value at t0.

    Attributes:
      error: the Newton correction of the algebraic components in units of
        the tolerance, ``max_i |delta_i| / (atol_i + rtol |y0_i|)`` (0 for an
        ODE); consistent when <= 1. nan or inf where G is singular.
      index_one: G = U_0^T J V_0 is nonsingular (the DAE has index 1 there).
    """

    error: jax.Array
    index_one: jax.Array


def tolerance_scale(y0: Pytree, rtol: Any, atol: Any) -> jax.Array:
    """``atol + rtol |y0|`` over the flattened state, (n,) of y0's real dtype
    (``rtol``, ``atol``: floats or per-element tolerances, as the loop's)."""
    leaves = jax.tree.leaves(y0)
    scales = []
    for leaf, r, a in zip(leaves, per_leaf(rtol, len(leaves)), per_leaf(atol, len(leaves))):
        magnitude = jnp.abs(leaf)
        dtype = magnitude.dtype
        r = jnp.asarray(np.broadcast_to(np.asarray(r, np.float64), leaf.shape), dtype)
        a = jnp.asarray(np.broadcast_to(np.asarray(a, np.float64), leaf.shape), dtype)
        scales.append((a + r * magnitude).ravel())
    return jnp.concatenate(scales) if scales else jnp.zeros((0,))


def _null_spaces(mass: MassMatrix, dtype: Any) -> tuple[jax.Array, jax.Array]:
    return jnp.asarray(mass.left_null, dtype), jnp.asarray(mass.right_null, dtype)


def consistency(flat_field: Callable[[jax.Array], jax.Array], y: jax.Array, mass: MassMatrix,
                scale: jax.Array) -> Consistency:
    """Check the flat (n,) initial value ``y`` of ``M y' = flat_field(y)``
    (the field at t0; see the module docstring).

    Args:
      flat_field: (n,) -> (n,), f(t0, .) on the flattened state.
      y: (n,) initial value; mass: the mass matrix.
      scale: (n,) ``atol + rtol |y|`` (:func:`tolerance_scale`).
    """
    m = mass.num_algebraic
    if m == 0:
        return Consistency(jnp.zeros((), scale.dtype), jnp.ones((), bool))
    left, right = _null_spaces(mass, y.dtype)
    f0, jv = jax.vmap(lambda v: jax.jvp(flat_field, (y,), (v,)), out_axes=(None, 1))(right.T)
    # (the small m x m algebra in float32 at least: no SVD or solve takes float16)
    work = jnp.dtype(jnp.float32) if jnp.finfo(y.dtype).bits < 32 else y.dtype
    g = (left.T @ f0).astype(work)                    # (m,)
    g_z = (left.T @ jv).astype(work)                  # (m, m) = U_0^T J V_0
    singular_values = jnp.linalg.svd(g_z, compute_uv=False)
    largest, smallest = singular_values[0], singular_values[-1]
    eps = jnp.finfo(singular_values.dtype).eps
    index_one = jnp.isfinite(largest) & (smallest > m * eps * largest)
    safe = jnp.where(index_one, g_z, jnp.eye(m, dtype=g_z.dtype))
    delta = right.astype(work) @ jnp.linalg.solve(safe, g)
    error = jnp.max(jnp.abs(delta) / scale.astype(work)).astype(scale.dtype)
    error = jnp.where(index_one, error, jnp.inf)
    return Consistency(error, index_one)


def initialize(flat_field: Callable[..., jax.Array], y: jax.Array, mass: MassMatrix,
               params: Pytree, throw: bool) -> tuple[jax.Array, jax.Array]:
    """The consistent initial value ``y + V_0 z`` with ``U_0^T
    flat_field(y + V_0 z, params) = 0``, ``z`` by ``odekit.root`` (Newton
    from ``z = 0``), and whether root converged.

    Args:
      flat_field: ``(v, params) -> (n,)``, f(t0, .) on the flattened state
        (``params`` are the arrays it depends on: gradients flow to them, and
        to ``y``, through root's implicit-function rule).
      y: (n,) initial guess whose differential part is kept.
      mass: the mass matrix; params: pytree of arrays.
      throw: root raises when Newton fails (else the flag is False).
    """
    m = mass.num_algebraic
    if m == 0:
        return y, jnp.ones((), bool)
    left, right = _null_spaces(mass, y.dtype)

    def algebraic(z: jax.Array, y: jax.Array, params: Pytree) -> jax.Array:
        return left.T @ flat_field(y + right @ z, params)

    result = root(algebraic, jnp.zeros((m,), y.dtype), y, params, method="newton", throw=throw)
    return y + right @ result.x, result.success
