"""The integration loop in segments, for loops that run kernel by kernel.

When the loop is not compiled as one kernel (:mod:`odekit.ode.engine.single_kernel`:
GPUs, large states, vector fields with matrix products), XLA:CPU runs each
kernel of the loop body as a separate task, and a body that touches a
buffer larger than 512 bytes runs on its slower concurrent executor. So the
big buffers (all of ``t_eval``, the values there, the adjoint's stops and
jump data) stay out of the step loop: an outer loop hands the step loop one
segment at a time, a window of ``window`` output times whose values it
fills in a small block, or the way to the next stop, and then stores the
block or applies the jump. Steps are clipped at every stop, never at the
end of a window: the steps are those of the plain loop (values at
``t_eval`` do not depend on whether steps are recorded for
``dense_output``, as in SciPy). An accepted step that passes the first
output time after the window fills the window and is then taken back: the
segment ends before it, and the next segment takes the same step again
(from the same state, by the same compiled body: the same numbers) for the
next window, until a window holds the last output time the step passes.
A method that lands on every output time (``Method.lands_on_outputs``)
ends each segment on the output time after the window.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from odekit import status as codes
from odekit._tree import tree_where, vary_like
from odekit.ode.engine import loop, output
from odekit.ode.methods import Method

Pytree = Any


def applies(outputs: output.Outputs) -> bool:
    """Whether the outputs can run in segments (values at times and stops;
    events and the step record run in the plain loop)."""
    return (outputs.window > 0 and outputs.events is None and not outputs.record
            and (outputs.t_eval is not None or outputs.stops is not None))


def _padded(tree: Pytree, window: int, fill: float) -> Pytree:
    return jax.tree.map(lambda b: jnp.concatenate(
        [b, jnp.full((window,) + b.shape[1:], fill, b.dtype)]), tree)


def _within(bound: jax.Array) -> Callable:
    """A ``while_loop`` for :func:`odekit.ode.engine.loop.steps` that ends
    the segment before an accepted step passing ``bound`` (the first output
    time after the window): that step's values in the window are kept, its
    new state is not (the next segment takes it again)."""
    def while_loop(cond: Callable, body: Callable, init: loop.LoopState) -> loop.LoopState:
        def going(carry):
            state, ahead = carry
            return lax.bitwise_and(cond(state), lax.bitwise_not(ahead))

        def attempt(carry):
            state, _ = carry
            new = body(state)
            ahead = ((new.num_accepted > state.num_accepted) & (new.t > bound)
                     & (new.status == codes.SUCCESS))
            return tree_where(ahead, state._replace(out=new.out), new), ahead

        start = (init, vary_like(jnp.bool_(False), init))
        return lax.while_loop(going, attempt, start)[0]
    return while_loop


def run(method: Method, func: Callable, config: loop.LoopConfig, outputs: output.Outputs,
        state: loop.LoopState, t_end: jax.Array) -> loop.LoopResult:
    """:func:`odekit.ode.engine.loop.run` in segments (same arguments, same result)."""
    window, t_eval, stops = outputs.window, outputs.t_eval, outputs.stops
    m = 0 if t_eval is None else t_eval.shape[0]
    k = 0 if stops is None else stops.shape[0]
    big = state.out
    if t_eval is not None:
        times = _padded(t_eval, window, float("inf"))
        big = big._replace(ys_eval=_padded(big.ys_eval, window, float("nan")))

    def pending(st, big):
        due = jnp.bool_(False)
        if t_eval is not None:
            due = due | ((big.eval_index < m) & (times[big.eval_index] <= st.t))
        if stops is not None:
            due = due | ((big.stop_index < k) & (stops[jnp.minimum(big.stop_index, k - 1)] <= st.t))
        return due

    def going(carry):
        st, big = carry
        return ((st.t < t_end) | pending(st, big)) & (st.status == codes.SUCCESS) & \
            loop.within_limits(config, st)

    def segment(carry):
        st, big = carry
        seg_end, inner, small = t_end, output.Outputs(window=window), output.OutputState()
        while_loop = lax.while_loop
        if t_eval is not None:
            i0 = big.eval_index
            block_times = lax.dynamic_slice_in_dim(times, i0, window)
            if method.lands_on_outputs:
                seg_end = jnp.minimum(seg_end, times[i0 + window])
            else:
                while_loop = _within(times[i0 + window])
            inner = inner._replace(t_eval=block_times)
            small, _ = output.initial(inner, st.t, st.y)
        if stops is not None:
            nxt = stops[jnp.minimum(big.stop_index, k - 1)]
            seg_end = jnp.where(big.stop_index < k, jnp.minimum(seg_end, nxt), seg_end)
        st = loop.steps(method, func, config, inner, st._replace(out=small), seg_end,
                        while_loop=while_loop, t_final=t_end)
        if t_eval is not None:
            ys = jax.tree.map(lambda b, blk: lax.dynamic_update_slice_in_dim(b, blk, i0, 0),
                              big.ys_eval, st.out.ys_eval)
            big = big._replace(ys_eval=ys, eval_index=i0 + st.out.eval_index)
        if stops is not None:
            ok = st.status == codes.SUCCESS
            big, y, f, cost, reached = output.apply_stops(outputs, func, big, st.t, st.y, st.f, ok)
            method_state = st.method_state
            if outputs.jump is not None:
                method_state = loop.after_jump(method, func, config, method_state, reached,
                                               st.t, y, f, st.h)
            st = st._replace(y=y, f=f, nfev=st.nfev + cost, method_state=method_state,
                             since_output=jnp.where(reached, 0, st.since_output).astype(jnp.int32))
        return st._replace(out=output.OutputState()), big

    init = vary_like((state._replace(out=output.OutputState()), big), t_end, t_eval, stops)
    st, big = lax.while_loop(going, segment, init)
    if t_eval is not None:
        big = big._replace(ys_eval=jax.tree.map(lambda b: b[:m], big.ys_eval))
    return loop.finish(method, config, st._replace(out=big), t_end)
