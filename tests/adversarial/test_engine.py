"""Cases an adversarial pass found in the ODE engine (issue 17): each failed, crashed or
returned a confident wrong number before its fix. Multi-device cases run in
a subprocess, which must set the device count before JAX starts."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit


def test_large_start_time_fails_or_is_right_never_silently_wrong():
    decay = lambda y, t: -y
    exact = np.exp(-10.0)
    for t0 in (0.0, 1e10, 1e13):   # y advances by the step t really takes (ulp(1e13) = 2e-3)
        ys = odekit.odeint(decay, 1.0, jnp.array([t0, t0 + 10.0]), rtol=1e-10, atol=1e-12)
        assert abs(float(ys[-1]) - exact) < 1e-8 * exact, t0   # 3.2e-9 at every t0
    with pytest.raises(odekit.ODESolverError, match="step size underflowed"):
        odekit.odeint(decay, 1.0, jnp.array([1e16, 1e16 + 10.0]))   # ulp(1e16) = 2: t + h == t


def test_float32_start_time_beyond_its_resolution_fails():
    with pytest.raises(odekit.ODESolverError, match="step size underflowed"):
        odekit.odeint(lambda y, t: -y, jnp.float32(1.0),
                      jnp.array([1e7, 1e7 + 10.0], jnp.float32), rtol=1e-6, atol=1e-6)


def test_more_than_4096_output_times():
    ys = odekit.odeint(lambda y, t: -y, 1.0, jnp.linspace(0.0, 1.0, 4097))
    np.testing.assert_allclose(ys, np.exp(-np.linspace(0.0, 1.0, 4097)), rtol=1e-7)


def test_times_ending_at_infinity_are_a_trace_time_error():
    with pytest.raises(ValueError, match="t must be finite"):
        odekit.odeint(lambda y, t: -y, 1.0, jnp.array([0.0, jnp.inf]))


def test_scipy_argument_order_passed_to_odeint_gets_a_hint():
    with pytest.raises(TypeError, match="func\\(y, t, \\*args\\).*solve_ivp"):
        odekit.odeint(lambda t, y: jnp.stack([y[1], -y[0]]), jnp.array([1.0, 0.0]),
                      jnp.array([0.0, 1.0]))


def test_float32_times_with_a_float64_state_are_computed_in_float64():
    t32 = jnp.linspace(0.0, 10.0, 11, dtype=jnp.float32)
    f = lambda y, t: jnp.stack([y[1], -jnp.sin(y[0])])
    y0 = jnp.array([1.0, 0.0])
    np.testing.assert_allclose(odekit.odeint(f, y0, t32, rtol=1e-11, atol=1e-11),
                               odekit.odeint(f, y0, t32.astype(jnp.float64), rtol=1e-11,
                                             atol=1e-11), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fn", [odekit.expit, odekit.logit, odekit.special.log_expit,
                                odekit.special.softplus])
def test_forward_mode_of_special_functions_with_python_scalars(fn):
    value, tangent = jax.jvp(fn, (0.3,), (1.0,))
    np.testing.assert_allclose(tangent, jax.grad(fn)(0.3), rtol=1e-6)


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import odekit
    mesh = Mesh(np.array(jax.devices()), ("b",))
    y0 = jnp.linspace(0.5, 2.0, 8)[:, None] * jnp.ones((8, 2))
    placed = jax.device_put(y0, NamedSharding(mesh, P("b")))
    f = lambda y, t: jnp.stack([y[1], -jnp.sin(y[0])])
    ts = jnp.linspace(0.0, 5.0, 11)
    solve = jax.vmap(lambda y: odekit.odeint(f, y, ts))
    ref = np.asarray(solve(y0))
    out = jax.jit(solve)(placed)
    assert np.max(np.abs(np.asarray(out) - ref)) < 1e-12
    assert len(out.sharding.device_set) == 4, out.sharding
    ivp = jax.jit(jax.vmap(lambda y: odekit.solve_ivp(lambda t, y: f(y, t), (0.0, 5.0), y,
                                                      t_eval=ts, rtol=1.4e-8, atol=1.4e-8,
                                                      method="dopri5").ys))(placed)
    assert np.max(np.abs(np.asarray(ivp) - ref)) < 1e-6
    print("ok")
""")


def test_a_batch_sharded_over_four_devices():
    done = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


SHARD_MAP = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax import shard_map
    from jax.sharding import Mesh, PartitionSpec as P
    import odekit
    mesh = Mesh(np.array(jax.devices()), ("b",))
    y0 = jnp.linspace(0.5, 2.0, 8)[:, None] * jnp.ones((8, 2))
    f = lambda y, t: jnp.stack([y[1], -jnp.sin(y[0])])
    ts = jnp.linspace(0.0, 5.0, 11)
    batch = jax.vmap(lambda y: odekit.odeint(f, y, ts))
    sharded = shard_map(batch, mesh=mesh, in_specs=P("b"), out_specs=P("b"))
    assert np.max(np.abs(jax.jit(sharded)(y0) - batch(y0))) < 1e-12
    grad = lambda solve: jax.grad(lambda y0: solve(y0).sum())(y0)
    assert np.max(np.abs(jax.jit(lambda y: grad(sharded))(y0) - grad(batch))) < 1e-10
    print("ok")
""")


def test_shard_map_of_a_vmapped_solve_and_its_gradient():
    done = subprocess.run([sys.executable, "-c", SHARD_MAP], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
