"""ODE solvers: odeint and solve_ivp (adjoint gradients) and the pieces they are built from."""
from odekit.ode.adjoints import Checkpoint, Interpolate
from odekit.ode.linear_options import jacobian_sparsity
from odekit.ode.methods import EXPLICIT_METHODS, METHODS
from odekit.ode.odeint import odeint
from odekit.ode.solve_ivp import IVPSolution, solve_ivp
from odekit.status import ODESolverError

__all__ = ["Checkpoint", "EXPLICIT_METHODS", "Interpolate", "IVPSolution", "jacobian_sparsity", "METHODS", "ODESolverError", "odeint", "solve_ivp"]
