"""A ``while_loop`` that reverse-mode autodiff can go through, in bounded memory.

``lax.while_loop`` has no reverse-mode derivative: its trip count is not
known in advance, so JAX cannot store what the backward pass needs. A loop
with at most ``max_trips`` iterations can be written as ``levels`` nested
``lax.scan``s of ``base = ceil(max_trips ** (1 / levels))`` iterations each,
every iteration guarded by the loop's condition (``lax.cond``: once the
condition fails, whole chunks are skipped at the cost of one test each), and
every inner level under ``jax.checkpoint`` (Griewank's multi-level
checkpointing in its simplest, uniform form; Griewank & Walther,
"Evaluating Derivatives", 2nd ed., Ch. 12).

Cost of a reverse pass, with ``n`` iterations actually taken:

* memory: ``levels * base`` stored carries (one per chunk boundary per level)
  plus the residuals of one innermost chunk, instead of ``n`` carries;
* time: each level below the top is recomputed once more in the backward
  pass, so about ``levels`` forward passes plus one backward pass.

``levels=1`` stores every iteration (fastest, memory O(max_trips));
``levels=2`` stores ``2 sqrt(max_trips)`` carries (128 for 4096 trips) for
one extra forward pass; each further level divides memory by about
``base`` again for one more pass.

Under ``vmap`` the innermost guard becomes a select, but the chunk guards
test whether *any* member still runs (:func:`any_member`), so a batch skips
its remaining chunks once its slowest member is done: a batch costs the
trips of its slowest member rounded up to a chunk, not ``base ** levels``.
Forward mode (``jax.jvp``) goes through it as through any scan.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

Carry = Any


def base_for(max_trips: int, levels: int) -> int:
    """Iterations per level: the smallest ``b`` with ``b ** levels >= max_trips``."""
    if max_trips < 1 or levels < 1:
        raise ValueError(f"max_trips and levels must be positive, got {max_trips}, {levels}.")
    base = max(1, math.ceil(max_trips ** (1.0 / levels)))
    while base ** levels < max_trips:      # guard the float root
        base += 1
    while base > 1 and (base - 1) ** levels >= max_trips:
        base -= 1
    return base


@custom_vmap
def any_member(flag: jax.Array) -> jax.Array:
    """``flag`` unbatched; under ``vmap``, whether any member's ``flag`` holds
    (an unbatched bool, so a ``lax.cond`` on it stays a branch rather than
    becoming a select of both)."""
    return flag


@any_member.def_vmap
def _any_member_batched(axis_size: int, in_batched: list, flag: jax.Array) -> tuple:
    del axis_size
    return (jnp.any(flag) if in_batched[0] else flag), False


def bounded_while_loop(cond: Callable[[Carry], Any], body: Callable[[Carry], Carry],
                       init: Carry, max_trips: int, levels: int = 2) -> Carry:
    """``lax.while_loop(cond, body, init)`` for at most ``max_trips`` iterations
    (at least: ``base_for(max_trips, levels) ** levels``), differentiable in
    both modes. The caller's ``cond`` must itself enforce the trip limit
    where it matters: iterations past ``max_trips`` run while ``cond`` holds."""
    base = base_for(max_trips, levels)

    def skip(carry: Carry) -> Carry:
        return carry

    def run(level: int, carry: Carry) -> Carry:
        if level == 0:
            return lax.cond(cond(carry), body, skip, carry)
        inner = partial(run, level - 1)
        if level < levels:
            inner = jax.checkpoint(inner, prevent_cse=False)

        def chunk(c: Carry, _: None) -> tuple[Carry, None]:
            return lax.cond(any_member(cond(c)), inner, skip, c), None

        return lax.scan(chunk, carry, None, length=base)[0]

    return run(levels, init)


def with_limit(max_trips: int, levels: int = 2) -> Callable:
    """``bounded_while_loop`` with its bound fixed, as a ``while_loop(cond,
    body, init)`` seam (:func:`odekit.ode.engine.loop.run`)."""
    return partial(_seam, max_trips, levels)


def _seam(max_trips: int, levels: int, cond: Callable, body: Callable, init: Carry) -> Carry:
    return bounded_while_loop(cond, body, init, max_trips, levels)
