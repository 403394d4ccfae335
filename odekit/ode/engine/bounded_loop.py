"""A ``while_loop`` that reverse-mode autodiff can go through, in bounded memory.

``lax.while_loop`` has no reverse-mode derivative: its trip count is not
known in advance, so JAX cannot store what the backward pass needs. A loop
with at most ``max_trips`` iterations is written here as blocks of
``BLOCK`` iterations nested in ``levels`` scans of ``base = ceil((max_trips
/ BLOCK) ** (1 / levels))`` chunks each. Every chunk is skipped by a
``lax.cond`` once the loop's condition fails (one test per chunk) and, for
``levels > 1``, is under ``jax.checkpoint`` (Griewank's multi-level
checkpointing in its uniform form; Griewank & Walther, "Evaluating
Derivatives", 2nd ed., Ch. 12). Inside a block the iterations run without a
``cond``: each is computed and kept only where the condition held, so at
most ``BLOCK - 1`` iterations are wasted at the end of the loop.

Why blocks and not a ``cond`` per iteration: the values the body closes
over (a neural network's P weights) must stay loop invariants, stored once.
A ``cond`` returns the values its branch's derivative needs as outputs,
new values in every iteration, which the enclosing scan then stacks:
O(base * P) memory and O(P) traffic per iteration, skipped iterations
included (a 13-step neural-ODE gradient with 4.5k weights took 19 ms at a
bound of 5000 steps and 8 ms at 1000; with blocks, 1.2 ms at both). For the
same reason the derivative of the kept values is stopped by
:func:`derivative_where`, whose value is its input itself.

Cost of a reverse pass, with ``n`` iterations actually taken:

* memory: ``levels * base`` stored carries (one per chunk boundary per level)
  plus the residuals of one block, instead of ``n`` carries; the closed-over
  values once;
* time: about ``levels`` forward passes of the ``n`` iterations (rounded up
  to a block) plus one backward pass, and one test per skipped chunk: the
  cost follows the iterations taken, not ``max_trips``.

``levels=1`` stores every block (no recomputation, memory O(max_trips));
``levels=2`` stores ``2 sqrt(max_trips / BLOCK)`` carries (64 for 4096
trips) for one extra forward pass; each further level divides memory by
about ``base`` again for one more pass.

A recomputed chunk must take the decisions its first run took. XLA
compiles the recomputation (inside the backward pass, fused with the
derivative's operations) apart from the first run, so their values may
differ in the last bits; an error norm within an ulp of 1 then accepts a
step that was rejected, the recomputed chunk ends a whole step away from the
carry stored at its end, and the derivative is wrong far beyond the
tolerance (5e-5 relative, measured with LLVM's cheap pipeline, at rtol
1e-13). The body marks its decisions with :func:`decision` (a step's
acceptance, the next step size, the status, a method's order): the chunks'
checkpoints store them (``O(max_trips)`` scalars) rather than recompute
them, so a recomputation follows the same steps.

Under ``vmap`` the chunk guards test whether *any* member still runs
(:func:`any_member`), so a batch skips its remaining chunks once its slowest
member is done: a batch costs the trips of its slowest member rounded up to
a block. Forward mode (``jax.jvp``) goes through it as through any scan.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
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
    return derivative_where(on, x), lax.select(on if jnp.ndim(dx) == 0 else _bcast(on, dx), dx,
                                               jnp.zeros_like(dx))


def _masked(body: Callable[..., Carry], consts: list, going: jax.Array, carry: Carry) -> Carry:
    """One iteration for the members whose ``going`` holds, the others kept:
    ``where(going, body(c_in, *k_in), carry)`` with ``c_in`` the carry with
    its derivative stopped where ``going`` fails (:func:`derivative_where`)
    and the same for the values ``k`` the body closes over (``body``
    closure-converted: ``consts`` are those values).

    This is what ``vmap`` of a ``lax.cond`` with a batched predicate does,
    written out so that it stays transposable: JAX's batching rule puts the
    ``stop_gradient`` on the cond's operands, which are tangents when the
    cond is a JVP's, and reverse mode then meets a ``stop_gradient`` of a
    tangent, which has no transpose (jax issues 22011, 39219). Here the
    derivative is stopped on primal values, a select of their tangents that
    transposes. The stops keep a finished member's iteration (run on its
    final carry, its result discarded) out of the derivative, also where
    that iteration's own derivative is not finite (a zero-length step).
    """
    keep = partial(_derivative_only, going)
    new = body(jax.tree.map(keep, carry), *map(keep, consts))
    return jax.tree.map(lambda a, b: lax.select(_bcast(going, a), a, b), new, carry)


def _derivative_only(on: jax.Array, x: Any) -> Any:
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

        on_t, on_f = partial(_derivative_only, take), partial(_derivative_only, lax.bitwise_not(take))
        yes = t_fun(*jax.tree.map(on_t, ops), *map(on_t, t_consts))
        no = f_fun(*jax.tree.map(on_f, ops), *map(on_f, f_consts))
        return jax.tree.map(lambda a, b: lax.select(_bcast(take, a), a, b), yes, no)

    return lax.cond(any_member(pred), both, lambda *ops: f_fun(*ops, *f_consts), *operands)


def _bcast(flag: jax.Array, like: jax.Array) -> jax.Array:
    """A scalar ``flag`` broadcast to ``like``'s shape (``lax.select`` takes a
    scalar predicate or one of the operands' shape)."""
    return flag if jnp.ndim(like) == 0 else lax.broadcast(flag, jnp.shape(like))


DECISION = "odekit_decision"
_SAVE_DECISIONS = jax.checkpoint_policies.save_only_these_names(DECISION)


def decision(x: Any) -> Any:
    """``x``, marked as a decision of a loop body (whether a step is accepted,
    the next step size): a checkpointed chunk stores it in its first run and
    its recomputation reads it back rather than computing it again (see the
    module's docstring). A plain value outside a checkpointed chunk."""
    return checkpoint_name(x, DECISION)


# Iterations of the innermost block: run one after another without a test
# (a finished member's or the finished loop's iteration is computed and
# discarded), so that the values the body closes over stay loop-invariant
# residuals (a lax.cond would return them as per-iteration residuals, which
# the scan around it stacks: O(base * P) per iteration for P weights). At
# most BLOCK - 1 discarded iterations per loop.
BLOCK = 4


def bounded_while_loop(cond: Callable[[Carry], Any], body: Callable[[Carry], Carry],
                       init: Carry, max_trips: int, levels: int = 2) -> Carry:
    """``lax.while_loop(cond, body, init)`` for at most ``max_trips`` iterations
    (at least: ``BLOCK * base_for(ceil(max_trips / BLOCK), levels) ** levels``),
    differentiable in both modes. The caller's ``cond`` must itself enforce
    the trip limit where it matters: iterations past ``max_trips`` run while
    ``cond`` holds.

    Layout: blocks of ``BLOCK`` guarded iterations (each computed, kept where
    ``cond`` held: :func:`_masked`), nested in ``levels`` scans of
    ``base`` chunks, every chunk skipped by a ``lax.cond`` once ``cond``
    fails and, for ``levels > 1``, under ``jax.checkpoint`` (its residuals
    are its input carry; the values the body closes over are loop
    invariants, stored once).
    """
    block = min(BLOCK, max_trips)
    base = base_for(-(-max_trips // block), levels)
    # The values the body closes over (parameters under jvp/grad), as
    # arguments: a finished member's iteration stops their derivative too.
    converted, consts = jax.closure_convert(body, init)

    def skip(carry: Carry) -> Carry:
        return carry

    def guarded(carry: Carry, _: None) -> tuple[Carry, None]:
        return _masked(converted, consts, cond(carry), carry), None

    def run(level: int, carry: Carry) -> Carry:
        if level == 0:
            return lax.scan(guarded, carry, None, length=block)[0]
        inner = partial(run, level - 1)

        def chunk(c: Carry, _: None) -> tuple[Carry, None]:
            return lax.cond(any_member(cond(c)), inner, skip, c), None

        if levels > 1:
            chunk = jax.checkpoint(chunk, prevent_cse=False, policy=_SAVE_DECISIONS)
        return lax.scan(chunk, carry, None, length=base)[0]

    return run(levels, init)


def with_limit(max_trips: int, levels: int = 2) -> Callable:
    """``bounded_while_loop`` with its bound fixed, as a ``while_loop(cond,
    body, init)`` seam (:func:`odekit.ode.engine.loop.run`)."""
    return partial(_seam, max_trips, levels)


def _seam(max_trips: int, levels: int, cond: Callable, body: Callable, init: Carry) -> Carry:
    return bounded_while_loop(cond, body, init, max_trips, levels)
