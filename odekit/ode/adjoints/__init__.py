"""The adjoints (``adjoint=`` of odeint and solve_ivp): one module per adjoint
(:mod:`backsolve`, :mod:`interpolate`, :mod:`checkpoint`, :mod:`forward`),
what they share (:mod:`continuous`, :mod:`few_inputs`, :mod:`forward_only`,
:mod:`common`) and the choice among them (:mod:`select`), whose names are
re-exported here."""
from odekit.ode.adjoints.select import (NAMES, Checkpoint, Forward, Interpolate,
                                       forward_mode_explained, resolve, solver,
                                       step_limit_hint)

__all__ = ["NAMES", "Checkpoint", "Forward", "Interpolate", "forward_mode_explained", "resolve",
           "solver", "step_limit_hint"]
