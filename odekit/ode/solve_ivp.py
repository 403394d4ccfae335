"""``odekit.solve_ivp``: a SciPy-shaped front end with statistics, status,
dense output and events, differentiable by the checkpoint (discrete)
or the continuous (backsolve) adjoint.

Time may run backwards (``t_span = (t0, t1)`` with ``t1 < t0``): the solve
runs in ``s = d t`` with ``d = sign(t1 - t0)`` (so ``ds/dt = d`` and
``dy/ds = d fun(d s, y)``), which keeps the engine increasing-time only and
works for traced ``t_span`` too.

Event times are differentiable by the implicit function theorem on
``g(t*, y(t*)) = 0``: with ``G(t) = g(t, sol.sol(t))``,
``dt*/dp = -(dG/dp) / (dG/dt)``, a custom_jvp rule that evaluates this at
the differentiable ``t*`` itself, so that derivatives of every order are
exact (:func:`odekit.ode.engine.events.implicit_time`); ``p`` includes t0
and t1, through the recorded times of the dense output.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import status as codes
from odekit._programs import compiled
from odekit._tree import tree_ravel
from odekit.custom.closure import closure_convert
from odekit.ode import adjoints, dae
from odekit.ode.arguments import (check_args, check_finite_y0, check_output, check_tolerances,
                                  convert_field, effective_rtol, known_value, prepare_y0,
                                  static_float, static_tolerance)
from odekit.ode.engine import auto, output, single_kernel
from odekit.ode.engine.dense import DenseOutput
from odekit.ode.engine.events import EventSpec, implicit_time
from odekit.ode.engine.loop import LoopConfig
from odekit.ode.engine.solve import Solution, SolveOptions
from odekit.ode.linalg import linear_system, mass_matrix as mass_matrices
from odekit.ode.methods import METHODS, check_replayable, get_method

Pytree = Any
WHO = "solve_ivp"
#: Steps recorded when ``max_steps`` is None and a record is needed
#: (``t_eval=None``, ``dense_output=True`` or events): the length of the
#: buffers that hold them. Without a record, None means no step limit.
RECORDED_STEPS = 4096

SCIPY_MESSAGES = {
    codes.SUCCESS: "The solver successfully reached the end of the integration interval.",
    codes.TERMINATED: "A termination event occurred.",
}


class IVPSolution(NamedTuple):
    """Result of :func:`solve_ivp` (a pytree: it can leave ``jit`` and ``vmap``).

    Attributes:
      ts: (N,) times of the rows of ``ys``: ``t_eval``, or every accepted step
        when ``t_eval`` is None (``N = max_steps + 1``, 4097 by default). Rows past
        ``num_points`` are padding: time ``+inf`` (``-inf`` for a backward
        solve) and the last value (nan after a failure).
      ys: the solution at ``ts``: the structure of ``y0``, leaves (N, ...).
      num_points: int32, rows of ``ts``/``ys`` that hold solution values.
      status: int32: 0 reached the end, 1 a terminal event, < 0 a failure
        (codes in :mod:`odekit.status`).
      stats: {"num_steps", "num_accepted", "num_rejected", "nfev", "njev", "nlu",
        "nlinsolve", "nliniter"} (int32; Jacobian evaluations, LU decompositions
        and solves with the iteration matrix are 0 for explicit methods (rodas5p
        makes one solve per stage, kvaerno5 and bdf one per Newton iteration);
        "nliniter" counts the GMRES iterations of those solves with
        ``linear_solver="krylov"`` (products with W, CVODE's "nli"; 0 with
        an LU);
        ``nfev`` leaves out the Jacobian's evaluations; "bdf"
        counts those it really made, and adds "order_counts", (6,) int32,
        ``order_counts[k]`` its accepted steps at order k).
      t_events, y_events: per event function (a list, or one array when
        ``events`` is one function): its occurrence times, padded with
        ``inf``, and the states there (nan padding); None without events.
      event_counts: (E,) int32 occurrences of each event (None without events).
      sol: :class:`odekit.ode.engine.dense.DenseOutput` when ``dense_output=True``.
      y0: with a ``mass_matrix``, the initial value the solve started from
        (like ``y0``): the given one, or with ``dae_initialize=True`` the one
        whose algebraic components were computed; None without a mass matrix.
    """

    ts: jax.Array
    ys: Pytree
    num_points: jax.Array
    status: jax.Array
    stats: dict
    t_events: Any = None
    y_events: Any = None
    event_counts: Any = None
    sol: DenseOutput | None = None
    y0: Pytree = None

    def __getattr__(self, name: str) -> Any:
        # Only called for a missing attribute: SciPy's names get a pointer.
        hint = _SCIPY_ATTRIBUTES.get(name)
        raise AttributeError(f"'IVPSolution' object has no attribute {name!r}"
                             + (f"; {hint}" if hint else ""))

    @property
    def success(self) -> jax.Array:
        """True where ``status >= 0`` (the end or a terminal event was reached)."""
        return self.status >= 0

    @property
    def message(self) -> str | list:
        """Text of a concrete ``status`` (a list for a batch)."""
        status = np.asarray(self.status)
        text = lambda c: SCIPY_MESSAGES.get(int(c), codes.message(int(c)).capitalize() + ".")
        return text(status) if status.ndim == 0 else [text(c) for c in status.ravel()]


_SCIPY_ATTRIBUTES = {
    "t": "odekit's times are sol.ts (time-leading, padded past sol.num_points)",
    "y": "odekit's values are sol.ys, time-leading (ys[i] is the state at ts[i]); "
         "SciPy's sol.y is ys[:num_points].T for an array state",
    **{k: f"the counters are in sol.stats[{k!r}]" for k in ("nfev", "njev", "nlu")},
}


class _Directed:
    """Time and values in the solve's direction ``d`` (see the module
    docstring), for a dataclass with a ``direction`` field: ``d`` itself
    (+1.0 or -1.0) when ``t_span`` is concrete, so that a forward solve calls
    ``fun`` on the engine's own time and values; None when it is traced, and
    then the traced ``d`` the engine passes is used."""

    direction: float | None

    def time(self, s: jax.Array, d: jax.Array) -> jax.Array:
        if self.direction is None:
            return d * s
        return s if self.direction > 0 else lax.neg(s)

    def signed(self, v: jax.Array, d: jax.Array) -> jax.Array:
        if self.direction is None:
            return d.astype(v.dtype) * v
        return v if self.direction > 0 else -v


@dataclasses.dataclass(frozen=True)
class _VectorField(_Directed):
    """``fun(t, y, *args)`` as the engine calls it: ``field(y, s, d, args, fc, gc)``
    returns ``dy/ds = d fun(d s, y, *args, *fc)`` (``fun`` closure-converted);
    with a user ``jac``, ``field.jacobian(y, s, ...)`` is ``d jac(d s, y, *args,
    *jc)``, its constants ``jc`` the last ``num_jac_consts`` of ``fc``."""

    fun: Callable
    jac: Callable | None = None
    num_jac_consts: int = 0
    direction: float | None = None
    linear_system: Any = None      # odekit.ode.linalg.linear_system (None: dense)
    check_pattern: bool = False    # the pattern is the user's: checked at t0

    def __call__(self, y, s, d, args, f_consts, g_consts):
        f_consts = f_consts[:len(f_consts) - self.num_jac_consts]
        dy = self.fun(self.time(s, d), y, *args, *f_consts)   # cast to y's dtypes by the solve
        return jax.tree.map(lambda v: self.signed(v, d), dy)

    @property
    def jacobian(self) -> Callable | None:
        return None if self.jac is None else self._jacobian

    def _jacobian(self, y, s, d, args, f_consts, g_consts):
        j_consts = f_consts[len(f_consts) - self.num_jac_consts:]
        return self.signed(jnp.asarray(self.jac(self.time(s, d), y, *args, *j_consts))
                           .astype(y.dtype), d)


@dataclasses.dataclass(frozen=True)
class _EventField(_Directed):
    """The stacked event functions as the engine calls them: ``(E,)`` values."""

    events: tuple
    direction: float | None = None

    def __call__(self, s, y, d, args, f_consts, g_consts):
        t = self.time(s, d)
        values = [jnp.asarray(g(t, y, *args, *consts)) for g, consts in zip(self.events, g_consts)]
        dtype = jnp.result_type(s)
        return jnp.stack([v.reshape(()).astype(dtype) for v in values])


def _event_attributes(g: Callable, max_steps: int) -> tuple[float, int, int]:
    """(direction, terminal count, capacity) of an event function."""
    terminal = getattr(g, "terminal", None)
    if terminal is None:   # unset, as SciPy reads it: not terminal
        count = 0
    elif isinstance(terminal, (bool, np.bool_)):
        count = int(bool(terminal))
    elif isinstance(terminal, (int, np.integer)) and terminal >= 0:
        count = int(terminal)
    else:
        raise ValueError(f"{WHO}: The `terminal` attribute of an event function must be a bool, "
                         f"a non-negative int (stop at that occurrence) or None, got {terminal!r}.")
    direction = getattr(g, "direction", 0.0)
    value = known_value(direction)
    if (value is None or value.ndim or value.dtype.kind not in "iuf"
            or not np.isfinite(value)):
        raise ValueError(f"{WHO}: event.direction must be a number: > 0 (the event fires where g "
                         "goes from negative to positive), < 0 (positive to negative) or 0 "
                         f"(either way, the default); got {direction!r}.")
    return float(np.sign(value)), count, (count if count else max_steps)


def _check_times(t_span: Any, t_eval: Any
                 ) -> tuple[jax.Array, jax.Array, jax.Array | None, float | None]:
    """(t0, t1, t_eval) as arrays of one float dtype, and the direction of
    ``t_span`` (+1.0 or -1.0; None when ``t_span`` is traced)."""
    try:
        t0, t1 = t_span
    except (TypeError, ValueError):
        raise ValueError(f"{WHO}: t_span must be a pair (t0, t1), got {t_span!r}.") from None
    known = (known_value(t0), known_value(t1))
    t0, t1 = jnp.asarray(t0), jnp.asarray(t1)
    if t0.ndim or t1.ndim:
        raise ValueError(f"{WHO}: t0 and t1 must be scalars, got shapes {t0.shape} and {t1.shape}.")
    dtype = jnp.result_type(float)
    for t in (t0, t1):
        if not jnp.issubdtype(t.dtype, jnp.inexact):
            continue
        dtype = jnp.promote_types(dtype, t.dtype) if jnp.issubdtype(t.dtype, jnp.floating) else dtype
    direction = None
    if all(v is not None for v in known):
        a, b = (float(v) for v in known)
        if not (np.isfinite(a) and np.isfinite(b)):
            raise ValueError(f"{WHO}: t_span must be finite, got {t_span!r}. To integrate until "
                             "a terminal event, give a finite t1 beyond the latest time the "
                             "event can occur, e.g. t_span=(t0, t0 + 1e6), and a max_steps "
                             "large enough: the solve stops at the event (sol.status == 1), "
                             "or returns status 0 at t1 if the event never fires.")
        direction = 1.0 if b >= a else -1.0
    if t_eval is None:
        return t0.astype(dtype), t1.astype(dtype), None, direction
    te = known_value(t_eval)
    t_eval = jnp.asarray(t_eval)
    if not jnp.issubdtype(t_eval.dtype, jnp.number) or t_eval.ndim != 1:
        raise ValueError(f"{WHO}: t_eval must be a 1-D array of times, got {t_eval!r}.")
    t_eval = t_eval.astype(dtype)
    if te is not None and not np.all(np.isfinite(te)):
        raise ValueError(f"{WHO}: t_eval must be finite, got {te!r}.")
    if direction is not None and te is not None:
        d = direction
        if np.any(d * np.diff(te) <= 0):
            raise ValueError(f"{WHO}: t_eval must be strictly {'in' if d > 0 else 'de'}creasing "
                             f"(the direction of t_span).")
        if te.size and (d * (te[0] - a) < 0 or d * (te[-1] - b) > 0):
            raise ValueError(f"{WHO}: t_eval must lie within t_span={t_span!r}.")
    return t0.astype(dtype), t1.astype(dtype), t_eval, direction


def _convert_checked(fun: Callable, t0: jax.Array, y0: Pytree,
                     args: tuple) -> tuple[Callable, list]:
    """``closure_convert(fun, t0, y0, *args)`` after checking what ``fun``
    returns (one trace of ``fun`` for both)."""
    traced = []

    def check(out: Pytree) -> None:
        traced.append(True)
        check_output(out, y0, WHO, "fun")

    try:
        return convert_field(fun, (t0, y0, *args), y0, check)
    except (IndexError, TypeError) as error:
        if traced:   # fun ran: the error is about its result
            raise
        raise TypeError(f"{WHO}: calling fun(t, y, *args) failed ({error}). solve_ivp uses "
                        "SciPy's argument order fun(t, y, *args); odeint uses func(y, t, *args).") from error


def _check_jacobian(jac: Callable, method: str, t0: jax.Array, y0: Pytree, args: tuple) -> None:
    """A user ``jac(t, y, *args)``: callable, for a method that uses a
    Jacobian, a 1-D state, and an (n, n) result of y's kind (real or complex)."""
    if not callable(jac):
        raise TypeError(f"{WHO}: jac must be callable jac(t, y, *args) -> (n, n), got {jac!r}.")
    if method != auto.AUTO and not get_method(method).jacobians_per_step:
        raise ValueError(f"{WHO}: jac is used by the stiff methods ('rodas5p', 'kvaerno5', and "
                         f"'auto' once it switches to rodas5p); method={method!r} takes no "
                         "Jacobian. Drop jac or pick a stiff method.")
    if not (isinstance(y0, jax.Array) and y0.ndim == 1):
        raise TypeError(f"{WHO}: jac needs y0 to be a 1-D array (jac(t, y, *args) is the (n, n) "
                        f"matrix df_i/dy_j, as in SciPy), got {jax.tree.structure(y0)} with "
                        f"shapes {[np.shape(x) for x in jax.tree.leaves(y0)]}: flatten the state "
                        "(jax.flatten_util.ravel_pytree) or leave jac out (odekit then takes the "
                        "Jacobian by forward mode).")
    try:
        out = jax.eval_shape(jac, t0, y0, *args)
    except (IndexError, TypeError) as error:
        raise TypeError(f"{WHO}: calling jac(t, y, *args) failed ({error}); jac takes the same "
                        "arguments as fun.") from error
    n = y0.shape[0]
    if not isinstance(out, jax.ShapeDtypeStruct) or out.shape != (n, n):
        raise ValueError(f"{WHO}: jac(t, y, *args) must return an ({n}, {n}) array for a state "
                         f"of {n} numbers, got {out}.")
    if jnp.issubdtype(out.dtype, jnp.complexfloating) and not jnp.issubdtype(
            y0.dtype, jnp.complexfloating):
        raise TypeError(f"{WHO}: jac returned complex values ({out.dtype}) for a real state "
                        f"({y0.dtype}).")


def _mass(value: Any, initialize: Any, method: str, adjoint: Any, structure_given: bool,
          y0: Pytree) -> mass_matrices.MassMatrix | None:
    """The checked ``mass_matrix=`` (None without one), with a ValueError for
    a method, an adjoint or a linear solver that cannot take it."""
    if value is None:
        if initialize:
            raise ValueError(f"{WHO}: dae_initialize=True computes the algebraic components of "
                             "y0 for a DAE given with mass_matrix=M; no mass_matrix was given.")
        return None
    accepting = sorted(name for name, m in METHODS.items() if m.accepts_mass_matrix)
    if method == auto.AUTO or not get_method(method).accepts_mass_matrix:
        raise ValueError(f"{WHO}: mass_matrix is taken by method={' or '.join(map(repr, accepting))}"
                         f" (M y' = f(t, y), index-1 DAEs); method={method!r} does not take it.")
    if adjoint == "backsolve":
        raise ValueError(f"{WHO}: with mass_matrix use adjoint='checkpoint' (the default), "
                         "'interpolate' or 'forward'; adjoint='backsolve' integrates y "
                         "backwards, which the algebraic equations of a DAE do not allow.")
    n = int(sum(np.size(leaf) for leaf in jax.tree.leaves(y0)))
    if any(jnp.issubdtype(jnp.result_type(leaf), jnp.complexfloating)
           for leaf in jax.tree.leaves(y0)):
        raise TypeError(f"{WHO}: mass_matrix needs a real state; y0 is complex.")
    mass = mass_matrices.from_argument(value, n, WHO)
    if structure_given and mass.diagonal is None and not mass.coordinate_aligned:
        raise ValueError(f"{WHO}: with jac_sparsity, lband/uband or linear_solver the mass "
                         "matrix must be singular only in zero rows (the algebraic equations) "
                         "and zero columns (the algebraic components); this M's null space "
                         "mixes components, which works with the dense linear algebra only: "
                         "drop those options, or write M with zero rows and columns.")
    return mass


def _flat_at_start(field: _VectorField, y0: Pytree, s0: jax.Array, d: jax.Array,
                   g_consts: tuple) -> tuple[jax.Array, Callable, Callable]:
    """``(y, unravel, flat)``: the flat (n,) y0 and ``flat(v, (args,
    f_consts)) -> (n,)``, dy/ds at s0 on flat states."""
    y, unravel = tree_ravel(y0)

    def flat(v: jax.Array, params: tuple) -> jax.Array:
        args, f_consts = params
        return tree_ravel(field(unravel(v), s0, d, args, f_consts, g_consts))[0].astype(v.dtype)
    return y, unravel, flat


def _dae_start(field: _VectorField, mass: mass_matrices.MassMatrix, options: SolveOptions,
               initialize: bool, y0: Pytree, s0: jax.Array, d: jax.Array, args: tuple,
               f_consts: tuple, g_consts: tuple) -> tuple[Pytree, jax.Array]:
    """``(y0, ok)`` inside the program: the initial value to start from
    (computed by :func:`odekit.ode.dae.initialize` when ``initialize``) and
    whether it is consistent and of index 1 (:func:`odekit.ode.dae.consistency`)."""
    y, unravel, flat = _flat_at_start(field, y0, s0, d, g_consts)
    params = (args, f_consts)
    converged = jnp.ones((), bool)
    if initialize:
        y, converged = dae.initialize(flat, y, mass, params, options.throw)
        y0 = unravel(y)
    fixed = lax.stop_gradient((y, params))
    check = dae.consistency(lambda v: flat(v, fixed[1]), fixed[0], mass,
                            dae.tolerance_scale(unravel(fixed[0]), options.loop.rtol,
                                                options.loop.atol))
    return y0, converged & check.index_one & (check.error <= 1)


def _concrete(*trees: Any) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(trees))


def _check_dae_start(field: _VectorField, mass: mass_matrices.MassMatrix, options: SolveOptions,
                     initialize: bool, y0: Pytree, t0: jax.Array, t1: jax.Array, args: tuple,
                     f_consts: tuple) -> None:
    """At trace time, when y0, t_span and the parameters are concrete: a
    ValueError for a DAE of index > 1 at t0, and (without ``initialize``) for
    an inconsistent y0. (Traced, the program's check gives status
    DAE_INCONSISTENT.)"""
    if mass.num_algebraic == 0 or not _concrete(y0, t0, t1, args, f_consts):
        return
    d = jnp.where(t1 >= t0, 1.0, -1.0).astype(t0.dtype)
    y, unravel, flat = _flat_at_start(field, y0, d * t0, d, ())
    check = dae.consistency(lambda v: flat(v, (args, f_consts)), y, mass,
                            dae.tolerance_scale(y0, options.loop.rtol, options.loop.atol))
    if not bool(check.index_one):
        raise ValueError(
            f"{WHO}: the DAE given with mass_matrix is not of index 1 at t0={float(t0):.6g}: the "
            "Jacobian of its algebraic equations (the zero rows of M, or generally U_0^T f with "
            "U_0^T M = 0) with respect to its algebraic components (the null space of M) is "
            "singular, so they do not determine the algebraic components. odekit's DAE "
            "methods solve index-1 problems: reduce the index (differentiate the constraints "
            "and replace them by the derivatives, e.g. 0 = g(y) by 0 = dg/dy y').")
    if not initialize and not float(check.error) <= 1:
        raise ValueError(
            f"{WHO}: y0 is not consistent with the algebraic equations of the DAE given with "
            f"mass_matrix: removing their residual at t0 needs a change of the algebraic "
            f"components {float(check.error):.3g} times the tolerance (atol + rtol |y0|). Pass "
            "dae_initialize=True to compute them from the differential components "
            "(odekit.root), or correct y0.")


def _convert_event(g: Callable, t0: jax.Array, y0: Pytree, args: tuple) -> tuple:
    if not callable(g):
        raise TypeError(f"{WHO}: events must be callables g(t, y, *args), got {g!r}.")
    try:
        out = jax.eval_shape(g, t0, y0, *args)
    except TypeError as error:
        raise TypeError(f"{WHO}: calling the event function as g(t, y, *args) failed ({error}); "
                        "event functions take the same arguments as fun.") from error
    if jax.tree.structure(out).num_leaves != 1 or int(np.prod(jax.tree.leaves(out)[0].shape)) != 1:
        raise ValueError(f"{WHO}: an event function must return a scalar, got {out}.")
    return closure_convert(g, t0, y0, *args)


def _options(method, rtol, atol, first_step, max_step, max_steps, record, spec, throw, progress,
             time_sign, y0):
    if method != auto.AUTO:
        get_method(method)
    rtol = static_tolerance(rtol, "rtol", y0, who=WHO)
    atol = static_tolerance(atol, "atol", y0, who=WHO)
    rtol = effective_rtol(rtol, y0, WHO, stacklevel=4)
    check_tolerances(rtol, atol, y0, WHO)
    hmax = static_float(max_step, "max_step", allow_inf=True, who=WHO)
    if hmax == 0:
        raise ValueError(f"{WHO}: max_step must be positive, got {max_step!r}.")
    if first_step is not None and not static_float(first_step, "first_step", who=WHO) > 0:
        raise ValueError(f"{WHO}: first_step must be positive, got {first_step!r}.")
    loop = LoopConfig(rtol=rtol, atol=atol, hmax=hmax,
                      max_steps=float("inf") if max_steps is None else float(max_steps),
                      detect_stiffness=True, progress=bool(progress), time_sign=time_sign)
    return SolveOptions(method=method, loop=loop, record=record, event_spec=spec,
                        given_first_step=first_step is not None,
                        single_kernel=single_kernel.switched_on(), throw=bool(throw))



#: SciPy's solve_ivp options (and scipy.integrate.odeint's) that odekit does
#: not take, with what to write instead.
SCIPY_OPTIONS = {
    "vectorized": ("odekit traces fun with JAX and calls it on one state; nothing is "
                   "vectorized by hand: drop vectorized, and for many problems at once use "
                   "jax.vmap over solve_ivp or odekit.ensemble"),
    "ml": "a banded Jacobian is given as lband=, uband= (SciPy solve_ivp's names)",
    "mu": "a banded Jacobian is given as lband=, uband= (SciPy solve_ivp's names)",
    "min_step": ("odekit has no minimum step; a step below the rounding of t fails with "
                 "status STEP_UNDERFLOW: drop min_step"),
    "hmin": ("odekit has no minimum step; a step below the rounding of t fails with "
             "status STEP_UNDERFLOW: drop hmin"),
    "Dfun": "pass the Jacobian as jac=jac(t, y, *args) (SciPy solve_ivp's name)",
    "h0": "the first step is first_step=",
    "hmax": "the largest step is max_step=",
    "mxstep": "the step limit is max_steps= (attempted steps over the whole span)",
    "tfirst": "solve_ivp always calls fun(t, y, *args) (odekit.odeint calls func(y, t, *args))",
    "full_output": "the statistics are always in sol.stats and the status in sol.status",
    "col_deriv": "jac(t, y, *args) returns df_i/dy_j (rows are components of f), as in SciPy's solve_ivp",
    "tcrit": ("odekit has no critical times; to step exactly onto a discontinuity, solve "
              "each piece with its own t_span"),
}


_SCIPY_DEFAULTS = {"vectorized": False, "min_step": 0}


def _is_default(value: Any, default: Any) -> bool:
    if default is None:
        return value is None
    return isinstance(value, (bool, int, float, np.bool_, np.number)) and value == default


def _refuse_options(options: dict) -> None:
    """A TypeError for keywords solve_ivp does not take: for SciPy's, what odekit does
    instead; for others, Python's own message. SciPy's defaults, which ask
    for what odekit does anyway (vectorized=False, min_step 0), are accepted."""
    for name, value in options.items():
        if name in _SCIPY_DEFAULTS and _is_default(value, _SCIPY_DEFAULTS[name]):
            continue
        if name in SCIPY_OPTIONS:
            raise TypeError(f"{WHO}: odekit does not take SciPy's option {name}=: "
                            f"{SCIPY_OPTIONS[name]}.")
        raise TypeError(f"solve_ivp() got an unexpected keyword argument {name!r}")


def solve_ivp(fun: Callable, t_span: Sequence, y0: Pytree, *, t_eval: Any = None,
              args: tuple = (), method: str = "tsit5", rtol: float = 1e-6, atol: float = 1e-9,
              first_step: float | None = None, max_step: float = jnp.inf,
              max_steps: int | None = None,
              events: Callable | Sequence[Callable] | None = None, dense_output: bool = False,
              adjoint: Any = "checkpoint", throw: bool = True, progress: bool = False,
              jac: Callable | None = None, jac_sparsity: Any = None,
              linear_solver: str = "auto", lband: int | None = None, uband: int | None = None,
              mass_matrix: Any = None, dae_initialize: bool = False,
              **scipy_options: Any) -> IVPSolution:
    """Solve ``dy/dt = fun(t, y, *args)``, ``y(t0) = y0`` on ``t_span = (t0, t1)``.

    Args:
      fun: ``fun(t, y, *args)`` (SciPy's order) returning dy/dt like ``y``.
      t_span: ``(t0, t1)``, finite; ``t1 < t0`` integrates backwards.
      y0: initial state, an array or any pytree of real or complex arrays.
      t_eval: finite times (strictly monotonic in the direction of ``t_span``,
        inside it) to return the solution at; None returns every accepted
        step; an empty one returns no rows (the solve still runs to t1, for
        the status, events and dense output). Traced times that break these
        rules give status BAD_TIMES (raised when ``throw``).
      args: tuple of arrays passed to ``fun`` and the events.
      method: a registry name: explicit "tsit5", "dopri5", "dopri8", "bosh3";
        "rodas5p" (Rosenbrock, Jacobian by forward mode (n jvps, vectorised), one LU per step)
        or "kvaerno5" (ESDIRK, simplified Newton) for stiff problems, not
        with adjoint="backsolve"; "bdf" (variable-order NDF/BDF, orders 1-5,
        Jacobian and LU reused across steps, SciPy's BDF rules; dense output
        and events from each step's recorded interpolating polynomial, memory
        O(steps * 6 * n); adjoint="interpolate" reads them too, but not with
        dense_output or events); "auto": tsit5, and rodas5p
        from where tsit5's stiffness verdict stops it (from t0 again when
        tsit5 runs out of steps, or an event with a terminal count of 2 or
        more occurred before the switch; see :mod:`odekit.ode.engine.auto`).
      rtol, atol: local error tolerances: numbers, or per component (as
        SciPy's and diffrax's atol): an array broadcastable to ``y0`` when
        ``y0`` is one array, or a pytree with ``y0``'s structure whose leaves
        broadcast to its leaves. Static: concrete values (Python numbers,
        lists, NumPy arrays), not traced ones. Each entry is non-negative and
        finite, and no component has both zero. An rtol (entry) below 4 eps of
        y's dtype is raised to it with a warning. The adjoints' backward
        solves keep the entries on y and give the adjoint's own components
        the tightest positive entry (see docs/solving-odes.md).
      first_step: first step size (None: Hairer's estimate); max_step: largest step.
      max_steps: attempted steps allowed, and the length of the step record
        kept for ``t_eval=None``, ``dense_output=True`` and events (its
        buffers need a static length). None (default): 4096 when a record
        is kept; when none is (``t_eval`` given, no dense output, no
        events) no limit at all, as in SciPy, which has none.
      events: ``g(t, y, *args) -> scalar`` or a list of them, with SciPy's
        optional attributes ``terminal`` (True or a count) and ``direction``.
      dense_output: return ``sol``, the continuous solution.
      adjoint: "checkpoint" / ``odekit.Checkpoint(levels, max_steps)``
        (default: the derivative of the discrete solution, forward and
        reverse mode: with respect to at most 16 numbers a forward-mode
        Jacobian, beyond that a checkpointed loop of at most ``max_steps``
        steps plus one per 8 outputs),
        "backsolve" (continuous adjoint: reverse mode only, memory
        independent of the steps, faster, but it can fail where the
        backward integration is unstable), "interpolate" /
        ``odekit.Interpolate(max_steps)`` (continuous adjoint with y(t) from
        the recorded steps: stable where backsolve is not, memory O(steps),
        first derivatives only), or "forward" (forward sensitivities for
        ``jax.jvp`` / ``jax.jacfwd``: checkpoint's derivative, the tangents
        carried along the ordinary loop, about the cost of one solve;
        reverse mode raises a ValueError).
      throw: raise on failure; False returns ``success=False`` and a status.
      progress: show a progress meter (tqdm if installed, else stderr).
      jac: for the stiff methods, ``jac(t, y, *args)`` -> the (n, n) matrix
        ``df_i/dy_j`` for a 1-D ``y`` (SciPy's convention), used in place of
        forward mode (n evaluations of ``fun``' jvp a step) where an
        analytic Jacobian is cheaper; gradients go through it as through
        ``fun`` (with the checkpoint adjoint it must be differentiable JAX
        code, and exact: a Rosenbrock method's order assumes the true J).
      jac_sparsity: for the stiff methods, the (n, n) nonzero pattern of
        ``df/dy`` over the flattened state (array-like of bools / 0-1, or a
        scipy.sparse matrix), or "auto" to find it from the traced ``fun``
        (:func:`odekit.ode.jacobian_sparsity`). J's nonzeros then cost one
        jvp per color of a column coloring (3 for Robertson groups of any
        number, about 5 for a 1-D two-species PDE) instead of n, and W is
        factored by a structured LU (``linear_solver``). A given pattern is
        checked against the true Jacobian at t0: a nonzero outside it gives
        status BAD_SPARSITY.
      linear_solver: "auto" (default: dense without a pattern; with one, the
        structure decides: "block_diagonal" for small independent groups,
        "banded" for a narrow band after a reverse Cuthill-McKee ordering,
        else "dense"), or one of those names, or "krylov": no LU of W but
        GMRES with W's diagonal blocks as preconditioner, for 2-D and 3-D
        grids whose band is wide (odekit.ode.linalg.krylov). A structured
        solver without a pattern finds it ("auto"). See docs/stiff.md.
      lband, uband: SciPy's band of ``df/dy`` (``-lband <= j - i <= uband``),
        another way to give the pattern.
      mass_matrix: a constant (n, n) matrix M over the flattened state: solve
        ``M y' = fun(t, y, *args)`` instead (a linearly implicit ODE, or for a
        singular M a differential-algebraic equation of index 1: zero rows of
        M are algebraic equations ``0 = fun_i``). ``method="rodas5p"``
        (``W = M / (h gamma) - J``, Hairer & Wanner VI.4) and ``"bdf"``
        (corrector ``M (d + psi) = c f``, iteration matrix ``M - c J``); a
        NumPy array or a ``scipy.sparse`` matrix; with ``jac_sparsity``,
        ``lband``/``uband`` or a structured ``linear_solver`` M must be
        singular only in zero rows and zero columns (its entries join J's
        pattern and are folded into J's values: no (n, n) array for a
        ``scipy.sparse`` M; an M whose null space mixes components is made
        dense, up to n = 4096, for the dense linear algebra); with the adjoints
        "checkpoint", "forward" and "interpolate" (the adjoint DAE
        ``M^T lambda' = -J^T lambda`` with consistent jumps,
        :mod:`odekit.ode.adjoints.dae_adjoint`), not "backsolve" (y cannot
        be integrated backwards through the algebraic equations).
        Concrete (a NumPy or untraced array: its null space is structure);
        real, finite. The error of algebraic components is controlled as
        that of differential ones. ``y0`` must satisfy the algebraic
        equations to the tolerance (one Newton correction of the algebraic
        components within ``atol + rtol |y0|``) and the DAE must have index
        1 at t0 (see :mod:`odekit.ode.dae`): else a ValueError (status
        DAE_INCONSISTENT when y0 or args are traced).
      dae_initialize: with ``mass_matrix``, compute the algebraic components
        of ``y0`` (the null space of M; for zero columns of M those
        components of y) by ``odekit.root`` (Newton) so that the algebraic
        equations hold, keeping the differential components as given; the
        value used is returned as ``sol.y0`` (derivatives flow through it by
        the implicit function theorem).
      **scipy_options: none are taken. SciPy's options odekit lacks
        (``vectorized``, ``lband``, ``uband``, ``jac_sparsity``, ``min_step``,
        and scipy.integrate.odeint's names) raise a TypeError that says what
        to write instead (see ``SCIPY_OPTIONS``); their SciPy defaults
        (``vectorized=False``, ``None``, ``min_step=0``) are accepted.

    Returns:
      An :class:`IVPSolution`.

    Raises:
      ODESolverError: when ``throw`` and the solve fails (under jit see
        :mod:`odekit.status` for what reaches the caller).
      TypeError, ValueError: for invalid arguments, at trace time.
    """
    _refuse_options(scipy_options)
    adjoint = adjoints.resolve(adjoint, WHO)
    structure_given = not (jac_sparsity is None and lband is None and uband is None
                           and linear_solver in ("auto", "dense"))
    if structure_given and method != auto.AUTO and not get_method(method).jacobians_per_step:
        raise ValueError(f"{WHO}: jac_sparsity, lband/uband and linear_solver are for the stiff "
                         f"methods ('rodas5p', 'kvaerno5', 'auto'); {method!r} uses no "
                         "Jacobian. Drop them or pick a stiff method.")
    if method == auto.AUTO and adjoint == "backsolve":
        raise ValueError(f"{WHO}: method='auto' may solve with the stiff {auto.STIFF_METHOD!r}, "
                         "which adjoint='backsolve' cannot differentiate; use "
                         "adjoint='checkpoint' (the default) or 'interpolate'.")
    if not callable(fun):
        raise TypeError(f"{WHO}: fun must be callable, got {fun!r}.")
    if not isinstance(args, tuple):
        raise TypeError(f"{WHO}: args must be a tuple, got {type(args).__name__}.")
    if max_steps is not None:
        if isinstance(max_steps, bool) or int(max_steps) != max_steps or max_steps < 1:
            raise ValueError(f"{WHO}: max_steps must be a positive integer or None, "
                             f"got {max_steps!r}.")
        max_steps = int(max_steps)
    check_args(args, WHO, "fun", "args")
    y0 = prepare_y0(y0, WHO)
    check_finite_y0(y0, WHO)
    mass = _mass(mass_matrix, dae_initialize, method, adjoint, structure_given, y0)
    t0, t1, t_eval, direction = _check_times(t_span, t_eval)
    # An empty t_eval (SciPy: empty t and y): solve to t1 as for t_eval=[t1]
    # (status, events, dense output), then return no rows.
    empty = t_eval is not None and t_eval.shape[0] == 0
    if empty:
        t_eval = jnp.reshape(t1, (1,))
    f_conv, f_consts = _convert_checked(fun, t0, y0, args)
    single = callable(events)
    event_list = [events] if single else list(events or [])
    if method != auto.AUTO and isinstance(method, str) and method in METHODS:
        # A multistep method's dense output cannot be rebuilt from (t_n, y_n):
        # dense output, events and the interpolate adjoint read the
        # polynomials the record keeps (Method.recorded_dense).
        record_keeps = get_method(method).recorded_dense is not None
        interpolate = isinstance(adjoint, adjoints.Interpolate)
        needs_replay = [what for what, asked in (
            ("dense_output=True", bool(dense_output) and not record_keeps),
            ("events", bool(event_list) and not record_keeps),
            ("adjoint='interpolate'", interpolate and not record_keeps)) if asked]
        if needs_replay:
            check_replayable(get_method(method), " and ".join(needs_replay))
        if (interpolate and not get_method(method).replayable
                and (bool(dense_output) or bool(event_list))):
            raise ValueError(
                f"{WHO}: adjoint='interpolate' with method={method!r} does not differentiate "
                "dense_output=True or events: their values come from the step polynomials "
                "the forward pass records, which this adjoint does not differentiate. Use "
                "adjoint='checkpoint' (the default) or adjoint='forward' with them.")
    recording = t_eval is None or bool(dense_output) or bool(event_list)
    if max_steps is None and recording:
        max_steps = RECORDED_STEPS
    attrs = [_event_attributes(g, max_steps) for g in event_list]
    spec = EventSpec(*map(tuple, zip(*attrs))) if attrs else None
    record = max_steps + 1 if recording else 0
    options = _options(method, rtol, atol, first_step, max_step, max_steps, record, spec, throw,
                       progress, -1.0 if direction == -1.0 else 1.0, y0)
    # the dense output and the events' times read the steps' polynomials
    options = options._replace(dense_record=bool(dense_output) or bool(event_list))
    j_conv, j_consts = None, []
    if jac is not None:
        _check_jacobian(jac, method, t0, y0, args)
        j_conv, j_consts = closure_convert(jac, t0, y0, *args)
    converted = [_convert_event(g, t0, y0, args) for g in event_list]
    system, check_pattern = None, False
    if structure_given:    # SciPy (scipy.sparse) is imported only then
        from odekit.ode import linear_options
        system, check_pattern = linear_options.system_for(
            fun, t0, y0, args, method, jac_sparsity, linear_solver, lband, uband, WHO, mass)
    if system is not None and isinstance(adjoint, adjoints.Interpolate):
        raise ValueError(f"{WHO}: adjoint='interpolate' does not use the sparsity structure: "
                         "its backward solve would form the dense Jacobian of the adjoint "
                         "system. With jac_sparsity / lband / linear_solver use "
                         "adjoint='checkpoint' (the default; through the structured LU) or "
                         "adjoint='forward'.")
    if mass is not None and system is None:   # (a structured one carries M already)
        system = linear_system.Dense(mass=mass)
    field = _VectorField(f_conv, j_conv, len(j_consts), direction, system, check_pattern)
    f_consts = [*f_consts, *j_consts]
    if mass is not None:
        _check_dae_start(field, mass, options, bool(dae_initialize), y0, t0, t1, args,
                         tuple(f_consts))
    event_field = _EventField(tuple(c for c, _ in converted), direction) if converted else None
    g_consts = tuple(tuple(k) for _, k in converted)
    h0 = jnp.asarray(0.0 if first_step is None else abs(float(first_step)), t0.dtype)
    program = compiled(_solve, field, event_field, tuple(event_list), options, adjoint,
                       bool(dae_initialize))
    with adjoints.forward_mode_explained(adjoint):
        out = program(y0, t0, t1, t_eval, h0, args, tuple(f_consts), g_consts)
    if empty:
        out = dict(out, ts=out["ts"][:0], ys=jax.tree.map(lambda v: v[:0], out["ys"]),
                   num_points=jnp.zeros_like(out["num_points"]))
    result = _result(out, options, field, single, args, tuple(f_consts), g_consts, dense_output)
    if throw:
        fields = (out["t_reached"], out["stats"]["num_steps"], out["stats"]["num_accepted"])
        result = codes.raise_if_failed(result.status, result, fields,
                                       partial(_failure_message, method, adjoint=adjoint),
                                       codes.ODESolverError)
    return result


def _failure_message(method: str, status: np.ndarray, t: np.ndarray, steps: np.ndarray,
                     accepted: np.ndarray, adjoint: Any = None) -> str:
    status = np.ravel(status)
    failed = np.flatnonzero(status < 0)
    i = int(failed[0])
    where = (f" ({failed.size} of {status.size} batch members failed; the first is member {i})"
             if status.size > 1 else "")
    hint = {codes.MAX_STEPS: ("Raise max_steps or loosen rtol/atol. (max_steps is also the "
                              "length of the step record kept for t_eval=None, dense_output=True "
                              "or events, 4096 by default; with t_eval given and neither, the "
                              "default max_steps=None sets no limit.)"),
            codes.STIFF: ("The step size is limited by stability, not accuracy: pass "
                          "method=\"rodas5p\", odekit's stiff (L-stable Rosenbrock) method. "
                          "The rest of the span needs more steps than max_steps leaves (or "
                          "more than 100,000): raise max_steps to go on with the explicit "
                          "method."),
            codes.STALLED: ("Steps became smaller than the rounding of y, so y stopped "
                            "moving: loosen rtol/atol or use a float64 y0."),
            codes.BAD_TIMES: ("Traced times are checked when the program runs: t_span must be "
                              "finite, and t_eval finite, strictly monotonic in the direction "
                              "of t_span and inside it."),
            codes.BAD_SPARSITY: ("Correct jac_sparsity (every (i, j) where f_i depends on y_j) or "
                                 "pass jac_sparsity='auto' to have it found from fun."),
            codes.DAE_INCONSISTENT: (
                "Pass dae_initialize=True to compute y0's algebraic components from its "
                "differential ones (odekit.root), or correct y0. If the algebraic equations do "
                "not involve the algebraic components (index 2 or more), reduce the index: "
                "differentiate the constraints until they do."),
            codes.STEP_UNDERFLOW: "Look for a singularity of fun near that time; with atol=0 a "
                                  "zero component has no error scale. With a mass_matrix, an "
                                  "index > 1 DAE fails this way: reduce its index."}.get(int(status[i]), "")
    if int(status[i]) == codes.MAX_STEPS:   # stopped at the adjoint's own bound?
        hint = adjoints.step_limit_hint(adjoint, int(np.ravel(steps)[i])) or hint
    return (f"odekit.solve_ivp ({method}) failed{where}: {codes.message(int(status[i]))}. "
            f"Stopped at t={float(np.ravel(t)[i]):.6g} after {int(np.ravel(steps)[i])} steps "
            f"({int(np.ravel(accepted)[i])} accepted). {hint} Pass throw=False to get the "
            f"solution with success=False instead.")


def _solve(field, event_field, event_list, options, adjoint, initialize, y0, t0, t1, t_eval, h0,
           args, f_consts, g_consts) -> dict:
    """The whole solve as one program: the loop, the outputs, and the event
    times and states (differentiable through the dense output). With a mass
    matrix, the consistent initial value first (``initialize``) and its check."""
    d = jnp.where(t1 >= t0, 1.0, -1.0).astype(t0.dtype)
    mass = getattr(field.linear_system, "mass", None)
    if mass is not None:
        y0, dae_ok = _dae_start(field, mass, options, initialize, y0, d * t0, d, args, f_consts,
                                g_consts)
    s_eval = None if t_eval is None else d * t_eval
    # A pattern that misses a nonzero of df/dy is found before the first step:
    # the solve then stops at t0 (status BAD_SPARSITY below), never running
    # to t1 on a wrong Jacobian (an empty pattern makes the stiff method an
    # explicit one: millions of steps).
    pattern_ok = (_pattern_ok(field, y0, d * t0, d, args, f_consts, g_consts)
                  if field.check_pattern else None)
    t_stop = t1 if pattern_ok is None else jnp.where(pattern_ok, t1, t0)

    def run(opts: SolveOptions, y_start: Pytree, s_start: jax.Array) -> Solution:
        return adjoints.solver(adjoint)(field, event_field, opts, y_start, s_start, d * t_stop,
                                        s_eval, h0, d, args, f_consts, g_consts)

    if options.method == auto.AUTO:
        sol, stiff_from = auto.solve(run, options, y0, d * t0, s_eval)
    else:
        sol, stiff_from = run(options, y0, d * t0), None
    times_ok = _times_ok(t0, t1, t_eval, d)   # checked at trace time when concrete
    sol = sol._replace(status=jnp.where(times_ok, sol.status, codes.BAD_TIMES).astype(jnp.int32))
    if pattern_ok is not None:
        sol = sol._replace(status=jnp.where(pattern_ok, sol.status, codes.BAD_SPARSITY)
                           .astype(jnp.int32))
    if mass is not None:
        sol = sol._replace(status=jnp.where(dae_ok, sol.status, codes.DAE_INCONSISTENT)
                           .astype(jnp.int32))
    failed = sol.status < 0
    big, _ = output.padding(t0.dtype)
    if t_eval is None:
        n = sol.num_points
        valid = jnp.arange(sol.ts_record.shape[0], dtype=jnp.int32) < n
        ts = jnp.where(valid, d * jnp.where(valid, sol.ts_record, 0.0), d * big)
        last = jax.tree.map(lambda leaf: leaf[jnp.maximum(n - 1, 0)], sol.ys_record)
        ys = _pad(sol.ys_record, valid, last, failed)
    else:
        valid = d * t_eval <= d * sol.t
        n = jnp.sum(valid).astype(jnp.int32)
        ts = jnp.where(valid, t_eval, d * big)
        ys = _pad(sol.ys_eval, valid, sol.y, failed)
    # no values from bad times, nor from an inconsistent start or an index > 1 DAE
    values_ok = times_ok & dae_ok if mass is not None else times_ok
    ys = jax.tree.map(lambda v: jnp.where(values_ok, v, jnp.full_like(v, jnp.nan)), ys)
    stats = dict(sol.stats._asdict())
    if options.method == auto.AUTO or get_method(options.method).statistics is None:
        del stats["order_counts"]   # the order history of a variable-order method only
    out = dict(ts=ts, ys=ys, num_points=n, status=sol.status, stats=stats, d=d,
               t_reached=lax.stop_gradient(d * sol.t), ts_record=sol.ts_record,
               ys_record=sol.ys_record, record_count=sol.num_points, stiff_from=stiff_from,
               dense_record=sol.dense_record, y0=y0 if mass is not None else None)
    if sol.events is not None:
        times = []
        for e, t_buf in enumerate(sol.events.times):
            found = jnp.arange(t_buf.shape[0], dtype=jnp.int32) < sol.events.counts[e]
            times.append(jnp.where(found, d * jnp.where(found, t_buf, 0.0), d * big))
        out.update(event_times=times, event_values=list(sol.events.values),
                   event_counts=sol.events.counts, last_h=sol.events.stop_h)
        dense = _dense(out, options, field, args, f_consts, g_consts)
        t_events, y_events = [], []
        for e, g in enumerate(event_list):
            found = jnp.arange(times[e].shape[0], dtype=jnp.int32) < sol.events.counts[e]
            t_e = _differentiable_event_times(event_field.events[e], g_consts[e], dense,
                                              times[e], found, args)
            t_events.append(t_e)
            y_events.append(_event_states(dense, t_e, found, out["event_values"][e]))
        out.update(t_events=t_events, y_events=y_events)
    return out


def _pattern_ok(field: _VectorField, y0: Pytree, s0: jax.Array, d: jax.Array, args: tuple,
                f_consts: tuple, g_consts: tuple) -> jax.Array:
    """Whether df/dy has no nonzero outside the user's pattern, at the start
    and at a nearby state: at each, one jvp along a fixed direction against
    the product of the colored Jacobian's values
    (:func:`odekit.ode.linalg.sparsity.pattern_mismatch`), within sqrt(eps)
    relative. The second state, ``y0 + 1e-3 (|y0| + 1) w`` with fixed weights
    w in [0.5, 1.5], catches entries that vanish only at y0 (``-k3 y2`` in
    Robertson's Jacobian while y2 = 0); where the field is not finite there,
    that check passes (it cannot tell)."""
    from odekit.ode.linalg import sparsity    # a structure was asked for: SciPy is loaded
    y, unravel = tree_ravel(lax.stop_gradient(y0))
    if jnp.issubdtype(y.dtype, jnp.floating) and jnp.finfo(y.dtype).bits < 32:
        y = y.astype(jnp.float32)
    flat = lambda v, s: tree_ravel(field(unravel(v), s, d, args, f_consts,
                                         g_consts))[0].astype(v.dtype)
    s0 = lax.stop_gradient(s0)
    system = field.linear_system
    tolerance = np.sqrt(float(jnp.finfo(y.dtype).eps))
    weights = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, y.shape[0]), y.real.dtype)
    ok = jnp.asarray(True)
    for state in (y, y + 1e-3 * (jnp.abs(y) + 1) * weights):
        values = system.jacobian(None, flat, state, s0)
        mismatch = sparsity.pattern_mismatch(flat, state, s0, system.pattern, values)
        ok = ok & ~(mismatch > tolerance)      # nan (no finite field there): passes
    return ok


def _times_ok(t0: jax.Array, t1: jax.Array, t_eval: jax.Array | None, d: jax.Array) -> jax.Array:
    """Whether the (possibly traced) times are valid: a finite ``t_span`` and
    a finite ``t_eval`` strictly monotonic in the direction ``d`` of the span
    and inside it (False for nan anywhere: every comparison with nan fails).
    ``_check_times`` raises for the same faults when the times are concrete;
    traced, a failure gives status BAD_TIMES (as odeint)."""
    ok = jnp.isfinite(t0) & jnp.isfinite(t1)
    if t_eval is None or t_eval.shape[0] == 0:
        return ok
    s = d * t_eval
    ok = ok & jnp.all(s[1:] > s[:-1]) & (s[0] >= d * t0) & (s[-1] <= d * t1)
    return ok


def _pad(ys: Pytree, valid: jax.Array, last: Pytree, failed: jax.Array) -> Pytree:
    """Rows where ``valid``, else ``last`` (nan after a failure)."""
    def leaf(rows, y):
        fill = jnp.where(failed, jnp.full_like(y, jnp.nan), y)
        return jnp.where(valid.reshape((-1,) + (1,) * y.ndim), rows, fill[None])
    return jax.tree.map(leaf, ys, last)


def _dense(out: dict, options: SolveOptions, field: _VectorField, args: tuple,
           f_consts: tuple, g_consts: tuple) -> DenseOutput | None:
    """The continuous solution from the recorded steps (None if none were)."""
    if not options.record:
        return None
    auto_choice = options.method == auto.AUTO
    return DenseOutput(out["ts_record"], out["ys_record"], out["record_count"], out["d"],
                       (out["d"], args, f_consts, g_consts), field,
                       auto.METHODS if auto_choice else options.method,
                       out["stiff_from"] if auto_choice else None, out.get("last_h"),
                       out["dense_record"])


def _result(out: dict, options: SolveOptions, field: _VectorField, single: bool, args: tuple,
            f_consts: tuple, g_consts: tuple, dense_output: bool) -> IVPSolution:
    dense = _dense(out, options, field, args, f_consts, g_consts) if dense_output else None
    result = IVPSolution(ts=out["ts"], ys=out["ys"], num_points=out["num_points"],
                         status=out["status"], stats=out["stats"], sol=dense, y0=out["y0"])
    if "t_events" not in out:
        return result
    t_events, y_events = out["t_events"], out["y_events"]
    if single:
        t_events, y_events = t_events[0], y_events[0]
    return result._replace(t_events=t_events, y_events=y_events, event_counts=out["event_counts"])


def _differentiable_event_times(g: Callable, consts: tuple, dense: DenseOutput,
                                times: jax.Array, found: jax.Array, args: tuple) -> jax.Array:
    """The located times (C,) with derivatives of every order by the implicit
    function theorem on ``G(t) = g(t, sol.sol(t), *args, *consts) = 0``
    (``g`` closure-converted, ``consts`` its constants; see
    :func:`odekit.ode.engine.events.implicit_time`): through the dense
    output they move with y0, args, t0 and t1."""
    start = lax.stop_gradient(dense.direction * dense.ts[0])
    t_star = lax.stop_gradient(jnp.where(found, times, start))

    def residual(t: jax.Array, params: tuple) -> jax.Array:
        dense, args, consts = params
        return jnp.asarray(g(t, dense(t), *args, *consts)).reshape(()).astype(t.dtype)

    located = jax.vmap(lambda t: implicit_time(residual, t, (dense, args, consts)))(t_star)
    return jnp.where(found, located, times)


def _event_states(dense: DenseOutput, times: jax.Array, found: jax.Array,
                  recorded: Pytree) -> Pytree:
    """y at each event time through the dense output (differentiable); the
    recorded padding (nan) elsewhere."""
    start = lax.stop_gradient(dense.direction * dense.ts[0])
    values = dense(jnp.where(found, times, start))
    _, missing = output.padding(jnp.result_type(times))
    return jax.tree.map(
        lambda v, r: jnp.where(found.reshape((-1,) + (1,) * (v.ndim - 1)), v,
                               jnp.full_like(r, missing)), values, recorded)
