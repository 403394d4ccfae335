"""Small pytree arithmetic shared by every odekit solver.

States and iterates are arbitrary pytrees of floating arrays (mixed dtypes
allowed); these helpers work leaf by leaf and reduce over all leaves, so
solvers never ravel a mixed structure unless they need a matrix (Newton,
Broyden). Each leaf keeps its own dtype, so the helpers are clean under
``jax_numpy_dtype_promotion="strict"``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from odekit import _lax as ops

PyTree = Any


def widest_dtype(tree: PyTree) -> np.dtype:
    """The dtype every leaf of ``tree`` promotes to, by NumPy's rules.

    Mixed float32/float64 leaves give float64 whatever the JAX promotion
    mode (``jnp.result_type`` raises for them under strict promotion).
    """
    return np.result_type(*(jnp.result_type(leaf) for leaf in jax.tree.leaves(tree)))


def tree_ravel(tree: PyTree) -> tuple[jax.Array, Callable[[jax.Array], PyTree]]:
    """``jax.flatten_util.ravel_pytree``, also for mixed dtypes under strict promotion.

    The flat vector has the widest leaf dtype; ``unravel`` casts each chunk
    back to its leaf's dtype.
    """
    with jax.numpy_dtype_promotion("standard"):  # only picks the flat dtype
        return ravel_pytree(tree)


def tree_add(x: PyTree, y: PyTree, scale: jax.typing.ArrayLike = 1.0) -> PyTree:
    """``x + scale * y`` leaf by leaf."""
    def add(a: jax.Array, b: jax.Array) -> jax.Array:
        return a + (jnp.asarray(scale).astype(b.dtype) * b).astype(a.dtype)
    return jax.tree.map(add, x, y)


def tree_sub(x: PyTree, y: PyTree) -> PyTree:
    """``x - y`` leaf by leaf."""
    return jax.tree.map(lambda a, b: a - b, x, y)


def tree_where(pred: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    """``where(pred, new, old)`` with a scalar predicate, leaf by leaf."""
    def pick(a: Any, b: Any) -> Any:
        if (np.ndim(pred) == 0 and getattr(a, "dtype", None) is not None
                and getattr(a, "dtype", None) == getattr(b, "dtype", None)
                and np.shape(a) == np.shape(b)):
            return jax.lax.select(pred, a, b)   # no jitted jnp wrapper (see odekit._lax)
        return jnp.where(pred, a, b)
    return jax.tree.map(pick, new, old)


def cast_like(tree: PyTree, like: PyTree) -> PyTree:
    """Each leaf of ``tree`` cast to the dtype of the matching leaf of ``like``."""
    def cast(a: Any, b: Any) -> Any:
        dtype = jnp.result_type(b)
        if getattr(a, "dtype", None) == dtype and isinstance(a, jax.Array):
            return a        # the usual case, traced on every stage of every solve
        return jnp.asarray(a).astype(dtype)
    return jax.tree.map(cast, tree, like)


def tree_max_abs(x: PyTree) -> jax.Array:
    """``max |x_i|`` over every element of every leaf (0 for an empty tree)."""
    if not jax.tree.leaves(x):
        return jnp.zeros(())
    dtype = widest_dtype(x)
    leaves = [jnp.max(jnp.abs(leaf), initial=0).astype(dtype) for leaf in jax.tree.leaves(x)]
    return jnp.max(jnp.stack(leaves))


def tree_sum_squares(x: PyTree) -> jax.Array:
    """``sum x_i**2`` over every element of every leaf, in the widest dtype."""
    dtype = widest_dtype(x)
    return sum((jnp.sum(jnp.square(leaf)).astype(dtype) for leaf in jax.tree.leaves(x)),
               jnp.zeros((), dtype))


def tree_all_finite(*trees: PyTree) -> jax.Array:
    """True when every element of every leaf of every tree is finite."""
    flags = [ops.all_of(ops.is_finite(leaf)) for t in trees for leaf in jax.tree.leaves(t)]
    return functools.reduce(jax.lax.bitwise_and, flags) if flags else jnp.bool_(True)


def tree_within(step: PyTree, x: PyTree, rtol: float, atol: float) -> jax.Array:
    """True when ``|step_i| <= atol + rtol * |x_i|`` for every element."""
    flags = [jnp.all(jnp.abs(s) <= atol + rtol * jnp.abs(v))
             for s, v in zip(jax.tree.leaves(step), jax.tree.leaves(x))]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


def varying_axes(x: Any) -> frozenset:
    """Manual mesh axes (inside ``shard_map``) along which ``x`` varies."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(getattr(mat, "varying", ()))
    return frozenset(getattr(aval, "vma", ()))


def vary_like(tree: PyTree, *like: PyTree) -> PyTree:
    """``tree`` with every leaf marked as varying along each ``shard_map`` axis
    that some leaf of ``tree`` or ``like`` varies along, so that a loop
    carry started from constants has the type its body returns. Outside
    ``shard_map`` (no such axes) it returns ``tree`` unchanged."""
    leaves = jax.tree.leaves((tree, like))
    axes = frozenset().union(*(varying_axes(leaf) for leaf in leaves)) if leaves else frozenset()
    if not axes:
        return tree

    def cast(x: Any) -> Any:
        missing = axes - varying_axes(x)
        return jax.lax.pcast(x, tuple(sorted(missing)), to="varying") if missing else x

    return jax.tree.map(cast, tree)


def float0_zeros(primal: Any, batch: tuple = ()) -> Any:
    """The zero tangent of an integer ``primal`` (float0, shape ``batch +
    primal.shape``), varying along the ``shard_map`` axes ``primal`` varies
    along (a custom rule's tangent must have its primal's type)."""
    return vary_like(np.zeros(tuple(batch) + np.shape(primal), jax.dtypes.float0), primal)


def sum_like(tree: PyTree, like: PyTree) -> PyTree:
    """Each leaf of ``tree`` summed over the ``shard_map`` axes it varies
    along but the matching leaf of ``like`` does not: the cotangent of a
    value shared by every shard is the sum of the shards' cotangents."""
    def reduce(g: Any, x: Any) -> Any:
        if g is None or not hasattr(g, "dtype") or g.dtype == jax.dtypes.float0:
            return g
        extra = varying_axes(g) - varying_axes(x)
        return jax.lax.psum(g, tuple(sorted(extra))) if extra else g
    return jax.tree.map(reduce, tree, like, is_leaf=lambda v: v is None)
