"""Argument checks shared by the ODE front ends (odeint, solve_ivp): each
raises at trace time with a message naming the front end and what to change."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from odekit.custom.closure import closure_convert
from odekit.ode.engine.controller import PerElement, per_leaf, uniform_or_per_element

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


def _is_scalar(value: Any) -> bool:
    if isinstance(value, (bool, int, float, np.generic)):
        return True
    return getattr(value, "shape", None) == () and not isinstance(value, (list, tuple, dict))


def static_tolerance(value: Any, name: str, y0: Pytree, who: str = "odeint") -> float | PerElement:
    """A tolerance as the loop takes it (static, concrete): a Python float for
    a number (or for an array whose entries are all equal), else a
    :class:`~odekit.ode.engine.controller.PerElement` of float64 arrays.

    Accepted: a number; when ``y0`` is one array, an array (or nested list)
    broadcastable to its shape; for any ``y0``, a pytree with ``y0``'s
    structure whose leaves (numbers or arrays) broadcast to ``y0``'s leaves.
    Every entry must be non-negative and finite."""
    if _is_scalar(value):
        return static_float(value, name, who=who)
    leaves, treedef = jax.tree.flatten(y0)
    single = jax.tree_util.treedef_is_leaf(treedef)
    if single:
        parts = [value]
    else:
        try:
            parts = treedef.flatten_up_to(value)
        except (ValueError, TypeError):
            raise ValueError(
                f"{who}: {name} must be a number or a pytree with the structure of y0, "
                f"{treedef} (leaves broadcastable to y0's leaves, of shapes "
                f"{[tuple(leaf.shape) for leaf in leaves]}), got {value!r}.") from None
    arrays = []
    for i, (part, leaf) in enumerate(zip(parts, leaves)):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(part)):
            raise TypeError(f"{who}: {name} must be concrete (it is a static option), not a "
                            f"traced value; pass Python floats or NumPy arrays.")
        try:
            array = np.asarray(part, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{who}: {name} must be a number or an array of numbers, got "
                            f"{part!r}.") from None
        where = "y0" if single else f"y0's leaf {i}"
        try:
            fits = np.broadcast_shapes(array.shape, leaf.shape) == tuple(leaf.shape)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{who}: {name} of shape {array.shape} does not broadcast to the "
                             f"shape {tuple(leaf.shape)} of {where}; pass a number, or one "
                             f"entry per component of {where}.")
        if np.any(np.isnan(array)) or np.any(array < 0) or np.any(np.isinf(array)):
            raise ValueError(f"{who}: {name} must be non-negative and finite in every entry, "
                             f"got {array.tolist()!r} for {where}.")
        arrays.append(array)
    return uniform_or_per_element(arrays)


def check_tolerances(rtol: float | PerElement, atol: float | PerElement, y0: Pytree,
                     who: str = "odeint") -> None:
    """No component may have both tolerances zero (its error scale would be 0)."""
    leaves = jax.tree.leaves(y0)
    rtols, atols = per_leaf(rtol, len(leaves)), per_leaf(atol, len(leaves))
    for i, (leaf, r, a) in enumerate(zip(leaves, rtols, atols)):
        both = np.broadcast_to((np.asarray(r) == 0) & (np.asarray(a) == 0), leaf.shape)
        if np.any(both):
            place = "" if len(leaves) == 1 and not np.shape(r) and not np.shape(a) else (
                f" (they are at index {tuple(int(j) for j in np.argwhere(both)[0])} of "
                f"y0's leaf {i})")
            raise ValueError(f"{who}: rtol and atol cannot both be zero{place}.")


RTOL_FLOOR_EPS = 4   # rtol below this many eps of the state's dtype is raised to it


def effective_rtol(rtol: float | PerElement, y0: Pytree, who: str = "odeint",
                   default: float | None = None, stacklevel: int = 3) -> float | PerElement:
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
    if isinstance(rtol, PerElement):    # the floor applies entry by entry
        low = [(a > 0) & (a < floor) for a in rtol.leaves]
        if not any(np.any(m) for m in low):
            return rtol
        smallest = min(float(a[m].min()) for a, m in zip(rtol.leaves, low) if np.any(m))
        warnings.warn(f"{who}: rtol entries down to {smallest:g} are below the precision of "
                      f"the {coarse.dtype.name} state (eps={float(coarse.eps):.3g}); using "
                      f"rtol={floor:.3g} for them. Pass a float64 y0 for tighter tolerances.",
                      UserWarning, stacklevel=stacklevel)
        return uniform_or_per_element([np.where(m, floor, a) for a, m in zip(rtol.leaves, low)])
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


def check_finite_y0(y0: Pytree, who: str = "solve_ivp") -> None:
    """A ValueError when a concrete ``y0`` holds nan or inf (a traced one is
    checked as the solve runs: status NONFINITE)."""
    for i, leaf in enumerate(jax.tree.leaves(y0)):
        value = known_value(leaf)
        if value is None or np.all(np.isfinite(value)):
            continue
        where = tuple(int(j) for j in np.argwhere(~np.isfinite(value))[0]) if value.ndim else ()
        leaf_name = "" if jax.tree_util.treedef_is_leaf(jax.tree.structure(y0)) else f" of leaf {i}"
        raise ValueError(f"{who}: All components of the initial state `y0` must be finite; "
                         f"y0{leaf_name} is {value[where]} at index {where}.")


def check_output(out: Pytree, y0: Pytree, who: str = "odeint", func: str = "func") -> None:
    """``out`` (shapes and dtypes of ``func``'s result) must match ``y0``:
    same structure, same leaf shapes, no complex leaf for a real one."""
    y_struct, out_struct = jax.tree.structure(y0), jax.tree.structure(out)
    if y_struct != out_struct:
        why = (f"with {_size(out)} numbers where y0 has {_size(y0)}"
               if _size(out) != _size(y0) else "with complex values for a real y0")
        raise TypeError(f"{who}: {func} must return a pytree with the structure of y0, "
                        f"{y_struct}, but it returned {out_struct}, {why}. Another structure "
                        "is accepted when it holds "
                        "as many numbers, none complex for a real y0 (its leaves are read in "
                        "order into y0's, as jax.experimental.ode does).")
    for y_leaf, o_leaf in zip(jax.tree.leaves(y0), jax.tree.leaves(out)):
        if y_leaf.shape != o_leaf.shape:
            raise ValueError(f"{who}: {func} returned a leaf of shape {o_leaf.shape} where y0 has "
                             f"shape {y_leaf.shape}; dy/dt must have the shape of y.")
        if jnp.issubdtype(o_leaf.dtype, jnp.complexfloating) and not jnp.iscomplexobj(y_leaf):
            raise TypeError(f"{who}: {func} returned complex values for a real y0 leaf; "
                            "make y0 complex (e.g. y0.astype(complex)).")


def _size(tree: Pytree) -> int:
    return sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(tree))


def readable_as_y0(out: Pytree, y0: Pytree) -> bool:
    """Whether ``func``'s result ``out`` (shapes and dtypes) has another
    structure than ``y0`` that :func:`as_structure_of` reads into y0's: as
    many numbers in all, and no complex ones for a real y0 (a list of
    scalars for an array y0, an array for a list y0: what
    jax.experimental.ode's odeint accepts, since it ravels func's output)."""
    if jax.tree.structure(out) == jax.tree.structure(y0):
        return False
    leaves = jax.tree.leaves(out)
    if not leaves or not all(hasattr(leaf, "dtype") and hasattr(leaf, "shape") for leaf in leaves):
        return False
    complex_out = any(jnp.issubdtype(leaf.dtype, jnp.complexfloating) for leaf in leaves)
    real_y0 = any(not jnp.iscomplexobj(leaf) for leaf in jax.tree.leaves(y0))
    return _size(out) == _size(y0) and not (complex_out and real_y0)


def as_structure_of(func: Callable, y0: Pytree) -> Callable:
    """``func`` with its result read into y0's structure: its leaves raveled
    in order and concatenated, then split, reshaped and cast into y0's
    leaves (jax.experimental.ode's ``ravel_pytree`` of func's output)."""
    leaves, treedef = jax.tree.flatten(y0)
    common = np.result_type(*(leaf.dtype for leaf in leaves))

    def read(*args: Any) -> Pytree:
        flat = jnp.concatenate([jnp.ravel(jnp.asarray(v)).astype(common)
                                for v in jax.tree.leaves(func(*args))])
        parts, start = [], 0
        for leaf in leaves:
            size = int(np.prod(leaf.shape))
            parts.append(flat[start:start + size].reshape(leaf.shape).astype(leaf.dtype))
            start += size
        return jax.tree.unflatten(treedef, parts)
    return read


class _OtherStructure(Exception):
    """Stops the first conversion of a ``func`` whose result is :func:`readable_as_y0`."""


def convert_field(func: Callable, example_args: tuple, y0: Pytree,
                  check: Callable[[Pytree], None]) -> tuple[Callable, list]:
    """``closure_convert(func, *example_args)`` after ``check`` of its
    result, in one trace of ``func``; a result of another structure that is
    :func:`readable_as_y0` is read into y0's structure instead
    (:func:`as_structure_of`, converted in a second trace, only then)."""
    def check_or_stop(out: Pytree) -> None:
        if readable_as_y0(out, y0):
            raise _OtherStructure
        check(out)

    try:
        return closure_convert(func, *example_args, check=check_or_stop)
    except _OtherStructure:
        return closure_convert(as_structure_of(func, y0), *example_args, check=check)
