"""Integration methods: the registry (:mod:`registry`) and every method family.

Each family is its coefficients as self-checking data plus one step function
with its dense output: explicit Runge-Kutta (:mod:`explicit_tableaux`,
:mod:`rk_step`, :mod:`interpolation`, :mod:`stiffness`), Rosenbrock
(:mod:`rosenbrock_tableaux`, :mod:`rosenbrock_step`), ESDIRK
(:mod:`esdirk_tableaux`, :mod:`esdirk_step`) and the multistep BDF/NDF
(:mod:`bdf_coefficients`, :mod:`bdf_step`). The registry's public names are
re-exported here: ``from odekit.ode.methods import get_method``.
"""
from odekit.ode.methods.registry import (EXPLICIT_METHODS, METHODS, SCIPY_EQUIVALENTS, Method,
                                         bdf, check_replayable, esdirk, explicit, get_method,
                                         get_tableau, method_table, rosenbrock)

__all__ = ["EXPLICIT_METHODS", "METHODS", "SCIPY_EQUIVALENTS", "Method", "bdf", "check_replayable",
           "esdirk", "explicit",
           "get_method", "get_tableau", "method_table", "rosenbrock"]
