"""Roots of ``f(x, *args) = 0``: Newton, Broyden and bisection."""
from odekit.custom.result import Result
from odekit.root.api import METHODS, root
from odekit.status import MESSAGES

__all__ = ["METHODS", "MESSAGES", "Result", "root"]
