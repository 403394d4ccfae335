"""Argument checks shared by the ODE front ends (odeint, solve_ivp): each
raises at trace time with a message naming the front end and what to change."""
from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Pytree = Any


def known_value(x: Any) -> np.ndarray | None:
    """``x`` as a NumPy array when its value is known at trace time (a Python
    number or list, a NumPy or concrete JAX array), else None (a tracer, or a
    list holding one). Take it from what the caller passed: inside ``jit``
    even ``jnp.asarray`` of a constant is a tracer."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except (TypeError, ValueError):   # TracerArrayConversionError is a TypeError
        return None


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


RTOL_FLOOR_EPS = 4   # rtol below this many eps of the state's dtype is raised to it


def effective_rtol(rtol: float, y0: Pytree, who: str = "odeint",
                   default: float | None = None, stacklevel: int = 3) -> float:
    """``rtol``, raised to ``RTOL_FLOOR_EPS`` eps of the least precise leaf of
    ``y0`` when it asks for more digits than the state carries (a UserWarning
    says so). A relative tolerance below a few ulp cannot be met: steps
    shrink until ``h f`` is lost to rounding and the state stalls (bfloat16
    with rtol=1.4e-8 froze at y(1) = 0.957 instead of 0.368). ``rtol == 0``
    (pure absolute control) is kept, and so is the front end's ``default``
    in float32 (jax.experimental.ode's 1.4e-8: more accurate there than the
    floor); the loop's stall test guards both (:mod:`odekit.ode.engine.controller`)."""
    leaves = jax.tree.leaves(y0)
    finfos = [jnp.finfo(jnp.result_type(leaf)) for leaf in leaves]
    coarse = max(finfos, key=lambda fi: float(fi.eps))
    floor = RTOL_FLOOR_EPS * float(coarse.eps)
    if rtol == 0 or rtol >= floor:
        return rtol
    if default is not None and rtol == default and coarse.bits >= 32:
        return rtol
    warnings.warn(f"{who}: rtol={rtol:g} is below the precision of the {coarse.dtype.name} state "
                  f"(eps={float(coarse.eps):.3g}); using rtol={floor:.3g}. Pass a float64 y0 for "
                  f"tighter tolerances.", UserWarning, stacklevel=stacklevel)
    return floor


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


def check_output(out: Pytree, y0: Pytree, who: str = "odeint", func: str = "func") -> None:
    """``out`` (shapes and dtypes of ``func``'s result) must match ``y0``:
    same structure, same leaf shapes, no complex leaf for a real one."""
    y_struct, out_struct = jax.tree.structure(y0), jax.tree.structure(out)
    if y_struct != out_struct:
        raise TypeError(f"{who}: {func} must return a pytree with the structure of y0, "
                        f"{y_struct}, but it returned {out_struct}.")
    for y_leaf, o_leaf in zip(jax.tree.leaves(y0), jax.tree.leaves(out)):
        if y_leaf.shape != o_leaf.shape:
            raise ValueError(f"{who}: {func} returned a leaf of shape {o_leaf.shape} where y0 has "
                             f"shape {y_leaf.shape}; dy/dt must have the shape of y.")
        if jnp.issubdtype(o_leaf.dtype, jnp.complexfloating) and not jnp.iscomplexobj(y_leaf):
            raise TypeError(f"{who}: {func} returned complex values for a real y0 leaf; "
                            "make y0 complex (e.g. y0.astype(complex)).")
