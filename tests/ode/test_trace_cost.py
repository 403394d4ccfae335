"""What a first call traces: the solver binds lax primitives, not jitted
jax.numpy wrappers (each a cache lookup per call and a trace per signature,
dropped by jax.clear_caches; the pendulum benchmark's first-call figure
depends on it), and the failure message still names the output time the
solve did not reach (found on the host from the output grid)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import odekit
from odekit import status

# Names of jitted jax.numpy helpers seen in odekit's trace before it bound
# lax primitives (jax 0.10.2): the public functions and their private kernels.
WRAPPERS = set(dir(jnp)) | {"_where", "_broadcast_arrays", "_reduce_sum", "_reduce_all",
                            "_reduce_any", "_reduce_min", "_reduce_max", "_power", "_squeeze",
                            "dynamic_index_in_dim", "dynamic_update_index_in_dim"}


def _jit_names(jaxpr, names):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("pjit", "jit"):
            names.append(eqn.params["name"])
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (tuple, list)) else [param]):
                if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                    _jit_names(sub.jaxpr, names)
                elif hasattr(sub, "eqns"):
                    _jit_names(sub, names)
    return names


def oscillator(y, t, k):
    # lax only, so that every wrapper in the trace would be odekit's
    return lax.concatenate([y[1:], lax.neg(lax.mul(k, y[:1]))], 0)


@pytest.mark.parametrize("method", ["dopri5", "tsit5", "dopri8"])
def test_odeint_traces_no_jax_numpy_wrapper(method):
    ts = np.linspace(0.0, 1.0, 11)
    solve = lambda y0, k: odekit.odeint(oscillator, y0, ts, k, method=method)
    jax.clear_caches()
    jaxpr = jax.make_jaxpr(solve)(jnp.array([1.0, 0.0]), 2.0)
    names = _jit_names(jaxpr.jaxpr, [])
    assert names, "expected odeint's own jitted functions"
    assert not [n for n in names if n in WRAPPERS], names
    # and the values are right: y = cos(sqrt(k) t)
    ys = jax.jit(solve)(jnp.array([1.0, 0.0]), 2.0)
    np.testing.assert_allclose(ys[:, 0], np.cos(np.sqrt(2.0) * ts), atol=1e-7)


def _message(fn, *args):
    with pytest.raises(status.ERRORS) as info:
        jax.block_until_ready(fn(*args))
    text = status.failure_message(info.value)
    assert text is not None
    return text


def test_failure_message_names_the_first_output_time_not_reached():
    ts = jnp.array([0.0, 0.25, 0.5, 1.0])
    fast = lambda y, t, k: -k * y
    text = _message(jax.jit(lambda k: odekit.odeint(fast, 1.0, ts, k, mxstep=3)), 1e3)
    assert "maximum number of steps" in text
    assert "before the output time t=0.25 " in text


def test_failure_message_under_vmap_uses_the_failing_members_grid():
    fast = lambda y, t, k: -k * y
    grids = jnp.array([[0.0, 0.5, 1.0, 2.0], [0.0, 0.125, 1.0, 2.0]])
    ks = jnp.array([1.0, 1e3])     # only member 1 runs out of steps
    solve = jax.vmap(lambda t, k: odekit.odeint(fast, 1.0, t, k, mxstep=20))
    text = _message(solve, grids, ks)
    assert "1 of 2 batch members failed; the first is batch member 1" in text
    assert "before the output time t=0.125 " in text
    # a grid shared by the members (unbatched) is broadcast to each of them
    shared = jax.vmap(lambda k: odekit.odeint(fast, 1.0, grids[1], k, mxstep=20))
    assert "before the output time t=0.125 " in _message(shared, ks)
