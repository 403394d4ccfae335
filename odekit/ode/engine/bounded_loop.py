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
import numpy as np
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


@custom_vmap
def members_going(flag: jax.Array) -> jax.Array:
    """Which members go on, inside a branch taken because one does
    (``lax.cond(any_member(flag), ...)``): unbatched, the constant True
    (the branch is taken only when ``flag`` holds; XLA folds the selects on
    it away, so an unbatched loop pays nothing for them); under ``vmap``,
    each member's own ``flag``."""
    return jnp.ones_like(flag)


@members_going.def_vmap
def _members_going_batched(axis_size: int, in_batched: list, flag: jax.Array) -> tuple:
    del axis_size
    return (flag, True) if in_batched[0] else (jnp.ones_like(flag), False)


def _masked(body: Callable[..., Carry], consts: list, going: jax.Array, carry: Carry) -> Carry:
    """One iteration for the members whose ``going`` holds, the others kept:
    ``where(going, body(c_in, *k_in), carry)`` with ``c_in = where(going,
    carry, stop_gradient(carry))`` and the same for the values ``k`` the body
    closes over (``body`` closure-converted: ``consts`` are those values).

    This is what ``vmap`` of a ``lax.cond`` with a batched predicate does,
    written out so that it stays transposable: JAX's batching rule puts the
    ``stop_gradient`` on the cond's operands, which are tangents when the
    cond is a JVP's, and reverse mode then meets a ``stop_gradient`` of a
    tangent, which has no transpose (jax issues 22011, 39219). Here the
    ``stop_gradient`` is applied to primal values, so its JVP is a zero
    tangent, ``dc_in = where(going, dc, 0)``, a select that transposes.
    The stops keep a finished member's iteration (run on its final carry,
    its result discarded) out of the derivative, also where that
    iteration's own derivative is not finite (a zero-length step): its
    cotangent is zero, and ``0 * inf`` would otherwise reach the
    parameters; a select passes no product.
    """
    keep = lambda x: lax.select(_bcast(going, x), x, lax.stop_gradient(x))
    new = body(jax.tree.map(keep, carry), *map(keep, consts))
    return jax.tree.map(lambda a, b: lax.select(_bcast(going, a), a, b), new, carry)


def member_cond(pred: jax.Array, true_fun: Callable, false_fun: Callable, *operands: Any) -> Any:
    """``lax.cond(pred, true_fun, false_fun, *operands)`` for a ``pred`` that
    may be batched, inside a computation that may be differentiated.

    Unbatched it is the cond itself (plus a select on a constant True that
    XLA folds away, and ``false_fun`` left dead). Under ``vmap`` with a batched
    ``pred``, the cond tests whether any member takes ``true_fun``; if one
    does, both branches run and each member's result is picked,
    ``where(pred, true_fun(x_t), false_fun(x_f))``, where ``x_t`` (the
    operands and the values the branch closes over) has its derivative
    stopped for the members that take the other branch, and ``x_f`` the
    reverse. This is ``vmap`` of ``lax.cond`` written so that reverse mode
    can transpose it when the cond is a JVP's (see :func:`_masked`): JAX's
    own rule puts a ``stop_gradient`` on tangents. The stops keep a branch a
    member does not take out of its derivative, also where that branch's
    derivative is not finite there.
    """
    t_fun, t_consts = jax.closure_convert(true_fun, *operands)
    f_fun, f_consts = jax.closure_convert(false_fun, *operands)

    def both(*ops: Any) -> Any:
        take = members_going(pred)

        def keep(on: jax.Array) -> Callable:
            return lambda x: lax.select(_bcast(on, x), x, lax.stop_gradient(x))

        on_t, on_f = keep(take), keep(lax.bitwise_not(take))
        yes = t_fun(*jax.tree.map(on_t, ops), *map(on_t, t_consts))
        no = f_fun(*jax.tree.map(on_f, ops), *map(on_f, f_consts))
        return jax.tree.map(lambda a, b: lax.select(_bcast(take, a), a, b), yes, no)

    return lax.cond(any_member(pred), both, lambda *ops: f_fun(*ops, *f_consts), *operands)


def _bcast(flag: jax.Array, like: jax.Array) -> jax.Array:
    """A scalar ``flag`` broadcast to ``like``'s shape (``lax.select`` takes a
    scalar predicate or one of the operands' shape)."""
    return flag if jnp.ndim(like) == 0 else lax.broadcast(flag, jnp.shape(like))


def bounded_while_loop(cond: Callable[[Carry], Any], body: Callable[[Carry], Carry],
                       init: Carry, max_trips: int, levels: int = 2) -> Carry:
    """``lax.while_loop(cond, body, init)`` for at most ``max_trips`` iterations
    (at least: ``base_for(max_trips, levels) ** levels``), differentiable in
    both modes. The caller's ``cond`` must itself enforce the trip limit
    where it matters: iterations past ``max_trips`` run while ``cond`` holds."""
    base = base_for(max_trips, levels)
    # The values the body closes over (parameters under jvp/grad), as
    # arguments: a finished member's iteration stops their derivative too.
    converted, consts = jax.closure_convert(body, init)

    def skip(carry: Carry) -> Carry:
        return carry

    def run(level: int, carry: Carry) -> Carry:
        if level == 0:
            # Not lax.cond(cond(carry), body, skip): vmap makes a cond with a
            # batched predicate a select with a stop_gradient on the JVP's
            # tangents, which reverse mode cannot transpose (see _masked).
            # The predicate here is unbatched; the members are told apart
            # inside the branch.
            going = cond(carry)
            step = partial(_masked, converted, consts, members_going(going))
            return lax.cond(any_member(going), step, skip, carry)
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
