"""Testing utilities: finite-difference gradient checks and reference problems."""
from odekit.testing.check_grads import check_grads, default_tolerance
from odekit.testing.dae_problems import DAE_PROBLEMS, DAEProblem, constraint_error
from odekit.testing.problems import PROBLEMS, Problem, get_problem, reference_solution, scipy_solution

__all__ = ["DAE_PROBLEMS", "DAEProblem", "PROBLEMS", "Problem", "check_grads", "constraint_error",
           "default_tolerance", "get_problem", "reference_solution", "scipy_solution"]
