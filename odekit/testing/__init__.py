"""Testing utilities: finite-difference gradient checks and reference problems."""
from odekit.testing.check_grads import check_grads, default_tolerance

__all__ = ["check_grads", "default_tolerance"]
