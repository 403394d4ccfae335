"""Small pytree arithmetic shared by the root and fixed-point methods.

Iterates are arbitrary pytrees of floating arrays; these helpers reduce over
all leaves so the methods never ravel a mixed structure unless they need a
matrix (Newton, Broyden).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def tree_add(x: PyTree, y: PyTree, scale: jax.typing.ArrayLike = 1.0) -> PyTree:
    """``x + scale * y`` leaf by leaf."""
    return jax.tree.map(lambda a, b: a + (scale * b).astype(a.dtype), x, y)


def tree_sub(x: PyTree, y: PyTree) -> PyTree:
    """``x - y`` leaf by leaf."""
    return jax.tree.map(lambda a, b: a - b, x, y)


def tree_where(pred: jax.Array, x: PyTree, y: PyTree) -> PyTree:
    """``where(pred, x, y)`` with a scalar predicate, leaf by leaf."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), x, y)


def tree_max_abs(x: PyTree) -> jax.Array:
    """``max |x_i|`` over every element of every leaf (0 for an empty tree)."""
    leaves = [jnp.max(jnp.abs(leaf), initial=0.0) for leaf in jax.tree.leaves(x)]
    return jnp.max(jnp.stack(leaves)) if leaves else jnp.zeros(())


def tree_sum_squares(x: PyTree) -> jax.Array:
    """``sum x_i**2`` over every element of every leaf."""
    return jnp.asarray(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(x)))


def tree_all_finite(*trees: PyTree) -> jax.Array:
    """True when every element of every leaf of every tree is finite."""
    flags = [jnp.all(jnp.isfinite(leaf)) for t in trees for leaf in jax.tree.leaves(t)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


def tree_within(step: PyTree, x: PyTree, rtol: float, atol: float) -> jax.Array:
    """True when ``|step_i| <= atol + rtol * |x_i|`` for every element."""
    flags = [jnp.all(jnp.abs(s) <= atol + rtol * jnp.abs(v))
             for s, v in zip(jax.tree.leaves(step), jax.tree.leaves(x))]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)
