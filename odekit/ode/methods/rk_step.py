"""One generic explicit Runge-Kutta step over a Butcher tableau.

For a tableau (c, a, b, b_error) with s stages and a step of size h from
(t0, y0) with k_1 = f(t0, y0) given (FSAL),

    k_i = f(t0 + c_i h, y0 + h sum_{j<i} a_ij k_j),   i = 2..s
    y1  = y0 + h sum_i b_i k_i
    err = h sum_i b_error_i k_i      (local error estimate, b - b_hat)

The state is any pytree; every linear combination is unrolled at trace time
over the non-zero coefficients only, so no coefficient lives in this code and
no (s, n) stage matrix is built. The same code serves every explicit method.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import _lax as ops
from odekit.ode.methods.explicit_tableaux import ButcherTableau

Pytree = Any


class StepResult(NamedTuple):
    """Outcome of one attempted step (before acceptance is decided)."""

    y1: Pytree                # solution at t0 + h
    f1: Pytree                # f(t0 + h, y1): the first stage of the next step
    error: Pytree             # local error estimate, same structure as y
    error_secondary: Pytree   # second error estimate (dopri8) or None
    stages: tuple             # (k_1, ..., k_s), each a pytree like y
    nfev: Any = None          # evaluations this step made (int32), or None: the
                              # method's evaluations_per_step (a fixed count)
    nsolve: Any = None        # solves with the iteration matrix W this step made
                              # (int32), or None: the method's solves_per_step
    niter: Any = None         # Krylov (GMRES) iterations of those solves (int32),
                              # or None: none (solves by a factorisation)


class Tolerances(NamedTuple):
    """The tolerances as a method with its own state and step-size rules
    sees them (``Method.init_state``; the loop builds it).

    Attributes:
      norm: ``norm(error, y0, y1)``: the RMS over every element of ``error /
        (atol + rtol max(|y0|, |y1|))`` (pytrees like the state), the
        loop's own error norm.
      rtol: the tightest relative tolerance, a Python float (for rules of
        thumb such as a Newton tolerance).
    """

    norm: Callable
    rtol: float


def combine(y0: Pytree, h: jax.Array, weights: np.ndarray, stages: tuple) -> Pytree:
    """Return y0 + h * sum_j weights[j] * stages[j] leaf by leaf (y0 None: 0).

    Zero weights are skipped at trace time. ``h`` is cast to each leaf's real
    dtype so that float32 states stay float32 under float64 time. A float16
    or bfloat16 leaf is combined in float32 and rounded once at the end:
    the tableaux' coefficients (tsit5's up to ~20, of both signs) cancel,
    and summed in half precision the rounding of every term stayed in the
    result (tsit5 on y' = -y: 2.9% off in float16, 22% in bfloat16, with
    success; rounded once, a few eps of the dtype).
    """
    terms = [(float(w), k) for w, k in zip(weights, stages) if w != 0.0]

    def leaf_combine(y_leaf, *k_leaves):
        dtype = k_leaves[0].dtype if k_leaves else None
        half = dtype is not None and _is_half(dtype)
        widen = (lambda v: lax.convert_element_type(v, np.float32)) if half else (lambda v: v)
        acc = None
        for (w, _), k in zip(terms, k_leaves):
            k = widen(k)
            term = lax.mul(ops.cast(w, k), k)
            acc = term if acc is None else lax.add(acc, term)
        if acc is None:
            return jnp.zeros_like(y_leaf) if y_leaf is not None else None
        scaled = lax.mul(ops.cast(h, acc), acc)
        out = scaled if y_leaf is None else lax.add(widen(y_leaf), scaled)
        return lax.convert_element_type(out, dtype) if half else out

    if y0 is None:
        return jax.tree.map(lambda *ks: leaf_combine(None, *ks), *[k for _, k in terms])
    return jax.tree.map(leaf_combine, y0, *[k for _, k in terms])


def _is_half(dtype: Any) -> bool:
    """A floating dtype narrower than float32 (float16, bfloat16)."""
    return bool(jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32)


def rk_step(func: Callable, tableau: ButcherTableau, t0: jax.Array, y0: Pytree,
            f0: Pytree, h: jax.Array) -> StepResult:
    """Take one explicit RK step of size ``h`` from ``(t0, y0)``.

    Args:
      func: vector field ``func(y, t) -> dy/dt`` with the structure of ``y``.
      tableau: the method's coefficients.
      t0: scalar time; h: scalar step size (same dtype as t0).
      y0: state pytree; f0: ``func(y0, t0)``.

    Returns:
      A :class:`StepResult`; ``f1`` costs no extra evaluation for FSAL tableaux.
    """
    stages = [f0]
    num_stages = len(tableau.c)
    y1 = None
    for i in range(1, num_stages):
        y_i = combine(y0, h, tableau.a[i, :i], tuple(stages))
        if tableau.fsal and i == num_stages - 1:
            y1 = y_i
        stages.append(func(y_i, lax.add(t0, lax.mul(ops.cast(float(tableau.c[i]), h), h))))
    stages = tuple(stages)
    if tableau.fsal:
        f1 = stages[-1]
    else:
        y1 = combine(y0, h, tableau.b, stages)
        f1 = func(y1, lax.add(t0, h))
    error = combine(None, h, tableau.b_error, stages)
    error_secondary = None
    if tableau.b_error_secondary is not None:
        error_secondary = combine(None, h, tableau.b_error_secondary, stages)
    return StepResult(y1, f1, error, error_secondary, stages)


def num_evaluations(tableau: ButcherTableau) -> int:
    """Function evaluations one attempted step costs (FSAL reuses the last)."""
    return len(tableau.c) - 1 if tableau.fsal else len(tableau.c)
