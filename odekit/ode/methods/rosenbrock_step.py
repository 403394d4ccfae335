"""One step of a Rosenbrock method, with its dense output.

For a tableau (a, coupling, c, d, gamma, b, b_error) with s stages
(:mod:`odekit.ode.methods.rosenbrock_tableaux`), a step of size h from (t0, y0):

    J = df/dy(t0, y0),  f_t = df/dt(t0, y0)          (one jax.jvp over n + 1 directions,
                                                     colors + 1 with a sparsity pattern,
                                                     or the user's jac and one jvp)
    W = I / (h gamma) - J                            (one LU)
    W u_i = f(t0 + c_i h, y0 + sum_{j<i} a_ij u_j) + sum_{j<i} (coupling_ij / h) u_j + h d_i f_t
    y1 = y0 + sum_i b_i u_i,    err = sum_i b_error_i u_i

(J and f_t, the factorisation of W and its solves from the field's linear
system, :mod:`odekit.ode.linalg.linear_system`: dense by default, or J's
nonzeros on a sparsity pattern and a banded or block-diagonal LU.) No Newton iteration: the
method is linearly implicit, and the exact J is part of the method (its
order conditions assume it). The Jacobian and the LU
act on the flattened state: a pytree y is raveled to one (n,) vector for the
step and unraveled at its end. The stages are the rows of an (s, n) matrix U
(row i is zero until stage i is solved), so a stage is ``y0 + a[i] @ U`` and
the loop over stages is unrolled at trace time, except inside the one CPU
kernel (:func:`odekit._kernel_scope.inside`), where a rolled
loop costs no dispatch and compiles in less time (issue 32's first calls:
rodas5p's checkpoint gradient of Robertson compiled in 1.1 s instead of
2.7 s, and 10 Robertson groups solved in 0.6x the time;
``benchmarks/results/stiff_first_call_notes.md``), and with an iterative
linear solver (``linear_solver="krylov"``: each solve is GMRES's nested loops,
whose program the unrolled stages would copy 8 times). A complex state needs a
holomorphic f (J is the complex derivative).

A singular W (1 / (h gamma) at an eigenvalue of J) gives non-finite stages;
the loop then rejects the step and shrinks h.

With a constant mass matrix M (``M y' = f(t, y)``, possibly singular: an
index-1 DAE; the linear system carries M, :mod:`odekit.ode.linalg.mass_matrix`)
the step is Hairer & Wanner's Rosenbrock method for linearly implicit systems
(Solving ODEs II, Sec. VI.4, eq. (4.21) in the transformed variables): W becomes
``M / (h gamma) - J`` and the coupling term stands for ``h y'``, so it is
multiplied by M:

    W u_i = f(t0 + c_i h, Y_i) + M sum_{j<i} (coupling_ij / h) u_j + h d_i f_t

The error estimate ``sum_i b_error_i u_i`` is used for every component,
algebraic ones included, with the same weights: for index-1 problems the
embedded solution of a stiffly accurate pair such as Rodas's is a valid
estimate for the algebraic components too (Hairer & Wanner, Sec. VI.4;
their code RODAS and Steinebach's Rodas5P, built for index-1 DAEs, control
all components alike; so does DASSL for index 1, Brenan, Campbell & Petzold,
Sec. 5.2).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from odekit import _kernel_scope as kernel_scope
from odekit._tree import tree_ravel
from odekit.ode.linalg import linear_system
from odekit.ode.linalg.lu import dot
from odekit.ode.methods.rk_step import StepResult
from odekit.ode.methods.rosenbrock_tableaux import RosenbrockTableau

Pytree = Any


def rosenbrock_step(func: Callable, tableau: RosenbrockTableau, t0: jax.Array, y0: Pytree,
                    f0: Pytree, h: jax.Array) -> StepResult:
    """Take one Rosenbrock step of size ``h`` from ``(t0, y0)``.

    Args:
      func: vector field ``func(y, t)`` returning a pytree like ``y``.
      tableau: the method's coefficients.
      t0, h: scalar time and step size; y0: state pytree; f0: ``func(y0, t0)``.

    Returns:
      A :class:`~odekit.ode.methods.rk_step.StepResult` whose ``stages`` is ``(U,)``,
      the (s, n) matrix of the ``u_i`` (the dense output combines them);
      ``f1`` costs one evaluation, the Jacobian one vectorised jvp of ``func``.
    """
    y, unravel_state = tree_ravel(y0)
    state_dtype = y.dtype
    if jnp.issubdtype(state_dtype, jnp.floating) and jnp.finfo(state_dtype).bits < 32:
        # float16 / bfloat16: no LU kernel takes them, and the tableau's large
        # coefficients (coupling / h) overflow or lose the stages there: the
        # step's linear algebra runs in float32, the state is cast back.
        y = y.astype(jnp.float32)
    unravel = lambda v: unravel_state(v.astype(state_dtype))
    field = lambda v, t: tree_ravel(func(unravel(v), t))[0].astype(v.dtype)
    system = linear_system.of(func)
    jac, f_t = system.jacobian_with_time_derivative(func, field, y, t0)
    n, dtype = y.shape[0], y.dtype
    # h = 0 (an idle iteration of the checkpointed loop) makes no stage that
    # is kept; 1 / h there was inf, and a third derivative's 0 * inf NaN.
    h_nonzero = jnp.where(h == 0, jnp.ones_like(h), h)
    inv_hg = (1.0 / (h_nonzero * tableau.gamma)).astype(dtype)
    solve = system.factor_counted(jac, inv_hg)
    a, coupling = jnp.asarray(tableau.a, dtype), jnp.asarray(tableau.coupling, dtype)
    c, d = jnp.asarray(tableau.c, h.dtype), jnp.asarray(tableau.d, h.dtype)
    inv_h, h_y = (1.0 / h_nonzero).astype(dtype), h.astype(dtype)

    def solve_stage(i, f_i, carry):
        stages, krylov = carry
        coupled = system.mass_times(inv_h * dot(coupling[i], stages))
        rhs = f_i + coupled + (h_y * d[i].astype(dtype)) * f_t
        u, iterations = solve(rhs)
        return stages.at[i].set(u), krylov + iterations

    def stage(i, carry):
        return solve_stage(i, field(y + dot(a[i], carry[0]), t0 + c[i] * h), carry)

    carry = solve_stage(0, tree_ravel(f0)[0].astype(dtype),
                        (jnp.zeros((tableau.num_stages, n), dtype), jnp.zeros((), jnp.int32)))
    rolled = kernel_scope.inside() or system.iterative
    stages, krylov = lax.fori_loop(1, tableau.num_stages, stage, carry, unroll=not rolled)
    b, b_error = jnp.asarray(tableau.b, dtype), jnp.asarray(tableau.b_error, dtype)
    y1 = unravel(y + dot(b, stages))
    error = unravel(dot(b_error, stages))
    # (the Krylov count only where solves iterate: an LU's zeros add nothing)
    niter = krylov if system.iterative else None
    return StepResult(y1, func(y1, t0 + h), error, None, (stages,), niter=niter)


def dense_prepare(tableau: RosenbrockTableau, y0: Pytree, step: StepResult) -> tuple:
    """``(y0, y1, k)``, the data of the step's dense output: ``k`` the pytrees
    ``k_r = sum_j dense[r, j] u_j`` (no evaluations)."""
    flat, unravel_state = tree_ravel(y0)
    unravel = lambda v: unravel_state(v.astype(flat.dtype))
    stages, = step.stages
    ks = tuple(unravel(k) for k in dot(jnp.asarray(tableau.dense, stages.dtype), stages))
    return y0, step.y1, ks


def dense_eval(dense_step: tuple, theta: jax.Array) -> Pytree:
    """``y(t0 + theta h) = (1 - theta) y0 + theta (y1 + (1 - theta) sum_r theta^r k_r)``
    for a (m,) ``theta``: leaves gain a leading (m,) axis."""
    y0, y1, ks = dense_step

    def leaf(a, b, *k_leaves):
        th = theta.astype(a.dtype).reshape(theta.shape + (1,) * a.ndim)
        poly = k_leaves[-1][None]
        for k in k_leaves[-2::-1]:
            poly = k[None] + th * poly
        return (1 - th) * a[None] + th * (b[None] + (1 - th) * poly)

    return jax.tree.map(leaf, y0, y1, *ks)
