"""The Jacobian df/dy a stiff step uses: the user's ``jac`` where one was
given (``solve_ivp(..., jac=...)``), else forward mode of the field.

A field carries a user Jacobian as its ``jacobian`` attribute:
``func.jacobian(y, t, *args)`` beside ``func(y, t, *args)`` (odekit's
argument order, ``y`` a 1-D array). :func:`bind` fixes ``args`` of both,
as the engine calls them; :func:`of` evaluates the Jacobian of a bound field
at a flat state; :func:`with_time_derivative` gives ``J = df/dy`` and
``f_t = df/dt`` together (a Rosenbrock step needs both): one ``jax.jvp``
vectorised over the n + 1 directions ``(e_1, 0), ..., (e_n, 0), (0, 1)``,
whose first n results are the columns of J and the last f_t.
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
    ``jacobian(y, t)`` for a 1-D state ``y`` of n numbers (or None), and the
    linear system its stiff steps use
    (:mod:`odekit.ode.linalg.linear_system`; None: dense)."""

    field: Callable
    jacobian: Callable | None
    linear_system: Any = None

    def __call__(self, y: Pytree, t: jax.Array) -> Pytree:
        return self.field(y, t)


def bind(func: Callable, args: tuple) -> Callable:
    """``(y, t) -> func(y, t, *args)`` cast to y's dtypes (as the solve
    evaluates it), carrying ``func.jacobian`` (bound the same way) and
    ``func.linear_system`` if any."""
    field = lambda y, t: cast_like(func(y, t, *args), y)
    user = getattr(func, "jacobian", None)
    system = getattr(func, "linear_system", None)
    if user is None and system is None:
        return field
    bound = None if user is None else (lambda y, t: user(y, t, *args))
    return WithJacobian(field, bound, system)


def of(func: Callable, flat_field: Callable, y: jax.Array, t: jax.Array) -> jax.Array:
    """df/dy at the flat (n,) state ``y``: ``func``'s own Jacobian when it
    carries one (``func`` takes the state's structure: for a user Jacobian
    that is the flat state itself), else forward mode of ``flat_field(v,
    t)`` over the n unit directions (one vectorised ``jax.jvp``, as
    :func:`with_time_derivative`: a complex state gets the complex derivative
    of a holomorphic field, where ``jax.jacfwd`` refuses complex inputs)."""
    user = getattr(func, "jacobian", None)
    if user is not None:
        return jnp.asarray(user(y, t)).astype(y.dtype)
    return forward(lambda v: flat_field(v, t), y)


def forward(flat_function: Callable, y: jax.Array) -> jax.Array:
    """The (n, n) Jacobian of ``flat_function`` at the (n,) ``y`` by forward
    mode over the n unit directions, real or complex (for a complex ``y``
    the derivative of a holomorphic function)."""
    eye = jnp.eye(y.shape[0], dtype=y.dtype)
    return jax.vmap(lambda u: jax.jvp(flat_function, (y,), (u,))[1])(eye).T


def with_time_derivative(field: Callable, y: jax.Array, t: jax.Array,
                         user: Callable | None = None) -> tuple[jax.Array, jax.Array]:
    """``(J, f_t)``: the (n, n) Jacobian of ``field(y, t)`` in ``y`` and its (n,)
    time derivative, by one vectorised forward-mode pass over n + 1 directions;
    with a ``user`` Jacobian ``user(y, t)``, J from it and f_t by one jvp."""
    n = y.shape[0]
    if user is not None:
        f_t = jax.jvp(lambda s: field(y, s), (t,), (jnp.ones_like(t),))[1]
        return jnp.asarray(user(y, t)).astype(y.dtype), f_t
    dy = jnp.concatenate([jnp.eye(n, dtype=y.dtype), jnp.zeros((1, n), y.dtype)])
    dt = (jnp.arange(n + 1) == n).astype(t.dtype)   # no scatter: one-kernel loops (single_kernel)
    columns = jax.vmap(lambda u, s: jax.jvp(field, (y, t), (u, s))[1])(dy, dt)
    return columns[:n].T, columns[n]
