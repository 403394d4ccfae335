"""Benchmark: which adjoint should a scientist pick?

Question: what does each of odekit's adjoints cost (time per gradient, first
call, memory) and how right is its gradient, on

* the pendulum (``theta'' = -b theta' - g sin(theta)``, 101 outputs on
  [0, 10], rtol = atol = 1.4e-8): ``jax.grad`` of the sum of the outputs
  w.r.t. (y0, b, g), with jax.experimental.ode's gradient as the peer;
* a kinetics chain with 8 rate constants (species 1 -> 2 -> ... -> 9,
  ``y_i' = k_{i-1} y_{i-1} - k_i y_i``, 50 outputs on [0, 10]): the full
  (50 x 9) x 8 Jacobian by ``jax.jacfwd`` (forward sensitivities) and
  ``jax.jacrev``;
* the problem where backsolve fails (``y' = [[-k, 1], [0, -10]] y``,
  ``y0 = [1, 1]`` on [0, 20], rtol = 1e-10, atol = 1e-14): d sum(y(20)) / dk
  at k = 1 against its closed form -4.578e-8;
* a 10,000-step solve (the undamped pendulum, b = 0, on [0, 400]) for the
  checkpoint adjoint's memory/recompute knob: ``levels`` = 1..4 with
  ``max_steps = 12000`` (the checkpointed loop, ``max_directions=0``), and
  the default rule for 4 perturbed numbers (a forward-mode Jacobian); memory is XLA's buffer assignment for the compiled
  gradient (``memory_analysis()``: arguments, outputs and temporaries);
* many parameters (:mod:`many_parameters`): a neural ODE with 4,482 and
  41,202 weights and a stiff reaction network with 34 rate constants,
  against diffrax's RecursiveCheckpointAdjoint and BacksolveAdjoint.

Times are medians of interleaved calls of jitted functions (the machine is
shared), first calls a fresh ``jax.jit`` after ``jax.clear_caches()``.
diffrax (not a dependency) is compared when installed: its Dopri5 with a
PIDController at the same tolerances and RecursiveCheckpointAdjoint,
BacksolveAdjoint or ForwardMode.

Run: ``python benchmarks/adjoints.py`` (about 5 minutes on 2 cores); writes
``benchmarks/results/adjoints.md`` and ``benchmarks/results/adjoints.png``.
``--quick`` runs fewer repeats, skips the 10,000-step table, the 41k-weight
network and the first calls of the many-parameter tables.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import ode as jax_ode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import many_parameters  # noqa: E402

import odekit  # noqa: E402

try:
    import diffrax  # noqa: E402
except ImportError:
    diffrax = None

HERE = os.path.dirname(os.path.abspath(__file__))
B, G = 0.25, 9.8
Y0 = jnp.array([np.pi - 0.1, 0.0])
TS = jnp.linspace(0.0, 10.0, 101)
TOL = dict(rtol=1.4e-8, atol=1.4e-8)
ADJOINTS = {"backsolve": "backsolve", "interpolate": "interpolate",
            "checkpoint (default: Jacobian, 4 directions)": "checkpoint",
            "checkpoint, loop (levels=3)": odekit.Checkpoint(max_directions=0),
            "checkpoint, loop (levels=2)": odekit.Checkpoint(levels=2, max_directions=0)}
DIFFRAX = {"diffrax RecursiveCheckpoint": "RecursiveCheckpointAdjoint",
           "diffrax Backsolve": "BacksolveAdjoint", "diffrax ForwardMode": "ForwardMode"}


def diffrax_solve(func, y0, ts, args, adjoint, rtol, atol, max_steps=4096):
    """diffrax's Dopri5 solution at ``ts`` of ``y' = func(y, t, *args)``."""
    term = diffrax.ODETerm(lambda t, y, a: func(y, t, *a))
    return diffrax.diffeqsolve(
        term, diffrax.Dopri5(), t0=ts[0], t1=ts[-1], dt0=None, y0=y0, args=args,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        adjoint=getattr(diffrax, adjoint)(), max_steps=max_steps).ys


def pend(y, t, b, g):
    return jnp.stack([y[1], -b * y[1] - g * jnp.sin(y[0])])


def pendulum_loss(adjoint, tol=TOL):
    def loss(y0, b, g):
        if adjoint == "jax.experimental.ode":
            return jax_ode.odeint(pend, y0, TS, b, g, **tol).sum()
        if adjoint in DIFFRAX:
            return diffrax_solve(pend, y0, TS, (b, g), DIFFRAX[adjoint], **tol).sum()
        return odekit.odeint(pend, y0, TS, b, g, adjoint=adjoint, **tol).sum()
    return loss


def first_call(make, repeats):
    samples = []
    for _ in range(repeats):
        jax.clear_caches()
        fn = make()
        start = time.perf_counter()
        harness.block(fn())
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def rel_error(g, ref):
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(ref)])
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def pendulum_table(rounds, repeats):
    args = (Y0, jnp.asarray(B), jnp.asarray(G))
    reference = jax.grad(pendulum_loss("checkpoint", dict(rtol=1e-13, atol=1e-13)),
                         argnums=(0, 1, 2))(*args)
    names = list(ADJOINTS) + ["jax.experimental.ode"]
    if diffrax is not None:
        names += ["diffrax RecursiveCheckpoint", "diffrax Backsolve"]
    grads = {n: jax.jit(jax.grad(pendulum_loss(ADJOINTS.get(n, n)), argnums=(0, 1, 2)))
             for n in names}
    times = harness.interleaved_medians({n: (lambda f=f: f(*args)) for n, f in grads.items()},
                                        rounds=rounds)
    firsts = {n: first_call(lambda n=n: (lambda f=jax.jit(jax.grad(
        pendulum_loss(ADJOINTS.get(n, n)), argnums=(0, 1, 2))): f(*args)), repeats) for n in names}
    rows = []
    for n in names:
        rows.append([n, f"{times[n] * 1e6:.0f}", f"{times[n] / times['backsolve']:.2f}",
                     f"{times[n] / times['jax.experimental.ode']:.2f}", f"{firsts[n]:.2f}",
                     f"{rel_error(grads[n](*args), reference):.1e}"])
    header = ["adjoint", "gradient (us)", "vs backsolve", "vs jax.ode", "first call (s)",
              "rel. error"]
    return header, rows, times


def kinetics(y, t, k):
    inflow = jnp.concatenate([jnp.zeros(1, y.dtype), k * y[:-1]])
    outflow = jnp.concatenate([k * y[:-1], jnp.zeros(1, y.dtype)])
    return inflow - outflow


def kinetics_table(rounds, repeats):
    k = jnp.linspace(0.5, 2.0, 8)
    y0 = jnp.zeros(9).at[0].set(1.0)
    ts = jnp.linspace(0.0, 10.0, 50)
    solve = lambda adjoint: (lambda k: odekit.odeint(kinetics, y0, ts, k, adjoint=adjoint,
                                                     rtol=1e-8, atol=1e-10))
    ways = {"jacfwd, forward": (jax.jacfwd, solve("forward")),
            "jacfwd, checkpoint": (jax.jacfwd, solve("checkpoint")),
            "jacrev, checkpoint": (jax.jacrev, solve("checkpoint")),
            "jacrev, interpolate": (jax.jacrev, solve("interpolate")),
            "jacrev, backsolve": (jax.jacrev, solve("backsolve"))}
    if diffrax is not None:
        dfx = lambda adjoint: (lambda k: diffrax_solve(kinetics, y0, ts, (k,), adjoint,
                                                       rtol=1e-8, atol=1e-10))
        ways["jacfwd, diffrax ForwardMode"] = (jax.jacfwd, dfx("ForwardMode"))
        ways["jacrev, diffrax RecursiveCheckpoint"] = (jax.jacrev,
                                                       dfx("RecursiveCheckpointAdjoint"))
    jacs = {n: jax.jit(transform(fn)) for n, (transform, fn) in ways.items()}
    reference = jax.jacfwd(lambda k: odekit.odeint(kinetics, y0, ts, k, adjoint="forward",
                                                   rtol=1e-12, atol=1e-14))(k)
    times = harness.interleaved_medians({n: (lambda f=f: f(k)) for n, f in jacs.items()},
                                        rounds=rounds)
    firsts = {n: first_call(lambda t=t, fn=fn: (lambda f=jax.jit(t(fn)): f(k)), repeats)
              for n, (t, fn) in ways.items()}
    rows = [[n, f"{times[n] * 1e3:.2f}", f"{times[n] / times['jacfwd, forward']:.1f}",
             f"{firsts[n]:.2f}", f"{rel_error(f(k), reference):.1e}"] for n, f in jacs.items()]
    return ["Jacobian (450 x 8)", "time (ms)", "vs jacfwd, forward", "first call (s)",
            "rel. error"], rows


def failure_table():
    def func(y, t, k):
        return jnp.stack([-k * y[0] + y[1], -10.0 * y[1]])

    T, k = 20.0, 1.0
    exact = (-T * np.exp(-k * T)
             + (-T * np.exp(-k * T) * (10 - k) + np.exp(-k * T) - np.exp(-10 * T)) / (10 - k) ** 2)
    rows = []
    contenders = [("backsolve", "backsolve"), ("interpolate", "interpolate"),
                  ("checkpoint", "checkpoint"), ("jax.experimental.ode", None)]
    if diffrax is not None:
        contenders += [("diffrax RecursiveCheckpoint", "RecursiveCheckpointAdjoint"),
                       ("diffrax Backsolve", "BacksolveAdjoint")]
    for name, adjoint in contenders:
        if adjoint is None:
            loss = lambda k: jax_ode.odeint(func, jnp.ones(2), jnp.array([0.0, T]), k,
                                            rtol=1e-10, atol=1e-14)[-1].sum()
        elif name.startswith("diffrax"):
            loss = lambda k, a=adjoint: diffrax_solve(func, jnp.ones(2), jnp.array([0.0, T]), (k,),
                                                      a, rtol=1e-10, atol=1e-14)[-1].sum()
        else:
            loss = lambda k, a=adjoint: odekit.odeint(func, jnp.ones(2), jnp.array([0.0, T]), k,
                                                      adjoint=a, rtol=1e-10, atol=1e-14)[-1].sum()
        try:
            value = float(jax.grad(loss)(k))
            rows.append([name, f"{value:.4g}", f"{abs(value - exact) / abs(exact):.1e}"])
        except (odekit.ODESolverError, jax.errors.JaxRuntimeError, ValueError) as error:
            # under jax.grad the error may come wrapped (odekit.status explains)
            text = str(error)
            marker = "ODESolverError: "
            start = text.rfind(marker) + len(marker) if marker in text else 0
            rows.append([name, f"raises {type(error).__name__}",
                         text[start:start + 90].replace("|", "/") + "..."])
    return ["adjoint", "d sum(y(20)) / dk", "rel. error (exact -4.578e-8)"], rows


def memory_table(rounds):
    ts = jnp.array([0.0, 400.0])
    args = (Y0, jnp.asarray(0.0), jnp.asarray(G))   # undamped: steps stay short
    steps = int(odekit.solve_ivp(lambda t, y, b, g: pend(y, t, b, g), (0.0, 400.0), Y0,
                                 t_eval=ts, args=(0.0, G), max_steps=20000,
                                 **TOL).stats["num_steps"])
    rows, fns = [], {}
    for levels in (1, 2, 3, 4, "Jacobian"):
        adjoint = (odekit.Checkpoint(max_steps=12000) if levels == "Jacobian" else
                   odekit.Checkpoint(levels=levels, max_steps=12000, max_directions=0))
        loss = lambda y0, b, g, a=adjoint: odekit.odeint(pend, y0, ts, b, g, adjoint=a,
                                                         **TOL)[-1].sum()
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        memory = grad.lower(*args).compile().memory_analysis()
        total = (memory.temp_size_in_bytes + memory.argument_size_in_bytes
                 + memory.output_size_in_bytes)
        fns[levels] = (lambda f=grad: f(*args))
        rows.append([levels, total])
    times = harness.interleaved_medians({str(k): f for k, f in fns.items()}, rounds=rounds)
    table = [[f"{levels}", f"{total / 2**20:.2f}", f"{times[str(levels)] * 1e3:.1f}"]
             for levels, total in rows]
    return ["levels (max_directions=0)", "memory (MiB)", "gradient (ms)"], table, steps


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plot(pend_times, memory_rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(pend_times)
    axes[0].barh(names, [pend_times[n] * 1e6 for n in names])
    axes[0].set_xlabel("pendulum gradient (us, median)")
    memory_rows = [r for r in memory_rows if r[0].isdigit()]   # the loop's levels only
    if memory_rows:
        levels = [int(r[0]) for r in memory_rows]
        axes[1].plot(levels, [float(r[1]) for r in memory_rows], "o-", label="memory (MiB)")
        ax2 = axes[1].twinx()
        ax2.plot(levels, [float(r[2]) for r in memory_rows], "s--", color="C1",
                 label="gradient (ms)")
        axes[1].set_xlabel("checkpoint levels (10,000-step solve)")
        axes[1].set_ylabel("memory (MiB)")
        ax2.set_ylabel("gradient (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    opts = parser.parse_args()
    rounds, repeats = (10, 1) if opts.quick else (60, 3)
    pend_header, pend_rows, pend_times = pendulum_table(rounds, repeats)
    kin_header, kin_rows = kinetics_table(rounds, repeats)
    fail_header, fail_rows = failure_table()
    text = [f"# Adjoints: time, memory and gradient error ({datetime.date.today()}, "
            f"jax {jax.__version__}, {jax.devices()[0].platform}, "
            f"`python benchmarks/adjoints.py{' --quick' if opts.quick else ''}`)", "",
            "## Pendulum gradient (101 outputs, rtol = atol = 1.4e-8)", "",
            markdown(pend_header, pend_rows), "",
            "Error: relative to the checkpoint gradient at rtol = atol = 1e-13.", "",
            "## Kinetics chain, 8 rate constants: the full Jacobian", "",
            markdown(kin_header, kin_rows), "",
            "## Where backsolve fails", "", markdown(fail_header, fail_rows)]
    widths = (64,) if opts.quick else (64, 200)
    for width in widths:
        header, rows, _, size = many_parameters.neural_table(width, rounds, firsts=not opts.quick)
        text += ["", f"## Neural ODE, {size:,} parameters (MLP 2-{width}-{width}-2, tsit5, "
                 "rtol = atol = 1e-6, 40 outputs on [0, 20])", "", markdown(header, rows)]
    header, rows, _ = many_parameters.network_table(rounds, firsts=not opts.quick)
    text += ["", "## Stiff reaction network, 34 rate constants (12 species, rodas5p; diffrax "
             "Kvaerno5; rtol = 1e-6, atol = 1e-9, 20 outputs on [0, 50])", "",
             markdown(header, rows), "",
             "Errors of these three tables: relative to odekit's checkpoint gradient at "
             "rtol = 1e-11 (see `benchmarks/many_parameters.py`)."]
    memory_rows = []
    if not opts.quick:
        mem_header, memory_rows, steps = memory_table(rounds // 4)
        text += ["", f"## Checkpoint levels on a {steps}-step solve (undamped pendulum on "
                 "[0, 400], max_steps = 12000)", "", markdown(mem_header, memory_rows)]
    text += ["", f"diffrax {diffrax.__version__} (Dopri5, PIDController, same tolerances)."
             if diffrax is not None else "diffrax is not installed here: no diffrax rows."]
    report = "\n".join(text) + "\n"
    print(report)
    if not opts.no_write:
        out = os.path.join(HERE, "results")
        with open(os.path.join(out, "adjoints.md"), "w") as f:
            f.write(report)
        plot(pend_times, memory_rows, os.path.join(out, "adjoints.png"))


if __name__ == "__main__":
    main()
