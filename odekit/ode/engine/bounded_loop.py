"""A ``while_loop`` that reverse-mode autodiff can go through, in bounded memory.

``lax.while_loop`` has no reverse-mode derivative: its trip count is not
known in advance, so JAX cannot store what the backward pass needs. A loop
with at most ``max_trips`` iterations is written here as blocks of
``BLOCK`` iterations. With ``levels >= 2``, where the body closes over at
least ``HEAD_MIN_CLOSED_BYTES`` of floating-point values (a network's
weights), the first ``HEAD_BLOCKS`` blocks (the head) are a scan of blocks,
each under ``jax.checkpoint`` and skipped by a ``lax.cond`` once the loop's
condition fails; the remaining blocks (all of them without a head) sit
behind one ``lax.cond`` and are nested in ``levels`` scans of ``base =
ceil(remaining ** (1 / levels))`` chunks each, every chunk skipped by a
``lax.cond`` and under ``jax.checkpoint`` (Griewank's multi-level
checkpointing in its uniform form; Griewank & Walther, "Evaluating
Derivatives", 2nd ed., Ch. 12). ``levels=1`` is one scan over all the
blocks, each skipped by a ``lax.cond``, none checkpointed. Inside a block
the iterations run without a ``cond``: each is computed and kept only where
the condition held, so at most ``BLOCK - 1`` iterations are wasted at the
end of the loop.

Why blocks and not a ``cond`` per iteration: the values the body closes
over (a neural network's P weights) must stay loop invariants, stored once.
A ``cond`` returns the values its branch's derivative needs as outputs,
new values in every iteration, which the enclosing scan then stacks:
O(base * P) memory and O(P) traffic per iteration, skipped iterations
included (a 13-step neural-ODE gradient with 4.5k weights took 19 ms at a
bound of 5000 steps and 8 ms at 1000; with blocks, 1.2 ms at both). For the
same reason the derivative of the kept values is stopped by
:func:`odekit._batched_cond.derivative_where`, whose value is its input itself.

Why a head: a skipped chunk is not free in reverse mode. Its transposed
``cond`` writes zeros for the cotangents of the closed-over values, the scan
adds them to its sum, and the recomputing ``cond`` writes a placeholder for
them as a residual: O(P) traffic per skipped chunk (about 60 of them for a
short solve at 4096 trips, two levels of 33). The head keeps a loop that
ends early to at most ``HEAD_BLOCKS - 1`` skipped blocks and one skipped
tail, and it needs no intermediate recomputation. With few closed-over
values a skipped chunk costs about 15 us, and the head (a second copy of the
body to compile) is left out.

Cost of a reverse pass, with ``n`` iterations actually taken:

* memory: ``HEAD_BLOCKS + levels * base`` stored carries (one per head block
  and per chunk boundary per level; ``levels * base`` without a head) plus
  the residuals of one block, instead of ``n`` carries; the closed-over
  values once;
* time: with a head and ``n <= HEAD_BLOCKS * BLOCK``, two forward passes of
  the ``n`` iterations (rounded up to a block: the first run and the
  recomputation of each block with its residuals) and one backward pass;
  beyond, about ``levels`` further passes over the iterations past the head
  (over all of them without a head). One test per skipped chunk: the cost
  follows the iterations taken, not ``max_trips``.

``levels=1`` stores every block (no recomputation, memory O(max_trips), and
the closed-over values once per block: take 2 or more for many weights);
``levels=2`` stores ``HEAD_BLOCKS + 2 sqrt(max_trips / BLOCK)`` carries (80
for 4096 trips; 64 without a head) and recomputes the iterations past the
head once more; each further level divides memory by about ``base`` again
for one more pass.

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
(:func:`odekit._batched_cond.any_member`), so a batch skips its remaining chunks once its slowest
member is done: a batch costs the trips of its slowest member rounded up to
a block. Forward mode (``jax.jvp``) goes through it as through any scan.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from odekit._batched_cond import any_member, broadcast_flag, derivative_where_inexact

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


def _masked(body: Callable[..., Carry], consts: list, going: jax.Array, carry: Carry) -> Carry:
    """One iteration for the members whose ``going`` holds, the others kept:
    ``where(going, body(c_in, *k_in), carry)`` with ``c_in`` the carry with
    its derivative stopped where ``going`` fails (:func:`odekit._batched_cond.derivative_where`)
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
    keep = partial(derivative_where_inexact, going)
    new = body(jax.tree.map(keep, carry), *map(keep, consts))
    return jax.tree.map(lambda a, b: lax.select(broadcast_flag(going, a), a, b), new, carry)



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


# Blocks of the loop's head: each stored (its input carry, under
# ``jax.checkpoint``), so that a loop ending within ``HEAD_BLOCKS * BLOCK``
# iterations costs one forward pass, one recomputation of its blocks and the
# backward pass, and skips at most ``HEAD_BLOCKS - 1`` blocks. The rest of
# the bound (the ``levels`` nest) sits behind one ``lax.cond``. Why: every
# skipped chunk costs its reverse pass a transposed ``cond``, which writes
# zeros for the cotangents of the values the body closes over and adds them
# up, and a placeholder for them as a residual (XLA materialises all three):
# 30 us per skipped chunk with a 4.5k-weight network, 150 us with 41k, about
# 60 skipped chunks at the default bound of 4096 steps
# (benchmarks/results/checkpoint_head_notes.md).
HEAD_BLOCKS = 16
# The head is a second copy of the body in the program (trace + compile of a
# 4.5k-weight neural ODE's gradient 5.7 -> 7.8 s; a 34-parameter rodas5p
# network's 12.9 -> 20.0 s). It pays where a skipped chunk is dear: where the
# body closes over at least this many bytes of floating-point values (a
# network's weights). Below, a skipped chunk costs about 15 us and the head
# gained nothing measurable (the rodas5p network: 15.76 against 15.70 ms).
HEAD_MIN_CLOSED_BYTES = 16 * 1024


def closed_bytes(values: list) -> int:
    """Bytes of the floating-point arrays among ``values`` (per member under ``vmap``)."""
    return sum(math.prod(jnp.shape(v)) * jnp.dtype(v.dtype).itemsize for v in values
               if jnp.issubdtype(v.dtype, jnp.inexact))


def bounded_while_loop(cond: Callable[[Carry], Any], body: Callable[[Carry], Carry],
                       init: Carry, max_trips: int, levels: int = 2) -> Carry:
    """``lax.while_loop(cond, body, init)`` for at most ``max_trips`` iterations
    (at least), differentiable in both modes. The caller's ``cond`` must itself
    enforce the trip limit where it matters: iterations past ``max_trips`` run
    while ``cond`` holds.

    Layout: blocks of ``BLOCK`` guarded iterations (each computed, kept where
    ``cond`` held: :func:`_masked`). ``levels=1``: one scan over every
    block, each skipped by a ``lax.cond`` once ``cond`` fails. ``levels >=
    2``: where ``body`` closes over at least ``HEAD_MIN_CLOSED_BYTES`` of
    floating-point values, a head of ``HEAD_BLOCKS`` blocks, each under
    ``jax.checkpoint`` and skipped by a ``lax.cond``; then, behind one
    ``lax.cond``, the remaining blocks in ``levels`` nested scans of ``base
    = base_for(remaining, levels)`` chunks, each chunk checkpointed and
    skipped by a ``lax.cond`` (the residuals of a checkpointed chunk are its
    input carry; the values the body closes over are loop invariants, stored
    once).
    """
    block = min(BLOCK, max_trips)
    blocks = -(-max_trips // block)
    # The values the body closes over (parameters under jvp/grad), as
    # arguments: a finished member's iteration stops their derivative too.
    converted, consts = jax.closure_convert(body, init)

    def skip(carry: Carry) -> Carry:
        return carry

    def guarded(carry: Carry, _: None) -> tuple[Carry, None]:
        return _masked(converted, consts, cond(carry), carry), None

    def run_block(carry: Carry) -> Carry:
        return lax.scan(guarded, carry, None, length=block)[0]

    def chunks(inner: Callable[[Carry], Carry], length: int, checkpointed: bool,
               carry: Carry) -> Carry:
        """``length`` runs of ``inner``, each skipped once ``cond`` fails."""
        def chunk(c: Carry, _: None) -> tuple[Carry, None]:
            return lax.cond(any_member(cond(c)), inner, skip, c), None

        if checkpointed:
            chunk = jax.checkpoint(chunk, prevent_cse=False, policy=_SAVE_DECISIONS)
        return lax.scan(chunk, carry, None, length=length)[0]

    def nest(level: int, base: int, carry: Carry) -> Carry:
        if level == 0:
            return run_block(carry)
        return chunks(partial(nest, level - 1, base), base, levels > 1, carry)

    if levels == 1:
        return nest(1, blocks, init)
    if closed_bytes(consts) < HEAD_MIN_CLOSED_BYTES:
        return nest(levels, base_for(blocks, levels), init)
    head = min(HEAD_BLOCKS, blocks)
    carry = chunks(run_block, head, True, init)
    rest = blocks - head
    if rest == 0:
        return carry
    tail = partial(nest, levels, base_for(rest, levels))
    return lax.cond(any_member(cond(carry)), tail, skip, carry)


def with_limit(max_trips: int, levels: int = 2) -> Callable:
    """``bounded_while_loop`` with its bound fixed, as a ``while_loop(cond,
    body, init)`` seam (:func:`odekit.ode.engine.loop.run`)."""
    return partial(_seam, max_trips, levels)


def _seam(max_trips: int, levels: int, cond: Callable, body: Callable, init: Carry) -> Carry:
    return bounded_while_loop(cond, body, init, max_trips, levels)
