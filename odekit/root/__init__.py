"""Roots of ``f(x, *args) = 0``: Newton, Broyden and bisection."""
from odekit.root.api import METHODS, root
from odekit.root.result import MESSAGES, Result

__all__ = ["METHODS", "MESSAGES", "Result", "root"]
