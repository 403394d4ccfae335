"""Benchmark tables: gradients with many parameters (neural ODEs, a stiff network).

Question: with thousands of parameters, or a stiff model with a few dozen,
which odekit adjoint is fastest, and how does it compare with diffrax's
``RecursiveCheckpointAdjoint`` (the reference everyone compares against)?

Problems (float64):

* a neural ODE ``y' = MLP(y) - 0.1 y``, state 2, two hidden tanh layers of
  width 64 (4,482 parameters) or 200 (41,202), on [0, 20] with 40 outputs,
  tsit5 (diffrax Tsit5), rtol = atol = 1e-6, PID/standard step-size control;
  the gradient of the sum of the outputs w.r.t. every weight;
* a stiff reaction network of 12 species with 34 rate constants (a chain
  of reversible steps ``A_i <-> A_{i+1}``, fast (1e3-1e4) and slow (0.3-1)
  in turn, a dimerisation ``A_i + A_{i+1} -> A_{i+2}`` every other species,
  inflow to A_0 and outflow of A_11), 20 outputs on [0, 50], rodas5p
  (diffrax Kvaerno5), rtol = 1e-6, atol = 1e-9; the gradient of the sum of
  the outputs w.r.t. the 34 log rate constants.

Columns: the median time of one jitted gradient (interleaved calls), the
first call (trace + compile + run, a fresh ``jax.jit`` after
``jax.clear_caches()``), XLA's memory for the compiled gradient
(``memory_analysis()``: arguments + outputs + temporaries) and the relative
max-norm error of the gradient against odekit's checkpoint gradient at
rtol = atol = 1e-11 (the discrete solution's exact derivative converges to
the true one as the tolerance shrinks). Used by ``benchmarks/adjoints.py``.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import harness

import odekit

try:
    import diffrax
except ImportError:      # anchors are never dependencies: rows left out
    diffrax = None

Pytree = Any

NEURAL_SPAN = 20.0
NEURAL_TS = np.linspace(0.0, NEURAL_SPAN, 40)
NEURAL_Y0 = np.array([1.0, 0.5])
NEURAL_TOL = dict(rtol=1e-6, atol=1e-6)

NETWORK_SPECIES = 12
NETWORK_TS = np.linspace(0.0, 50.0, 20)
NETWORK_TOL = dict(rtol=1e-6, atol=1e-9)

ODEKIT_ADJOINTS = {
    "odekit checkpoint (default)": "checkpoint",
    "odekit checkpoint levels=3": odekit.Checkpoint(levels=3, max_directions=0),
    "odekit backsolve": "backsolve",
    "odekit interpolate": "interpolate",
}


def mlp_parameters(width: int, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
    """Weights (2 -> width -> width -> 2), N(0, 1/fan_in), zero biases."""
    sizes = [2, width, width, 2]
    keys = jax.random.split(jax.random.PRNGKey(seed), len(sizes) - 1)
    return [(jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.zeros(b))
            for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def mlp_field(y: jax.Array, params: list) -> jax.Array:
    """``MLP(y) - 0.1 y`` for a state ``y`` of shape (2,)."""
    h = y
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return h - 0.1 * y


def network_rates() -> np.ndarray:
    """The 34 log rate constants: 11 forward chain rates alternating fast
    (1e3, 3e3, ...) and slow (0.3, 0.5, ...), 11 backward rates (half the
    forward ones: fast equilibria between slow transfers, hence stiff), 10
    dimerisations (1 to 5), inflow, outflow."""
    steps = np.arange(NETWORK_SPECIES - 1)
    forward = np.where(steps % 2 == 0, 1e3 * (1.0 + steps), 0.3 + 0.1 * steps)
    dimer = np.linspace(1.0, 5.0, NETWORK_SPECIES - 2)
    return np.log(np.concatenate([forward, 0.5 * forward, dimer, [1.0, 0.3]]))


def network_field(y: jax.Array, log_k: jax.Array) -> jax.Array:
    """Right-hand side of the 12-species network, (12,) -> (12,)."""
    n = NETWORK_SPECIES
    k = jnp.exp(log_k)
    kf, kb = k[:n - 1], k[n - 1:2 * n - 2]
    kd, k_in, k_out = k[2 * n - 2:3 * n - 4], k[3 * n - 4], k[3 * n - 3]
    chain = kf * y[:-1] - kb * y[1:]                    # net A_i -> A_{i+1}
    dimer = kd * y[:-2] * y[1:-1]                       # A_i + A_{i+1} -> A_{i+2}
    dy = jnp.zeros(n).at[:-1].add(-chain).at[1:].add(chain)
    dy = dy.at[:-2].add(-dimer).at[1:-1].add(-dimer).at[2:].add(dimer)
    return dy.at[0].add(k_in).at[-1].add(-k_out * y[-1])


def _odekit_loss(field: Callable, y0: np.ndarray, ts: np.ndarray, method: str, tol: dict,
                 adjoint: Any) -> Callable:
    def loss(theta: Pytree) -> jax.Array:
        sol = odekit.solve_ivp(lambda t, y, p: field(y, p), (float(ts[0]), float(ts[-1])),
                               jnp.asarray(y0), t_eval=jnp.asarray(ts), args=(theta,),
                               method=method, adjoint=adjoint, **tol)
        return jnp.sum(sol.ys)
    return loss


def _diffrax_loss(field: Callable, y0: np.ndarray, ts: np.ndarray, solver: str, tol: dict,
                  adjoint: str) -> Callable:
    def loss(theta: Pytree) -> jax.Array:
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, p: field(y, p)), getattr(diffrax, solver)(),
            t0=float(ts[0]), t1=float(ts[-1]), dt0=None, y0=jnp.asarray(y0), args=theta,
            saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
            stepsize_controller=diffrax.PIDController(**tol),
            adjoint=getattr(diffrax, adjoint)(), max_steps=4096)
        return jnp.sum(sol.ys)
    return loss


def _flat(tree: Pytree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


def _memory_mib(fn: Callable, theta: Pytree) -> float:
    memory = fn.lower(theta).compile().memory_analysis()
    return (memory.temp_size_in_bytes + memory.argument_size_in_bytes
            + memory.output_size_in_bytes) / 2**20


def _first_call(make: Callable[[], Callable], theta: Pytree) -> float:
    jax.clear_caches()
    fn = make()
    start = time.perf_counter()
    harness.block(fn(theta))
    return time.perf_counter() - start


def _derivative(name: str) -> Callable:
    """``jax.jacfwd`` for the rows of forward sensitivities, else ``jax.grad``."""
    return jax.jacfwd if "forward" in name else jax.grad


def gradient_table(losses: dict[str, Callable[[], Callable]], theta: Pytree,
                   reference: np.ndarray, rounds: int, firsts: bool = True
                   ) -> tuple[list[str], list[list[str]], dict[str, float]]:
    """One row per loss: gradient time, first call, memory, error.

    ``losses`` maps a row name to a function building the (unjitted) loss;
    a row whose name says "forward" takes the gradient by ``jax.jacfwd``.
    """
    grads = {name: jax.jit(_derivative(name)(make())) for name, make in losses.items()}
    times = harness.interleaved_medians({n: (lambda g=g: g(theta)) for n, g in grads.items()},
                                        rounds=rounds)
    scale = np.max(np.abs(reference))
    peer = next((n for n in grads if n.startswith("diffrax RecursiveCheckpoint")), None)
    rows = []
    for name, grad in grads.items():
        error = np.max(np.abs(_flat(grad(theta)) - reference)) / scale
        first = (f"{_first_call(lambda m=losses[name], d=_derivative(name): jax.jit(d(m())), theta):.1f}"
                 if firsts else "-")
        ratio = f"{times[name] / times[peer]:.2f}" if peer else "-"
        rows.append([name, f"{times[name] * 1e3:.2f}", ratio, first,
                     f"{_memory_mib(grad, theta):.1f}", f"{error:.1e}"])
    header = ["adjoint", "gradient (ms)", "vs diffrax RecursiveCheckpoint", "first call (s)",
              "memory (MiB)", "rel. error"]
    return header, rows, times


def neural_table(width: int, rounds: int, firsts: bool = True):
    """The neural ODE with two hidden layers of ``width``: (header, rows, times, P)."""
    theta = mlp_parameters(width)
    size = int(sum(w.size + b.size for w, b in theta))
    make = lambda adjoint: (lambda: _odekit_loss(mlp_field, NEURAL_Y0, NEURAL_TS, "tsit5",
                                                 NEURAL_TOL, adjoint))
    losses = {name: make(adjoint) for name, adjoint in ODEKIT_ADJOINTS.items()}
    if diffrax is not None:
        for adjoint in ("RecursiveCheckpointAdjoint", "BacksolveAdjoint"):
            losses[f"diffrax {adjoint}"] = (lambda a=adjoint: _diffrax_loss(
                mlp_field, NEURAL_Y0, NEURAL_TS, "Tsit5", NEURAL_TOL, a))
    tight = dict(rtol=1e-11, atol=1e-11)
    reference = _flat(jax.jit(jax.grad(_odekit_loss(mlp_field, NEURAL_Y0, NEURAL_TS, "tsit5",
                                                    tight, "checkpoint")))(theta))
    return (*gradient_table(losses, theta, reference, rounds, firsts), size)


def network_table(rounds: int, firsts: bool = True):
    """The 34-parameter stiff network: (header, rows, times)."""
    theta = jnp.asarray(network_rates())
    y0 = np.zeros(NETWORK_SPECIES)
    make = lambda adjoint: (lambda: _odekit_loss(network_field, y0, NETWORK_TS, "rodas5p",
                                                 NETWORK_TOL, adjoint))
    # backsolve refuses stiff methods (it would integrate y backwards).
    adjoints = {n: a for n, a in ODEKIT_ADJOINTS.items() if a != "backsolve"}
    adjoints["odekit checkpoint, Jacobian (max_directions=34)"] = odekit.Checkpoint(
        max_directions=34)
    losses = {name: make(adjoint) for name, adjoint in adjoints.items()}
    losses["odekit forward (jacfwd)"] = lambda: _odekit_loss(
        network_field, y0, NETWORK_TS, "rodas5p", NETWORK_TOL, "forward")
    if diffrax is not None:
        losses["diffrax RecursiveCheckpointAdjoint"] = lambda: _diffrax_loss(
            network_field, y0, NETWORK_TS, "Kvaerno5", NETWORK_TOL, "RecursiveCheckpointAdjoint")
    tight = dict(rtol=1e-11, atol=1e-14)
    reference = _flat(jax.jit(jax.grad(_odekit_loss(network_field, y0, NETWORK_TS, "rodas5p",
                                                    tight, "checkpoint")))(theta))
    return gradient_table(losses, theta, reference, rounds, firsts)
