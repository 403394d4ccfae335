"""Testing utilities: finite-difference gradient checks and reference problems."""
from odekit.testing.check_grads import check_grads, default_tolerance
from odekit.testing.problems import PROBLEMS, Problem, get_problem, reference_solution, scipy_solution

__all__ = ["PROBLEMS", "Problem", "check_grads", "default_tolerance", "get_problem",
           "reference_solution", "scipy_solution"]
