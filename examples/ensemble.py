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

Run: ``python examples/ensemble.py [--quick] [--side N] [--out DIR]`` (n = N^2
members); writes ensemble.png.
"""
from __future__ import annotations

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np

import odekit

G, T_END = 9.8, 10.0
TS = jnp.array([0.0, T_END])


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


def main():
    opts = _common.parse_args(__doc__, lambda parser: parser.add_argument(
        "--side", type=int, help="grid side N, n = N^2 members (default 32 quick, 256 full)"))
    side = opts.side or (32 if opts.quick else 256)
    batch = grid(side)
    devices = jax.devices()
    print(f"{side * side} pendulums on {len(devices)} device(s): "
          f"{', '.join(sorted({d.platform for d in devices}))}")
    energies = odekit.ensemble(energy_left, batch)
    shards = {s.device for s in energies.addressable_shards}
    print(f"result shape {energies.shape}, sharding {energies.sharding.spec} "
          f"over {len(energies.sharding.device_set)} device(s) ({len(shards)} addressable)")
    t_ensemble, t_vmap, plain = timings(batch, 3 if opts.quick else 5)
    energies = np.asarray(energies)
    print(f"odekit.ensemble: {1e3 * t_ensemble:.1f} ms ({side * side / t_ensemble:.3g} "
          f"pendulums/s); plain jit(vmap): {1e3 * t_vmap:.1f} ms; max difference "
          f"{np.max(np.abs(energies - plain)):.1e}")
    print(f"E(T) from {energies.min():.3e} to {energies.max():.3e}")
    plot(batch, energies, side, opts.out)


if __name__ == "__main__":
    main()
