"""Fixed points of ``x = f(x, *args)``: damped iteration and Anderson acceleration."""
from odekit.fixed_point.api import METHODS, fixed_point

__all__ = ["METHODS", "fixed_point"]
