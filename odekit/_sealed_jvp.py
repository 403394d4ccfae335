"""A custom JVP rule that JAX's partial evaluation cannot drop.

``jax.custom_jvp`` keeps its rule while the call is evaluated or
differentiated, but a *partial* evaluation with some input unknown inlines
the primal function and discards the rule (jax 0.10,
``JaxprTrace.process_custom_jvp_call``: "we assume non-trivial partial
evaluation is only performed to build linear functions"). Reverse mode of
``lax.scan`` (and so of ``fori_loop``) runs such a partial evaluation on
the primal body with the carry unknown, to hoist loop-invariant residuals
(``_scan_known_hoisting``). A custom_jvp that a rule calls for its primal
output (the pattern that makes a rule differentiable again: the few-inputs
Jacobian of the checkpoint adjoint, an event time, an implicit root) then
reaches the next order of differentiation through its primal
implementation: a ``while_loop`` (reverse mode fails), or a single-kernel
call whose operands travel as bytes (a zero tangent: jax.hessian of a stiff
solve inside ``fori_loop`` came out 0, silently).

A primitive survives partial evaluation: it is staged whole. :class:`sealed_jvp`
binds one primitive, ``odekit_sealed_jvp``, whose parameters are the primal
function's jaxpr (traced once, when called) and the rule (flattened). It is
evaluated and lowered as that jaxpr (the same program as a custom_jvp's),
differentiated by the rule (reverse mode by JAX's linearisation of it, as
for a custom_jvp) and batched by ``vmap`` of both (the batched call is the
same primitive, so the rule survives ``vmap`` too). Cost: one trace of the
primal per call, as a custom_jvp under ``jit``; O(1) memory beyond it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.extend.core
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.interpreters import ad, batching, mlir

sealed_jvp_p = jax.extend.core.Primitive("odekit_sealed_jvp")
sealed_jvp_p.multiple_results = True


def _evaluate(*args: Any, jaxpr: Any, rule: Callable, symbolic_zeros: bool) -> list:
    del rule, symbolic_zeros
    return jax.extend.core.jaxpr_as_fun(jaxpr)(*args)


def _abstract(*avals: Any, jaxpr: Any, rule: Callable, symbolic_zeros: bool) -> tuple:
    del avals, rule, symbolic_zeros
    # as JAX typed the function's outputs: a varying axis of shard_map stays on them
    return tuple(jaxpr.out_avals)


def _zero_out(aval: Any, tangent: Any) -> Any:
    """A rule's output tangent as JAX wants it: a symbolic zero for a float0
    array or a SymbolicZero."""
    if isinstance(tangent, SymbolicZero) or tangent.dtype == jax.dtypes.float0:
        return ad.Zero(aval.to_tangent_aval())
    return tangent


def _jvp(primals: Sequence, tangents: Sequence, *, jaxpr: Any, rule: Callable,
         symbolic_zeros: bool) -> tuple[list, list]:
    out_avals = jaxpr.out_avals
    if symbolic_zeros:
        tangents = [SymbolicZero(t.aval) if isinstance(t, ad.Zero) else t for t in tangents]
    else:
        tangents = [ad.instantiate_zeros(t) for t in tangents]
    outs = rule(*primals, *tangents)
    n = len(out_avals)
    primal_out, tangent_out = list(outs[:n]), list(outs[n:])
    return primal_out, [_zero_out(aval, t) for aval, t in zip(out_avals, tangent_out)]


def _instantiate(tangent: Any) -> Any:
    if not isinstance(tangent, SymbolicZero):
        return tangent
    if tangent.aval.dtype == jax.dtypes.float0:
        return np.zeros(tangent.aval.shape, jax.dtypes.float0)
    return jax.numpy.zeros(tangent.aval.shape, tangent.aval.dtype)


def _batched_rule(rule: Callable, member_avals: Sequence, axes: tuple) -> Callable:
    """``rule`` over a batch: members' primals along ``axes``, their tangents
    along the same axes (a tangent has its primal's shape) or symbolic zeros,
    which stay symbolic for each member (``member_avals``: the unbatched
    inputs' types); output zeros instantiated."""
    def batched(*flat: Any) -> list:
        n = len(axes)
        primals, tangents = flat[:n], flat[n:]
        zero = [isinstance(t, SymbolicZero) for t in tangents]
        given = [t for t, z in zip(tangents, zero) if not z]

        def member(member_primals, member_given):
            it = iter(member_given)
            member_tangents = [SymbolicZero(aval.to_tangent_aval()) if z else next(it)
                               for aval, z in zip(member_avals, zero)]
            return [_instantiate(t) for t in rule(*member_primals, *member_tangents)]

        given_axes = [a for a, z in zip(axes, zero) if not z]
        return jax.vmap(member, in_axes=(list(axes), given_axes))(list(primals), given)
    return batched


def _batch(args: Sequence, dims: Sequence, *, jaxpr: Any, rule: Callable,
           symbolic_zeros: bool) -> tuple[list, list]:
    axes = tuple(None if d is None else int(d) for d in dims)
    batched = jax.make_jaxpr(jax.vmap(jax.extend.core.jaxpr_as_fun(jaxpr), in_axes=axes))(*args)
    outs = sealed_jvp_p.bind(*args, jaxpr=batched,
                             rule=_batched_rule(rule, jaxpr.in_avals, axes),
                             symbolic_zeros=symbolic_zeros)
    return outs, [0] * len(outs)


sealed_jvp_p.def_impl(_evaluate)
sealed_jvp_p.def_abstract_eval(_abstract)
ad.primitive_jvps[sealed_jvp_p] = _jvp
batching.primitive_batchers[sealed_jvp_p] = _batch
mlir.register_lowering(sealed_jvp_p, mlir.lower_fun(_evaluate, multiple_results=True))


class sealed_jvp:
    """``jax.custom_jvp`` (with ``nondiff_argnums``, rules of the form
    ``rule(*nondiff, primals, tangents) -> (primal_out, tangent_out)``, zero
    tangents instantiated unless ``defjvp(rule, symbolic_zeros=True)``, as
    JAX's) whose rule partial evaluation keeps (module doc).

    The primal function's arguments other than ``nondiff_argnums`` are
    pytrees of arrays; integer leaves get float0 tangents. Use it where the
    rule calls the function itself for its primal output.
    """

    def __init__(self, fun: Callable, nondiff_argnums: tuple[int, ...] = ()):
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.rule: Callable | None = None
        self.symbolic_zeros = False

    def defjvp(self, rule: Callable, symbolic_zeros: bool = False) -> Callable:
        self.rule, self.symbolic_zeros = rule, symbolic_zeros
        return rule

    def __call__(self, *args: Any) -> Any:
        if self.rule is None:
            raise AttributeError("sealed_jvp: no rule defined (call defjvp first).")
        nondiff = [args[i] for i in self.nondiff_argnums]
        diff = [a for i, a in enumerate(args) if i not in self.nondiff_argnums]
        leaves, in_tree = jax.tree.flatten(diff)
        out_tree_box: list = []

        def merge(diff_args: list) -> list:
            merged, it_nondiff, it_diff = [], iter(nondiff), iter(diff_args)
            for i in range(len(args)):
                merged.append(next(it_nondiff) if i in self.nondiff_argnums else next(it_diff))
            return merged

        def flat_fun(*flat: Any) -> list:
            out = self.fun(*merge(jax.tree.unflatten(in_tree, list(flat))))
            out_leaves, out_tree = jax.tree.flatten(out)
            out_tree_box[:] = [out_tree]
            return out_leaves

        def flat_rule(*flat: Any) -> list:
            primals = jax.tree.unflatten(in_tree, list(flat[:len(leaves)]))
            tangents = jax.tree.unflatten(in_tree, list(flat[len(leaves):]))
            primal_out, tangent_out = self.rule(*nondiff, tuple(primals), tuple(tangents))
            primal_leaves = jax.tree.leaves(primal_out)
            tangent_leaves = jax.tree.leaves(tangent_out)
            if len(primal_leaves) != len(tangent_leaves):
                raise TypeError("sealed_jvp: the rule's tangent output must have one array "
                                "per primal output leaf (float0 zeros for integer ones).")
            return primal_leaves + tangent_leaves

        leaves = [np.asarray(leaf) if isinstance(leaf, (bool, int, float, complex)) else leaf
                  for leaf in leaves]
        jaxpr = jax.make_jaxpr(flat_fun)(*leaves)    # traced once, here
        if any(isinstance(c, jax.core.Tracer) for c in jaxpr.consts):
            # the rule would not see them (no derivative), and vmap would not batch them
            raise TypeError("sealed_jvp: the function closes over traced values; pass them "
                            "as arguments.")
        outs = sealed_jvp_p.bind(*leaves, jaxpr=jaxpr, rule=flat_rule,
                                 symbolic_zeros=self.symbolic_zeros)
        return jax.tree.unflatten(out_tree_box[0], outs)

