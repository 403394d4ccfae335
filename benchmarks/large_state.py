"""Larger states: odekit.odeint against jax.experimental.ode beyond the pendulum.

The pendulum benchmark measures a 2-number state, which odekit compiles into
one CPU kernel (odekit.ode.engine.single_kernel). Here the state grows past that
kernel's limit (256 numbers): the heat equation with a time-dependent source,

    u_t = D u_xx + sin(pi x) cos(t)   on (0, 1), u = 0 at both ends,

by the method of lines (second differences on n interior points), dopri5 at
rtol = 1e-6, atol = 1e-9 on [0, 0.1] with 11 outputs, for n = 100 (one
kernel), 300 and 1000 (kernel by kernel). At n = 1000 the explicit solve is
stability-limited (12,104 steps); odekit's stiffness verdict lets it run
because the span costs fewer than 100,000 steps. Forward solve time (medians
of calls alternating between the two solvers), first call (trace, compile
and run of a fresh jit after jax.clear_caches), steps, and the largest
difference between the two solutions.

    python benchmarks/large_state.py [--quick] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.ode import odeint as jax_odeint  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (block, interleaved_first_calls, interleaved_medians,  # noqa: E402
                     machine_description, markdown_table, write_result)

import odekit  # noqa: E402

RTOL, ATOL = 1e-6, 1e-9
TS = np.linspace(0.0, 0.1, 11)
HEADER = ["n", "solver", "forward (ms)", "vs jax.ode", "first call (s)", "steps",
          "max difference"]


def heat(n: int):
    """(field(u, t, D), u0) of the n-point heat equation."""
    x = jnp.linspace(0.0, 1.0, n + 2)[1:-1]
    dx = 1.0 / (n + 1)

    def field(u, t, diffusivity):
        right = jnp.concatenate([u[1:], jnp.zeros(1, u.dtype)])
        left = jnp.concatenate([jnp.zeros(1, u.dtype), u[:-1]])
        return diffusivity * (right - 2 * u + left) / dx**2 + jnp.sin(jnp.pi * x) * jnp.cos(t)

    return field, jnp.sin(jnp.pi * x)


def solvers(n: int) -> dict:
    field, u0 = heat(n)
    ts = jnp.asarray(TS)
    return {
        "odekit.odeint": (lambda u, d: odekit.odeint(field, u, ts, d, rtol=RTOL, atol=ATOL), u0),
        "jax.experimental.ode": (lambda u, d: jax_odeint(field, u, ts, d, rtol=RTOL, atol=ATOL),
                                 u0),
    }


def first_call_maker(fn, u0):
    """A fresh jitted call of ``fn`` (see harness.interleaved_first_calls)."""
    def make():
        jax.clear_caches()
        jitted = jax.jit(fn)
        return lambda: jitted(u0, 0.1)
    return make


def steps(n: int) -> int:
    field, u0 = heat(n)
    sol = odekit.solve_ivp(lambda t, u, d: field(u, t, d), (TS[0], TS[-1]), u0, args=(0.1,),
                           t_eval=jnp.asarray(TS), method="dopri5", rtol=RTOL, atol=ATOL,
                           max_steps=100_000)
    return int(sol.stats["num_steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 100 and 300, fewer rounds")
    parser.add_argument("--no-write", action="store_true")
    opts = parser.parse_args()
    sizes, rounds = ((100, 300), 5) if opts.quick else ((100, 300, 1000), 30)
    rows = []
    for n in sizes:
        contenders = solvers(n)
        jitted = {name: (jax.jit(fn), u0) for name, (fn, u0) in contenders.items()}
        values = {name: np.asarray(block(fn(u0, 0.1))) for name, (fn, u0) in jitted.items()}
        times = interleaved_medians({name: (lambda fn=fn, u0=u0: fn(u0, 0.1))
                                     for name, (fn, u0) in jitted.items()},
                                    rounds=rounds if n < 1000 else max(3, rounds // 5))
        firsts = interleaved_first_calls({name: first_call_maker(fn, u0)
                                          for name, (fn, u0) in contenders.items()},
                                         repeats=1 if opts.quick else 3)
        difference = float(np.max(np.abs(values["odekit.odeint"] - values["jax.experimental.ode"])))
        base = times["jax.experimental.ode"]
        for name in contenders:
            rows.append([n, name, times[name] * 1e3, f"{times[name] / base:.2f}", firsts[name],
                         steps(n) if name == "odekit.odeint" else "-",
                         f"{difference:.1e}" if name == "odekit.odeint" else "-"])
    text = "\n".join([
        "# Larger states: the heat equation by the method of lines (float64, dopri5)", "",
        f"{machine_description()}; `python benchmarks/large_state.py"
        f"{' --quick' if opts.quick else ''}`", "",
        f"rtol = {RTOL}, atol = {ATOL}, [0, 0.1], 11 outputs. forward = median of calls "
        "alternating between the solvers; first call = trace + compile + run of a fresh jit "
        "after jax.clear_caches(), median of rounds in which the solvers take turns after an "
        "untimed warm-up round; steps = odekit's attempted steps; max difference between "
        "the two solutions. n = 100 runs as one CPU kernel, 300 and 1000 kernel by kernel.", "",
        markdown_table(HEADER, rows)])
    print(text)
    if not opts.no_write:
        print("wrote", write_result("large_state", text))


if __name__ == "__main__":
    main()
