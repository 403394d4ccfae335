"""One step of an ESDIRK method by simplified Newton, with its dense output.

For a tableau (a, c, b, b_error, gamma, predictor) with s stages
(:mod:`odekit.ode.methods.esdirk_tableaux`), a step of size h from (t0, y0) with
``k_i = h f(Y_i)`` and ``z_i = Y_i - y0``:

    k_1 = h f0                                        (explicit first stage)
    z_i = base_i + gamma h f(t0 + c_i h, y0 + z_i),   base_i = sum_{j<i} a_ij k_j
    k_i = (z_i - base_i) / gamma                      (no evaluation at the solution)
    y1 = y0 + sum_i b_i k_i = y0 + z_s,    err = sum_i b_error_i k_i = z_s - z_{s-1}

(stiffly accurate: y1 is the last stage, the embedded solution the one before).

Each implicit stage is solved by simplified Newton (Hairer & Wanner, Solving
ODEs II, Sec. IV.8) with ONE Jacobian ``J = df/dy(t0, y0)`` (one vectorised
``jax.jvp`` over n directions) and ONE LU of ``I - h gamma J`` per step,
reused by every stage and iteration:

    (I - h gamma J) dz = -(z - base_i - h gamma f(t0 + c_i h, y0 + z)),   z <- z + dz

starting from the predictor ``k_i ~ sum_j predictor_ij k_j``.

Stopping test. The step is not told the solve's tolerances, so the iteration
stops by a test relative to the stage itself (Hairer & Wanner IV.8 with a
fixed relative tolerance): in the weighted RMS norm with weights
``w = NEWTON_RTOL max(|y0|, |y0 + z_0|) + eps^1.5 rms(...)`` (fixed for the
stage, so that a runaway iterate cannot shrink its own norm), with
``theta = |dz_m| / |dz_{m-1}|`` the contraction rate, the iteration has
converged when the remaining error ``theta / (1 - theta) |dz_m|`` (``|dz_0|``
after the first iteration) is at most 1: far below the local error any
rtol >= 1e-9 accepts (NEWTON_RTOL is at least the state dtype's eps: in
float32 ``eps |Y|``, below the rtol floor of 4 eps the front ends apply).
An increment within ``ROUNDING_INCREMENT eps |Y|`` has also converged: the
iteration is at the state's rounding, where theta is noise, and no step
size would do better: nothing joins the error estimate. If it runs out of ``MAX_NEWTON_ITERATIONS`` while still
contracting (theta < 1), the last iterate is kept and its estimated remaining
error, ``theta / (1 - theta) |dz|`` per component, is added to the magnitude
of the step's error estimate: the controller, which knows the tolerances,
decides whether that is good enough. It fails when ``theta >= DIVERGENCE``,
when it runs out without contracting, or on a non-finite increment; a failed
step returns ``y1 = y0`` and an infinite error estimate, so the loop rejects
it and shrinks h by the controller's smallest factor (0.2).

The evaluations a step makes vary (one per Newton iteration, plus f(t1, y1));
the step reports them in ``StepResult.nfev`` and the loop counts them.

Derivatives (the checkpoint adjoint, forward mode) see each stage as the exact
solution of its equation: the iteration runs inside ``jax.lax.custom_root``,
whose derivative is the implicit function theorem's (one dense Jacobian and
solve of ``I - h gamma df/dy(Y_i)`` per stage), not the unrolled iterations.

The Jacobian, the LU and the Newton iteration act on the flattened state (a
pytree is raveled to one (n,) vector). A complex state needs a holomorphic f.

Dense output (order 4, :mod:`odekit.ode.methods.esdirk_tableaux`): a polynomial in
theta whose coefficients combine the stage values z_2..z_s (no evaluations).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from odekit._tree import tree_ravel
from odekit.ode.linalg import linear_system
from odekit.ode.linalg.lu import dot
from odekit.ode.methods.esdirk_tableaux import ESDIRKTableau
from odekit.ode.methods.rk_step import StepResult

Pytree = Any

MAX_NEWTON_ITERATIONS = 8
NEWTON_RTOL = 1e-10        # converged: remaining error <= this relative to |Y_i|
                           # (at least eps), plus eps^1.5 rms(Y_i) for zeros
ROUNDING_INCREMENT = 4.0   # converged: an increment within this many eps of |Y_i|
                           # (rounding; the contraction rate is noise there)
DIVERGENCE = 2.0           # contraction rate at which the iteration is abandoned


def _rms(v: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.mean(jnp.real(v * jnp.conj(v))))


def _newton(solve: Callable, y: jax.Array, rtol: float) -> Callable:
    """``newton(residual, z0) -> (z, ([ok, iterations, krylov], remaining))``:
    simplified Newton on ``residual(z) = 0`` with the fixed ``solve`` of ``I -
    h gamma J`` (``b -> (x, Krylov iterations)``); ``remaining`` is the (n,)
    estimate of ``|z - z*|`` (contraction based)."""
    eps = float(jnp.finfo(y.dtype).eps)

    def newton(residual: Callable, z0: jax.Array):
        rdtype = jnp.finfo(y.dtype).dtype
        # one weight for every iteration (from y0 and the guess): an iterate
        # that runs away cannot pass for converged by scaling its own norm
        size_of = jnp.maximum(jnp.abs(y), jnp.abs(y + z0))
        weight = rtol * size_of + eps**1.5 * _rms(size_of)
        weight = jnp.maximum(weight, jnp.finfo(rdtype).tiny).astype(y.dtype)
        # |dz| <= ROUNDING_INCREMENT eps |Y| in the units of ``weight``
        at_rounding = ROUNDING_INCREMENT * eps / rtol
        zero = jnp.zeros((), rdtype)
        init = (jnp.zeros((), jnp.int32), z0, zero, zero, jnp.bool_(False), jnp.bool_(False),
                jnp.zeros(z0.shape, rdtype), jnp.zeros((), jnp.int32))

        def cond(state):
            m, _, _, _, converged, failed, _, _ = state
            return (m < MAX_NEWTON_ITERATIONS) & ~converged & ~failed

        def body(state):
            m, z, previous, _, _, _, _, krylov = state
            dz, used = solve(-residual(z))
            z_new = z + dz
            size = _rms(dz / weight)
            theta = jnp.where(m == 0, 0.0, size / jnp.where(previous > 0, previous, 1.0))
            eta = jnp.where(m == 0, 1.0, theta / jnp.where(theta < 1, 1 - theta, 1.0))
            rounding = size <= at_rounding
            converged = (size == 0) | ((theta < 1) & (eta * size <= 1)) | rounding
            failed = ~converged & ((theta >= DIVERGENCE) | ~jnp.isfinite(size))
            # a diverging iterate is not kept (it stays finite for the derivative)
            z_next = jnp.where(failed, z, z_new)
            # at the rounding the iterate is as good as the state can hold: no
            # step size does better, so the error estimate gains nothing
            remaining = (jnp.where(rounding, 0.0, eta) * jnp.abs(dz)).astype(rdtype)
            return (m + 1, z_next, size.astype(rdtype), theta.astype(rdtype), converged, failed,
                    remaining, krylov + used)

        m, z, _, theta, converged, failed, remaining, krylov = lax.while_loop(cond, body, init)
        # Out of iterations but contracting: keep the iterate; its remaining
        # error joins the step's error estimate, which the tolerance judges.
        ok = converged | (~failed & (theta < 1))
        # a failed stage returns its starting guess: the step is rejected, and
        # the derivative of custom_root is taken at a benign point
        z = jnp.where(ok, z, z0)
        # auxiliary outputs as floats: custom_root gives integer and boolean
        # ones a tangent of their own dtype, which JVP tracing refuses (jax 0.10)
        counts = jnp.stack([ok.astype(rdtype), m.astype(rdtype), krylov.astype(rdtype)])
        return z, (counts, jnp.where(ok, remaining, 0.0))

    return newton


def _tangent_solve(system: Any, linear: Callable, b: jax.Array) -> jax.Array:
    """Solve ``linear(x) = b`` for the residual's linearisation at a stage
    (``I - h gamma df/dy(Y_i)``): its matrix by forward mode (colored on a
    sparsity pattern), then the system's LU.

    A rejected step's stage may sit anywhere (a failed iteration returns its
    starting guess): its derivative is discarded, but a zero cotangent through
    a singular or non-finite factorisation would still be nan, so such a
    solution is replaced by ``b``."""
    dtype = b.dtype
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        # no half-precision LU
        wide = lambda x: linear(x.astype(dtype)).astype(jnp.float32)
        return system.solve_linear_map(wide, b.astype(jnp.float32)).astype(dtype)
    return system.solve_linear_map(linear, b)


def esdirk_step(func: Callable, tableau: ESDIRKTableau, t0: jax.Array, y0: Pytree,
                f0: Pytree, h: jax.Array) -> StepResult:
    """Take one ESDIRK step of size ``h`` from ``(t0, y0)``.

    Args:
      func: vector field ``func(y, t)`` returning a pytree like ``y``.
      tableau: the method's coefficients.
      t0, h: scalar time and step size; y0: state pytree; f0: ``func(y0, t0)``.

    Returns:
      A :class:`~odekit.ode.methods.rk_step.StepResult` whose ``stages`` is ``(K, Z)``,
      the (s, n) matrices of the ``k_i = h f(Y_i)`` and ``z_i = Y_i - y0``
      (the dense output combines the latter), and whose ``nfev`` counts
      the evaluations of ``func`` the step made (one per Newton iteration,
      plus ``f1``); the Jacobian is one vectorised jvp of ``func``.
    """
    y, unravel_state = tree_ravel(y0)
    state_dtype = y.dtype
    # float32: eps, not 100 eps (1.2e-5), which exceeds solve_ivp's default
    # rtol: the remaining Newton error joins the error estimate, and kvaerno5
    # took 537 steps on y' = -y where rodas5p takes 39
    newton_rtol = max(NEWTON_RTOL, float(jnp.finfo(state_dtype).eps))
    # a float16 / bfloat16 leaf: 100 of its eps would be most of the value;
    # the iteration converges to the field's own rounding (its eps)
    eps = max((float(jnp.finfo(jnp.result_type(leaf)).eps) for leaf in jax.tree.leaves(y0)),
              default=0.0)
    if eps > float(jnp.finfo(jnp.float32).eps):
        newton_rtol = eps
    if jnp.issubdtype(state_dtype, jnp.floating) and jnp.finfo(state_dtype).bits < 32:
        # no LU kernel takes float16 / bfloat16: the step's linear algebra
        # runs in float32 (the field in the state's dtype), the state cast back.
        y = y.astype(jnp.float32)
    unravel = lambda v: unravel_state(v.astype(state_dtype))
    field = lambda v, t: tree_ravel(func(unravel(v), t))[0].astype(v.dtype)
    n, dtype = y.shape[0], y.dtype
    # J is an iteration matrix, not part of the method: no derivative through it.
    system = linear_system.of(func)
    jac = lax.stop_gradient(system.jacobian(func, field, lax.stop_gradient(y),
                                            lax.stop_gradient(t0)))
    h_y = h.astype(dtype)
    gamma = float(tableau.gamma)
    # I - h gamma J = h gamma (I / (h gamma) - J)
    h_gamma = lax.stop_gradient(h_y * gamma)
    solve_shifted = system.factor_counted(jac, 1 / h_gamma)

    def solve(b):
        x, iterations = solve_shifted(b)
        return x / h_gamma, iterations

    newton = _newton(solve, lax.stop_gradient(y), newton_rtol)
    a, predictor = jnp.asarray(tableau.a, dtype), jnp.asarray(tableau.predictor, dtype)
    c = jnp.asarray(tableau.c, h.dtype)

    def stage(i, carry):
        ks, zs, evaluations, ok, newton_error, krylov = carry
        base = dot(a[i], ks)             # row i of a has zeros from column i on
        t_i = t0 + c[i] * h
        residual = lambda z: z - base - (h_y * gamma) * field(y + z, t_i)
        guess = base + gamma * dot(predictor[i], ks)
        z, (counts, remaining) = lax.custom_root(residual, guess, newton,
                                                 partial(_tangent_solve, system), has_aux=True)
        converged, iterations = counts[0] > 0, counts[1].astype(jnp.int32)
        ks = ks.at[i].set((z - base) / gamma)
        return (ks, zs.at[i].set(z), evaluations + iterations, ok & converged,
                jnp.maximum(newton_error, remaining), krylov + counts[2].astype(jnp.int32))

    s = tableau.num_stages
    ks = jnp.zeros((s, n), dtype).at[0].set(h_y * tree_ravel(f0)[0].astype(dtype))
    rdtype = jnp.finfo(dtype).dtype
    ks, zs, evaluations, ok, newton_error, krylov = lax.fori_loop(
        1, s, stage, (ks, jnp.zeros((s, n), dtype), jnp.zeros((), jnp.int32), jnp.bool_(True),
                      jnp.zeros((n,), rdtype), jnp.zeros((), jnp.int32)))
    y1 = unravel(jnp.where(ok, y + zs[s - 1], y))
    # |err| grows by the largest remaining Newton error of a stage
    embedded = zs[s - 1] - zs[s - 2]
    size = jnp.abs(embedded)
    phase = embedded / jnp.where(size > 0, size, 1.0).astype(dtype)
    phase = jnp.where(size > 0, phase, jnp.ones_like(phase))
    error = unravel(jnp.where(ok, embedded + newton_error.astype(dtype) * phase, jnp.inf))
    # one solve with I - h gamma J per Newton iteration, one evaluation each
    return StepResult(y1, func(y1, t0 + h), error, None, (ks, zs), evaluations + 1,
                      evaluations, krylov)


def dense_prepare(tableau: ESDIRKTableau, y0: Pytree, step: StepResult) -> tuple:
    """``(y0, p)``, the data of the step's dense output: ``p`` the pytrees
    ``p_r = sum_i dense[r, i] z_i`` (no evaluations)."""
    flat, unravel_state = tree_ravel(y0)
    unravel = lambda v: unravel_state(v.astype(flat.dtype))
    _, zs = step.stages
    ps = tuple(unravel(p) for p in dot(jnp.asarray(tableau.dense, zs.dtype), zs))
    return y0, ps


def dense_eval(dense_step: tuple, theta: jax.Array) -> Pytree:
    """``y(t0 + theta h) = y0 + sum_r theta^(r+1) p_r`` for a (m,) ``theta``:
    leaves gain a leading (m,) axis."""
    y0, ps = dense_step

    def leaf(a, *p_leaves):
        th = theta.astype(a.dtype).reshape(theta.shape + (1,) * a.ndim)
        poly = p_leaves[-1][None]
        for p in p_leaves[-2::-1]:
            poly = p[None] + th * poly
        return a[None] + th * poly

    return jax.tree.map(leaf, y0, *ps)
