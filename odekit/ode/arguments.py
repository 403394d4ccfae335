"""Argument checks shared by the ODE front ends (odeint, solve_ivp): each
raises at trace time with a message naming the front end and what to change."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Pytree = Any


def static_float(value: Any, name: str, allow_inf: bool = False, who: str = "odeint") -> float:
    """A non-negative Python float from a concrete number, with a clear error."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{who}: {name} must be a concrete number (it is a static option), "
                        f"not a traced value; pass a Python float.")
    try:
        number = float(np.asarray(value).reshape(()))
    except (TypeError, ValueError):
        raise TypeError(f"{who}: {name} must be a number, got {value!r}.") from None
    if np.isnan(number) or number < 0 or (np.isinf(number) and not allow_inf):
        raise ValueError(f"{who}: {name} must be a non-negative finite number"
                         f"{' or inf' if allow_inf else ''}, got {value!r}.")
    return number


def check_args(args: tuple, who: str = "odeint", func: str = "func", name: str = "*args") -> None:
    for leaf in jax.tree.leaves(args):
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
            if jnp.issubdtype(jnp.result_type(leaf), jnp.number) or jnp.result_type(leaf) == bool:
                continue
        raise TypeError(
            f"{who}: the contents of {name} must be arrays or numbers, got {type(leaf).__name__} "
            f"{leaf!r}. Close over non-array values in {func} instead of passing them.")


def prepare_y0(y0: Pytree, who: str = "odeint") -> Pytree:
    leaves, treedef = jax.tree.flatten(y0)
    if not leaves:
        raise ValueError(f"{who}: y0 has no array leaves; pass an array or a pytree of arrays.")
    out = []
    for leaf in leaves:
        try:
            arr = jnp.asarray(leaf)
        except TypeError:
            raise TypeError(f"{who}: y0 leaves must be arrays or numbers, got {leaf!r}.") from None
        if not jnp.issubdtype(arr.dtype, jnp.inexact):
            arr = arr.astype(jnp.result_type(float))
        out.append(arr)
    return jax.tree.unflatten(treedef, out)
