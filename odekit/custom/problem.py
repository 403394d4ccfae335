"""The front door shared by :func:`odekit.root` and :func:`odekit.fixed_point`.

It checks the arguments at trace time, closure-converts the user's ``f`` (so
values it closes over become explicit parameters with gradients), runs the
method's loop inside the one implicit-gradient rule of
:mod:`odekit.custom.implicit`, and raises for a failed solve when asked to.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from odekit._tree import tree_sub, widest_dtype
from odekit.custom import iteration
from odekit.custom.closure import closure_convert
from odekit.custom.implicit import implicit_solve
from odekit.custom.linear_solve import LINEAR_SOLVERS
from odekit.custom.result import Result, default_tolerances, raise_if_failed

PyTree = Any


def pick_method(solver: str, methods: Mapping[str, iteration.Method], name: Any) -> iteration.Method:
    """The method called ``name``, or ``ValueError`` listing the valid names."""
    if not isinstance(name, str) or name not in methods:
        raise ValueError(f"odekit.{solver}: unknown method {name!r}; "
                         f"choose one of {sorted(methods)}.")
    return methods[name]


def _is_real_scalar(value: Any) -> bool:
    """True for a concrete real number: a Python, NumPy or 0-d array scalar."""
    try:
        dtype = np.asarray(value).dtype
    except TypeError:
        return False
    return np.ndim(value) == 0 and np.issubdtype(dtype, np.number) and not np.iscomplexobj(value)


_ARRAY_LEAVES = (jax.Array, np.ndarray, np.generic, int, float, complex)


def _check_static(solver: str, rtol: Any, atol: Any, max_steps: Any, throw: Any,
                  linear_solver: Any) -> None:
    for label, tol in (("rtol", rtol), ("atol", atol)):
        if tol is not None and (isinstance(tol, (bool, jax.core.Tracer))
                                or not _is_real_scalar(tol) or not np.isfinite(tol) or tol < 0):
            raise ValueError(f"odekit.{solver}: {label} must be None or a non-negative finite "
                             f"Python float, got {tol!r}.")
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"odekit.{solver}: max_steps must be a positive int, got {max_steps!r}.")
    if not isinstance(throw, bool):
        raise TypeError(f"odekit.{solver}: throw must be True or False, got {throw!r}.")
    if linear_solver not in LINEAR_SOLVERS:
        raise ValueError(f"odekit.{solver}: linear_solver must be one of {LINEAR_SOLVERS}, "
                         f"got {linear_solver!r}.")


def check_floating(solver: str, name: str, tree: PyTree) -> PyTree:
    """``tree`` as real floating JAX arrays, or ``TypeError`` saying what to change.

    Integer and boolean leaves become the default float dtype (float64 with
    ``jax_enable_x64``, else float32), as SciPy and ``odekit.odeint`` treat
    an integer start; complex and non-numeric leaves are errors.
    """
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError(f"odekit.{solver}: {name} has no array leaves.")
    for leaf in leaves:
        if not isinstance(leaf, _ARRAY_LEAVES):
            raise TypeError(f"odekit.{solver}: {name} must be a pytree of real floating arrays, "
                            f"got a leaf of type {type(leaf).__name__}.")
        dtype = jnp.result_type(leaf)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(f"odekit.{solver}: {name} must be real floating point, got a leaf of "
                            f"dtype {dtype}; split a complex unknown into real and imaginary "
                            f"parts.")

    def as_float(leaf: Any) -> jax.Array:
        dtype = jnp.result_type(leaf)
        return jnp.asarray(leaf, dtype=dtype if jnp.issubdtype(dtype, jnp.floating)
                           else jnp.result_type(float))

    return jax.tree.map(as_float, tree)


def tolerances(x: PyTree, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """``(rtol, atol)``: the given values, or where None the default
    (``eps**0.75``) of the least precise dtype among the leaves of ``x``.

    With float32 and float64 leaves together the float64 unknowns are only
    as accurate as the float32 residuals they are coupled to, so a float64
    tolerance could never be reached.
    """
    coarsest = max((leaf.dtype for leaf in jax.tree.leaves(x)),
                   key=lambda dtype: float(jnp.finfo(dtype).eps))
    default_rtol, default_atol = default_tolerances(coarsest)
    return (default_rtol if rtol is None else float(rtol),
            default_atol if atol is None else float(atol))


def _check_args(solver: str, args: Sequence[Any]) -> tuple:
    for i, leaf in enumerate(jax.tree.leaves(args)):
        if not isinstance(leaf, _ARRAY_LEAVES):
            raise TypeError(f"odekit.{solver}: *args must be arrays or pytrees of arrays (got "
                            f"{type(leaf).__name__} in leaf {i}); close over other values in f "
                            "instead, e.g. f = lambda x, a: g(x, a, option).")
    return tuple(jax.tree.map(jnp.asarray, tuple(args)))


def _convert(solver: str, f: Callable, x: PyTree, args: tuple) -> tuple[Callable, list]:
    """Check ``f(x, *args)`` is shaped like ``x``, then closure-convert it."""
    if not callable(f):
        raise TypeError(f"odekit.{solver}: f must be callable, got {type(f).__name__}.")
    out = jax.eval_shape(f, x, *args)
    want = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), x)
    if jax.tree.structure(out) != jax.tree.structure(want) or any(
            (o.shape, o.dtype) != (w.shape, w.dtype)
            for o, w in zip(jax.tree.leaves(out), jax.tree.leaves(want))):
        raise ValueError(f"odekit.{solver}: f(x, *args) must return a pytree with the structure, "
                         f"shapes and dtypes of x; got {out} for x like {want}. Cast inside f or "
                         "pass x0 and args in one precision.")
    return closure_convert(f, x, *args)


def solve(solver: str, method: iteration.Method, f: Callable, x0: PyTree, x_like: PyTree,
          args: Sequence[Any], fixed_point: bool, rtol: float | None, atol: float | None,
          max_steps: int, throw: bool, options: Mapping[str, Any] | None,
          linear_solver: str) -> Result:
    """Solve ``f(x, *args) = x`` (``fixed_point``) or ``f(x, *args) = 0``.

    Args:
      solver: ``"root"`` or ``"fixed_point"``, for messages.
      method: the method record.
      f: the user's function.
      x0: the method's starting value (a bracket for bisection).
      x_like: a pytree shaped like the solution.
      args: extra positional arrays of ``f``; they receive gradients.
      fixed_point: which equation ``f`` defines.
      rtol, atol, max_steps, throw, options, linear_solver: as in the
        public front ends.

    Returns:
      The :class:`~odekit.custom.result.Result`.
    """
    _check_static(solver, rtol, atol, max_steps, throw, linear_solver)
    dtype = widest_dtype(x_like)
    options = method.check(options, dtype)
    args = _check_args(solver, args)
    fn, consts = _convert(solver, f, x_like, args)
    rtol, atol = tolerances(x_like, rtol, atol)

    def g(x, params):
        return fn(x, *params[0], *params[1])

    def residual(x, params):
        return tree_sub(g(x, params), x) if fixed_point else g(x, params)

    def run(start, params):
        return iteration.run(method, lambda x: g(x, params), start, rtol, atol, max_steps, options)

    x, success, stats = implicit_solve(run, residual, linear_solver, x0, (args, tuple(consts)))
    result = Result(x, success, stats.num_steps, stats.error, stats.status)
    label = "max|f(x) - x|" if fixed_point else "max|f(x)|"
    return raise_if_failed(result, solver, method.name, label, throw)
