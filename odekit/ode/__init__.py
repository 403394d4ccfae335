"""ODE solvers: odeint (adjoint gradients) and the pieces it is built from."""
from odekit.ode.errors import ODESolverError
from odekit.ode.methods import EXPLICIT_METHODS
from odekit.ode.odeint import odeint

__all__ = ["EXPLICIT_METHODS", "ODESolverError", "odeint"]
