"""Static solver options shared by the loop, the adjoints and the front ends."""
from __future__ import annotations

from typing import NamedTuple

from odekit.ode.controller import Tolerance


class SolverOptions(NamedTuple):
    """Hashable options, passed as a nondiff argument of the custom rules.

    Attributes:
      method: registry name of the explicit method.
      rtol, atol: relative and absolute tolerance (floats).
      mxstep: attempted steps allowed per output interval (float, may be inf).
      hmax: largest step size (float, may be inf).
      stop_at_outputs: land on every output time instead of interpolating.
      given_first_step: use the ``h0`` argument instead of Hairer's estimate.
      detect_stiffness: probe for stiffness and fail when found (off for the
        adjoint's backward solves, whose forward solve was already checked).
      single_kernel: compile the loops as one CPU kernel where eligible
        (opt-in, see :mod:`odekit.ode.single_kernel`); part of the options so
        that compiled solves with and without it are cached apart.
    """

    method: str
    rtol: float
    atol: float
    mxstep: float
    hmax: float
    stop_at_outputs: bool = False
    given_first_step: bool = False
    detect_stiffness: bool = True
    single_kernel: bool = False

    @property
    def tolerance(self) -> Tolerance:
        return Tolerance(self.rtol, self.atol)
