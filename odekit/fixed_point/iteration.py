"""Damped fixed-point (Picard) iteration ``x+ = x + beta (f(x) - x)``.

With ``beta = 1`` (the default) this is plain iteration ``x+ = f(x)``,
which converges linearly with rate ``L`` when ``f`` is a contraction with
Lipschitz constant ``L < 1``; ``0 < beta < 1`` (Krasnosel'skii-Mann
averaging) also converges for nonexpansive maps and can tame oscillation.
"""
from __future__ import annotations

import numbers

from odekit._tree import tree_add, tree_sub
from odekit.custom.iteration import Iterate, Method, parse_options


def point(fun, x) -> Iterate:
    """The iterate at ``x``: the residual ``f(x) - x`` is also the step, and
    there is no status (iteration itself cannot fail; the loop's tests decide)."""
    return Iterate(x, tree_sub(fun(x), x), None, None)


def check_damping(options: dict, method: str) -> dict:
    """``ValueError`` unless ``options["damping"]`` is a float in (0, 1].

    Returns:
      ``options`` with the damping as a Python float (weakly typed, so a
      NumPy scalar does not promote float32 iterates).
    """
    damping = options["damping"]
    if isinstance(damping, bool) or not isinstance(damping, numbers.Real) or not 0 < damping <= 1:
        raise ValueError(f"method {method!r}: damping must be a float in (0, 1], got {damping!r}.")
    return {**options, "damping": float(damping)}


def _init(fun, x0, options):
    return point(fun, x0), ()


def _step(fun, it, state, options):
    return point(fun, tree_add(it.x, it.residual, options["damping"])), state


def _check(options, dtype):
    return check_damping(parse_options(options, {"damping": 1.0}, "iteration"), "iteration")


ITERATION = Method("iteration", _init, _step, _check)
