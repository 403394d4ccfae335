"""odekit: JAX solvers whose derivatives are custom rules."""
from odekit.status import ODESolverError, RootSolverError, SolverError
from odekit import testing
from odekit.ode import Checkpoint, Interpolate, odeint, solve_ivp
from odekit import custom, special
from odekit.special import expit, logit
from odekit.fixed_point import fixed_point
from odekit.root import root
from odekit.ensemble import ensemble

__version__ = "0.1.0"
