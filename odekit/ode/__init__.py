"""ODE solvers: odeint and solve_ivp (adjoint gradients) and the pieces they are built from."""
from odekit.ode.methods import EXPLICIT_METHODS, METHODS
from odekit.ode.odeint import odeint
from odekit.status import ODESolverError

__all__ = ["EXPLICIT_METHODS", "METHODS", "ODESolverError", "odeint"]
