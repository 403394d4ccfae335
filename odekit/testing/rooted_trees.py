"""Rooted trees for the order conditions of Runge-Kutta-type methods.

A tree is the sorted tuple of its children's subtrees; the leaf is ``()``.
A method has order p iff, for every tree t with at most p vertices, its
elementary weight equals ``1 / density(t)`` (Butcher; for Rosenbrock
methods, Hairer & Wanner, Solving ODEs II, Sec. IV.7).
"""
from __future__ import annotations

import functools
import math

Tree = tuple


@functools.lru_cache(maxsize=None)
def _forests(order: int) -> frozenset:
    """Sorted tuples of trees with ``order`` vertices in total."""
    if order == 0:
        return frozenset({()})
    out = set()
    for k in range(1, order + 1):
        for tree in trees(k):
            for rest in _forests(order - k):
                out.add(tuple(sorted(rest + (tree,))))
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def trees(order: int) -> tuple[Tree, ...]:
    """All rooted trees with ``order`` vertices: a root over a forest of order - 1."""
    return tuple(sorted(_forests(order - 1)))


def size(tree: Tree) -> int:
    """Number of vertices |t|."""
    return 1 + sum(size(child) for child in tree)


def density(tree: Tree) -> int:
    """gamma(t) = |t| prod_k gamma(t_k) (the exact solution's weight is 1 / gamma(t))."""
    return size(tree) * math.prod(density(child) for child in tree)
