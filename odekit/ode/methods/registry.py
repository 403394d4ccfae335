"""Registry of integration methods: one record per method, looked up by name.

A :class:`Method` is everything the integration loop asks of a method: how to
take one step, the exponent order of its step-size rule, its dense output
and (optionally) its stiffness test. The loop never looks at a tableau, so a
Rosenbrock or ESDIRK method is one more record with its own ``step`` and
``dense`` functions. Every explicit Runge-Kutta method is the same three
functions over a different tableau (:func:`explicit`); every Rosenbrock
method the same over a Rosenbrock tableau (:func:`rosenbrock`), every ESDIRK
method over an ESDIRK tableau (:func:`esdirk`).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable, NamedTuple

import jax

from odekit.ode.methods import bdf_step, esdirk_step, interpolation, rosenbrock_step, stiffness
from odekit.ode.methods.bdf_coefficients import NDF, BDFCoefficients
from odekit.ode.methods.esdirk_tableaux import ESDIRK_TABLEAUX, ESDIRKTableau
from odekit.ode.methods.rk_step import StepResult, num_evaluations, rk_step
from odekit.ode.methods.explicit_tableaux import TABLEAUX, ButcherTableau
from odekit.ode.methods.rosenbrock_tableaux import ROSENBROCK_TABLEAUX, RosenbrockTableau

Pytree = Any


class RecordedDense(NamedTuple):
    """How a method whose steps depend on its carried state (``Method.replayable``
    False) keeps the dense output of its accepted steps: one row per step,
    written by the loop (:mod:`odekit.ode.engine.output`), read by the dense
    output object (:mod:`odekit.ode.engine.dense`).

    Attributes:
      row: ``row(dense_step) -> row``, what is kept of ``dense_prepare``'s
        result (a pytree of arrays of fixed shapes).
      step: ``step(row, y_n) -> dense_step``, for ``dense_eval`` again
        (``y_n``, the recorded state at the step's start, gives the
        structure of the values).
      empty: ``empty(y0) -> row`` of zeros for a state like ``y0`` (the
        record's shapes and dtypes; memory ``record`` times its size).
    """

    row: Callable[[Pytree], Pytree]
    step: Callable[[Pytree, Pytree], Pytree]
    empty: Callable[[Pytree], Pytree]


@dataclasses.dataclass(frozen=True, eq=False)
class Method:
    """An integration method as the loop sees it.

    Attributes:
      name: lower-case registry name (``method=``).
      order: order of the propagated solution.
      controller_order: k in the step-size rule ``h ~ err**(-1/k)`` (the
        embedded order + 1; DOP853's combined estimate behaves like h**8).
      controller_beta2: weight of the previous step's error in the PI rule
        (:func:`odekit.ode.engine.controller.propose_step`); None for Gustafsson's
        0.2 / k, 0 for the plain rule.
      step: ``step(func, t, y, f, h) -> StepResult`` (``f = func(y, t)``).
      evaluations_per_step: evaluations of ``func`` one attempted step costs
        (an implicit method's step reports its own count, ``StepResult.nfev``;
        this is then its least one).
      dense_prepare: ``dense_prepare(func, t, y, h, step) -> dense_step``, the
        continuous extension of an accepted step (a pytree of arrays).
      dense_evaluations: extra evaluations one ``dense_prepare`` costs.
      dense_eval: ``dense_eval(dense_step, theta) -> values`` at
        ``t + theta h`` for a (m,) ``theta``: leaves gain a leading (m,) axis.
      is_stiff: ``is_stiff(h, step, scale) -> bool`` (Hairer's test on the
        step's stages in the norm weighted by ``scale``, a pytree like the
        state), or None for a method that needs none (a stiff method).
      tableau: the coefficients, for tables and tests.
      jacobians_per_step: Jacobians of ``func`` one attempted step computes.
      factorizations_per_step: LU decompositions one attempted step computes
        (a method with any goes through LAPACK: never one CPU kernel).
      solves_per_step: solves with the iteration matrix W one attempted step
        makes (a Rosenbrock method: one per stage); a Newton iteration's
        step reports its own count (``StepResult.nsolve``) instead.
      lands_on_outputs: no step passes the next output time (t_eval): the
        values there are step ends, not the dense output (for a dense output
        of low order on stiff components, as the ESDIRK methods'). The
        dense output ``sol.sol(t)`` between steps is unchanged.
      init_state: None for a one-step method. A method that carries its own
        state between steps (a multistep method's history, order, Jacobian
        and factorisation, counters) gives ``init_state(func, t0, y0, f0, h0,
        tolerances) -> state`` (a pytree of arrays; ``tolerances`` a
        :class:`~odekit.ode.methods.rk_step.Tolerances`); the loop carries it
        as ``LoopState.method_state``, and ``step`` is then ``step(func, t, y,
        f, h, state, tolerances) -> (StepResult, trial)``.
      advance: with ``init_state``: ``advance(trial, accepted, h, err) ->
        (h_next, state)``, the method's own step-size (and order) choice
        and its state after the loop accepted or rejected the attempt
        (``err`` the loop's error norm); it replaces the PI controller.
      statistics: with ``init_state``: ``statistics(state) -> (njev, nlu,
        order_counts)``, the Jacobians and factorisations really made and
        the accepted steps at each order ((MAX_ORDER + 1,) int32); without
        it ``jacobians_per_step`` and ``factorizations_per_step`` count per
        attempted step (then also flags: the method uses a Jacobian / LU).
      replayable: a step's dense output can be rebuilt from ``(t_n, y_n)``
        alone (:func:`odekit.ode.engine.dense.replay_step`: ``sol.sol``,
        events' differentiable times, the interpolate adjoint). False for a
        method whose step depends on its carried state.
      recorded_dense: for a method that is not ``replayable``, how the
        solve keeps each accepted step's dense output instead of replaying
        it (:class:`RecordedDense`): the loop records one row per accepted
        step beside ``(t_n, y_n)`` (``sol.sol`` and events' times and states
        read it). None: the dense output needs a replay.
      restart: with ``init_state``: ``restart(state, func, t, y, f, h,
        tolerances) -> state``, the state to go on with after a jump at a
        stop replaced ``y`` (an adjoint's backward pass): a multistep
        method's history no longer describes the solution there, so it
        starts again as at ``t0`` (keeping its counters). None: the method
        carries nothing a jump invalidates.
      accepts_mass_matrix: the step solves ``M y' = f(t, y)`` with the
        constant mass matrix its linear system carries
        (:mod:`odekit.ode.linalg.mass_matrix`; index-1 DAEs for a singular M).

    Equality and hashing are by identity, so a method is a valid static
    argument of ``jax.jit`` and ``custom_vjp``.
    """

    name: str
    order: int
    controller_order: int
    step: Callable[..., StepResult]
    evaluations_per_step: int
    dense_prepare: Callable[..., Pytree]
    dense_evaluations: int
    dense_eval: Callable[..., Pytree]
    is_stiff: Callable[..., jax.Array] | None
    tableau: ButcherTableau | RosenbrockTableau | ESDIRKTableau | BDFCoefficients
    jacobians_per_step: int = 0
    factorizations_per_step: int = 0
    solves_per_step: int = 0
    lands_on_outputs: bool = False
    controller_beta2: float | None = None
    init_state: Callable[..., Pytree] | None = None
    advance: Callable[..., tuple] | None = None
    statistics: Callable[..., tuple] | None = None
    replayable: bool = True
    recorded_dense: RecordedDense | None = None
    restart: Callable[..., Pytree] | None = None
    accepts_mass_matrix: bool = False


def _rk_step(tableau: ButcherTableau, func: Callable, t: jax.Array, y: Pytree, f: Pytree,
             h: jax.Array) -> StepResult:
    return rk_step(func, tableau, t, y, f, h)


def _rk_dense_prepare(tableau: ButcherTableau, func: Callable, t: jax.Array, y: Pytree,
                      h: jax.Array, step: StepResult) -> tuple:
    return y, h, interpolation.extend_stages(func, tableau, t, y, h, step.stages)


def _rk_dense_eval(tableau: ButcherTableau, dense_step: tuple, theta: jax.Array) -> Pytree:
    y, h, stages = dense_step
    return interpolation.evaluate(tableau, y, h, stages, theta)


def _rk_is_stiff(tableau: ButcherTableau, h: jax.Array, step: StepResult,
                 scale: Pytree) -> jax.Array:
    return stiffness.is_stiff_stages(tableau, h, step.stages, scale)


def explicit(tableau: ButcherTableau) -> Method:
    """The record of an explicit Runge-Kutta pair given by ``tableau``."""
    combined_estimate = tableau.b_error_secondary is not None
    return Method(
        name=tableau.name, order=tableau.order,
        controller_order=tableau.order if combined_estimate else tableau.error_order + 1,
        step=partial(_rk_step, tableau), evaluations_per_step=num_evaluations(tableau),
        dense_prepare=partial(_rk_dense_prepare, tableau), dense_evaluations=len(tableau.extra_c),
        dense_eval=partial(_rk_dense_eval, tableau),
        is_stiff=partial(_rk_is_stiff, tableau), tableau=tableau,
        # DOP853's combined estimate with the plain rule, as Hairer's dop853.f
        # (BETA = 0 by default) and SciPy's DOP853: with dopri5.f's memory
        # (0.2 / 8) dopri8 took up to 1.2x SciPy's evaluations for the same
        # error at single tolerances of the Kepler orbit; with the plain rule
        # it accepts SciPy's steps (tests/ode/test_controller.py).
        controller_beta2=0.0 if combined_estimate else None)


def _rosenbrock_step(tableau: RosenbrockTableau, func: Callable, t: jax.Array, y: Pytree,
                     f: Pytree, h: jax.Array) -> StepResult:
    return rosenbrock_step.rosenbrock_step(func, tableau, t, y, f, h)


def _rosenbrock_dense_prepare(tableau: RosenbrockTableau, func: Callable, t: jax.Array, y: Pytree,
                              h: jax.Array, step: StepResult) -> tuple:
    return rosenbrock_step.dense_prepare(tableau, y, step)


def rosenbrock(tableau: RosenbrockTableau) -> Method:
    """The record of the Rosenbrock method given by ``tableau`` (L-stable,
    for stiff problems: no stiffness test, one Jacobian and one LU per step)."""
    return Method(
        name=tableau.name, order=tableau.order, controller_order=tableau.error_order + 1,
        step=partial(_rosenbrock_step, tableau),
        evaluations_per_step=tableau.num_stages,   # stages 2..s and f(t1, y1)
        dense_prepare=partial(_rosenbrock_dense_prepare, tableau), dense_evaluations=0,
        dense_eval=rosenbrock_step.dense_eval, is_stiff=None, tableau=tableau,
        jacobians_per_step=1, factorizations_per_step=1,
        solves_per_step=tableau.num_stages, accepts_mass_matrix=True)


def _esdirk_step(tableau: ESDIRKTableau, func: Callable, t: jax.Array, y: Pytree, f: Pytree,
                 h: jax.Array) -> StepResult:
    return esdirk_step.esdirk_step(func, tableau, t, y, f, h)


def _esdirk_dense_prepare(tableau: ESDIRKTableau, func: Callable, t: jax.Array, y: Pytree,
                          h: jax.Array, step: StepResult) -> tuple:
    return esdirk_step.dense_prepare(tableau, y, step)


def esdirk(tableau: ESDIRKTableau) -> Method:
    """The record of the ESDIRK method given by ``tableau`` (L-stable, for stiff
    problems: no stiffness test; simplified Newton with one Jacobian and one LU
    per step; dense output from the stage values)."""
    return Method(
        name=tableau.name, order=tableau.order, controller_order=tableau.error_order + 1,
        step=partial(_esdirk_step, tableau),
        # one Newton iteration per implicit stage and f(t1, y1) at least; the
        # step reports what it made (StepResult.nfev)
        evaluations_per_step=tableau.num_stages,
        dense_prepare=partial(_esdirk_dense_prepare, tableau), dense_evaluations=0,
        dense_eval=esdirk_step.dense_eval, is_stiff=None, tableau=tableau,
        jacobians_per_step=1, factorizations_per_step=1,
        # the dense output has order 4 but only order 2 on stiff components
        # (stage order 2): Robertson's y2 and Van der Pol's y2 between steps
        # were off by up to 100 and 240 tolerances
        lands_on_outputs=True)


def bdf(coefficients: BDFCoefficients = NDF, name: str = "bdf") -> Method:
    """The record of the variable-order (1-5) BDF method on ``coefficients``
    (:data:`~odekit.ode.methods.bdf_coefficients.NDF`, the default, or the
    classical :data:`~odekit.ode.methods.bdf_coefficients.BDF`): a multistep
    method with its own state (history, order, Jacobian, LU), step-size and
    order rules and counters (:mod:`odekit.ode.methods.bdf_step`).

    ``order`` is the starting order 1 (the initial step size is Hairer's
    estimate for order 1, as SciPy's BDF); ``jacobians_per_step`` and
    ``factorizations_per_step`` only say that it uses both (the counts are
    the method's own)."""
    return Method(
        name=name, order=1, controller_order=2,
        step=partial(bdf_step.step, coefficients),
        evaluations_per_step=1,
        dense_prepare=bdf_step.dense_prepare, dense_evaluations=0,
        dense_eval=bdf_step.dense_eval, is_stiff=None, tableau=coefficients,
        jacobians_per_step=1, factorizations_per_step=1,
        init_state=partial(bdf_step.init_state, coefficients), advance=bdf_step.advance,
        statistics=bdf_step.statistics, replayable=False,
        restart=partial(bdf_step.restart, coefficients), accepts_mass_matrix=True,
        recorded_dense=RecordedDense(row=bdf_step.dense_row, step=bdf_step.dense_from_row,
                                     empty=bdf_step.empty_dense_row))


METHODS: dict[str, Method] = {name: explicit(tab) for name, tab in TABLEAUX.items()}
METHODS.update({name: rosenbrock(tab) for name, tab in ROSENBROCK_TABLEAUX.items()})
METHODS.update({name: esdirk(tab) for name, tab in ESDIRK_TABLEAUX.items()})
METHODS["bdf"] = bdf()
EXPLICIT_METHODS: dict[str, ButcherTableau] = dict(TABLEAUX)


# What a SciPy user reaches for, and odekit's answer (for the error message).
SCIPY_EQUIVALENTS = {
    "RK45": "'dopri5' (the same Dormand-Prince 5(4) pair; 'tsit5' is usually cheaper)",
    "RK23": "'bosh3' (the same Bogacki-Shampine 3(2) pair)",
    "DOP853": "'dopri8' (the same Dormand-Prince 8(5,3) method)",
    "Radau": "'rodas5p' (an L-stable Rosenbrock method for the same stiff problems) "
             "or 'kvaerno5'",
    "BDF": "'bdf' (the same variable-order NDF/BDF method, orders 1-5)",
    "LSODA": "'auto' in solve_ivp (tsit5, switching to rodas5p when the problem "
             "turns out stiff)",
}


def get_method(name: str) -> Method:
    """The method registered as ``name``; ValueError naming the choices (and
    odekit's counterpart of a SciPy method name)."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        hint = SCIPY_EQUIVALENTS.get(name) if isinstance(name, str) else None
        hint = f" SciPy's {name!r} corresponds to {hint}." if hint else ""
        raise ValueError(f"Unknown method {name!r}; choose one of {sorted(METHODS)}.{hint}") from None


def check_replayable(method: Method, what: str) -> None:
    """ValueError when ``what`` (dense output, events, the interpolate
    adjoint) needs a step's dense output rebuilt from ``(t_n, y_n)`` alone
    (:func:`odekit.ode.engine.dense.replay_step`) and ``method`` carries a
    state its steps depend on (a multistep method's history)."""
    if method.replayable:
        return
    kept = (" (dense_output=True, events and adjoint='interpolate' read each step's "
            "polynomial from the step record instead)" if method.recorded_dense is not None
            else "")
    other = ("" if method.recorded_dense is not None else
             "; for dense_output=True, events or adjoint='interpolate' use method='rodas5p' "
             "or 'kvaerno5'")
    raise ValueError(
        f"odekit: method={method.name!r} does not support {what} yet: that rebuilds a "
        f"step's dense output from the step's start (t_n, y_n) alone, and a {method.name!r} "
        f"step also depends on the history the method carries{kept}. With {method.name!r} "
        f"use adjoint='checkpoint' (the default of solve_ivp and of odeint for stiff "
        f"methods) or adjoint='forward'{other}.")


def get_tableau(name: str) -> ButcherTableau:
    """The tableau of the method ``name`` (a Butcher, Rosenbrock or ESDIRK tableau)."""
    return get_method(name).tableau


def method_table() -> str:
    """Markdown table of the registered methods (the README embeds it verbatim;
    a test keeps the two identical)."""
    rows = ["| method | order (embedded) | stages | FSAL | dense output order | real stability interval |",
            "|---|---|---|---|---|---|"]
    for name, tab in EXPLICIT_METHODS.items():
        extra = f" + {len(tab.extra_c)} for dense output" if len(tab.extra_c) else ""
        rows.append(f"| `\"{name}\"` | {tab.order} ({tab.error_order}) | {tab.num_stages}{extra} | "
                    f"{'yes' if tab.fsal else 'no'} | {tab.dense_order} | "
                    f"[-{stiffness.stability_boundary(tab):.2f}, 0] |")
    return "\n".join(rows)
