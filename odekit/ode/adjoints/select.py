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

import contextlib
from typing import Any, Callable, Iterator

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


# What JAX says when forward mode meets a custom_vjp (jax 0.10.2, TypeError).
_JAX_JVP_OF_CUSTOM_VJP = "can't apply forward-mode autodiff (jvp) to a custom_vjp"


@contextlib.contextmanager
def forward_mode_explained(spec: Any) -> Iterator[None]:
    """Around a front end's call of its program: forward mode (``jax.jvp``,
    ``jax.jacfwd``, ``jax.hessian``) through a reverse-only adjoint
    (backsolve and interpolate are custom_vjp rules) raises a ``TypeError``
    that names the adjoints that support it, instead of JAX's generic
    message about custom_vjp functions."""
    try:
        yield
    except TypeError as error:
        reverse_only = spec == "backsolve" or isinstance(spec, Interpolate)
        if not reverse_only or _JAX_JVP_OF_CUSTOM_VJP not in str(error):
            raise
        name = "'backsolve'" if spec == "backsolve" else "'interpolate'"
        raise TypeError(
            f"odekit: adjoint={name} is a reverse-mode rule (jax.grad, jax.vjp, jax.jacrev); "
            "forward mode (jax.jvp, jax.jacfwd, jax.linearize, jax.hessian) cannot go "
            "through it. Use adjoint='checkpoint' (forward and reverse mode, any order) or "
            "adjoint='forward' (forward sensitivities: forward mode only, cheapest for "
            "jax.jacfwd).") from error


def step_limit_hint(spec: Any, steps: int) -> str:
    """What to raise after a MAX_STEPS failure that stopped at ``steps``
    attempted steps: the adjoint's own bound when ``spec`` sets one
    (``odekit.Interpolate(max_steps=...)``, ``odekit.Checkpoint(max_steps=...)``)
    and the solve stopped exactly there, else "" (the front end's own limit)."""
    limit = getattr(spec, "max_steps", None)
    if limit is None or steps != limit:
        return ""
    name = type(spec).__name__
    return (f"A differentiated solve with adjoint=odekit.{name}(max_steps={limit}) stops at "
            f"{limit} attempted steps: raise it, odekit.{name}(max_steps=...), or loosen "
            "rtol/atol.")


def solver(spec: Any) -> Callable:
    """The solve function of a resolved spec."""
    if isinstance(spec, Checkpoint):
        return checkpoint.make(spec)
    if isinstance(spec, Interpolate):
        return interpolate.make(spec)
    if isinstance(spec, Forward):
        return forward.make(spec)
    return backsolve.solve
