"""Profile: where a continuous adjoint's time goes with many parameters.

Question (issue 30, item 2): the neural ODE of ``many_parameters.py`` (MLP
2-200-200-2, 41,202 weights, tsit5, rtol = atol = 1e-6, 40 outputs) takes
its gradient by ``adjoint="interpolate"`` several times slower than by the
checkpoint adjoint, which makes the same vector-Jacobian products. The rows
separate the parts: the forward solve alone, the vjps a backward solve makes
(43 backward steps x 7 stages = 301 MLP vjps, in a fori_loop), the three
adjoints, and the same solve with a trivial field carrying 41,000 unused
parameters (what the backward state's size costs by itself).

``python benchmarks/interpolate_overhead.py`` prints the table (medians of
interleaved calls; set OPENBLAS_NUM_THREADS=1 on a shared machine).
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import many_parameters as mp  # noqa: E402

import odekit  # noqa: E402

jax.config.update("jax_enable_x64", True)


def _neural(theta, adjoint, y0=None):
    y0 = jnp.asarray(mp.NEURAL_Y0) if y0 is None else y0
    return odekit.solve_ivp(lambda t, y, p: mp.mlp_field(y, p), (0.0, mp.NEURAL_SPAN), y0,
                            args=(theta,), t_eval=jnp.asarray(mp.NEURAL_TS), method="tsit5",
                            adjoint=adjoint, **mp.NEURAL_TOL).ys


def _trivial(p, adjoint):
    def field(t, y, a, unused):
        return jnp.stack([-a * y[0] + jnp.sin(t), -y[1] + y[0]]) + 1e-3 * jnp.sum(unused[:5])
    return odekit.solve_ivp(field, (0.0, mp.NEURAL_SPAN), jnp.asarray(mp.NEURAL_Y0), args=p,
                            t_eval=jnp.asarray(mp.NEURAL_TS), method="tsit5", adjoint=adjoint,
                            **mp.NEURAL_TOL).ys


def rows(width: int = 200, rounds: int = 7) -> list[tuple[str, float]]:
    theta = mp.mlp_parameters(width)
    y0 = jnp.asarray(mp.NEURAL_Y0)
    unused = (jnp.asarray(0.3), jnp.zeros(41_000))

    def vjps(th):
        def body(i, acc):
            pull = jax.vjp(lambda p: mp.mlp_field(y0 + i * 1e-3, p), th)[1]
            return jax.tree.map(jnp.add, acc, pull(jnp.ones(2))[0])
        return jax.lax.fori_loop(0, 301, body, jax.tree.map(jnp.zeros_like, th))

    grad = lambda adjoint: jax.jit(jax.grad(lambda th: jnp.sum(_neural(th, adjoint))))
    cases = {
        "forward solve": (jax.jit(lambda th: _neural(th, "checkpoint")), theta),
        "301 MLP vjps": (jax.jit(vjps), theta),
        "gradient, checkpoint": (grad("checkpoint"), theta),
        "gradient, interpolate": (grad("interpolate"), theta),
        "gradient, backsolve": (grad("backsolve"), theta),
        "trivial field + 41,000 unused, interpolate": (
            jax.jit(jax.grad(lambda p: jnp.sum(_trivial(p, "interpolate")))), unused),
        "trivial field + 41,000 unused, checkpoint": (
            jax.jit(jax.grad(lambda p: jnp.sum(_trivial(p, "checkpoint")))), unused),
    }
    for fn, arg in cases.values():
        jax.block_until_ready(fn(arg))
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (fn, arg) in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(arg))
            times[name].append(time.perf_counter() - start)
    return [(name, float(np.median(t)) * 1e3) for name, t in times.items()]


if __name__ == "__main__":
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"jax {jax.__version__}, {jax.devices()[0].platform}")
    print("| part | time (ms) |\n|---|---|")
    for name, ms in rows():
        print(f"| {name} | {ms:.2f} |")
