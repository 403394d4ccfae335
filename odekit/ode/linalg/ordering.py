"""Trace-time structure of a sparse pattern: orderings, band widths, components,
and the choice of a structured linear solver.

Everything here is NumPy/SciPy on *static* integer arrays (the structural
positions ``rows``, ``cols`` of a Jacobian's nonzeros, known at trace time);
nothing is traced. The numerical solvers that use it are
:mod:`odekit.ode.linalg.banded_lu` and :mod:`odekit.ode.linalg.block_diagonal_lu`.

A pattern is an (n, n) matrix whose structural nonzeros are at
``(rows[k], cols[k])``; orderings and components use the symmetrised pattern
``S + S^T`` (with the diagonal), since the solvers factor ``shift * I - J``.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from odekit.ode.linalg import stacked_lu

# choose(): a pattern whose largest connected component has at most this many
# nodes is solved block by block (one batched LU, no sequential loop).
BLOCK_DIAGONAL_MAX_COMPONENT = 64
# choose(): below this size one dense LU is as fast as anything structured.
DENSE_MAX_N = 64


def _pattern(n: int, rows, cols) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    cols = np.asarray(cols, dtype=np.int64).reshape(-1)
    if rows.shape != cols.shape:
        raise ValueError(f"rows and cols must have the same length, got {rows.shape} and {cols.shape}")
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    if rows.size and (rows.min() < 0 or cols.min() < 0 or rows.max() >= n or cols.max() >= n):
        raise ValueError(f"rows and cols must lie in [0, {n}), got entries in "
                         f"[{min(rows.min(), cols.min())}, {max(rows.max(), cols.max())}]")
    return rows, cols


def symmetric_pattern(n: int, rows, cols) -> sp.csr_matrix:
    """The (n, n) CSR pattern of ``S + S^T + I`` (ones), S the pattern of
    ``(rows, cols)``. O(nnz + n) memory."""
    rows, cols = _pattern(n, rows, cols)
    diag = np.arange(n, dtype=np.int64)
    r = np.concatenate([rows, cols, diag])
    c = np.concatenate([cols, rows, diag])
    matrix = sp.csr_matrix((np.ones(r.size, dtype=np.int8), (r, c)), shape=(n, n))
    matrix.sum_duplicates()
    matrix.data[:] = 1
    return matrix


def reverse_cuthill_mckee(n: int, rows, cols) -> np.ndarray:
    """A permutation ``p`` ((n,) int64) that narrows the band of the pattern:
    the reordered matrix is ``A[p][:, p]`` (new index ``i`` is old index ``p[i]``).

    Reverse Cuthill-McKee (Cuthill & McKee 1969; George 1971) on the
    symmetrised pattern, by ``scipy.sparse.csgraph.reverse_cuthill_mckee``;
    O(nnz log) time at trace time. If RCM widens the band (it can, on patterns
    that are already narrow), the identity is returned instead."""
    matrix = symmetric_pattern(n, rows, cols)
    permutation = np.asarray(csgraph.reverse_cuthill_mckee(matrix, symmetric_mode=True),
                             dtype=np.int64)
    identity = np.arange(n, dtype=np.int64)
    if max(bandwidths(n, rows, cols, identity)) <= max(bandwidths(n, rows, cols, permutation)):
        return identity
    return permutation


def bandwidths(n: int, rows, cols, permutation=None) -> tuple[int, int]:
    """``(lower, upper)`` band widths of ``A[p][:, p]`` (``p = permutation``, the
    identity when None): the largest ``i - j`` over the entries below the
    diagonal and the largest ``j - i`` above it (0 when there are none)."""
    rows, cols = _pattern(n, rows, cols)
    if permutation is None:
        inverse = np.arange(n, dtype=np.int64)
    else:
        permutation = np.asarray(permutation, dtype=np.int64)
        if permutation.shape != (n,):
            raise ValueError(f"permutation must have shape ({n},), got {permutation.shape}")
        inverse = np.empty(n, dtype=np.int64)
        inverse[permutation] = np.arange(n, dtype=np.int64)
    if rows.size == 0:
        return 0, 0
    distance = inverse[rows] - inverse[cols]
    return int(max(distance.max(), 0)), int(max(-distance.min(), 0))


def connected_components(n: int, rows, cols) -> tuple[int, np.ndarray]:
    """``(num_components, labels)`` of the symmetrised pattern's graph: ``labels``
    is (n,) int64, the component of each unknown, numbered 0.. in order of
    their smallest unknown. An unknown that couples to nothing is a component
    of its own."""
    matrix = symmetric_pattern(n, rows, cols)
    count, labels = csgraph.connected_components(matrix, directed=False)
    return int(count), np.asarray(labels, dtype=np.int64)


def choose(n: int, rows, cols) -> str:
    """The structured solver for ``shift * I - J`` with J's nonzeros at
    ``(rows, cols)``: ``"block_diagonal"``, ``"banded"`` or ``"dense"``.

    The rule (trace time, O(nnz log)):

    1. more than one connected component and the largest has at most
       :data:`odekit.ode.linalg.stacked_lu.MAX_BLOCK` unknowns:
       ``"block_diagonal"`` at any n (the blocks factored in lax operations,
       O(n c^2) work; the stiff loop can stay one CPU kernel).
    2. ``n <= 64``: ``"dense"`` (one small LU; nothing structured is faster).
    3. more than one connected component and the largest has at most 64
       unknowns: ``"block_diagonal"`` (one batched LU of (components, c, c),
       O(n c^2) work, no sequential loop).
    4. the RCM band width ``b = max(lower, upper)`` satisfies ``b <= n / 8``:
       ``"banded"`` (O(n m^2) work with ``m = max(b, 16..32)``, against
       ``2 n^3 / 3`` dense; at ``b = n / 8`` the flop ratio is about 5).
    5. otherwise ``"dense"``.
    """
    rows, cols = _pattern(n, rows, cols)
    count, labels = connected_components(n, rows, cols)
    largest = np.bincount(labels).max()
    if count > 1 and largest <= stacked_lu.MAX_BLOCK:
        return "block_diagonal"
    if n <= DENSE_MAX_N:
        return "dense"
    if count > 1 and largest <= BLOCK_DIAGONAL_MAX_COMPONENT:
        return "block_diagonal"
    lower, upper = bandwidths(n, rows, cols, reverse_cuthill_mckee(n, rows, cols))
    if max(lower, upper) <= n / 8:
        return "banded"
    return "dense"
