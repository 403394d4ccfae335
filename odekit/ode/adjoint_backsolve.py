"""The continuous ("backsolve") adjoint of an ODE solve, as a custom_vjp.

Primal: ``ys[i] = y(t_i)`` for ``y' = f(y, t, *args)``, ``y(t_0) = y0``.
For a loss L with cotangents ``g_i = dL/dys[i]`` the adjoint
``a(t) = dL/dy(t)`` obeys, between output times (Pontryagin; Chen et al.,
"Neural ODEs", NeurIPS 2018, appendix C),

    a'(t)      = -a^T df/dy,            a(t_N^-) = g_N,   a jumps by g_i at t_i,
    dL/dargs   = int_{t_0}^{t_N} a^T df/dargs dt,
    dL/dt_i    = g_i . f(y(t_i), t_i)   (i >= 1),
    dL/dt_0    = -a(t_0^+) . f(y0, t_0),    dL/dy0 = a(t_0^+) + g_0.

The backward pass integrates the augmented state (y, a, args_bar) backwards
in time (as s = -t, so the same forward integrator serves) in ONE call of the
loop (:func:`odekit.ode.loop.integrate_piecewise`): it lands exactly on every
output time, where y restarts from the stored forward value ys[i] and g_i is
added to a; the step size carries over. When all its leaves share a dtype the
augmented state travels as one flat vector (one kernel per stage instead of
one per leaf). One pass instead of one solve per interval removes a fixed
cost of a few microseconds per output time (the per-interval setup).

Second order (grad of grad): the backward pass is itself a custom_vjp whose
rule differentiates the interval-by-interval version (a scan of calls of
``solve``, each differentiable again), which solves the same adjoint
equations to the same tolerance. Memory is O(len(t)) for the outputs and
O(1) in the number of steps.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from odekit.ode import errors, loop, single_kernel
from odekit.ode.methods import get_tableau
from odekit.ode.options import SolverOptions

Pytree = Any


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def solve(func: Callable, options: SolverOptions, y0: Pytree, ts: jax.Array,
          h0: jax.Array, *args: Any) -> tuple[Pytree, jax.Array, errors.SolveInfo]:
    """Integrate ``func(y, t, *args)`` and return ``(ys, h_next, info)``.

    ``h0`` is the first step to try when ``options.given_first_step``; its
    cotangent is zero, as are those of ``h_next`` and ``info``.
    """
    tableau = get_tableau(options.method)

    one_kernel = options.single_kernel and single_kernel.eligible(func, y0, ts[0], *args)

    def integrate(y0, ts, h0, args):
        vector_field = lambda y, t: loop.cast_like(func(y, t, *args), y)
        first = h0 if options.given_first_step else None
        return loop.integrate(vector_field, tableau, options.tolerance, y0, ts, first,
                              options.mxstep, options.hmax, options.stop_at_outputs,
                              options.detect_stiffness, one_kernel)

    if one_kernel:
        return single_kernel.run(integrate, y0, ts, h0, args)
    return integrate(y0, ts, h0, args)


def _solve_fwd(func, options, y0, ts, h0, *args):
    ys, h_next, info = solve(func, options, y0, ts, h0, *args)
    # Copies, not the inputs themselves: with the inputs as residuals a
    # third-order derivative failed at trace time (a shape error while JAX
    # transposes the scan of these solves in _adjoint_by_interval; the same
    # error stops jax.experimental.ode at third order). With copies it works
    # (tested); XLA removes them. The mechanism inside JAX was not traced.
    return (ys, h_next, info), (ys, jnp.copy(ts), h_next, jax.tree.map(jnp.copy, args))


def _at(tree: Pytree, i: Any) -> Pytree:
    """Row ``i`` of every leaf (the state at output ``i``)."""
    return jax.tree.map(lambda leaf: leaf[i], tree)


def _dot_real(a: Pytree, b: Pytree) -> jax.Array:
    """Re(sum(a * b)) over all leaves (JAX's cotangent pairing for time)."""
    return sum(jnp.sum(jnp.real(x * y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _is_differentiable(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def _split(args: tuple) -> tuple[list, Callable]:
    """Inexact leaves of ``args`` and a function rebuilding ``args`` from them."""
    leaves, treedef = jax.tree.flatten(args)
    mask = [_is_differentiable(leaf) for leaf in leaves]

    def rebuild(diff_leaves):
        it = iter(diff_leaves)
        return jax.tree.unflatten(treedef, [next(it) if m else leaf for m, leaf in zip(mask, leaves)])

    return [leaf for m, leaf in zip(mask, leaves) if m], rebuild


def _augmented_dynamics(func: Callable, state: tuple, s: jax.Array, *args: Any) -> tuple:
    """d/ds of (y, a, args_bar) in reversed time s = -t (args_bar: inexact leaves)."""
    y, a, _ = state
    diff_args, rebuild = _split(args)
    f, pullback = jax.vjp(lambda y_, d_: func(y_, -s, *rebuild(d_)), y, diff_args)
    a_y, a_args = pullback(a)
    return jax.tree.map(jnp.negative, f), a_y, a_args


def _same_dtype(tree: Pytree) -> bool:
    return len({jnp.result_type(leaf) for leaf in jax.tree.leaves(tree)}) == 1


def _flat_dynamics(dynamics: Callable, unravel: Callable, z: jax.Array, s: jax.Array,
                   *args: Any) -> jax.Array:
    """``dynamics`` on the flat vector ``z`` of a pytree state."""
    return ravel_pytree(dynamics(unravel(z), s, *args))[0]


def _solve_bwd(func, options, residuals, cotangents):
    ys, ts, h_next, args = residuals
    y0_bar, ts_bar, args_bar, info = _adjoint(func, options, ys, ts, cotangents[0],
                                              lax.stop_gradient(h_next), *args)
    it = iter(args_bar)
    args_cotangent = jax.tree.map(
        lambda leaf: next(it) if _is_differentiable(leaf)
        else np.zeros(np.shape(leaf), dtype=jax.dtypes.float0), args)
    grads = (y0_bar, ts_bar, jnp.zeros_like(h_next), *args_cotangent)
    return errors.raise_if_failed(info, grads, "the backward (adjoint) solve of odekit",
                                  "Times are reported in reversed time s = -t.")


def _time_cotangents(func, ys, ts, g, a0, args):
    """dL/dt_i: the outputs move along the trajectory (i >= 1); t_0 moves the
    start, which the adjoint a(t_0) weighs."""
    f_at_outputs = jax.vmap(lambda y, t: func(y, t, *args))(ys, ts)
    t_bar = jax.vmap(_dot_real)(f_at_outputs, g)
    t0_bar = -_dot_real(a0, _at(f_at_outputs, 0))
    return jnp.concatenate([t0_bar[None], t_bar[1:]]).astype(ts.dtype)


def _augmented_start(g: Pytree, ys: Pytree, diff_args: list) -> tuple:
    """(y, a, args_bar) at the last output time."""
    return _at(ys, -1), _at(g, -1), [jnp.zeros_like(leaf) for leaf in diff_args]


def _adjoint_one_pass(func, options, ys, ts, g, h_next, *args):
    """The backward solve as one call of the loop: it lands on every output
    time, where y restarts from the stored forward value and the cotangent
    g_i jumps into a (one step loop, no per-interval setup)."""
    aug_func = partial(_augmented_dynamics, func)
    diff_args, _ = _split(args)
    state0 = _augmented_start(g, ys, diff_args)
    n = ts.shape[0]
    one_kernel = options.single_kernel and single_kernel.eligible(aug_func, state0, ts[0], *args)

    def backward(state0, ys, g, ts, h_next, args):
        def jump(i, state):  # i counts reversed times: output n - 1 - i
            _, a, args_bar = state
            return _at(ys, n - 1 - i), jax.tree.map(jnp.add, a, _at(g, n - 1 - i)), args_bar

        vector_field = lambda z, s: loop.cast_like(aug_func(z, s, *args), z)
        start, field, jumps, finish = state0, vector_field, jump, lambda z: z
        if _same_dtype(state0):
            # One flat vector: every stage is then one kernel, not one per leaf.
            start, unravel = ravel_pytree(state0)
            field = partial(_flat_dynamics, vector_field, unravel)
            jumps = lambda i, z: ravel_pytree(jump(i, unravel(z)))[0]
            finish = unravel
        end, _, info = loop.integrate_piecewise(field, get_tableau(options.method),
                                                options.tolerance, start, -ts[::-1], h_next,
                                                options.mxstep, options.hmax, jumps)
        return finish(end), info

    operands = (state0, ys, g, ts, h_next, args)
    if one_kernel:
        end, info = single_kernel.run(backward, *operands)
    else:
        end, info = backward(*operands)
    _, a0, args_bar = end
    y0_bar = jax.tree.map(jnp.add, a0, _at(g, 0))
    return y0_bar, _time_cotangents(func, ys, ts, g, a0, args), args_bar, info


def _adjoint_by_interval(func, options, ys, ts, g, h_next, *args):
    """The same backward solve, one call of :func:`solve` per output interval
    (a scan): slower, but every piece is differentiable again, so this is
    what second-order derivatives differentiate."""
    aug_options = _augmented_options(options)
    aug_func = partial(_augmented_dynamics, func)
    diff_args, _ = _split(args)

    def interval(carry, i):
        a, args_bar, h = carry
        a = jax.tree.map(jnp.add, a, _at(g, i))
        state0 = (_at(ys, i), a, args_bar)
        times = jnp.stack([-ts[i], -ts[i - 1]])
        if _same_dtype(state0):
            # One flat vector: every stage is then one kernel, not one per leaf.
            flat0, unravel = ravel_pytree(state0)
            out, h, info = solve(partial(_flat_dynamics, aug_func, unravel), aug_options, flat0,
                                 times, h, *args)
            _, a, args_bar = unravel(out[1])
        else:
            out, h, info = solve(aug_func, aug_options, state0, times, h, *args)
            _, a, args_bar = _at(out, 1)
        return (a, args_bar, h), info

    a_final = jax.tree.map(jnp.zeros_like, _at(g, 0))
    args_bar0 = [jnp.zeros_like(leaf) for leaf in diff_args]
    (a0, args_bar, _), infos = lax.scan(interval, (a_final, args_bar0, h_next),
                                        jnp.arange(len(ts) - 1, 0, -1))
    y0_bar = jax.tree.map(jnp.add, a0, _at(g, 0))
    return y0_bar, _time_cotangents(func, ys, ts, g, a0, args), args_bar, errors.first_failure(infos)


def _augmented_options(options: SolverOptions) -> SolverOptions:
    return options._replace(stop_at_outputs=True, given_first_step=True, detect_stiffness=False)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _adjoint(func, options, ys, ts, g, h_next, *args):
    """``(y0_bar, ts_bar, args_bar, info)`` of the backward pass: computed in
    one pass; differentiated (grad of grad) through the interval-by-interval
    version, which solves the same adjoint equations to the same tolerance."""
    if ts.shape[0] < 2:
        return _adjoint_by_interval(func, options, ys, ts, g, h_next, *args)
    return _adjoint_one_pass(func, options, ys, ts, g, h_next, *args)


def _adjoint_fwd(func, options, *inputs):
    return _adjoint(func, options, *inputs), inputs


def _adjoint_bwd(func, options, inputs, cotangents):
    _, pullback = jax.vjp(partial(_adjoint_by_interval, func, options), *inputs)
    return pullback(cotangents)


_adjoint.defvjp(_adjoint_fwd, _adjoint_bwd)


solve.defvjp(_solve_fwd, _solve_bwd)
