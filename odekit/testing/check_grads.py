"""Finite-difference validation of JAX derivatives.

Every gradient test in odekit goes through :func:`check_grads`. For each
inexact argument leaf ``x_i`` it draws a random unit direction ``v_i`` and
compares

* forward mode: ``jvp(f, x, v_i)`` with the central difference
  ``(f(x + eps v_i) - f(x - eps v_i)) / (2 eps)``;
* reverse mode (dot-product test): ``<u, D_i>`` with ``<vjp_i(u), v_i>``,
  where ``u`` is a random output cotangent, ``D_i`` the central difference
  above and ``<a, b> = Re(sum(conj(a) b))`` the real inner product.

The finite differences are evaluated in float64 (float32 leaves are cast up),
with ``eps = cbrt(float64 eps) * max(1, |x_i|)``, which balances the O(eps^2)
truncation error against the O(macheps / eps) rounding error. ``order=2``
repeats the check on the derivative maps themselves (grad of grad).

On a miss it raises ``AssertionError`` with a table of the per-argument
errors so that the failing argument is obvious.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_grads", "default_tolerance"]

# Default (rtol, atol) by the dtype the derivative is computed in.
_TOLERANCE = {
    np.dtype("float64"): (1e-6, 1e-9),
    np.dtype("complex128"): (1e-6, 1e-9),
    np.dtype("float32"): (2e-3, 1e-4),
    np.dtype("complex64"): (2e-3, 1e-4),
    np.dtype("float16"): (5e-2, 1e-2),
    np.dtype("bfloat16"): (5e-2, 1e-2),
}


def default_tolerance(dtype: Any) -> tuple[float, float]:
    """The default ``(rtol, atol)`` used for derivatives computed in ``dtype``."""
    return _TOLERANCE.get(np.dtype(dtype), (1e-6, 1e-9))


def _is_inexact(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _inner(a: Any, b: Any) -> float:
    """Real inner product Re(sum(conj(a) * b)) of two pytrees, in float64."""
    total = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if not (_is_inexact(x) and _is_inexact(y)):
            continue
        x = np.asarray(x, dtype=np.complex128)
        y = np.asarray(y, dtype=np.complex128)
        total += float(np.real(np.vdot(x, y)))
    return total


def _random_like(rng: np.random.Generator, x: Any, unit: bool) -> np.ndarray:
    if not _is_inexact(x):
        return np.zeros(np.shape(x), dtype=jax.dtypes.float0)
    x = np.asarray(x)
    v = rng.standard_normal(x.shape)
    if np.iscomplexobj(x):
        v = v + 1j * rng.standard_normal(x.shape)
    if unit:
        norm = np.sqrt(np.sum(np.abs(v) ** 2))
        v = v / norm if norm > 0 else v
    return v.astype(x.dtype)


def _to_float64(x: Any) -> Any:
    x = np.asarray(x)
    if np.iscomplexobj(x):
        return x.astype(np.complex128)
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float64)
    return x


def _central_difference(f: Callable, args: list, index: int, v: np.ndarray) -> Any:
    """(f(x + eps v) - f(x - eps v)) / (2 eps) along argument leaf ``index``."""
    leaves, treedef = jax.tree.flatten(args)
    x = _to_float64(leaves[index])
    eps = np.cbrt(np.finfo(np.float64).eps) * max(1.0, float(np.max(np.abs(x), initial=0.0)))
    v64 = _to_float64(v)

    def at(x_i):
        new = list(leaves)
        new[index] = x_i
        up = [jnp.asarray(_to_float64(leaf)) if _is_inexact(leaf) else leaf for leaf in new]
        return f(*jax.tree.unflatten(treedef, up))

    plus, minus = at(x + eps * v64), at(x - eps * v64)
    return jax.tree.map(lambda p, m: (np.asarray(p) - np.asarray(m)) / (2 * eps) if _is_inexact(p)
                        else np.zeros(np.shape(p), dtype=jax.dtypes.float0), plus, minus)


def _check_order1(f, args, modes, rtol, atol, rng, label) -> list[tuple]:
    """One row (label, mode, argument, ad, fd, error, allowed) per check.

    One ``jax.vjp`` over all arguments serves every leaf, and ``jax.jvp`` is
    always called with a full set of tangents (zeros but for one leaf), so a
    jitted ``f`` is differentiated and compiled once, not once per leaf.
    """
    leaves, treedef = jax.tree.flatten(list(args))
    rows = []
    out = f(*args)
    u = jax.tree.map(lambda o: _random_like(rng, o, unit=False), out)
    inexact = [i for i, leaf in enumerate(leaves) if _is_inexact(leaf) and np.size(leaf) > 0]
    directions = {i: _random_like(rng, leaves[i], unit=True) for i in inexact}
    primals = [jnp.asarray(leaf) for leaf in leaves]

    def f_flat(*flat):
        return f(*jax.tree.unflatten(treedef, list(flat)))

    cotangents = None
    if "rev" in modes:
        diff = [jnp.asarray(leaves[i]) for i in inexact]

        def f_inexact(*xs):
            new = list(primals)
            for i, x in zip(inexact, xs):
                new[i] = x
            return f_flat(*new)

        _, pullback = jax.vjp(f_inexact, *diff)
        u_conj = jax.tree.map(lambda a, o: np.conj(a).astype(jnp.result_type(o)) if _is_inexact(o)
                              else a, u, out)
        cotangents = dict(zip(inexact, pullback(u_conj)))
    for mode in modes:
        if mode not in ("fwd", "rev"):
            raise ValueError(f"check_grads: unknown mode {mode!r}; use 'fwd' and/or 'rev'.")
    for i in inexact:
        v = directions[i]
        fd = _central_difference(f, list(args), i, v)
        fd_norm = np.sqrt(_inner(fd, fd))
        for mode in modes:
            if mode == "fwd":
                tangents = [jnp.zeros_like(p) if _is_inexact(p) else
                            np.zeros(np.shape(p), dtype=jax.dtypes.float0) for p in primals]
                tangents[i] = jnp.asarray(v)
                _, tangent = jax.jvp(f_flat, primals, tangents)
                ad_val = np.sqrt(_inner(tangent, tangent))
                diff_tree = jax.tree.map(
                    lambda a, b: np.asarray(a) - np.asarray(b) if _is_inexact(a) else np.zeros(()),
                    tangent, fd)
                err = np.sqrt(_inner(diff_tree, diff_tree))
                ref = max(ad_val, fd_norm)
                fd_val = fd_norm
            else:
                ad_val = _inner(np.conj(np.asarray(cotangents[i])), v)
                fd_val = _inner(u, fd)
                err = abs(ad_val - fd_val)
                ref = max(abs(ad_val), abs(fd_val))
            allowed = atol + rtol * ref
            rows.append((label, mode, f"arg leaf {i} {np.shape(leaves[i])}", ad_val, fd_val, err,
                         allowed))
    return rows


def _derivative_maps(f, args, modes, rng) -> list[tuple[str, Callable]]:
    """Functions x -> (J v) and x -> (J^T u) whose own derivatives are checked at order 2."""
    leaves, treedef = jax.tree.flatten(list(args))
    out = f(*args)
    u = jax.tree.map(lambda o: jnp.asarray(_random_like(rng, o, unit=False)), out)
    tangents = [jnp.asarray(_random_like(rng, leaf, unit=True)) if _is_inexact(leaf) else None
                for leaf in leaves]
    maps = []
    if "fwd" in modes:
        def jvp_map(*a):
            ls = jax.tree.leaves(list(a))
            idx = [i for i, t in enumerate(tangents) if t is not None]

            def g(*xs):
                new = list(ls)
                for i, x in zip(idx, xs):
                    new[i] = x
                return f(*jax.tree.unflatten(treedef, new))
            primals = tuple(ls[i] for i in idx)
            ts = tuple(tangents[i].astype(jnp.result_type(p)) for i, p in zip(idx, primals))
            return jax.jvp(g, primals, ts)[1]
        maps.append(("d(jvp)", jvp_map))
    if "rev" in modes:
        def vjp_map(*a):
            out_a, pullback = jax.vjp(f, *a)
            u_conj = jax.tree.map(lambda c, o: jnp.conj(c).astype(o.dtype) if _is_inexact(o) else c,
                                  u, out_a)
            return [c for c in jax.tree.leaves(pullback(u_conj)) if _is_inexact(c)]
        maps.append(("d(vjp)", vjp_map))
    return maps


def check_grads(
    f: Callable,
    args: Sequence[Any],
    order: int = 1,
    modes: Sequence[str] = ("rev",),
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> None:
    """Check the derivatives of ``f`` at ``args`` against central finite differences.

    Args:
      f: function of the positional arguments ``*args`` returning a pytree of
        arrays. Integer and boolean leaves are held fixed.
      args: tuple or list of the positional arguments (pytrees).
      order: highest derivative order to check; ``2`` also checks the
        derivatives of the JVP/VJP maps (grad of grad).
      modes: any of ``"fwd"`` (jax.jvp) and ``"rev"`` (jax.vjp).
      rtol, atol: tolerances; an entry passes when
        ``|ad - fd| <= atol + rtol * max(|ad|, |fd|)``. Defaults come from
        :func:`default_tolerance` for the result dtype of the inputs.
      seed: seed of the random directions and cotangents.

    Raises:
      AssertionError: with a per-argument table when any entry misses.
    """
    if order < 1:
        raise ValueError(f"check_grads: order must be >= 1, got {order}.")
    args = list(args)
    inexact = [leaf for leaf in jax.tree.leaves(args) if _is_inexact(leaf)]
    if not inexact:
        raise ValueError("check_grads: no floating-point argument to differentiate.")
    if not jax.config.jax_enable_x64:
        raise RuntimeError("check_grads needs float64: set jax_enable_x64 before calling it.")
    with jax.numpy_dtype_promotion("standard"):  # mixed float32/float64 under strict
        dtype = jnp.result_type(*inexact)
    default_rtol, default_atol = default_tolerance(dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    rng = np.random.default_rng(seed)

    rows = _check_order1(f, args, modes, rtol, atol, rng, "order 1")
    functions = [("", f)]
    for k in range(2, order + 1):
        next_functions = []
        for name, g in functions:
            for dname, dg in _derivative_maps(g, args, modes, rng):
                label = f"order {k} {dname}{name}"
                rows += _check_order1(dg, args, modes, rtol, atol, rng, label)
                next_functions.append((dname + name, dg))
        functions = next_functions

    passed = [bool(r[5] <= r[6]) for r in rows]  # a nan error fails
    failed = [r for r, ok in zip(rows, passed) if not ok]
    if failed:
        header = f"{'check':<22} {'mode':<4} {'argument':<22} {'autodiff':>14} {'finite diff':>14} {'abs err':>10} {'allowed':>10}"
        lines = [header, "-" * len(header)]
        for (label, mode, arg, ad, fd, err, allowed), ok in zip(rows, passed):
            flag = "" if ok else "  <-- FAIL"
            lines.append(f"{label:<22} {mode:<4} {arg:<22} {ad:>14.6e} {fd:>14.6e} {err:>10.2e} {allowed:>10.2e}{flag}")
        raise AssertionError(
            f"check_grads: {len(failed)} of {len(rows)} derivative checks missed "
            f"(rtol={rtol:g}, atol={atol:g}):\n" + "\n".join(lines))
