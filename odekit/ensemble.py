"""Ensembles: one function mapped over a batch that is sharded over devices.

``ensemble(fn, batch)`` computes ``jax.vmap(fn)(batch)`` with the batch
axis split across a 1-D ``jax.sharding.Mesh`` (by default every device of
the process, or of every process after ``jax.distributed.initialize()``):
member ``i`` of the result is ``fn(batch[i])``, and the devices each solve
``ceil(n / d)`` members side by side. The same call runs on one CPU,
several GPUs or several hosts.

Over several processes (after ``jax.distributed.initialize()``, JAX's
multi-controller runtime) every process runs the same program: each passes
the batch (the same full batch as NumPy or local arrays, or one global
``jax.Array`` built from each process's own rows with
``jax.make_array_from_process_local_data``) and each gets the same global
result, a ``jax.Array`` of which a process holds only the rows on its own
devices. :func:`gather` copies the whole result to the host in every process.

A batch of ``n`` members on ``d`` devices is padded to ``m = d * ceil(n / d)``
members by repeating its last member (a valid input, so the padding cannot
make a solver fail or raise), and the result is trimmed back to ``n``.
Results agree with a plain ``jax.vmap(fn)(batch)`` to rounding: the sharded
program is compiled separately (and on several devices odekit does not use
its single-kernel CPU loop), so the last bits may differ.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from odekit import status
from odekit._programs import compiled

__all__ = ["ensemble", "batch_mesh", "gather"]

Pytree = Any


def batch_mesh(devices: Any = None, axis_name: str = "batch") -> Mesh:
    """A 1-D mesh over ``devices`` (default: ``jax.devices()``, all processes).

    Args:
      devices: a sequence of ``jax.Device``; None for every device.
      axis_name: the name of the mesh's single axis.

    Returns:
      ``Mesh`` of shape ``(len(devices),)`` with axis ``axis_name``.
    """
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (axis_name,))


def _batch_size(batch: Pytree) -> int:
    """The common leading-axis length of every leaf of ``batch``."""
    leaves = jax.tree.leaves(batch)
    if not leaves:
        raise ValueError("ensemble: `batch` has no array leaves to map over.")
    sizes = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in leaves}
    if None in sizes:
        raise ValueError("ensemble: every leaf of `batch` needs a leading batch axis; "
                         "found a scalar leaf.")
    if len(sizes) != 1:
        raise ValueError(f"ensemble: the leaves of `batch` have different leading sizes "
                         f"{sorted(sizes)}; they must all have the batch size.")
    size = sizes.pop()
    if size == 0:
        raise ValueError("ensemble: `batch` is empty (leading size 0).")
    return size


def _pad(batch: Pytree, pad: int) -> Pytree:
    """Append ``pad`` copies of the last member along the leading axis."""
    if pad == 0:
        return batch
    return jax.tree.map(
        lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)], axis=0), batch)


def _run(fn: Callable, size: int, sharding: NamedSharding, batch: Pytree) -> Pytree:
    """``vmap(fn)`` on the padded, sharded batch; results kept sharded, trimmed to ``size``.
    A solver failure inside ``fn`` counts and names members of the caller's
    batch, not the padding copies (:func:`odekit.status.padded_batch`)."""
    leaves = jax.tree.leaves(batch)
    with status.padded_batch(size, leaves[0].shape[0], leaves[0]):
        out = jax.vmap(fn)(jax.lax.with_sharding_constraint(batch, sharding))
    out = jax.lax.with_sharding_constraint(out, sharding)
    return jax.tree.map(lambda x: x[:size], out)


def ensemble(fn: Callable[[Pytree], Pytree], batch: Pytree, *,
             mesh: Mesh | None = None) -> Pytree:
    """``jax.vmap(fn)(batch)``, jitted, with the batch sharded over a device mesh.

    Args:
      fn: maps one member (a pytree like ``batch`` without its leading
        axis) to a pytree of arrays, e.g. a closure around
        ``odekit.solve_ivp``. It is traced once per batch size and mesh;
        pass the same function object to reuse the compiled code.
      batch: pytree whose leaves all have the leading shape ``(n, ...)``.
      mesh: a 1-D ``jax.sharding.Mesh``; None for ``batch_mesh()``, every
        device. Members are placed with ``NamedSharding(mesh, P(axis))``.

    Returns:
      The pytree ``fn`` returns with a leading axis of size ``n``: leaf
      ``(n, ...)`` holds ``fn(member i)`` in row ``i``. When ``n`` is a
      multiple of the device count ``d`` the result is sharded along that
      axis over the mesh (``n / d`` rows per device). Otherwise the batch
      is padded with copies of its last member to the next multiple of
      ``d``, solved sharded, and the extra rows are dropped; JAX cannot
      split ``n`` rows evenly over ``d`` devices, so this trimmed result
      is replicated on every device (choose ``n`` a multiple of ``d`` to
      keep large results sharded).

    Raises:
      ValueError: the mesh is not 1-D, or the leaves of ``batch`` do not
        share one non-zero leading size.

    Several processes: call it in every process with the same ``fn`` and
    either the same full batch (every process holds all of it on the host)
    or a global ``jax.Array`` batch (every process holds its own rows, e.g.
    from ``jax.make_array_from_process_local_data``). Every process gets the
    same global result and holds the rows of its own devices
    (``result.addressable_shards``); :func:`gather` brings all rows to every
    process. A failing member with ``throw=True`` raises in every process.

    Example::

        solve = lambda y0: odekit.odeint(pend, y0, ts, 0.25, 9.8)
        ys = odekit.ensemble(solve, y0s)   # y0s: (n, 2) -> ys: (n, len(ts), 2)
    """
    mesh = batch_mesh() if mesh is None else mesh
    if len(mesh.axis_names) != 1:
        raise ValueError(f"ensemble: `mesh` must be 1-D; got axes {mesh.axis_names}.")
    sharding = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    size = _batch_size(batch)
    padded = _pad(batch, -size % mesh.size)
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(padded)):
        padded = jax.device_put(padded, sharding)
    return compiled(_run, fn, size, sharding)(padded)


def gather(result: Pytree) -> Pytree:
    """The whole of ``result`` as NumPy arrays on the host of every process.

    Args:
      result: a pytree of arrays, e.g. what :func:`ensemble` returns. Over
        several processes its leaves are global ``jax.Array`` s of which
        each process holds only its own rows.

    Returns:
      The same pytree with every leaf a ``numpy.ndarray`` of the leaf's
      global shape, identical in every process. With one process this is
      ``jax.device_get``; a leaf that is not fully addressable is gathered
      with ``jax.experimental.multihost_utils.process_allgather`` (a
      collective over all processes, so every process must call
      ``gather`` with the same pytree, in the same order as its other
      computations). Only do this for results that fit in one host's
      memory; otherwise read each process's own rows from
      ``leaf.addressable_shards``.
    """
    def one(x: Any) -> np.ndarray:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(one, result)
