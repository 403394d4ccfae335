"""Cases an adversarial pass found in the failure machinery (issue 17, items 6,
9 and 10): a failing member of a sharded batch aborted the process, a caught
failure wrote tracebacks to stderr, and the CPU-only single-kernel tag was
chosen from the default backend rather than from where the solve runs.
Multi-device cases run in one subprocess, which sets the device count before
JAX starts and cannot hang or kill pytest (XLA aborted after 40 s)."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import status
from odekit.ode.engine import single_kernel

# --- item 6: a failing member of a batch placed over four devices -----------

SHARDED_FAILURES = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax import shard_map
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import odekit
    from odekit import status

    mesh = Mesh(np.array(jax.devices()), ("b",))
    place = lambda x: jax.device_put(x, NamedSharding(mesh, P("b")))
    y0 = jnp.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 5.0])   # y' = y^2 blows up at t = 1/y0
    ts = jnp.array([0.0, 1.0])
    blow_up = lambda y, t: y ** 2

    def fails(solve, x, expected):
        try:
            np.asarray(solve(x))
        except status.ERRORS as error:
            message = status.failure_message(error)
            assert message is not None and expected in message, message
            return
        raise AssertionError(f"no error; expected {expected!r}")

    for switch in ("1", "0"):   # the single kernel is off over several devices either way
        os.environ["ODEKIT_SINGLE_KERNEL"] = switch
        solve = jax.jit(jax.vmap(lambda y: odekit.odeint(blow_up, y, ts)))
        fails(solve, place(y0), "odekit.odeint (dopri5) failed (1 of 8 batch members failed; "
                                "the first is batch member 7 of 8)")
        np.testing.assert_allclose(solve(place(0.1 * y0))[:, 1], 0.1 * y0 / (1 - 0.1 * y0),
                                   rtol=1e-6)
        fails(solve, place(y0), "batch member 7 of 8")   # after a success: JAX's fast path

    ivp = lambda throw: jax.jit(jax.vmap(lambda y: odekit.solve_ivp(
        lambda t, y: y ** 2, (0.0, 1.0), y, throw=throw).status))
    fails(ivp(True), place(y0), "(1 of 8 batch members failed; the first is member 7)")
    assert np.asarray(ivp(False)(place(y0))).tolist() == [0] * 7 + [status.STEP_UNDERFLOW]

    # root: x^2 = 1 - c has no real root for c = 5
    root = lambda method, throw: jax.jit(jax.vmap(lambda c: odekit.root(
        lambda x, c: x ** 2 + c - 1.0, 1.0, c, method=method, throw=throw).success))
    for method in ("newton", "broyden"):
        fails(root(method, True), place(y0), "failed in 1 of 8 batch members")
        assert np.asarray(root(method, False)(place(y0))).tolist() == [True] * 7 + [False]
    # fixed_point: x = c x + 1 contracts slowly for c near 1: out of steps there
    rate = place(jnp.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.999]))
    fixed = jax.jit(jax.vmap(lambda c: odekit.fixed_point(lambda x, c: c * x + 1.0, 0.0, c,
                                                          max_steps=100).x))
    fails(fixed, rate, "1 of 8")

    # shard_map, a collective after the solve: every device must stop together.
    # A 2 x 2 mesh with the batch split along "a" (each member on two devices):
    # the message counts each member once.
    grid = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "c"))
    def body(y):
        ys = jax.vmap(lambda y: odekit.odeint(blow_up, y, ts))(y)
        return ys + jax.lax.psum(ys.sum(), "a")
    sharded = jax.jit(shard_map(body, mesh=grid, in_specs=P("a"), out_specs=P(None, "a")))
    fails(sharded, y0, "1 of 8 batch members failed; the first is batch member 7 of 8")
    print("ok")
""")


def test_a_failing_member_of_a_sharded_batch_raises_and_the_process_lives():
    """odeint (single kernel on and off), solve_ivp, root (newton, broyden),
    fixed_point and shard_map with a psum: each raises (or returns its status
    with throw=False); before, a callback raised on device 0 while the others
    waited in an all-reduce, and XLA aborted after 40 s. Nothing on stderr: no
    rendezvous warning, no "pure_callback failed", no traceback at exit."""
    done = subprocess.run([sys.executable, "-c", SHARDED_FAILURES], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    for noise in ("rendezvous", "pure_callback", "Traceback", "Exception ignored"):
        assert noise not in done.stderr, done.stderr[-3000:]


# --- item 9: the exception under jit, its message, and stderr ---------------

@pytest.mark.parametrize("solver", ["odeint", "root"])
def test_a_caught_failure_names_the_solver_and_leaves_stderr_clean(solver, capfd):
    if solver == "odeint":
        solve = lambda y0: odekit.odeint(lambda y, t: y ** 2, y0, jnp.array([0.0, 1.0]))
        good, bad, expected = 0.5, 5.0, "odekit.odeint (dopri5) failed"   # y' = y^2 blows up
    else:
        solve = lambda c: odekit.root(lambda x, c: x ** 2 - c, 1.0, c).x
        good, bad, expected = 2.0, -2.0, "odekit.root(method='newton') failed"
    caught = []
    for calls in ([bad], [good, bad]):   # the compiling call; the fast path after a success
        compiled = jax.jit(lambda x: solve(x))
        for x in calls:
            try:
                compiled(x).block_until_ready()
            except status.ERRORS as error:
                caught.append(error)
    assert [type(e) for e in caught] == [jax.errors.JaxRuntimeError, ValueError]
    assert all(status.failure_message(e).startswith(expected) for e in caught)
    assert capfd.readouterr().err == ""


# --- item 10: the CPU-only kernel is chosen by the lowering platform ---------

TAG = 'xla_cpu_small_call = "true"'


def pendulum(t, y):
    return jnp.stack([y[1], -jnp.sin(y[0])])


def solve_batch(y0s):
    return jax.vmap(lambda y0: odekit.solve_ivp(pendulum, (0.0, 1.0), y0, throw=False).ys)(y0s)


@pytest.fixture
def switched_on(monkeypatch):
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "1")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="traces for the CPU")
def test_a_program_traced_on_the_cpu_holds_the_tag_only_for_the_cpu(switched_on):
    """One trace, lowered for several platforms (JAX lowers for the platform
    of the devices the inputs are on): the CPU-only tag and the member loop
    appear for the CPU alone; elsewhere the loop is untagged and batched."""
    traced = jax.jit(solve_batch).trace(jnp.ones((3, 2)))
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    assert TAG in cpu
    for platform in ("cuda", "rocm", "tpu"):
        text = traced.lower(lowering_platforms=(platform,)).as_text()
        assert TAG not in text and "stablehlo.while" in text, platform
    both = traced.lower(lowering_platforms=("cpu", "cuda")).as_text()
    assert TAG in both   # chosen when the executable is compiled for one of them
    np.testing.assert_allclose(jax.jit(solve_batch)(jnp.ones((3, 2))),
                               jax.vmap(lambda y0: odekit.solve_ivp(
                                   pendulum, (0.0, 1.0), y0, throw=False).ys)(jnp.ones((3, 2))),
                               rtol=1e-12)


def test_the_trace_time_guess_follows_placement_not_only_the_default_backend(monkeypatch):
    """Simulated: a default backend that is no CPU, with and without a CPU
    default device, and committed operands. The guess only decides whether
    the tagged loop is traced at all; the lowering platform decides its use."""
    y = jnp.ones(2)
    f = lambda y, t: -y
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert single_kernel.likely_platform(y) == "gpu"
    assert not single_kernel.eligible(f, y, 0.0)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        assert single_kernel.likely_platform(y) == "cpu"
        assert single_kernel.eligible(f, y, 0.0)
    with jax.default_device("cpu"):
        assert single_kernel.likely_platform(y) == "cpu"
    assert single_kernel.likely_platform(jax.device_put(y, cpu)) == "cpu"
    monkeypatch.setattr(single_kernel, "_cpu_device_count", lambda: 4)
    with jax.default_device(cpu):
        assert not single_kernel.eligible(f, y, 0.0)   # a sharded batch would break the tag
