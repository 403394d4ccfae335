"""Bisection for a scalar root inside a bracket ``(lower, upper)``.

With ``f(lower)`` and ``f(upper)`` of opposite signs (or one of them zero),
each step halves the bracket, keeping the half whose ends still differ in
sign; the iterate is the midpoint and the step is half the bracket width, so
the loop stops once ``width / 2 <= atol + rtol |mid|`` or ``f(mid) == 0``,
and the answer is that midpoint.
A bracket with ``f`` of one sign at both ends is reported as
``BAD_BRACKET``. Linear convergence, one ``f`` evaluation per step, never
leaves the bracket.
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
    bracket = Bracket(lower, upper, jnp.sign(f_lower))
    return _midpoint(fun, bracket, status.astype(jnp.int32)), bracket


def _step(fun, it, bracket, options):
    right = jnp.sign(it.residual) == bracket.sign_lower
    bracket = Bracket(jnp.where(right, it.x, bracket.lower),
                      jnp.where(right, bracket.upper, it.x), bracket.sign_lower)
    return _midpoint(fun, bracket, it.status), bracket


def _check(options, dtype):
    return parse_options(options, {}, "bisection")


def _finish(it):
    return it.x


BISECTION = Method("bisection", _init, _step, _check, _finish)
