"""``odekit.odeint``: drop-in replacement for ``jax.experimental.ode.odeint``."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from odekit.custom.closure import closure_convert
from odekit.ode import adjoint_backsolve, errors, single_kernel
from odekit.ode.methods import get_tableau
from odekit.ode.options import SolverOptions

Pytree = Any

ADJOINTS = {"backsolve": adjoint_backsolve.solve}


def _static_float(value: Any, name: str, allow_inf: bool = False) -> float:
    """A non-negative Python float from a concrete number, with a clear error."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"odeint: {name} must be a concrete number (it is a static option), "
                        f"not a traced value; pass a Python float.")
    try:
        number = float(np.asarray(value).reshape(()))
    except (TypeError, ValueError):
        raise TypeError(f"odeint: {name} must be a number, got {value!r}.") from None
    if np.isnan(number) or number < 0 or (np.isinf(number) and not allow_inf):
        raise ValueError(f"odeint: {name} must be a non-negative finite number"
                         f"{' or inf' if allow_inf else ''}, got {value!r}.")
    return number


def _check_args(args: tuple) -> None:
    for leaf in jax.tree.leaves(args):
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
            if jnp.issubdtype(jnp.result_type(leaf), jnp.number) or jnp.result_type(leaf) == bool:
                continue
        raise TypeError(
            f"odeint: the contents of *args must be arrays or numbers, got {type(leaf).__name__} "
            f"{leaf!r}. Close over non-array values in func instead of passing them.")


def _prepare_y0(y0: Pytree) -> Pytree:
    leaves, treedef = jax.tree.flatten(y0)
    if not leaves:
        raise ValueError("odeint: y0 has no array leaves; pass an array or a pytree of arrays.")
    out = []
    for leaf in leaves:
        try:
            arr = jnp.asarray(leaf)
        except TypeError:
            raise TypeError(f"odeint: y0 leaves must be arrays or numbers, got {leaf!r}.") from None
        if not jnp.issubdtype(arr.dtype, jnp.inexact):
            arr = arr.astype(jnp.result_type(float))
        out.append(arr)
    return jax.tree.unflatten(treedef, out)


def _check_times(t: Any) -> jax.Array:
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        raise TypeError(f"odeint: t must be an array of floats, got dtype {t.dtype}; "
                        f"use e.g. jnp.linspace(0., 10., 101) or jnp.asarray(t, float).")
    if t.ndim != 1 or t.shape[0] < 1:
        raise ValueError(f"odeint: t must be a 1-D array of at least one time, got shape {t.shape}.")
    if not isinstance(t, jax.core.Tracer):
        diffs = np.diff(np.asarray(t))
        if np.any(~(diffs > 0)):
            bad = int(np.argmax(~(diffs > 0)))
            raise ValueError(f"odeint: t must be strictly increasing, but t[{bad}]={float(t[bad])} "
                             f"is followed by t[{bad + 1}]={float(t[bad + 1])}.")
    return t


def _check_output(func: Callable, y0: Pytree, t0: jax.Array, args: tuple) -> None:
    out = jax.eval_shape(func, y0, t0, *args)
    y_struct, out_struct = jax.tree.structure(y0), jax.tree.structure(out)
    if y_struct != out_struct:
        raise TypeError(f"odeint: func must return a pytree with the structure of y0, "
                        f"{y_struct}, but it returned {out_struct}.")
    for y_leaf, o_leaf in zip(jax.tree.leaves(y0), jax.tree.leaves(out)):
        if y_leaf.shape != o_leaf.shape:
            raise ValueError(f"odeint: func returned a leaf of shape {o_leaf.shape} where y0 has "
                             f"shape {y_leaf.shape}; dy/dt must have the shape of y.")
        if jnp.issubdtype(o_leaf.dtype, jnp.complexfloating) and not jnp.iscomplexobj(y_leaf):
            raise TypeError("odeint: func returned complex values for a real y0 leaf; "
                            "make y0 complex (e.g. y0.astype(complex)).")


def odeint(func: Callable, y0: Pytree, t: jax.Array, *args: Any, rtol: float = 1.4e-8,
           atol: float = 1.4e-8, mxstep: float = jnp.inf, hmax: float = jnp.inf,
           method: str = "dopri5", adjoint: str = "backsolve") -> Pytree:
    """Adaptive Runge-Kutta solution of ``dy/dt = func(y, t, *args)`` at times ``t``.

    Same signature and defaults as ``jax.experimental.ode.odeint``; gradients
    with respect to ``y0``, ``t``, ``*args`` and values closed over by ``func``
    come from the continuous adjoint (see :mod:`odekit.ode.adjoint_backsolve`).

    Args:
      func: ``func(y, t, *args)`` returning dy/dt with the structure of ``y``.
      y0: initial state at ``t[0]``: an array or any pytree (nested lists too)
        of real or complex arrays.
      t: (n,) strictly increasing float times; ``t[0]`` is the initial time.
      *args: arrays (or pytrees of arrays) passed to ``func``.
      rtol, atol: relative and absolute local error tolerances (>= 0).
      mxstep: attempted steps allowed between consecutive output times.
      hmax: largest step size.
      method: "bosh3", "dopri5" (default), "tsit5" or "dopri8".
      adjoint: gradient method; "backsolve" (continuous adjoint, O(1) memory).

    Returns:
      The solution at every ``t``: the structure of ``y0`` with a leading axis
      of length ``len(t)``.

    Raises:
      ODESolverError: when the solver stops early (mxstep reached, step size
        underflow, non-finite state), also under jit and vmap.
      TypeError, ValueError: for invalid arguments (at trace time).
    """
    get_tableau(method)
    if adjoint not in ADJOINTS:
        raise ValueError(f"odeint: unknown adjoint {adjoint!r}; choose one of {sorted(ADJOINTS)}.")
    options = SolverOptions(
        method=method, rtol=_static_float(rtol, "rtol"), atol=_static_float(atol, "atol"),
        mxstep=_static_float(mxstep, "mxstep", allow_inf=True),
        hmax=_static_float(hmax, "hmax", allow_inf=True),
        single_kernel=single_kernel.switched_on())
    if options.rtol == 0 and options.atol == 0:
        raise ValueError("odeint: rtol and atol cannot both be zero.")
    if options.mxstep < 1 or options.hmax == 0:
        raise ValueError(f"odeint: mxstep must be >= 1 and hmax > 0, got mxstep={mxstep}, hmax={hmax}.")
    _check_args(args)
    y0 = _prepare_y0(y0)
    t = _check_times(t)
    _check_output(func, y0, t[0], args)
    converted, consts = closure_convert(func, y0, t[0], *args)
    ys, info = _odeint_compiled(converted, options, adjoint, y0, t, *args, *consts)
    return errors.raise_if_failed(info, ys, f"odekit.odeint ({method})")


@partial(jax.jit, static_argnums=(0, 1, 2))
def _odeint_compiled(func: Callable, options: SolverOptions, adjoint: str, y0: Pytree,
                     t: jax.Array, *args: Any) -> tuple[Pytree, errors.SolveInfo]:
    h0 = jnp.zeros((), t.dtype)
    ys, _, info = ADJOINTS[adjoint](func, options, y0, t, h0, *args)
    return ys, info
