"""Whether the code being traced now will run inside one CPU kernel.

:func:`odekit.ode.engine.single_kernel.run` traces the solver loop it
compiles as one XLA:CPU kernel inside :func:`entered`; code that has a
cheaper form there asks :func:`inside` at trace time. In one kernel a loop
is native control flow, with no dispatch per iteration, and a shorter
program compiles faster, so a method can keep a loop over its stages
rolled there and unroll it elsewhere (:mod:`odekit.ode.methods.rosenbrock_step`).
The answer only selects between equivalent programs; the program lowered
for another platform shares the trace (see the single_kernel module).

A module of its own, below every floor of ``odekit.ode``, because the
engine sets it and the methods read it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_state = threading.local()


def inside() -> bool:
    """Whether the code being traced is the body of a one-kernel loop."""
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def entered() -> Iterator[None]:
    """Trace the enclosed code as the body of a one-kernel loop (nests; the
    flag is restored when the block ends, also by an exception)."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
