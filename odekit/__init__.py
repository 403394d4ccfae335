"""odekit: JAX solvers whose derivatives are custom rules."""
from odekit import testing

__version__ = "0.1.0"
