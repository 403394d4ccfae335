"""The iteration core shared by root and fixed_point: one ``while_loop``.

A method is a record of two functions, ``init`` and ``step``, that produce an
:class:`Iterate` (the point ``x``, its residual, the step the method would
take next and a failure code) plus any method state (Anderson history,
Broyden's inverse Jacobian, the bisection bracket). The loop stops when

    |step_i| <= atol + rtol * |x_i|   for every element i,

when a method reports a failure, when ``x``, the residual or the step is not
finite, or after ``max_steps`` steps. Under ``vmap`` the loop runs until every member has
stopped and each member keeps its own step count.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from odekit import _lax as ops
from odekit._tree import tree_add, tree_all_finite, tree_max_abs, tree_where, tree_within
from odekit.status import MAX_STEPS, NONFINITE, SUCCESS

PyTree = Any


class Iterate(NamedTuple):
    """What every method exposes to the loop.

    Attributes:
      x: the current point, a pytree.
      residual: ``f(x) - x`` for fixed points, ``f(x)`` for roots (like ``x``).
      step: the step the method would take from ``x`` (like ``x``); the
        convergence test is on it. ``None`` means the residual is the step
        (fixed points), so the loop does not carry the same array twice.
      status: int32, ``SUCCESS`` (0) while nothing went wrong, else a
        negative code from :mod:`odekit.status` set by the method. ``None`` for a
        method that cannot fail by itself (fixed-point iteration): one array
        fewer to carry, which is a kernel and a copy fewer per step.
    """

    x: PyTree
    residual: PyTree
    step: PyTree
    status: jax.Array


class Stats(NamedTuple):
    """Non-differentiable outputs of a solve."""

    status: jax.Array
    num_steps: jax.Array
    error: jax.Array


def next_step(it: Iterate) -> PyTree:
    """``it.step``, or the residual when the method leaves ``step`` as None."""
    return it.residual if it.step is None else it.step


def status_of(it: Iterate) -> jax.Array:
    """``it.status``, or ``SUCCESS`` when the method leaves it as None."""
    return jnp.int32(SUCCESS) if it.status is None else it.status


def loop_tests(it: Iterate, rtol: float, atol: float) -> tuple[jax.Array, jax.Array]:
    """``(finite, converged)`` of an iterate, in one reduction per leaf.

    ``finite``: every element of ``x``, the residual and the step is finite;
    ``converged``: ``|step_i| <= atol + rtol |x_i|`` for every element. The
    elementwise facts are two bits OR-reduced together, so the loop's test
    is one kernel per leaf, not one per leaf and test (XLA does not merge
    separate reductions, and each costs a dispatch per step and compile
    time). Trees whose leaves differ in shape take the separate tests.
    """
    step = next_step(it)
    trees = [t for t in (it.x, it.residual, it.step) if t is not None]
    leaves = [jax.tree.leaves(t) for t in trees]
    groups = list(zip(*leaves))
    if (not groups or len({len(group) for group in leaves}) != 1
            or any(len({jnp.shape(leaf) for leaf in group}) != 1 for group in groups)):
        return tree_all_finite(*trees), tree_within(step, it.x, rtol, atol)

    def bits(group, s, v):
        finite = functools.reduce(lax.bitwise_and, [ops.is_finite(leaf) for leaf in group])
        within = jnp.abs(s) <= atol + rtol * jnp.abs(v)
        found = (jnp.where(finite, jnp.int32(0), jnp.int32(1))
                 | jnp.where(within, jnp.int32(0), jnp.int32(2)))
        return lax.reduce(found, jnp.int32(0), lax.bitwise_or, tuple(range(found.ndim)))
    found = functools.reduce(lax.bitwise_or, [
        bits(group, s, v) for group, s, v in zip(groups, jax.tree.leaves(step),
                                                 jax.tree.leaves(it.x))])
    return (found & 1) == 0, (found & 2) == 0


def take_step(it: Iterate) -> PyTree:
    """``x + step``: the point a converged method would move to next."""
    return tree_add(it.x, next_step(it))


class Method(NamedTuple):
    """A solver method: a name and pure functions.

    ``init(fun, x0, options) -> (Iterate, state)`` and
    ``step(fun, iterate, state, options) -> (Iterate, state)``, where ``fun``
    is the map (fixed points) or the residual function (roots) of one
    pytree argument. ``check(options, dtype)`` validates the options and
    returns them with defaults filled in. ``finish(iterate)`` is the answer
    returned once converged: by default :func:`take_step`, since the last
    step was computed but not yet taken (for a fixed point ``x + (f(x) - x)``
    is ``f(x)``; for Newton it is the next, quadratically better, point).
    """

    name: str
    init: Callable[..., tuple[Iterate, Any]]
    step: Callable[..., tuple[Iterate, Any]]
    check: Callable[[dict, Any], dict]
    finish: Callable[[Iterate], PyTree] = take_step
    #: ``verdict(fun, iterate, state) -> status`` on a converged iterate:
    #: SUCCESS, or a failure code where convergence of the steps does not make
    #: an answer (bisection closing on a pole). None: every converged one is.
    verdict: Callable[..., jax.Array] | None = None
    #: True (or a function of ``x0`` returning True) when ``init`` only builds
    #: a placeholder iterate (no evaluation of ``fun``) and the loop's first
    #: pass, which is not counted as a step, makes the first evaluation with
    #: ``step``. The loop body is then the only place ``fun`` (and, for
    #: Newton, its Jacobian and LU) is compiled, instead of once in ``init``
    #: and once in the body.
    lazy_init: bool | Callable[[PyTree], bool] = False


def parse_options(options: Mapping[str, Any] | None, defaults: Mapping[str, Any],
                  method: str) -> dict:
    """``defaults`` updated with ``options``; unknown keys raise ``ValueError``."""
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"method {method!r}: options must be a dict such as "
                        f"{dict(defaults) or {}}, got {type(options).__name__}.")
    options = dict(options or {})
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "none"
        raise ValueError(f"method {method!r} has no option(s) {unknown}; "
                         f"its options are: {allowed}.")
    return {**defaults, **options}


def run(method: Method, fun: Callable[[PyTree], PyTree], x0: PyTree, rtol: float, atol: float,
        max_steps: int, options: dict) -> tuple[PyTree, jax.Array, Stats]:
    """Iterate ``method`` from ``x0``.

    Returns:
      ``(x, success, stats)``: ``method.finish`` of the last iterate if it
      converged, else the last point; whether it converged; and
      :class:`Stats`, whose ``error`` is the max-norm of the residual at the
      last point where ``f`` was evaluated (one step before a finished ``x``).
    """
    def cond(carry):
        k, it, _ = carry
        finite, converged = loop_tests(it, rtol, atol)
        going = (k < max_steps) & (status_of(it) == SUCCESS) & finite & ~converged
        # A lazy method's pass at k = -1 evaluates the start: always taken.
        return (k < 0) | going if lazy else going

    def body(carry):
        k, it, state = carry
        return (k + 1, *method.step(fun, it, state, options))

    lazy = method.lazy_init(x0) if callable(method.lazy_init) else method.lazy_init
    it, state = method.init(fun, x0, options)
    first = jnp.int32(-1 if lazy else 0)
    num_steps, it, state = lax.while_loop(cond, body, (first, it, state))
    code = status_of(it)
    finite, converged = loop_tests(it, rtol, atol)
    if method.verdict is not None:
        accepted = converged & (code == SUCCESS) & finite
        code = jnp.where(accepted, method.verdict(fun, it, state), code)
    ok = converged & (code == SUCCESS) & finite
    failure = jnp.where(code != SUCCESS, code, jnp.where(finite, MAX_STEPS, NONFINITE))
    status = jnp.where(ok, SUCCESS, failure).astype(jnp.int32)
    x = tree_where(ok, method.finish(it), it.x)
    return x, ok, Stats(status, num_steps, tree_max_abs(it.residual))
