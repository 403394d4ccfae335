"""Control flow whose predicate may be batched, inside computations that may
be differentiated in both modes.

Under ``vmap`` a ``lax.cond`` with a batched predicate becomes a select of
both branches: every member pays for the expensive branch (a Jacobian, a
factorisation) whenever the batch meets it, and JAX's batching rule puts a
``stop_gradient`` on the operands, which reverse mode cannot transpose when
the cond is a JVP's (jax issues 22011, 39219). The pieces here keep a branch
a branch as long as some member takes it (:func:`any_member`), pick each
member's result inside it (:func:`members_going`), and stop the derivative
of the values a member does not use with a select of tangents that
transposes (:func:`derivative_where`). :func:`member_cond` puts them
together; the checkpointed loop (:mod:`odekit.ode.engine.bounded_loop`) and
the multistep methods' Jacobian and factorisation reuse use them.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap


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


@jax.custom_jvp
def derivative_where(on: jax.Array, x: jax.Array) -> jax.Array:
    """``x``, with its tangent kept where ``on`` holds and zero elsewhere
    (``on`` a scalar bool, or under ``vmap`` one per member).

    The value is ``x`` itself, not a select of ``x`` and ``stop_gradient(x)``:
    inside a differentiated loop, a value the body closes over (a network's
    weights) then stays the same array in every iteration, so JAX keeps it
    once as a loop-invariant residual instead of storing a per-iteration copy
    of it (a select's output is a new value in every iteration: an MLP with
    P weights cost O(P) memory traffic per iteration, skipped ones included).
    The tangent is ``select(on, dx, 0)``, linear in ``dx`` and transposable:
    its transpose passes no product to ``x``'s cotangent where ``on`` is
    false, so a non-finite cotangent there (a finished member's discarded
    iteration, a zero-length step) cannot reach it as ``0 * inf``.
    """
    del on
    return x


@derivative_where.defjvp
def _derivative_where_jvp(primals: tuple, tangents: tuple) -> tuple:
    on, x = primals
    dx = tangents[1]
    # The value is again this function's: a derivative of the derivative is masked too.
    return derivative_where(on, x), lax.select(broadcast_flag(on, dx), dx, jnp.zeros_like(dx))




def derivative_where_inexact(on: jax.Array, x: Any) -> Any:
    """:func:`derivative_where` for float leaves; other leaves (integers,
    bools, which carry no derivative) as they are."""
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return derivative_where(on, x)
    return x


def member_cond(pred: jax.Array, true_fun: Callable, false_fun: Callable, *operands: Any) -> Any:
    """``lax.cond(pred, true_fun, false_fun, *operands)`` for a ``pred`` that
    may be batched, inside a computation that may be differentiated.

    Unbatched it is the cond itself (plus a select on a constant True that
    XLA folds away, and ``false_fun`` left dead). Under ``vmap`` with a batched
    ``pred``, the cond tests whether any member takes ``true_fun``; if one
    does, both branches run and each member's result is picked,
    ``where(pred, true_fun(x_t), false_fun(x_f))``, where ``x_t`` (the
    operands and the values the branch closes over) has its derivative
    stopped for the members that take the other branch
    (:func:`derivative_where`), and ``x_f`` the reverse. This is ``vmap`` of ``lax.cond`` written so that reverse mode
    can transpose it when the cond is a JVP's (see :func:`_masked`): JAX's
    own rule puts a ``stop_gradient`` on tangents. The stops keep a branch a
    member does not take out of its derivative, also where that branch's
    derivative is not finite there.
    """
    t_fun, t_consts = jax.closure_convert(true_fun, *operands)
    f_fun, f_consts = jax.closure_convert(false_fun, *operands)

    def both(*ops: Any) -> Any:
        take = members_going(pred)

        on_t = partial(derivative_where_inexact, take)
        on_f = partial(derivative_where_inexact, lax.bitwise_not(take))
        yes = t_fun(*jax.tree.map(on_t, ops), *map(on_t, t_consts))
        no = f_fun(*jax.tree.map(on_f, ops), *map(on_f, f_consts))
        return jax.tree.map(lambda a, b: lax.select(broadcast_flag(take, a), a, b), yes, no)

    return lax.cond(any_member(pred), both, lambda *ops: f_fun(*ops, *f_consts), *operands)


def broadcast_flag(flag: jax.Array, like: jax.Array) -> jax.Array:
    """A scalar ``flag`` broadcast to ``like``'s shape (``lax.select`` takes a
    scalar predicate or one of the operands' shape)."""
    return flag if jnp.ndim(like) == 0 else lax.broadcast(flag, jnp.shape(like))

