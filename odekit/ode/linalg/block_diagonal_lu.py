"""Block-diagonal LU for ``W = shift * I - J`` when J's pattern splits into
many small independent systems (connected components), in lax (jit, vmap,
grad, jvp; CPU and GPU).

Structure (trace time, NumPy/SciPy; :meth:`BlockDiagonalLU.build`)
------------------------------------------------------------------
The connected components of the symmetrised pattern
(:func:`odekit.ode.linalg.ordering.connected_components`) are independent
systems: W is block diagonal after a permutation. Components are grouped by
size and each group is stored as one padded stack (K_g, c_g, c_g), c_g the
largest component of the group, the padding filled with identity rows and
columns (it decouples, so the padded unknowns solve to 0 and are dropped).

Grouping rule: when the components have at most :data:`MAX_EXACT_GROUPS`
distinct sizes, one group per size (no padding at all: Robertson x 1000 is
one (1000, 3, 3) stack). Otherwise sizes are grouped by octave,
``2^(j-1) < size <= 2^j``, each group padded to its largest member: the
padded LU work is at most 8 times (typically about 2 times) the unpadded
one, with at most ``log2(c) + 1`` groups (each a few operations, whatever
its number of components). Measured (2-core CPU, float64, jit, minimum of
15; 500 components of random sizes 1..16, n = 4072): octave groups (5)
factor 0.60 ms / solve 0.23 ms, one group per size (16) 1.00 / 0.23 ms,
all padded to 16 (one group) 1.13 / 0.28 ms. Robertson x 1000 (n = 3000):
factor 0.15 ms, solve 0.14 ms; x 3334 (n = 10002): 0.45 / 0.43 ms.

Numerics (traced)
-----------------
The stacks are gathered from J's values (static indices; no scatter).
:meth:`BlockDiagonalLU.factor`: per group ONE batched partial-pivoting LU
(``P_i W_i = L_i U_i``), fully parallel: O(sum c_i^3) work, no sequential
loop over the blocks. Blocks of at most
:data:`odekit.ode.linalg.stacked_lu.MAX_BLOCK` unknowns are factored by
:mod:`odekit.ode.linalg.stacked_lu` (lax operations: the whole stiff loop can
then run as one CPU kernel), larger ones by LAPACK's batched getrf
(``lax.linalg.lu``). :meth:`BlockDiagonalLU.solve`: gather b into the
stacks, permute, two batched triangular solves (lax, or
``lax.linalg.triangular_solve``), then gather back: O(sum c_i^2) work.
Derivatives go through lax's rules.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit.ode.linalg import ordering, stacked_lu
from odekit.ode.linalg.sparsity import shifted_matvec, values_and_shift

# At most this many distinct component sizes: one group per size; more: octaves.
MAX_EXACT_GROUPS = 8


class BlockDiagonalFactors(NamedTuple):
    """The factors of :meth:`BlockDiagonalLU.factor`, one entry per group:
    ``lu[g]`` (K_g, c_g, c_g) packed L (unit lower) and U, ``permutation[g]``
    (K_g, c_g) int32 row permutations (``P_i W_i = L_i U_i``)."""
    lu: tuple
    permutation: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class BlockDiagonalLU:
    """Static structure of a block-diagonal LU of ``W = shift * I - J`` (build
    once with :meth:`build`; then :meth:`factor` and :meth:`solve`).

    Attributes: ``n``; ``rows``, ``cols`` the pattern; ``num_components`` and
    ``labels`` (n,) from the connected components; ``group_shapes`` the
    (K_g, c_g) of each group; ``offsets`` the start of each group in the flat
    storage (sum of K_g c_g^2 entries); ``entry_index`` (nnz,),
    ``diagonal_index`` (n,), ``padding_index`` the flat positions of the
    entries, the diagonal and the padded diagonal; ``gather_index`` (per group
    (K_g, c_g)) the unknown in each slot (n for padding); ``scatter_index``
    (n,) each unknown's slot in the concatenated flattened stacks;
    ``stack_source`` (storage_size,) the entry of J's values each stack slot
    takes (nnz where none), ``diagonal_mask`` and ``padding_mask``
    (storage_size,) the slots of W's diagonal and of the padding."""
    n: int
    rows: np.ndarray
    cols: np.ndarray
    num_components: int
    labels: np.ndarray
    group_shapes: tuple
    offsets: tuple
    entry_index: np.ndarray
    diagonal_index: np.ndarray
    padding_index: np.ndarray
    gather_index: tuple
    scatter_index: np.ndarray
    stack_source: np.ndarray
    diagonal_mask: np.ndarray
    padding_mask: np.ndarray
    in_order: bool = False      # one unpadded group whose slots are 0..n-1 in order

    @classmethod
    def build(cls, n: int, rows, cols) -> "BlockDiagonalLU":
        """The structure for the (n, n) pattern with entries at ``(rows, cols)``
        (NumPy int arrays of equal length, no entry twice; the diagonal
        need not be among them). O(nnz + n log n) NumPy work."""
        n = int(n)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        cols = np.asarray(cols, dtype=np.int64).reshape(-1)
        count, labels = ordering.connected_components(n, rows, cols)
        sizes = np.bincount(labels, minlength=count)
        distinct = np.unique(sizes)
        if distinct.size <= MAX_EXACT_GROUPS:
            key = sizes
        else:
            key = np.ceil(np.log2(sizes)).astype(np.int64)
        group_of_component = np.unique(key, return_inverse=True)[1].reshape(-1)
        num_groups = int(group_of_component.max()) + 1

        # unknowns sorted by (group, component, index): slots in the stacks
        order = np.lexsort((np.arange(n), labels, group_of_component[labels]))
        component_sorted = labels[order]
        starts = np.flatnonzero(np.r_[True, component_sorted[1:] != component_sorted[:-1]])
        local = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        local_of = np.empty(n, dtype=np.int64)
        local_of[order] = local

        shapes, offsets, gathers = [], [], []
        slot_of_component = np.empty(count, dtype=np.int64)
        offset = 0
        slot_offset = 0
        flat_slot_offset = np.empty(num_groups, dtype=np.int64)
        for g in range(num_groups):
            members = np.flatnonzero(group_of_component == g)
            c = int(sizes[members].max())
            k = members.size
            slot_of_component[members] = np.arange(k)
            shapes.append((k, c))
            offsets.append(offset)
            flat_slot_offset[g] = slot_offset
            gather = np.full((k, c), n, dtype=np.int64)
            node = np.arange(n)
            in_group = group_of_component[labels] == g
            gather[slot_of_component[labels[in_group]], local_of[in_group]] = node[in_group]
            gathers.append(gather)
            offset += k * c * c
            slot_offset += k * c

        group_offset = np.asarray(offsets, dtype=np.int64)
        group_width = np.asarray([c for _, c in shapes], dtype=np.int64)

        def flat(i: np.ndarray, j: np.ndarray) -> np.ndarray:
            g = group_of_component[labels[i]]
            c = group_width[g]
            return group_offset[g] + (slot_of_component[labels[i]] * c + local_of[i]) * c + local_of[j]

        if rows.size and np.any(labels[rows] != labels[cols]):   # cannot happen
            raise AssertionError("an entry couples two components")
        padding = []
        for g, ((k, c), gather) in enumerate(zip(shapes, gathers)):
            slot, pos = np.nonzero(gather == n)
            padding.append(offsets[g] + (slot * c + pos) * c + pos)
        padding_index = np.concatenate(padding) if padding else np.zeros(0, np.int64)
        node = np.arange(n)
        g_node = group_of_component[labels]
        scatter_index = (flat_slot_offset[g_node] + slot_of_component[labels] * group_width[g_node]
                         + local_of)
        index_dtype = np.int32 if max(offset, rows.size) < 2**31 else np.int64
        entry_index = flat(rows, cols)
        if np.unique(entry_index).size != entry_index.size:
            raise ValueError("the pattern holds an entry twice")
        stack_source = np.full(offset, rows.size, dtype=np.int64)
        stack_source[entry_index] = np.arange(rows.size)
        diagonal_mask = np.zeros(offset, dtype=bool)
        diagonal_mask[flat(node, node)] = True
        padding_mask = np.zeros(offset, dtype=bool)
        padding_mask[padding_index] = True
        return cls(n=n, rows=rows, cols=cols, num_components=count, labels=labels,
                   group_shapes=tuple(shapes), offsets=tuple(offsets),
                   entry_index=entry_index.astype(index_dtype),
                   diagonal_index=flat(node, node).astype(index_dtype),
                   padding_index=padding_index.astype(index_dtype),
                   gather_index=tuple(g.astype(index_dtype) for g in gathers),
                   scatter_index=scatter_index.astype(index_dtype),
                   stack_source=stack_source.astype(index_dtype),
                   diagonal_mask=diagonal_mask, padding_mask=padding_mask,
                   in_order=len(gathers) == 1 and np.array_equal(gathers[0].ravel(), node))

    @property
    def storage_size(self) -> int:
        """Entries in the padded stacks, sum of K_g c_g^2."""
        return sum(k * c * c for k, c in self.group_shapes)

    def describe(self) -> str:
        """A one-line summary of the structure."""
        groups = ", ".join(f"{k} x ({c}, {c})" for k, c in self.group_shapes)
        return (f"block-diagonal LU: n={self.n}, {self.num_components} components, "
                f"{len(self.group_shapes)} group(s): {groups}")

    @property
    def in_lax(self) -> bool:
        """Whether every group is factored in lax (:mod:`odekit.ode.linalg.stacked_lu`:
        blocks of at most ``stacked_lu.MAX_BLOCK`` unknowns), so that no
        library call is made."""
        return all(c <= stacked_lu.MAX_BLOCK for _, c in self.group_shapes)

    def stacks(self, values: jax.Array, shift: jax.Array) -> list:
        """The padded (K_g, c_g, c_g) stacks of ``shift I - J``, one per group,
        gathered from ``values`` (static indices). O(storage_size)."""
        values, shift = values_and_shift(self.rows, values, shift)
        dtype = values.dtype
        zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)
        taken = jnp.concatenate([-values, jnp.zeros((1,), dtype)])[self.stack_source]
        flat = (taken + jnp.where(self.diagonal_mask, shift, zero)
                + jnp.where(self.padding_mask, one, zero))
        return [flat[o:o + k * c * c].reshape(k, c, c)
                for (k, c), o in zip(self.group_shapes, self.offsets)]

    def factor(self, values: jax.Array, shift: jax.Array) -> BlockDiagonalFactors:
        """Factor ``W = shift * I - J`` (``values`` (nnz,), ``shift`` a scalar
        cast to values' dtype): one batched partial-pivoting LU per group,
        O(sum K_g c_g^3), fully parallel."""
        lus, perms = [], []
        for stack in self.stacks(values, shift):
            if stack.shape[-1] <= stacked_lu.MAX_BLOCK:
                lu, perm = stacked_lu.factor(stack)
            else:
                lu, _, perm = lax.linalg.lu(stack)
            lus.append(lu)
            perms.append(perm)
        return BlockDiagonalFactors(tuple(lus), tuple(perms))

    def solve(self, factors: BlockDiagonalFactors, b: jax.Array) -> jax.Array:
        """``W^-1 b`` for (n,) ``b`` (cast to the factors' dtype): batched
        permutation and triangular solves, O(sum K_g c_g^2)."""
        dtype = factors.lu[0].dtype
        b = jnp.asarray(b)
        if b.shape != (self.n,):
            raise ValueError(f"b must have shape ({self.n},), got {b.shape}")
        if self.in_order:          # equal blocks, unknowns in order: a reshape, no gathers
            lu, perm = factors.lu[0], factors.permutation[0]
            x = b.astype(dtype).reshape(lu.shape[:2])
            if lu.shape[-1] <= stacked_lu.MAX_BLOCK:
                return stacked_lu.solve(lu, perm, x).reshape(-1)
        b = jnp.concatenate([b.astype(dtype), jnp.zeros((1,), dtype)])
        out = []
        for lu, perm, gather in zip(factors.lu, factors.permutation, self.gather_index):
            if lu.shape[-1] <= stacked_lu.MAX_BLOCK:
                out.append(stacked_lu.solve(lu, perm, b[gather]).reshape(-1))
                continue
            x = jnp.take_along_axis(b[gather], perm, axis=1)[..., None]     # (K, c, 1)
            x = lax.linalg.triangular_solve(lu, x, left_side=True, lower=True,
                                            unit_diagonal=True)
            x = lax.linalg.triangular_solve(lu, x, left_side=True, lower=False)
            out.append(x.reshape(-1))
        return jnp.concatenate(out)[self.scatter_index]

    def matvec(self, values: jax.Array, shift: jax.Array, v: jax.Array) -> jax.Array:
        """``W v = shift v - J v`` for (n,) v from the structural entries
        (O(nnz); no dense matrix)."""
        return shifted_matvec(self.n, self.rows, self.cols, values, shift, v)
