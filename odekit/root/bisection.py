"""Bisection for a scalar root inside a bracket ``(lower, upper)``.

With ``f(lower)`` and ``f(upper)`` of opposite signs (or one of them zero),
each step halves the bracket, keeping the half whose ends still differ in
sign; the iterate is the midpoint and the step is half the bracket width, so
the loop stops once ``width / 2 <= atol + rtol |mid|`` or ``f(mid) == 0``,
and the answer is that midpoint.
A bracket with ``f`` of one sign at both ends is reported as
``BAD_BRACKET``. Linear convergence, one ``f`` evaluation per step, never
leaves the bracket.

A sign change need not be a root: ``1/x`` changes sign across its pole at
0, a step function across its jump, and bisection closes on either as it
would on a root. Such a converged bracket is reported as ``NOT_A_ROOT``
(see :func:`_verdict` for the test).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from odekit import status as _status
from odekit.custom.iteration import Iterate, Method, parse_options


class Bracket(NamedTuple):
    lower: jax.Array
    upper: jax.Array
    sign_lower: jax.Array
    abs_lower: jax.Array    # |f(lower)|
    abs_upper: jax.Array    # |f(upper)|
    largest: jax.Array      # the largest |f| evaluated so far (the function's scale)


#: Halvings past convergence the verdict takes to see whether |f| shrinks.
EXTRA_HALVINGS = 8


def _midpoint(fun, bracket: Bracket, status: jax.Array) -> Iterate:
    mid = bracket.lower + (bracket.upper - bracket.lower) / 2
    value = fun(mid)
    half = jnp.where(value == 0, 0.0, jnp.abs(bracket.upper - bracket.lower) / 2)
    return Iterate(mid, value, half.astype(mid.dtype), status)


def _init(fun, x0, options):
    lower, upper = x0
    f_lower, f_upper = fun(lower), fun(upper)
    finite = jnp.isfinite(f_lower) & jnp.isfinite(f_upper)
    brackets = jnp.sign(f_lower) * jnp.sign(f_upper) <= 0
    status = jnp.where(~finite, _status.NONFINITE,
                       jnp.where(brackets, _status.SUCCESS, _status.BAD_BRACKET))
    a_lower, a_upper = jnp.abs(f_lower), jnp.abs(f_upper)
    bracket = Bracket(lower, upper, jnp.sign(f_lower), a_lower, a_upper,
                      jnp.maximum(a_lower, a_upper))
    it = _midpoint(fun, bracket, status.astype(jnp.int32))
    return it, bracket._replace(largest=jnp.maximum(bracket.largest, jnp.abs(it.residual)))


def _step(fun, it, bracket, options):
    right = jnp.sign(it.residual) == bracket.sign_lower
    a_mid = jnp.abs(it.residual)
    a_lower = jnp.where(right, a_mid, bracket.abs_lower)
    a_upper = jnp.where(right, bracket.abs_upper, a_mid)
    bracket = Bracket(jnp.where(right, it.x, bracket.lower),
                      jnp.where(right, bracket.upper, it.x), bracket.sign_lower,
                      a_lower, a_upper, bracket.largest)
    it = _midpoint(fun, bracket, it.status)
    return it, bracket._replace(largest=jnp.maximum(bracket.largest, jnp.abs(it.residual)))


def _check(options, dtype):
    return parse_options(options, {}, "bisection")


def _finish(it):
    return it.x


def _verdict(fun, it, bracket):
    """SUCCESS for a converged bracket around a root, NOT_A_ROOT for one
    around a pole or a jump.

    The test is whether |f| shrinks as the bracket shrinks. Let E be
    max(|f(lower)|, |f(upper)|) of a bracket of width w. Near a root of a
    differentiable f, |f| ~ |f'| * distance and both ends lie within w of
    the root, so |f'| w / 2 <= E <= |f'| w: halving the converged bracket
    EXTRA_HALVINGS (8) more times divides E by at least 128, whatever the
    slope or the scale of f (tanh(1e6 x), x**3 - 1e-12 and a root next to a
    large bump of f all pass). Near a pole E grows instead (the ends are the
    evaluated points closest to it), and across a jump it stays the size of
    the jump. So the bracket is rejected when E has not at least halved
    over those halvings. Not rejected: an exact zero of f met on the way,
    and an E at the rounding level of f (below sqrt(eps) times the largest
    |f| seen), where |f| stops shrinking because f is computed in floating
    point (also when the bracket is down to adjacent floats and cannot
    shrink). A root steeper than 256 / tolerance (tanh(1e15 x) at the
    default atol 1.8e-12) is a jump at that resolution and is rejected; a
    smaller atol resolves it. The extra halvings cost 8 evaluations of f
    and do not change the answer, the converged midpoint.
    """
    before = jnp.maximum(bracket.abs_lower, bracket.abs_upper)

    def halve(_, carry):
        it, bracket, exact = carry
        it, bracket = _step(fun, it, bracket, None)
        return it, bracket, exact | (it.residual == 0)

    _, finer, exact = jax.lax.fori_loop(0, EXTRA_HALVINGS, halve,
                                        (it, bracket, it.residual == 0))
    after = jnp.maximum(finer.abs_lower, finer.abs_upper)
    floor = jnp.sqrt(jnp.finfo(after.dtype).eps) * finer.largest
    pole_or_jump = ~exact & (after > floor) & (after >= before / 2)
    return jnp.where(pole_or_jump, _status.NOT_A_ROOT, _status.SUCCESS).astype(jnp.int32)


BISECTION = Method("bisection", _init, _step, _check, _finish, _verdict)
