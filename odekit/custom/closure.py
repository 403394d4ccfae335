"""Closure conversion for user functions that enter a custom rule.

A custom rule receives the user's function as a nondiff argument, so every
traced value the function closes over must be turned into an explicit
argument (DESIGN section 3). ``jax.closure_convert`` does that for values
that may carry a tangent, but leaves other tracers inside the function: a
parameter closed over under a plain ``jax.vmap`` (a batch tracer with a
concrete value) stays a closure constant. Code that must see every batched
operand (a ``custom_vmap`` rule, for one) then finds a batched value it was
not given. :func:`closure_convert` hoists every closed-over tracer, whatever
its kind, and otherwise defers to ``jax.closure_convert`` (which caches its
result per function, so repeated calls keep hitting the jit cache).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.extend.core

from odekit._tree import vary_like

Pytree = Any


def closure_convert(fun: Callable, *example_args: Pytree,
                    check: Callable[[Pytree], None] | None = None) -> tuple[Callable, list]:
    """``(converted, consts)`` with ``converted(*args, *consts) == fun(*args)``.

    Args:
      fun: the user's function; it may close over arrays and tracers.
      *example_args: arguments of the shapes and dtypes ``fun`` is called with.
      check: called with ``fun``'s result as ``jax.ShapeDtypeStruct`` leaves
        (what ``jax.eval_shape`` gives) before the conversion, to raise on a
        malformed result without tracing ``fun`` once more.

    Returns:
      ``converted``, which closes over no tracer, and the list of the values
      it needs as extra trailing arguments.
    """
    closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*example_args)
    if check is not None:
        check(out_shape)
    return _convert(fun, closed, out_shape, example_args)


def _convert(fun: Callable, closed: Any, out_shape: Pytree,
             example_args: tuple) -> tuple[Callable, list]:
    """:func:`closure_convert` from ``fun``'s traced jaxpr ``closed``."""
    # Under shard_map, trace with every argument varying along the axes that
    # any argument or closed-over value varies along: the solvers' loops carry
    # such values (odekit._tree.vary_like), and a jaxpr traced from an
    # invariant example holds a pvary that fails on a varying argument.
    varying = vary_like(example_args, closed.consts)
    if any(jax.typeof(a) != jax.typeof(b)
           for a, b in zip(jax.tree.leaves(example_args), jax.tree.leaves(varying))):
        converted, consts = closure_convert(fun, *varying)
        # ... and called with its arguments varying the same way.
        return (lambda *a: converted(*vary_like(a, varying))), consts
    hoist = [isinstance(c, jax.core.Tracer) for c in closed.consts]
    if not any(hoist):
        return jax.closure_convert(fun, *example_args)
    jaxpr, out_tree = closed.jaxpr, jax.tree.structure(out_shape)
    kept = [c for c, h in zip(closed.consts, hoist) if not h]
    hoisted = [c for c, h in zip(closed.consts, hoist) if h]
    num_hoisted = len(hoisted)

    def converted(*args_and_consts: Any) -> Pytree:
        args, consts = args_and_consts[:-num_hoisted], iter(args_and_consts[-num_hoisted:])
        kept_consts = iter(kept)
        merged = [next(consts) if h else next(kept_consts) for h in hoist]
        call = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(jaxpr, merged))
        return jax.tree.unflatten(out_tree, call(*jax.tree.leaves(args)))

    return converted, hoisted
