"""The adjoints a front end accepts (``adjoint=`` of odeint and solve_ivp).

Each adjoint is a function with the interface of
:func:`odekit.ode.adjoints.backsolve.solve`, ``solve(func, events, options,
y0, t0, t_end, t_eval, h0, *args) -> Solution``, wrapping the forward solve
in its own derivative rule:

* ``"backsolve"``: the continuous adjoint, integrated backwards with y
  (memory O(outputs); unstable where the problem has fast-decaying modes);
* ``"interpolate"`` or :class:`Interpolate`: the continuous adjoint with y(t) from the recorded
  forward steps (memory O(steps); stable where backsolve is not; first
  derivatives only);
* ``"checkpoint"`` or :class:`Checkpoint`: the derivative of the discrete
  solution, in forward and reverse mode, in memory bounded by ``levels``;
* ``"forward"``: forward sensitivities (:mod:`odekit.ode.adjoints.forward`): ``jax.jvp``
  / ``jax.jacfwd`` carry the tangents along the ordinary loop (one CPU
  kernel where the solve is one), about one solve for all directions; the
  checkpoint adjoint's derivative; reverse mode raises a clear error.
"""
from __future__ import annotations

from typing import Any, Callable

from odekit.ode.adjoints import backsolve, checkpoint, forward, interpolate
from odekit.ode.adjoints.checkpoint import Checkpoint
from odekit.ode.adjoints.forward import Forward
from odekit.ode.adjoints.interpolate import Interpolate

NAMES = ("backsolve", "checkpoint", "forward", "interpolate")


def resolve(adjoint: Any, who: str) -> Any:
    """A hashable adjoint spec (``"backsolve"``, a :class:`Checkpoint` or an
    :class:`Interpolate`) from a name or a spec, with a clear error for
    anything else."""
    if isinstance(adjoint, (Checkpoint, Forward, Interpolate)):
        return adjoint
    if adjoint == "checkpoint":
        return Checkpoint()
    if adjoint == "forward":
        return Forward()
    if adjoint == "interpolate":
        return Interpolate()
    if adjoint == "backsolve":
        return adjoint
    raise ValueError(f"{who}: unknown adjoint {adjoint!r}; choose one of {list(NAMES)} "
                     f"or odekit.Checkpoint(levels=...) / odekit.Interpolate(max_steps=...).")


def solver(spec: Any) -> Callable:
    """The solve function of a resolved spec."""
    if isinstance(spec, Checkpoint):
        return checkpoint.make(spec)
    if isinstance(spec, Interpolate):
        return interpolate.make(spec)
    if isinstance(spec, Forward):
        return forward.make(spec)
    return backsolve.solve
