"""An ensemble of damped pendulums over a grid of (initial angle, damping),
solved in one call by odekit.ensemble: vmap over the batch, with the batch
sharded across every device JAX sees.

Model: theta'' = -b theta' - g sin(theta), y(0) = (theta0, 0), g = 9.8,
solved on [0, T] with odekit.odeint (dopri5, rtol = atol = 1e-8). Member i
of the batch is (theta0_i, b_i); the output is the energy left at T,
E_i = omega(T)^2 / 2 + g (1 - cos theta(T)), shape (n,). The same script runs
on one CPU, several GPUs (one batch slice per device) or several hosts after
jax.distributed.initialize(); to try several devices on a CPU set
XLA_FLAGS=--xla_force_host_platform_device_count=4 before starting.

``--processes P`` runs the same sweep over P local processes with JAX's
multi-controller runtime: this script starts P copies of itself (workers),
each calls ``jax.distributed.initialize`` on a coordinator at 127.0.0.1 and
owns one CPU device; every worker builds the same grid, calls the same
``odekit.ensemble`` and holds the rows of its own device; ``gather`` copies
the whole result to every worker, and worker 0 reports and plots it. On a
cluster, start one worker per host yourself (docs/ensembles-and-devices.md).

Run: ``python examples/ensemble.py [--quick] [--side N] [--processes P]
[--out DIR]`` (n = N^2 members); writes ensemble.png.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np

import odekit
from odekit.ensemble import gather

G, T_END = 9.8, 10.0
TS = np.array([0.0, T_END])   # NumPy: no JAX computation before jax.distributed.initialize
WORKER_ENV = "ODEKIT_ENSEMBLE_WORKER"   # "host:port,process count,process id" in a worker


def pendulum(y, t, b):
    """y = (theta, omega) -> (omega, -b omega - g sin theta); shapes (2,) -> (2,)."""
    return jnp.stack([y[1], -b * y[1] - G * jnp.sin(y[0])])


def energy_left(member):
    """member {"theta0": (), "b": ()} -> E(T) = omega^2 / 2 + g (1 - cos theta), shape ()."""
    y0 = jnp.stack([member["theta0"], jnp.zeros_like(member["theta0"])])
    theta, omega = odekit.odeint(pendulum, y0, TS, member["b"], rtol=1e-8, atol=1e-8)[-1]
    return 0.5 * omega ** 2 + G * (1.0 - jnp.cos(theta))


def grid(side):
    """The batch: theta0 in [0.1, pi - 0.01] x b in [0.02, 1], both (side^2,)."""
    theta0, b = jnp.meshgrid(jnp.linspace(0.1, jnp.pi - 0.01, side),
                             jnp.linspace(0.02, 1.0, side), indexing="ij")
    return {"theta0": theta0.ravel(), "b": b.ravel()}


def timings(batch, repeats):
    """Median seconds of odekit.ensemble and of a plain jitted vmap on the same batch."""
    plain = jax.jit(jax.vmap(energy_left))
    sharded = lambda: odekit.ensemble(energy_left, batch)
    return (_common.median_time(sharded, repeats),
            _common.median_time(lambda: plain(batch), repeats),
            np.asarray(plain(batch)))


def plot(batch, energies, side, out_dir):
    """Heat map of E(T) over (theta0, b)."""
    fig, ax = plt.subplots(figsize=(7, 5))
    image = ax.pcolormesh(np.asarray(batch["b"]).reshape(side, side),
                          np.asarray(batch["theta0"]).reshape(side, side),
                          np.log10(np.maximum(energies.reshape(side, side), 1e-300)),
                          shading="auto", cmap="viridis")
    fig.colorbar(image, ax=ax, label="log10 E(T = 10)")
    ax.set(xlabel="damping b", ylabel="initial angle theta0",
           title=f"{side * side} damped pendulums by odekit.ensemble")
    return _common.save_figure(fig, out_dir, "ensemble")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The example's own options: --side and --processes."""
    parser.add_argument("--side", type=int,
                        help="grid side N, n = N^2 members (default 32 quick, 256 full)")
    parser.add_argument("--processes", type=int, default=1,
                        help="run the sweep over this many local processes (jax.distributed)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(opts: argparse.Namespace) -> None:
    """Start ``opts.processes`` workers (this script, with WORKER_ENV set),
    print worker 0's report, and always reap them: a worker that fails or a
    run longer than the time limit ends every worker and exits non-zero."""
    count, port = opts.processes, free_port()
    limit = 300 if opts.quick else 3600
    args = [sys.executable, os.path.abspath(__file__), "--out", opts.out,
            "--processes", str(count)] + (["--quick"] if opts.quick else []) \
        + (["--side", str(opts.side)] if opts.side else [])
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one device per worker
    env["JAX_PLATFORMS"] = "cpu"
    start, procs = time.perf_counter(), []
    try:
        for index in range(count):
            env[WORKER_ENV] = f"127.0.0.1:{port},{count},{index}"
            procs.append(subprocess.Popen(args, env=dict(env), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = [proc.communicate(timeout=max(1.0, limit - (time.perf_counter() - start)))
                   for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    print("".join(line for line in outputs[0][0].splitlines(keepends=True)
                  if not line.startswith("[Gloo]")), end="")   # Gloo's connection notices
    failed = [i for i, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        for i in failed:
            print(f"worker {i} exited {procs[i].returncode}:\n{outputs[i][1][-3000:]}",
                  file=sys.stderr)
        sys.exit(1)
    print(f"{count} processes: {time.perf_counter() - start:.1f} s wall in all (start-up, "
          f"jax.distributed, compilation, the sweep, its timing repeats and the plot)")


def worker() -> None:
    """One of several processes: jax.distributed.initialize from WORKER_ENV,
    then the sweep. Every worker holds its own rows of the result; after
    ``gather`` every worker holds all of it, and worker 0 prints and plots."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=_common.OUT_DIR)
    opts = parser.parse_args()
    address, count, index = os.environ[WORKER_ENV].split(",")
    jax.distributed.initialize(coordinator_address=address, num_processes=int(count),
                               process_id=int(index), initialization_timeout=120)
    side = opts.side or (32 if opts.quick else 256)
    batch = grid(side)   # the same full grid in every process
    first = time.perf_counter()
    energies = jax.block_until_ready(odekit.ensemble(energy_left, batch))
    first = time.perf_counter() - first
    mine = sum(s.data.shape[0] for s in energies.addressable_shards)
    t_ensemble = _common.median_time(lambda: odekit.ensemble(energy_left, batch),
                                     3 if opts.quick else 5)
    t_gather = time.perf_counter()
    energies = gather(energies)   # every process: the whole (n,) result as NumPy
    t_gather = time.perf_counter() - t_gather
    if jax.process_index() != 0:
        return
    print(f"{side * side} pendulums on {jax.process_count()} processes, {jax.device_count()} "
          f"device(s) in all; this process holds {mine} rows of the result")
    check = np.arange(0, side * side, max(1, side * side // 64))   # 64 members on one device
    local = jax.device_put({k: v[check] for k, v in batch.items()}, jax.local_devices()[0])
    plain = np.asarray(jax.jit(jax.vmap(energy_left))(local))
    print(f"odekit.ensemble: {1e3 * t_ensemble:.1f} ms ({side * side / t_ensemble:.3g} "
          f"pendulums/s); first call {first:.2f} s; gather {1e3 * t_gather:.1f} ms; max "
          f"difference from jit(vmap) on one device, {check.size} members: "
          f"{np.max(np.abs(energies[check] - plain)):.1e}")
    print(f"E(T) from {energies.min():.3e} to {energies.max():.3e}")
    plot(batch, energies, side, opts.out)


def main():
    opts = _common.parse_args(__doc__, add_arguments)
    if opts.processes > 1:
        launch(opts)
        return
    side = opts.side or (32 if opts.quick else 256)
    batch = grid(side)
    devices = jax.devices()
    print(f"{side * side} pendulums on {len(devices)} device(s): "
          f"{', '.join(sorted({d.platform for d in devices}))}")
    first = time.perf_counter()
    energies = jax.block_until_ready(odekit.ensemble(energy_left, batch))
    first = time.perf_counter() - first
    shards = {s.device for s in energies.addressable_shards}
    print(f"result shape {energies.shape}, sharding {energies.sharding.spec} "
          f"over {len(energies.sharding.device_set)} device(s) ({len(shards)} addressable)")
    t_ensemble, t_vmap, plain = timings(batch, 3 if opts.quick else 5)
    energies = np.asarray(energies)
    print(f"odekit.ensemble: {1e3 * t_ensemble:.1f} ms ({side * side / t_ensemble:.3g} "
          f"pendulums/s); first call {first:.2f} s; plain jit(vmap): {1e3 * t_vmap:.1f} ms; "
          f"max difference "
          f"{np.max(np.abs(energies - plain)):.1e}")
    print(f"E(T) from {energies.min():.3e} to {energies.max():.3e}")
    plot(batch, energies, side, opts.out)


if __name__ == "__main__":
    worker() if WORKER_ENV in os.environ else main()
