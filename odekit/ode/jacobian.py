"""The Jacobian df/dy a stiff step uses: the user's ``jac`` where one was
given (``solve_ivp(..., jac=...)``), else forward mode of the field.

A field carries a user Jacobian as its ``jacobian`` attribute:
``func.jacobian(y, t, *args)`` beside ``func(y, t, *args)`` (odekit's
argument order, ``y`` a 1-D array). :func:`bind` fixes ``args`` of both,
as the engine calls them; :func:`of` evaluates the Jacobian of a bound field
at a flat state.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from odekit._tree import cast_like

Pytree = Any


@dataclasses.dataclass(frozen=True)
class WithJacobian:
    """A bound vector field ``field(y, t)`` with its (n, n) Jacobian
    ``jacobian(y, t)`` for a 1-D state ``y`` of n numbers."""

    field: Callable
    jacobian: Callable

    def __call__(self, y: Pytree, t: jax.Array) -> Pytree:
        return self.field(y, t)


def bind(func: Callable, args: tuple) -> Callable:
    """``(y, t) -> func(y, t, *args)`` cast to y's dtypes (as the solve
    evaluates it), carrying ``func.jacobian`` (bound the same way) if any."""
    field = lambda y, t: cast_like(func(y, t, *args), y)
    user = getattr(func, "jacobian", None)
    if user is None:
        return field
    return WithJacobian(field, lambda y, t: user(y, t, *args))


def of(func: Callable, flat_field: Callable, y: jax.Array, t: jax.Array) -> jax.Array:
    """df/dy at the flat (n,) state ``y``: ``func``'s own Jacobian when it
    carries one (``func`` takes the state's structure: for a user Jacobian
    that is the flat state itself), else forward mode of ``flat_field(v,
    t)`` over the n unit directions."""
    user = getattr(func, "jacobian", None)
    if user is not None:
        return jnp.asarray(user(y, t)).astype(y.dtype)
    return jax.jacfwd(lambda v: flat_field(v, t))(y)
