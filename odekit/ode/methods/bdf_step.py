"""The variable-order BDF / NDF method (orders 1-5) on backward differences.

A multistep method: it carries its own state between steps
(:class:`BDFState`: the history, the order, the step size the history is
built for, the Jacobian and the factorisation of the iteration matrix, and
its counters), as the loop's ``LoopState.method_state``
(:mod:`odekit.ode.engine.loop`). The formulas and the strategy follow
Shampine & Reichelt, "The MATLAB ODE Suite" (SIAM J. Sci. Comput. 18(1),
1997, Sec. 2) and the choices of SciPy's ``BDF`` (scipy/integrate/_ivp/bdf.py),
re-derived and written here for ``lax`` (every decision a ``where`` or a
``cond`` on arrays, so that ``vmap`` gives each member its own order and step).

History. ``D`` is an (8, n) array whose rows ``D_j = nabla^j y_n`` (j = 0..k)
are the backward differences of the solution on the grid ``t_n - i h_D``;
rows k+1 and k+2 hold the last two corrections (for the error estimates of
orders k+1). Changing the step size from h_D to h = r h_D re-samples the
interpolating polynomial on the new grid: ``D[:k+1] <- (R(r) U)^T D[:k+1]``
with ``R(r)_{ij} = prod_{m=1}^{i} (m - 1 - r j) / m`` and ``U = R(1)``
(Shampine & Reichelt, Sec. 2.3), an O(k^2 n) product. It is applied lazily,
at the start of the next attempt, from the history of the last accepted
step: consecutive changes compose exactly (the polynomial is the same).

One step of order k (coefficients :mod:`odekit.ode.methods.bdf_coefficients`):

    y_pred = sum_{j<=k} D_j,   psi = sum_{j=1}^{k} gamma_j D_j / alpha_k,   c = h / alpha_k
    solve  d + psi - c f(t + h, y_pred + d) = 0     (simplified Newton, d_0 = 0)
    y_new = y_pred + d,   err = error_const_k d,   f(t + h, y_new) = (d + psi) / c

Simplified Newton: ``(I - c_LU J) dd = -(d + psi - c f(y_pred + d))`` with a
Jacobian J and a factorisation of ``I / c_LU - J`` kept across steps, at most
4 iterations; with ``rate = |dd_m| / |dd_{m-1}|`` (norms weighted by ``atol +
rtol |y|``) it fails when ``rate >= 1`` or ``rate^(4 - m) / (1 - rate) |dd_m|
> tol`` and converges when ``rate / (1 - rate) |dd_m| < tol``, ``tol =
max(10 eps / rtol, min(0.03, sqrt(rtol)))`` (SciPy's rules; Hairer & Wanner,
Solving ODEs II, Sec. IV.8).

With a constant mass matrix M (``M y' = f``, possibly singular: an index-1
DAE; the linear system carries M, :mod:`odekit.ode.linalg.mass_matrix`),
``(d + psi) / c`` stands for y' at the new point, so the corrector solves
``M (d + psi) - c f(t + h, y_pred + d) = 0`` with the iteration matrix ``M -
c J``, and ``D_1`` starts from the consistent slope ``h0 y'(t0)``
(:meth:`~odekit.ode.linalg.mass_matrix.MassMatrix.slope`). The error estimate
``error_const_k d`` is used for every component, algebraic ones included
(as DASSL does for index 1: Brenan, Campbell & Petzold, "Numerical Solution
of Initial-Value Problems in DAEs", Sec. 5.2; ode15s does the same for its
mass-matrix problems).

Reuse of J and the LU (Shampine & Reichelt, Sec. 2.3; SciPy): the LU is
made again when the history's step size or order was changed after an
accepted step, when a step is clipped (to the end of the span, ``max_step``)
to a size the LU was not made for, and after a Newton failure; an error
rejection keeps it (the iteration still converges with a slightly wrong c).
J is evaluated again (at ``(t + h, y_pred)``) only when Newton fails with a
J not evaluated since the last accepted step; if it fails again, h is
halved, and the next attempt may evaluate J again if Newton fails with the
one it has (SciPy keeps that J until a step is accepted: made at a
prediction far out it can fail Newton at every shorter step). The counts ``njev`` and ``nlu`` are what was really made.

Step size and order (SciPy's rules): after an error rejection ``h <- h
max(0.2, s err^(-1/(k+1)))`` with ``s = 0.9 (2 N + 1) / (2 N + iterations)``,
N = 4; after k + 1 accepted steps of constant size and order, the errors of
orders k - 1, k, k + 1 (``error_const_{k-1} D_k``, ``err``, ``error_const_{k+1}
(d - d_prev)``) give factors ``err_q^(-1/(q+1))``; the order with the largest
is taken and ``h <- h min(10, s max factor)``.

Cost per attempted step: 1-4 evaluations of f (one per Newton iteration; no
evaluation at the solution), O(k n) for the prediction and update, one LU
solve per iteration; a Jacobian (n jvps) and an LU only when the rules say.

Dense output: the interpolating polynomial of the accepted step,
``y(t + h + s h) = sum_{j=0}^{k} D'_j prod_{i<j} (s + i) / (i + 1)`` with the
updated differences ``D'``, for ``s = theta - 1`` in [-1, 0]. Inside the loop
it gives the values at ``t_eval`` and locates events; since the step cannot be
taken again from ``(t_n, y_n)`` alone, ``sol.sol`` and the differentiable
event times read ``D'`` from the step record instead (:func:`dense_row`: one
(6, n) row per accepted step, memory ``O(steps * 6 * n)``, kept only when
dense output or events are asked for).

Derivatives (checkpoint adjoint, forward mode): the corrector's attempts
(Newton with the carried J, then, after a failure, with a fresh J and LU)
run as one rolled loop on values with their derivatives stopped
(``jax.closure_convert``: func's parameters too), so the iteration is traced
once; the root found then passes through one ``lax.custom_root`` whose
solver returns it, and whose derivative is the implicit function theorem's
at the solution (a fresh ``I - c df/dy`` by forward mode), not the
iterations'. J, the LU, the order and the step-size choices carry none.
(Tracing the corrector once instead of twice took the checkpoint gradient's
compiled program on Robertson from 1.40M to 1.20M characters.)
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit._batched_cond import member_cond
from odekit._tree import tree_ravel
from odekit.ode.linalg import linear_system
from odekit.ode.linalg.lu import dot, factor, solve_factored
from odekit.ode.methods.bdf_coefficients import MAX_ORDER, BDFCoefficients
from odekit.ode.methods.rk_step import StepResult, Tolerances

Pytree = Any

MAX_NEWTON_ITERATIONS = 4   # SciPy's NEWTON_MAXITER
MIN_FACTOR = 0.2            # smallest step-size factor after an error rejection
MAX_FACTOR = 10.0           # largest step-size factor
NEWTON_FAILURE_FACTOR = 0.5  # step-size factor after a Newton failure with a fresh J
ROWS = MAX_ORDER + 3        # rows of the history D


class BDFState(NamedTuple):
    """What the method carries from step to step (all arrays: vmap-able).

    Attributes:
      history: (ROWS, n) backward differences D (module docstring), for
        step ``h_history`` and order ``order``.
      order: int32 in 1..5.
      h_history: the step size D is built for (time dtype).
      h_proposed: the step size last proposed to the loop.
      n_equal: int32 accepted steps at ``h_history`` and ``order``.
      jac: J (an (n, n) array, or a structured system's (nnz,) values).
      factors: the factorisation of ``I / c_lu - J`` (a pytree of arrays).
      c_lu: the c = h / alpha_k it was made for.
      lu_invalid: bool, the next attempt must factor again.
      jac_current: bool, J was evaluated since the last accepted step.
      njev, nlu: int32 Jacobians and factorisations made so far.
      order_counts: (MAX_ORDER + 1,) int32 accepted steps at each order.
    """

    history: jax.Array
    order: jax.Array
    h_history: jax.Array
    h_proposed: jax.Array
    n_equal: jax.Array
    jac: jax.Array
    factors: Any
    c_lu: jax.Array
    lu_invalid: jax.Array
    jac_current: jax.Array
    njev: jax.Array
    nlu: jax.Array
    order_counts: jax.Array


class BDFTrial(NamedTuple):
    """An attempt's outcome, before the loop decides: the state to keep if
    it is rejected and the one if it is accepted, and what the step-size
    and order rules need."""

    rejected: BDFState
    accepted: BDFState
    newton_ok: jax.Array
    safety: jax.Array
    err_lower: jax.Array      # error norm of order k - 1 (inf at k = 1)
    err_higher: jax.Array     # error norm of order k + 1 (inf at k = MAX_ORDER)


def _work_dtype(y0: Pytree) -> Any:
    """The dtype of the flat state's linear algebra: float32 for a
    half-precision state (no LU kernel takes float16 / bfloat16)."""
    dtype = tree_ravel(y0)[0].dtype
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return dtype


def _flat(tree: Pytree, dtype: Any) -> jax.Array:
    return tree_ravel(tree)[0].astype(dtype)


def _unraveler(y0: Pytree) -> Callable[[jax.Array], Pytree]:
    flat, unravel = tree_ravel(y0)
    return lambda v: unravel(v.astype(flat.dtype))


def newton_tolerance(rtol: float, dtype: Any) -> float:
    """SciPy's ``max(10 eps / rtol, min(0.03, sqrt(rtol)))``."""
    eps = float(jnp.finfo(dtype).eps)
    rtol = max(float(rtol), eps)
    return max(10 * eps / rtol, min(0.03, rtol ** 0.5))


# --- the iteration matrix as data (kept across steps) ------------------------

def factorize(system: Any, jac: jax.Array, c: jax.Array) -> Any:
    """The factorisation of ``I / c - J`` (``M / c - J`` with a mass matrix) as a pytree of arrays (so that the
    method state can carry it): a structured system's own LU
    (:mod:`odekit.ode.linalg.linear_system`), else a dense LU with partial
    pivoting ``(lu, permutation)`` (:func:`odekit.ode.linalg.lu.factor`).
    O(n^3) dense, O(n b^2) banded."""
    shift = 1 / c
    lu = getattr(system, "lu", None)
    if lu is not None:     # (a diagonal mass matrix folded into J's diagonal values)
        return lu.factor(system.with_mass_folded(jac, shift.astype(jac.dtype)),
                         shift.astype(jac.dtype))
    matrix = system.dense(jac) if jac.ndim == 1 else jac
    mass = getattr(system, "mass", None)
    if mass is not None:
        return factor(mass.shifted(shift.astype(matrix.dtype), matrix))
    n = matrix.shape[0]
    return factor(shift.astype(matrix.dtype) * jnp.eye(n, dtype=matrix.dtype) - matrix)


def solve_with(system: Any, factors: Any, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``((I / c - J)^-1 b, iterations)`` from :func:`factorize`'s factors:
    the solution and the Krylov iterations it took (0 with an LU); O(n^2)
    dense, O(n b) banded."""
    return system.solve_with_count(factors, b)


def _tangent_solve(system: Any, linear: Callable, b: jax.Array) -> jax.Array:
    """``x`` with ``linear(x) = b`` for the corrector's linearisation ``I -
    c df/dy`` at the solution (the derivative of custom_root): its matrix by
    forward mode, then LU (``system.solve_linear_map``)."""
    return system.solve_linear_map(linear, b)


# --- history --------------------------------------------------------------------

def _r_matrix(order: jax.Array, factor: jax.Array, dtype: Any) -> jax.Array:
    """(6, 6) ``R(factor)`` restricted to rows and columns 0..order (zeros
    elsewhere): ``R_0j = 1``, ``R_i0 = 0`` (i > 0), ``R_ij = prod_{m=1}^{i} (m
    - 1 - factor j) / m``."""
    size = MAX_ORDER + 1
    i = jnp.arange(1, size, dtype=dtype)[:, None]
    j = jnp.arange(1, size, dtype=dtype)[None, :]
    body = (i - 1 - factor.astype(dtype) * j) / i
    m = jnp.zeros((size, size), dtype).at[1:, 1:].set(body).at[0].set(1)
    r = jnp.cumprod(m, axis=0)
    index = jnp.arange(size, dtype=jnp.int32)
    inside = (index[:, None] <= order) & (index[None, :] <= order)
    return jnp.where(inside, r, jnp.zeros((), dtype))


def rescale(history: jax.Array, order: jax.Array, factor: jax.Array) -> jax.Array:
    """The history for a step size ``factor`` times the one it is built for:
    ``D[:k+1] <- (R(factor) U)^T D[:k+1]``, the other rows kept. O(k^2 n)."""
    dtype = history.dtype
    real = jnp.finfo(dtype).dtype
    ru = dot(_r_matrix(order, factor, real), _r_matrix(order, jnp.ones((), real), real))
    head = dot(ru.T.astype(dtype), history[:MAX_ORDER + 1])
    rows = jnp.arange(MAX_ORDER + 1, dtype=jnp.int32)[:, None]
    head = jnp.where(rows <= order, head, history[:MAX_ORDER + 1])
    return jnp.concatenate([head, history[MAX_ORDER + 1:]])


def _row(history: jax.Array, i: jax.Array) -> jax.Array:
    return lax.dynamic_index_in_dim(history, i, keepdims=False)


def _updated(history: jax.Array, order: jax.Array, d: jax.Array) -> jax.Array:
    """The history after accepting ``d``: ``D_{k+2} = d - D_{k+1}``,
    ``D_{k+1} = d``, then ``D_i += D_{i+1}`` for i = k..0 (a reversed
    cumulative sum over rows 0..k+1)."""
    rows = jnp.arange(ROWS, dtype=jnp.int32)[:, None]
    previous = _row(history, order + 1)
    new = jnp.where(rows == order + 2, (d - previous)[None],
                    jnp.where(rows == order + 1, d[None], history))
    low = rows <= order + 1
    summed = jnp.flip(jnp.cumsum(jnp.flip(jnp.where(low, new, jnp.zeros_like(new)), 0), 0), 0)
    return jnp.where(low, summed, new)


# --- the method -----------------------------------------------------------------

def init_state(coefficients: BDFCoefficients, func: Callable, t0: jax.Array, y0: Pytree,
               f0: Pytree, h0: jax.Array, tolerances: Tolerances) -> BDFState:
    """Order 1, ``D_0 = y0``, ``D_1 = h0 f0`` (``h0 y'(t0)`` with ``M y'(t0) =
    f0`` given a mass matrix), J at (t0, y0) (one Jacobian); no
    factorisation yet (the first attempt makes it)."""
    del tolerances
    dtype = _work_dtype(y0)
    y, f = _flat(y0, dtype), _flat(f0, dtype)
    n = y.shape[0]
    history = jnp.zeros((ROWS, n), dtype).at[0].set(y).at[1].set(h0.astype(dtype) * f)
    unravel = _unraveler(y0)
    field = lambda v, t: _flat(func(unravel(v), t), v.dtype)
    system = linear_system.of(func)
    jac = lax.stop_gradient(system.jacobian(func, field, lax.stop_gradient(y),
                                            lax.stop_gradient(t0)))
    mass = getattr(system, "mass", None)
    if mass is not None:    # D_1 = h0 y'(t0), y' from M y' = f (MassMatrix.slope)
        f_t = jax.jvp(lambda s: field(y, s), (t0,), (jnp.ones_like(t0),))[1]
        slope = mass.slope(f, partial(system.jacobian_times, jac), f_t)
        history = history.at[1].set(h0.astype(dtype) * slope)
    c0 = lax.stop_gradient(h0.astype(dtype) / float(coefficients.alpha[1]))
    shapes = jax.eval_shape(partial(factorize, system), jac, c0)
    factors = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    int0 = jnp.zeros((), jnp.int32)
    h0 = lax.stop_gradient(h0)
    return BDFState(history=history, order=jnp.ones((), jnp.int32), h_history=h0,
                    h_proposed=h0, n_equal=int0, jac=jac, factors=factors, c_lu=c0,
                    lu_invalid=jnp.bool_(True), jac_current=jnp.bool_(False),
                    njev=jnp.ones((), jnp.int32), nlu=int0,
                    order_counts=jnp.zeros((MAX_ORDER + 1,), jnp.int32))


def restart(coefficients: BDFCoefficients, state: BDFState, func: Callable, t: jax.Array,
            y: Pytree, f: Pytree, h: jax.Array, tolerances: Tolerances) -> BDFState:
    """The state after a jump replaced the solution at ``t`` (``y``, ``f =
    func(y, t)``): order 1 from ``D_0 = y``, ``D_1 = h f`` and a fresh J, as
    :func:`init_state`, keeping the counters (one more Jacobian)."""
    fresh = init_state(coefficients, func, t, y, f, h, tolerances)
    return fresh._replace(njev=state.njev + fresh.njev, nlu=state.nlu,
                          order_counts=state.order_counts)


def _newton(solve: Callable, c_lu: jax.Array, norm: Callable, tol: float, run: jax.Array,
            residual: Callable, d0: jax.Array
            ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Simplified Newton on ``residual(d) = 0`` from ``d0`` with the fixed
    ``solve`` (``b -> ((I / c_lu - J)^-1 b, Krylov iterations)``; SciPy's
    BDF tests, module docstring), on values without derivatives. Returns
    ``(d, converged, iterations, krylov iterations)`` (int32 counts); ``d0``
    where it did not converge. Where ``run`` is False it makes no iteration
    and returns ``d0`` (a root found before) as converged."""
    real = jnp.finfo(d0.dtype).dtype
    zero = jnp.zeros((), real)
    int0 = jnp.zeros((), jnp.int32)
    init = (int0, d0, zero, ~run, jnp.bool_(False), int0)

    def cond(state):
        m, _, _, converged, failed, _ = state
        return (m < MAX_NEWTON_ITERATIONS) & ~converged & ~failed

    def body(state):
        m, d, previous, _, _, krylov = state
        r = residual(d)
        dd, used = solve(-r)
        dd = dd / c_lu
        size = norm(dd).astype(real)
        first = m == 0
        rate = jnp.where(first | (previous <= 0), zero, size / jnp.where(previous > 0, previous, 1))
        below = rate < 1
        safe = jnp.where(below, rate, zero)
        left = (MAX_NEWTON_ITERATIONS - m).astype(real)
        diverging = ~first & (~below | (safe ** left / (1 - safe) * size > tol))
        failed = diverging | ~jnp.isfinite(size) | ~jnp.all(jnp.isfinite(r))
        d_new = jnp.where(failed, d, d + dd)
        converged = ~failed & ((size == 0) | (~first & (safe / (1 - safe) * size < tol)))
        return m + 1, d_new, size, converged, failed, krylov + used

    m, d, _, converged, _, krylov = lax.while_loop(cond, body, init)
    return jnp.where(converged, d, d0), converged, m, krylov


def step(coefficients: BDFCoefficients, func: Callable, t: jax.Array, y: Pytree, f: Pytree,
         h: jax.Array, state: BDFState, tolerances: Tolerances) -> tuple[StepResult, BDFTrial]:
    """Attempt one step of size ``h`` from ``(t, y)`` with the carried ``state``.

    Returns ``(StepResult, BDFTrial)``: the result's ``y1`` is ``y_pred + d``
    (``y`` when Newton failed, with an infinite error), ``f1 = M (d + psi) /
    c`` (no evaluation; M = I without a mass matrix), ``error = error_const_k d``, ``stages = (D', k)``
    (the updated history and the order: the dense output), ``nfev`` the
    Newton iterations made.
    """
    del f
    dtype = state.history.dtype
    real = jnp.finfo(dtype).dtype
    unravel = _unraveler(y)
    field = lambda v, s: _flat(func(unravel(v), s), v.dtype)
    system = linear_system.of(func)
    k = state.order
    rows = jnp.arange(ROWS, dtype=jnp.int32)
    pad = lambda a: jnp.asarray(np.concatenate([a, np.zeros(ROWS - a.shape[0])]), real)
    gamma, alpha, error_const = (pad(coefficients.gamma), pad(coefficients.alpha),
                                 pad(coefficients.error_const))
    alpha_k = alpha[k]

    # the history for this step size (lazily from the last accepted step's)
    # The loop takes the step t really takes, fl(t + h) - t: a size within
    # that rounding of another counts as the same (no rescale, no new LU).
    h_fixed = lax.stop_gradient(h)
    slack = 4 * jnp.finfo(t.dtype).eps * jnp.maximum(jnp.abs(t), jnp.abs(t + h_fixed))
    factor = h_fixed / state.h_history
    same = jnp.abs(h_fixed - state.h_history) <= slack
    history = jnp.where(same, state.history, rescale(state.history, k, factor))
    # The step sizes carry no derivative, except a step clipped to the end of
    # the span (h = t_end - t): its value there moves with t_end through the
    # re-sampled history too (a zero-valued term holding d rescale / dh; with
    # it dropped, d y(t_end) / d t_end was 0.28 where y'(t_end) is 0.65).
    history = history + _rescale_tangent(state.history, k, h / state.h_history)
    n_equal = jnp.where(same, state.n_equal, 0).astype(jnp.int32)
    y_predict = jnp.sum(jnp.where((rows <= k)[:, None], history, jnp.zeros((), dtype)), axis=0)
    weights = jnp.where((rows >= 1) & (rows <= k), gamma, jnp.zeros((), real)).astype(dtype)
    psi = dot(weights, history) / alpha_k.astype(dtype)
    h_y = h.astype(dtype)
    c = h_y / alpha_k.astype(dtype)
    c_fixed = lax.stop_gradient(c)
    t_new = t + h

    # the factorisation: again after a change of the history's step size or
    # order, a Newton failure, or a step clipped to a size it was not made for
    clipped = jnp.abs(h_fixed - state.h_proposed) > slack
    refactor = state.lu_invalid | (clipped & (c_fixed != state.c_lu))

    def corrector_residual(y_predict, psi, c, t_new):
        # (M (d + psi) - c f with a mass matrix: d + psi stands for c y')
        return lambda d: system.mass_times(d + psi) - c * field(y_predict + d, t_new)

    def attempts(y_predict, psi, c, t_new, jac, factors, c_lu):
        """At most two corrector attempts on values without derivatives: the
        first with the J and the LU carried (a new LU if ``refactor``); after
        a Newton failure with a J not evaluated since the last accepted step,
        a fresh J at ``(t + h, y_pred)``, a new LU and Newton again (from
        ``d = 0``). One rolled loop, so the corrector is traced once."""
        predicted = unravel(y_predict)
        norm = lambda v: tolerances.norm(unravel(v), predicted, predicted)
        residual = corrector_residual(y_predict, psi, c, t_new)
        tol = newton_tolerance(tolerances.rtol, dtype)

        def fresh_jacobian(jac):
            new = system.jacobian(func, field, y_predict, t_new)
            # A prediction too far out (a first step much too long, an exp in
            # f) can make J non-finite there: keep the one we have rather than
            # carry inf into every later factorisation (a smaller step then
            # succeeds).
            return jnp.where(jnp.all(jnp.isfinite(new)), new, jac)

        def attempt(i, carry):
            d, ok, jac, factors, c_lu, iterations, last, _, linear_iterations = carry
            retry = (i == 1) & ~ok & ~state.jac_current
            run = (i == 0) | retry
            # (member_cond: under vmap, made when some member needs it, kept by the others)
            jac = member_cond(retry, fresh_jacobian, lambda jac: jac, jac)
            factors, c_lu = member_cond(((i == 0) & refactor) | retry,
                                        lambda: (factorize(system, jac, c), c),
                                        lambda: (factors, c_lu))
            solve = lambda b: solve_with(system, factors, b)
            d, converged, made, krylov = _newton(solve, c_lu, norm, tol, run, residual, d)
            ok = jnp.where(run, converged, ok)
            last = jnp.where(run, made, last)
            return (d, ok, jac, factors, c_lu, iterations + made, last, retry,
                    linear_iterations + krylov)

        int0 = jnp.zeros((), jnp.int32)
        init = (jnp.zeros_like(y_predict), jnp.bool_(False), jac, factors, c_lu, int0, int0,
                jnp.bool_(False), int0)
        return lax.fori_loop(0, 2, attempt, init)

    # The iterations carry no derivative (J, the LU and the Newton steps have
    # none): the attempts run on values with derivatives stopped, and the root
    # found gets its derivative from one lax.custom_root whose solver returns
    # it: the implicit function theorem's at the solution.
    operands = (y_predict, psi, c, t_new, state.jac, state.factors, state.c_lu)
    without_derivatives, closed = jax.closure_convert(attempts, *operands)
    stopped = lambda tree: jax.tree.map(lax.stop_gradient, tree)
    d, ok, jac, factors, c_lu, nfev, last_iterations, retry, niter = without_derivatives(
        *stopped(operands), *stopped(closed))
    d = lax.custom_root(corrector_residual(y_predict, psi, c, t_new), d, lambda _, root: root,
                        partial(_tangent_solve, system))
    safety = (0.9 * (2 * MAX_NEWTON_ITERATIONS + 1)
              / (2 * MAX_NEWTON_ITERATIONS + last_iterations.astype(real)))

    y_flat = history[0]
    y_new = y_predict + d
    y1 = unravel(jnp.where(ok, y_new, y_flat))
    f1 = unravel(jnp.where(ok, system.mass_times(d + psi) / c, jnp.zeros_like(d)))
    error = unravel(jnp.where(ok, error_const[k].astype(dtype) * d, jnp.full_like(d, jnp.inf)))

    updated = _updated(history, k, d)
    # errors of the neighbouring orders (for the order choice), scaled like err
    ref = unravel(y_flat)
    other = lambda v: lax.stop_gradient(tolerances.norm(unravel(v), ref, y1)).astype(real)
    inf = jnp.full((), jnp.inf, real)
    err_lower = jnp.where(k > 1, other(error_const[jnp.maximum(k - 1, 0)].astype(dtype)
                                       * _row(updated, k)), inf)
    err_higher = jnp.where(k < MAX_ORDER, other(error_const[jnp.minimum(k + 1, MAX_ORDER)]
                                                .astype(dtype) * _row(updated, k + 2)), inf)

    made_jac = retry.astype(jnp.int32)
    made_lu = refactor.astype(jnp.int32) + made_jac
    common = dict(jac=jac, factors=factors, c_lu=c_lu, lu_invalid=jnp.bool_(False),
                  njev=state.njev + made_jac, nlu=state.nlu + made_lu)
    # After a Newton failure (fresh J or not) the step is halved, and the next
    # attempt may evaluate J again at its own prediction: one made at a
    # prediction far out (a long step into an exp) misled Newton at every
    # shorter step (the transistor amplifier, a DAE, at rtol 1e-6).
    rejected = state._replace(jac_current=(state.jac_current | retry) & ok,
                              n_equal=jnp.zeros_like(n_equal), **common)
    accepted = state._replace(history=updated, h_history=lax.stop_gradient(h),
                              n_equal=n_equal + 1, jac_current=jnp.bool_(False),
                              order_counts=state.order_counts + (jnp.arange(MAX_ORDER + 1, dtype=jnp.int32) == k
                                                                 ).astype(jnp.int32),
                              **common)
    trial = BDFTrial(rejected, accepted, ok, lax.stop_gradient(safety), err_lower, err_higher)
    dense = (jnp.where((jnp.arange(MAX_ORDER + 1, dtype=jnp.int32) <= k)[:, None], updated[:MAX_ORDER + 1],
                       jnp.zeros((), dtype)),)
    # one solve per Newton iteration (each also one evaluation)
    return StepResult(y1, f1, error, None, dense, nfev, nfev, niter), trial


def _rescale_tangent(history: jax.Array, k: jax.Array, factor: jax.Array) -> jax.Array:
    """Zero, with the derivative of :func:`rescale` with respect to ``factor``
    (the history itself held fixed)."""
    fixed = lax.stop_gradient(history)
    moved = rescale(fixed, k, factor)
    return moved - lax.stop_gradient(moved)


def advance(trial: BDFTrial, accepted: jax.Array, h: jax.Array, err: jax.Array
            ) -> tuple[jax.Array, BDFState]:
    """``(h_next, state)`` after the loop's verdict on the attempt: SciPy's
    step-size and order rules (module docstring). ``err`` is the loop's
    error norm of the step (time dtype)."""
    real = trial.safety.dtype
    new = trial.accepted
    k = new.order
    err = lax.stop_gradient(err).astype(real)
    finite = jnp.isfinite(err)
    # rejected: shrink (halve after a Newton failure, which also needs a new LU)
    shrink = jnp.maximum(MIN_FACTOR, trial.safety * jnp.where(finite & (err > 0), err, 1.0)
                         ** (-1 / (k + 1).astype(real)))
    shrink = jnp.where(finite, shrink, MIN_FACTOR)
    shrink = jnp.where(trial.newton_ok, shrink, NEWTON_FAILURE_FACTOR)
    # accepted: after k + 1 steps of one size and order, choose both again
    choose = new.n_equal >= k + 1
    norms = jnp.stack([trial.err_lower, err, trial.err_higher])
    exponents = -1 / (k + jnp.arange(3, dtype=jnp.int32)).astype(real)
    factors = jnp.where(norms > 0, norms, jnp.zeros((), real))
    factors = jnp.where(norms > 0, factors ** exponents, jnp.inf)
    factors = jnp.where(jnp.isnan(factors), jnp.zeros((), real), factors)
    best = jnp.argmax(factors).astype(jnp.int32)
    grow = jnp.minimum(MAX_FACTOR, trial.safety * jnp.max(factors))
    order = jnp.where(choose, jnp.clip(k + best - 1, 1, MAX_ORDER), k).astype(jnp.int32)
    factor = jnp.where(accepted, jnp.where(choose, grow, 1.0), shrink)
    h_next = lax.stop_gradient(h * factor.astype(h.dtype))
    on_accept = new._replace(order=order, n_equal=jnp.where(choose, 0, new.n_equal),
                             lu_invalid=choose, h_proposed=h_next)
    on_reject = trial.rejected._replace(lu_invalid=~trial.newton_ok, h_proposed=h_next)
    state = jax.tree.map(lambda a, b: jnp.where(accepted, a, b), on_accept, on_reject)
    return h_next, state


def statistics(state: BDFState) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(njev, nlu, order_counts)`` as made."""
    return state.njev, state.nlu, state.order_counts


def dense_prepare(func: Callable, t: jax.Array, y: Pytree, h: jax.Array,
                  step_result: StepResult) -> tuple:
    """``(D', y)``: the updated differences (rows above the order zero) and
    the state (its structure, for the values)."""
    del func, t, h
    return step_result.stages[0], y


def dense_eval(dense_step: tuple, theta: jax.Array) -> Pytree:
    """``y(t + theta h) = sum_j D'_j prod_{i<j} (s + i) / (i + 1)``, ``s =
    theta - 1``, for a (m,) ``theta``: leaves gain a leading (m,) axis.
    O(m k n)."""
    differences, y = dense_step
    unravel = _unraveler(y)
    dtype = differences.dtype
    real = jnp.finfo(dtype).dtype
    s = theta.astype(real)[:, None] - 1
    i = jnp.arange(MAX_ORDER, dtype=real)[None, :]
    products = jnp.cumprod((s + i) / (i + 1), axis=1)
    values = differences[0][None] + dot(products.astype(dtype), differences[1:])
    return jax.vmap(unravel)(values)


def dense_row(dense_step: tuple) -> jax.Array:
    """What the step record keeps of an accepted step's dense output (the
    method is not replayable: its polynomial depends on the history): the
    (MAX_ORDER + 1, n) updated differences ``D'`` (rows above the order
    zero). With the recorded ``t_n`` and ``h = t_{n+1} - t_n`` they give
    the step's polynomial (:func:`dense_eval`); memory ``O(steps * 6 * n)``."""
    differences, _ = dense_step
    return differences


def dense_from_row(row: jax.Array, y: Pytree) -> tuple:
    """The dense data :func:`dense_eval` takes, from a recorded row ``D'``
    ((MAX_ORDER + 1, n)) and a state ``y`` of the solution's structure."""
    return row, y


def empty_dense_row(y0: Pytree) -> jax.Array:
    """A (MAX_ORDER + 1, n) row of zeros for a state like ``y0`` (6 n numbers)."""
    return jnp.zeros((MAX_ORDER + 1, tree_ravel(y0)[0].shape[0]), _work_dtype(y0))
