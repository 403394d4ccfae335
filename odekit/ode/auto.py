"""``method="auto"``: an explicit method that hands a stiff problem to a stiff one.

The solve starts with ``EXPLICIT`` and its stiffness verdict on (Hairer's
test fires and the rest of the span would cost more steps at the stability
limit than ``max_steps`` leaves, see :mod:`odekit.ode.loop`). When the
verdict stops it (status STIFF), or it runs out of steps (MAX_STEPS: an
explicit method at its stability limit may exhaust ``max_steps`` before the
verdict), the problem is solved again from ``t0`` by ``STIFF_METHOD``, and the
statistics count both solves. A restart rather than
LSODA's switch in mid-course: the record, the events and the dense output
then come from one method, and the explicit attempt costs at most the steps
it took to reach its verdict. A problem that becomes non-stiff again stays
with the stiff method.

Under ``vmap`` the stiff solve runs only when some member needs it, and each
member keeps the solution of the method that finished it.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from odekit._tree import tree_where
from odekit.ode.bounded_loop import any_member
from odekit.ode.solve import Solution, SolveOptions, taken_over

AUTO = "auto"
EXPLICIT = "tsit5"
STIFF_METHOD = "rodas5p"
METHODS = (EXPLICIT, STIFF_METHOD)   # DenseOutput's choice indexes this


def solve(run: Callable[[SolveOptions], Solution], options: SolveOptions
          ) -> tuple[Solution, jax.Array]:
    """``(solution, choice)``: ``run(options)`` with ``EXPLICIT``, or, where it
    ends STIFF or MAX_STEPS, with ``STIFF_METHOD`` (``choice`` int32: index
    in METHODS)."""
    explicit = run(options._replace(method=EXPLICIT, stiff_taken_over=True,
                                    loop=options.loop._replace(detect_stiffness=True)))
    switch = taken_over(explicit.status)

    def restart() -> Solution:
        stiff = run(options._replace(method=STIFF_METHOD))
        both = type(stiff.stats)(*(a + b for a, b in zip(explicit.stats, stiff.stats)))
        return tree_where(switch, stiff._replace(stats=both), explicit)

    sol = lax.cond(any_member(switch), restart, lambda: explicit)
    return sol, switch.astype(jnp.int32)
