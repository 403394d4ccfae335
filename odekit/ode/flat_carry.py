"""A ``lax.while_loop`` whose carry travels as one flat vector.

On the CPU every separately carried array of a ``while_loop`` costs a copy
and an output kernel per iteration, and for the small states of ODE solves
that bookkeeping costs as much as the arithmetic. When every leaf of the
carry has the same dtype, :func:`while_loop` packs the leaves into one 1-D
vector (static offsets; unpacking is slicing, which XLA fuses into the
consumers) so that the body ends in a single concatenate. Otherwise it is
``lax.while_loop`` unchanged. The semantics are exactly those of
``lax.while_loop`` (also under ``vmap``, where the vector gains a batch axis).

XLA's CPU backend fuses a concatenate of at most 8 operands and flattens
nested concatenates first; a body whose leaves are themselves stacks of many
values should pass them through ``lax.optimization_barrier`` so that the
packing stays one fused kernel.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Pytree = Any


class _Packing:
    """Static layout of a pytree's leaves inside one flat vector."""

    def __init__(self, tree: Pytree):
        leaves, self.treedef = jax.tree.flatten(tree)
        self.shapes = [jnp.shape(leaf) for leaf in leaves]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self.dtypes = {jnp.result_type(leaf) for leaf in leaves}

    def pack(self, tree: Pytree) -> jax.Array:
        return jnp.concatenate([jnp.ravel(leaf) for leaf in jax.tree.leaves(tree)])

    def unpack(self, vector: jax.Array) -> Pytree:
        leaves = [vector[start:stop].reshape(shape)
                  for start, stop, shape in zip(self.offsets[:-1], self.offsets[1:], self.shapes)]
        return jax.tree.unflatten(self.treedef, leaves)


def while_loop(cond: Callable[[Pytree], jax.Array], body: Callable[[Pytree], Pytree],
               init: Pytree) -> Pytree:
    """``lax.while_loop(cond, body, init)`` with the carry packed flat when all
    its leaves share one dtype (and there is more than one leaf)."""
    packing = _Packing(init)
    if len(packing.dtypes) != 1 or len(packing.shapes) < 2:
        return lax.while_loop(cond, body, init)
    final = lax.while_loop(lambda v: cond(packing.unpack(v)),
                           lambda v: packing.pack(body(packing.unpack(v))),
                           packing.pack(init))
    return packing.unpack(final)
