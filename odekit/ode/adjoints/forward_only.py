"""A marker for values that forward mode can carry and reverse mode cannot.

:func:`mark` is the identity on arrays, with an identity JVP (so ``jax.jvp``
and ``jax.jacfwd`` of any order go through it) and a transpose rule that
raises a ``ValueError`` with the caller's message. The forward-sensitivity
adjoint (:mod:`odekit.ode.adjoints.forward`) marks the tangents it computes by a
``while_loop`` carrying them: in reverse mode JAX transposes the marker
first (it is the last operation of the tangent computation), so the user
reads why and what to use instead, not JAX's error about transposing a
``while_loop``.
"""
from __future__ import annotations

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_MESSAGES: dict[int, str] = {}


def _identity(x, *, message_id):
    del message_id
    return x


forward_only_p = Primitive("odekit_forward_only")
forward_only_p.def_impl(_identity)
forward_only_p.def_abstract_eval(lambda aval, *, message_id: aval)
mlir.register_lowering(forward_only_p, mlir.lower_fun(_identity, multiple_results=False))


def _batch(args, dims, *, message_id):
    return forward_only_p.bind(args[0], message_id=message_id), dims[0]


def _jvp(primals, tangents, *, message_id):
    out = forward_only_p.bind(primals[0], message_id=message_id)
    return out, forward_only_p.bind(ad.instantiate_zeros(tangents[0]), message_id=message_id)


def _transpose(cotangent, operand, *, message_id):
    del cotangent, operand
    raise ValueError(_MESSAGES[message_id])


batching.primitive_batchers[forward_only_p] = _batch
ad.primitive_jvps[forward_only_p] = _jvp
ad.primitive_transposes[forward_only_p] = _transpose


def mark(x: jax.Array, message: str) -> jax.Array:
    """``x``, such that reverse-mode differentiation through it raises
    ``ValueError(message)``."""
    message_id = hash(message)
    _MESSAGES[message_id] = message
    return forward_only_p.bind(x, message_id=message_id)
