"""odekit.ensemble over several processes (JAX's multi-controller runtime).

Each test starts ``N`` local CPU processes that call
``jax.distributed.initialize(coordinator_address="127.0.0.1:<free port>",
num_processes=N, process_id=i)``; the CPU collectives between them are
JAX's Gloo implementation (``jax_cpu_collectives_implementation``, the
default of jax 0.10). Every process then runs the same program (:data:`WORKER`)
over a global batch sharded over the global mesh (one CPU device per
process), gathers the results with :func:`odekit.ensemble.gather` and prints
them as JSON; the test compares every process's report with a
single-process ``jax.vmap`` in the pytest process.

The children are bounded in time (``TIMEOUT`` seconds in all, after which
they are killed) and always reaped, also when the test fails; the
coordinator listens on 127.0.0.1 only. CI runs every check with 2
processes (25 to 45 s on 2 shared cores) and the gathered ensemble with 4;
every check with 4 processes oversubscribes those cores and is marked
``long`` (``ODEKIT_LONG_TESTS=1``).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240.0   # seconds for all the children of one test together


# The model, shared by the workers (which import this module after
# jax.distributed.initialize) and by the single-process reference below.
# Nothing here may run a JAX computation at import time.

def pendulum(y, t, b, g):
    """theta'' = -b theta' - g sin(theta) as y = (theta, omega)."""
    return jnp.stack([y[1], -b * y[1] - g * jnp.sin(y[0])])


def solve(member, g=9.8):
    """One member {"theta0": (), "b": ()} -> {"ys": (4, 2), "energy": ()} at ts = 0, 1, 2, 3."""
    ts = jnp.linspace(0.0, 3.0, 4)
    y0 = jnp.stack([member["theta0"], jnp.zeros_like(member["theta0"])])
    ys = odekit.odeint(pendulum, y0, ts, member["b"], g)
    theta, omega = ys[-1]
    return {"ys": ys, "energy": 0.5 * omega ** 2 + g * (1.0 - jnp.cos(theta))}


def make_batch(n):
    """n pendulums as NumPy arrays (the same in every process): theta0 (n,), b (n,)."""
    return {"theta0": np.linspace(0.1, 3.0, n), "b": np.linspace(0.1, 0.5, n)}


def blow_up(k, throw=True):
    """y' = k y^2, y(0) = 1 on [0, 1]: blows up at t = 1/k, so k > 1 fails."""
    sol = odekit.solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.ones(1), args=(k,),
                           t_eval=jnp.array([1.0]), throw=throw)
    return {"y1": sol.ys[-1, 0], "status": sol.status}


KS = [0.5, 0.5, 3.0, 0.5, 0.5]   # member 2 fails; 5 members are padded on 2 and 4 devices


def mean_energy(b, g, batch, ensemble=odekit.ensemble):
    """The ensemble mean of the final energy as a function of the dampings
    b (n,) and the shared gravity g (), for grad."""
    return ensemble(lambda m: solve(m, g), {"theta0": batch["theta0"], "b": b})["energy"].mean()


# One process of N: argv = [port, N, process id, tests dir, batch size, parts]
# (parts "basic": the gathered ensemble only; "all": every check).
WORKER = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    port, count, index, tests, n = sys.argv[1:6]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=int(count),
                               process_id=int(index), initialization_timeout=60)
    import jax.numpy as jnp, numpy as np
    sys.path.insert(0, tests)
    import odekit
    from odekit.ensemble import batch_mesh, gather
    from test_multiprocess import KS, blow_up, make_batch, mean_energy, solve
    n = int(n)
    report = {"process": jax.process_index(), "processes": jax.process_count(),
              "devices": jax.device_count(), "local_devices": jax.local_device_count()}
    batch = make_batch(n)

    # 1. The full batch in every process; the result stays sharded over the processes.
    out = odekit.ensemble(solve, batch)
    report["addressable"] = out["ys"].is_fully_addressable
    report["local_rows"] = sorted(s.index[0].start for s in out["ys"].addressable_shards)
    report["shard_rows"] = sorted({s.data.shape[0] for s in out["ys"].addressable_shards})
    report["ensemble"] = jax.tree.map(lambda x: x.tolist(), gather(out))
    if sys.argv[6] == "basic":
        raise SystemExit(print(json.dumps(report), flush=True))

    # 2. Each process passes only its own rows, as one global array.
    sharding = jax.sharding.NamedSharding(batch_mesh(), jax.sharding.PartitionSpec("batch"))
    rows = n // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    local = {k: jax.make_array_from_process_local_data(sharding, v[mine]) for k, v in batch.items()}
    report["from_local"] = gather(odekit.ensemble(solve, local))["energy"].tolist()

    # 3. A failing member: throw=True raises in every process, throw=False gives statuses.
    try:
        gather(odekit.ensemble(blow_up, jnp.array(KS)))
        report["raised"] = None
    except odekit.status.ERRORS as error:
        report["raised"] = odekit.status.failure_message(error)
    statuses = gather(odekit.ensemble(lambda k: blow_up(k, throw=False), jnp.array(KS)))
    report["status"] = statuses["status"].tolist()
    report["y1"] = statuses["y1"].tolist()

    # 4. The gradient of an ensemble mean, to the per-member b and the shared g.
    grad = jax.grad(mean_energy, argnums=(0, 1))(jnp.asarray(batch["b"]), jnp.float64(9.8), batch)
    report["grad_b"], report["grad_g"] = (x.tolist() for x in gather(grad))
    report["seconds"] = time.perf_counter() - start
    print(json.dumps(report), flush=True)
""")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_processes(count: int, n: int, meanwhile: Callable[[], Any] = lambda: None,
                  parts: str = "all") -> tuple[list[dict], Any]:
    """Start ``count`` workers on one coordinator port, call ``meanwhile()``
    while they start up and run, wait at most ``TIMEOUT`` seconds (from the
    start) for all of them, kill whatever is left, and return each
    process's report (in process order) and what ``meanwhile`` returned."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    # the suite's compile flags (tests/conftest.py: half the children's time), without
    # the device count other test modules add: one CPU device per process
    env["XLA_FLAGS"] = " ".join(flag for flag in os.environ.get("XLA_FLAGS", "").split()
                                if "device_count" not in flag)
    port, tests = free_port(), os.path.dirname(os.path.abspath(__file__))
    procs = []
    try:
        for index in range(count):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", WORKER, str(port), str(count), str(index), tests, str(n),
                 parts],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + TIMEOUT
        extra = meanwhile()
        outputs = [proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                   for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    reports = []
    for index, (proc, (stdout, stderr)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"process {index} exited {proc.returncode}:\n{stderr[-4000:]}"
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    return reports, extra


def reference(n: int) -> dict:
    """What the workers compute, by a single-process vmap in this process."""
    batch = make_batch(n)
    plain_mean = lambda b, g, batch: mean_energy(b, g, batch, lambda f, x: jax.vmap(f)(x))
    grad = jax.grad(plain_mean, argnums=(0, 1))(jnp.asarray(batch["b"]), jnp.float64(9.8), batch)
    return {"expected": jax.jit(jax.vmap(solve))(batch), "grad": grad,
            "bad": jax.vmap(lambda k: blow_up(k, throw=False))(jnp.array(KS))}


def check(reports: list[dict], count: int, n: int, ref: dict) -> None:
    """Every process's report against the single-process reference ``ref``
    (only the gathered ensemble where ``ref`` holds only ``"expected"``)."""
    expected = ref["expected"]
    assert [r["process"] for r in reports] == list(range(count))
    for report in reports:
        assert report["processes"] == count and report["devices"] == count
        assert report["local_devices"] == 1
        # each process holds its own n / count rows of the result
        assert not report["addressable"]
        assert report["shard_rows"] == [n // count]
        assert report["local_rows"] == [report["process"] * (n // count)]
        np.testing.assert_allclose(report["ensemble"]["ys"], expected["ys"], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(report["ensemble"]["energy"], expected["energy"], rtol=1e-12)
        if "bad" not in ref:
            continue
        bad, (grad_b, grad_g) = ref["bad"], ref["grad"]
        np.testing.assert_allclose(report["from_local"], expected["energy"], rtol=1e-12)
        assert report["raised"] is not None, "throw=True did not raise in every process"
        assert "(1 of 5 batch members failed; the first is member 2)" in report["raised"]
        assert report["status"] == np.asarray(bad["status"]).tolist()
        assert report["status"][2] < 0 and report["status"][:2] == [0, 0]
        np.testing.assert_allclose(np.delete(report["y1"], 2), np.delete(bad["y1"], 2), rtol=1e-12)
        np.testing.assert_allclose(report["grad_b"], grad_b, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(report["grad_g"], grad_g, rtol=1e-9)


def test_two_processes():
    reports, ref = run_processes(2, 8, lambda: reference(8))
    check(reports, 2, 8, ref)


def test_four_processes_hold_and_gather_their_rows():
    """CI's 4-process run: the ensemble over the global mesh, each process's
    rows, the gathered result (the other checks: the long variant below)."""
    batch = make_batch(8)
    reports, ref = run_processes(4, 8, lambda: {"expected": jax.jit(jax.vmap(solve))(batch)},
                                 parts="basic")
    check(reports, 4, 8, ref)


@pytest.mark.long
def test_four_processes():
    reports, ref = run_processes(4, 8, lambda: reference(8))
    check(reports, 4, 8, ref)


@pytest.mark.long
def test_example_over_two_processes(tmp_path):
    """``examples/ensemble.py --processes 2`` runs the sweep over two workers
    and process 0 reports and plots the gathered result."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_NUMPY_DTYPE_PROMOTION="strict", JAX_NUMPY_RANK_PROMOTION="raise",
               MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ensemble.py"), "--quick",
                           "--side", "8", "--processes", "2", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT + 60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "64 pendulums on 2 processes" in proc.stdout, proc.stdout
    assert "this process holds 32 rows" in proc.stdout, proc.stdout
    assert (tmp_path / "ensemble.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
