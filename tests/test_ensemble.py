"""odekit.ensemble: vmap over a batch sharded along a 1-D device mesh.

The multi-device checks run in a subprocess that forces 4 host devices
(``XLA_FLAGS`` must be set before JAX starts)."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.ensemble import batch_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TS = jnp.linspace(0.0, 2.0, 5)


def pendulum(y, t, b, g):
    """theta'' = -b theta' - g sin(theta) as y = (theta, omega)."""
    return jnp.stack([y[1], -b * y[1] - g * jnp.sin(y[0])])


def solve(member):
    """One member {"y0": (2,), "b": ()} -> {"ys": (5, 2), "energy": ()}."""
    ys = odekit.odeint(pendulum, member["y0"], TS, member["b"], 9.8)
    theta, omega = ys[-1]
    return {"ys": ys, "energy": 0.5 * omega**2 + 9.8 * (1.0 - jnp.cos(theta))}


def make_batch(n):
    """A pytree batch of n pendulums: y0 (n, 2), damping b (n,)."""
    theta0 = jnp.linspace(0.1, 3.0, n)
    return {"y0": jnp.stack([theta0, jnp.zeros(n)], axis=1), "b": jnp.linspace(0.1, 0.5, n)}


@pytest.mark.parametrize("n", [1, 6])
def test_single_device_equals_vmap(n):
    batch = make_batch(n)
    out = odekit.ensemble(solve, batch)
    expected = jax.jit(jax.vmap(solve))(batch)
    assert jax.tree.structure(out) == jax.tree.structure(expected)
    assert out["ys"].shape == (n, 5, 2) and out["energy"].shape == (n,)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


def test_under_jit_with_explicit_mesh():
    batch = make_batch(3)
    out = jax.jit(lambda b: odekit.ensemble(solve, b, mesh=batch_mesh()))(batch)
    np.testing.assert_allclose(out["energy"], jax.vmap(solve)(batch)["energy"], rtol=1e-13)


def test_bad_batches():
    with pytest.raises(ValueError, match="different leading sizes"):
        odekit.ensemble(solve, {"y0": jnp.zeros((3, 2)), "b": jnp.zeros(4)})
    with pytest.raises(ValueError, match="scalar leaf"):
        odekit.ensemble(solve, {"y0": jnp.zeros((3, 2)), "b": jnp.float64(0.1)})
    with pytest.raises(ValueError, match="empty"):
        odekit.ensemble(solve, {"y0": jnp.zeros((0, 2)), "b": jnp.zeros(0)})
    mesh2d = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("a", "b"))
    with pytest.raises(ValueError, match="1-D"):
        odekit.ensemble(solve, make_batch(2), mesh=mesh2d)


# The subprocess: the same settings as conftest.py, 4 forced host devices;
# prints JSON with the results (single device and 4 devices) and shardings.
CHILD = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    sys.path.insert(0, sys.argv[1])
    import odekit
    from odekit.ensemble import batch_mesh
    from test_ensemble import make_batch, solve
    report = {"devices": jax.device_count()}
    for n in (8, 10):
        batch = make_batch(n)
        many = odekit.ensemble(solve, batch)
        one = odekit.ensemble(solve, batch, mesh=batch_mesh(jax.devices()[:1]))
        report[n] = {
            "many": np.asarray(many["ys"]).tolist(), "one": np.asarray(one["ys"]).tolist(),
            "energy_many": np.asarray(many["energy"]).tolist(),
            "energy_one": np.asarray(one["energy"]).tolist(),
            "devices_used": len(many["ys"].sharding.device_set),
            "spec": list(many["ys"].sharding.spec),
            "shard_rows": sorted({s.data.shape[0] for s in many["ys"].addressable_shards}),
        }
    # 5 members on 4 devices: padded to 8 with copies of member 4 (issue 27.20).
    def blow_up(k):   # y' = k y^2, y(0) = 1 blows up at t = 1/k: k = 3 fails
        return odekit.solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.ones(1), args=(k,),
                                t_eval=jnp.array([1.0])).ys[-1, 0]
    def pole(c):      # 1/(x - c) has a pole, no root, in the bracket
        return odekit.root(lambda x, c: 1.0 / (x - c), (-1.0, 2.0), c, method="bisection").x
    failures = {}
    for name, fn, ks in (("last", blow_up, [0.5, 0.5, 0.5, 0.5, 3.0]),
                         ("second", blow_up, [0.5, 3.0, 0.5, 0.5, 0.5]),
                         ("root", pole, [0.1, 0.2, 0.3, 0.4, 0.5])):
        try:
            np.asarray(odekit.ensemble(fn, jnp.array(ks)))
            failures[name] = None
        except odekit.status.ERRORS as error:
            failures[name] = odekit.status.failure_message(error)
    failures["status"] = np.asarray(odekit.ensemble(
        lambda k: odekit.solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 1.0), jnp.ones(1), args=(k,),
                                   throw=False).status, jnp.array([0.5, 0.5, 0.5, 0.5, 3.0]))).tolist()
    report["failures"] = failures
    print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def four_devices():
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", CHILD, os.path.dirname(__file__)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_four_devices_equal_single_device_and_sharded(four_devices):
    assert four_devices["devices"] == 4
    result = four_devices["8"]
    np.testing.assert_allclose(result["many"], result["one"], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(result["energy_many"], result["energy_one"], rtol=1e-12)
    assert result["devices_used"] == 4
    assert result["spec"] == ["batch"]
    assert result["shard_rows"] == [2]  # 8 members, 2 per device


def test_four_devices_batch_not_a_multiple(four_devices):
    result = four_devices["10"]  # padded to 12, trimmed to 10
    assert np.shape(result["many"]) == (10, 5, 2)
    np.testing.assert_allclose(result["many"], result["one"], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(result["energy_many"], result["energy_one"], rtol=1e-12)
    assert result["devices_used"] == 4
    expected = jax.vmap(solve)(make_batch(10))["ys"]
    np.testing.assert_allclose(result["many"], expected, rtol=1e-12, atol=1e-13)


def test_four_devices_failures_count_the_callers_members(four_devices):
    """Issue 27.20: 5 members are padded to 8 with copies of the last; a
    failure of member 4 said "4 of 8 members failed"."""
    failures = four_devices["failures"]
    assert "(1 of 5 batch members failed; the first is member 4)" in failures["last"]
    assert "(1 of 5 batch members failed; the first is member 1)" in failures["second"]
    assert "failed in 5 of 5 batch members; the first failed member, member 0" in failures["root"]
    assert failures["status"][:4] == [0, 0, 0, 0] and failures["status"][4] < 0
    assert len(failures["status"]) == 5
