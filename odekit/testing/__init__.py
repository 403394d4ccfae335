"""Testing utilities: finite-difference gradient checks and reference problems."""
from odekit.testing.check_grads import check_grads, default_tolerance
from odekit.testing.problems import PROBLEMS, Problem, get_problem, reference_solution, scipy_solution  # noqa: F401

__all__ = ["check_grads", "default_tolerance"]
