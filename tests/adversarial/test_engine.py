"""Cases an adversarial pass found in the ODE engine (issue 17): each failed, crashed or
returned a confident wrong number before its fix. Multi-device cases run in
a subprocess, which must set the device count before JAX starts."""
import fcntl
import json
import os
import subprocess
import sys
import textwrap
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.testing.problems import get_problem, reference_solution


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
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
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


def test_a_batch_sharded_over_four_devices(four_devices):
    four_devices("SHARDED")


SHARD_MAP = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
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
    # The same start on every shard, a parameter that differs (func was once
    # closure-converted from an invariant y0, so its jaxpr failed on the loop's
    # varying state): values and the backsolve gradient.
    ks = jnp.linspace(0.5, 2.0, 8)
    decay = lambda k: odekit.odeint(lambda y, t, k: -k * y, jnp.ones(2), jnp.array([0., 1.]), k)
    per_k = shard_map(jax.vmap(lambda k: decay(k)[-1].sum()), mesh=mesh, in_specs=P("b"),
                      out_specs=P("b"))
    assert np.max(np.abs(jax.jit(per_k)(ks) - 2 * np.exp(-ks))) < 1e-6
    dk = jax.jit(jax.grad(lambda k: per_k(k).sum()))(ks)
    assert np.max(np.abs(dk + 2 * np.exp(-ks))) < 1e-6
    print("ok")
""")


SHARD_MAP_ADJOINTS = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax import shard_map
    from jax.sharding import Mesh, PartitionSpec as P
    import odekit
    mesh = Mesh(np.array(jax.devices()), ("b",))
    y0 = jnp.linspace(0.5, 2.0, 8)[:, None] * jnp.ones((8, 2))
    f = lambda y, t, k: jnp.stack([y[1], -k * jnp.sin(y[0])])
    ts = jnp.linspace(0.0, 5.0, 11)
    close = lambda a, b, tol: max(float(np.max(np.abs(x - y)))
                                  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))) < tol
    # one parameter shared by every shard (P()): each adjoint's derivative
    # (for k a psum over the shards) against the unsharded batch's by backsolve
    def batch(adjoint):
        return jax.vmap(lambda y, k: odekit.odeint(f, y, ts, k, adjoint=adjoint)[-1].sum(),
                        in_axes=(0, None))
    dk = lambda s: jax.jacfwd(lambda k: s(y0, k))(1.3)
    adjoints = [name for name in os.environ["ADJOINTS"].split(",") if name]
    if adjoints:
        reference = jax.jit(lambda: jax.jacrev(lambda k: batch("backsolve")(y0, k))(1.3))()
    for adjoint in adjoints:
        sharded = shard_map(batch(adjoint), mesh=mesh, in_specs=(P("b"), P()), out_specs=P("b"))
        if adjoint == "forward":
            found = jax.jit(lambda: dk(sharded))()
        else:
            found = jax.jit(lambda: jax.grad(lambda k: sharded(y0, k).sum())(1.3))()
            reference_sum = jnp.sum(reference)
            assert close(found, reference_sum, 1e-6 * float(jnp.abs(reference_sum))), adjoint
            continue
        assert close(found, reference, 1e-6 * float(jnp.max(jnp.abs(reference)))), adjoint
    if os.environ.get("WITH_EVENT") != "1":
        raise SystemExit(print("ok"))
    # solve_ivp (checkpoint, its default) with an event, a parameter per member
    def final(y, k):
        return odekit.solve_ivp(lambda t, y, k: f(y, t, k), (0.0, 5.0), y, args=(k,), t_eval=ts,
                                events=lambda t, y, k: y[0]).ys[-1].sum()
    ks = jnp.linspace(1.0, 1.5, 8)
    batch = jax.vmap(final)
    sharded = shard_map(batch, mesh=mesh, in_specs=(P("b"), P("b")), out_specs=P("b"))
    grad = lambda s: jax.grad(lambda k: s(y0, k).sum())(ks)
    assert close(jax.jit(lambda: grad(sharded))(), grad(batch), 1e-10)
    print("ok")
""")


@pytest.mark.parametrize("adjoints, with_event", [
    ("", "1"),
    pytest.param("checkpoint,forward", "1", marks=pytest.mark.long),
    pytest.param("backsolve,interpolate", "0", marks=pytest.mark.long),
])
def test_every_adjoint_inside_shard_map_with_a_shared_parameter(adjoints, with_event,
                                                                four_devices):
    """Inside shard_map the checkpoint, interpolate and forward derivatives
    failed with JAX's varying-axes type errors, solve_ivp with an event even
    undifferentiated, and backsolve with a parameter shared by the shards.
    (CI runs the event's part, solve_ivp's default checkpoint gradient, in
    the module's shared subprocess; the shared parameter by every adjoint,
    each in a subprocess of its own, with ODEKIT_LONG_TESTS=1.)"""
    if (adjoints, with_event) == SHARED_RUN_ADJOINTS:
        four_devices("SHARD_MAP_ADJOINTS")
        return
    env = dict(os.environ, ADJOINTS=adjoints, WITH_EVENT=with_event)
    done = subprocess.run([sys.executable, "-c", SHARD_MAP_ADJOINTS], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


# The three four-device scripts CI runs share one subprocess (one start of
# Python, JAX and odekit instead of three: 13% less time): each runs in its
# own namespace, and its test reads its own outcome.
SHARED_RUN_ADJOINTS = ("", "1")      # SHARD_MAP_ADJOINTS's variables in the shared run
RUNNER = textwrap.dedent("""
    import os, sys, traceback
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    for name, script in SCRIPTS.items():
        print(f"<<{name}>>", flush=True)
        try:
            exec(compile(script, name, "exec"), {"__name__": "__main__"})
        except SystemExit as done:       # the scripts' early "ok"
            if done.code not in (None, 0):
                print(f"<<{name} failed>> exit {done.code}", flush=True)
                continue
        except BaseException:
            print(f"<<{name} failed>>\\n" + traceback.format_exc(), flush=True)
            continue
        print(f"<<{name} passed>>", flush=True)
""")


def _run_the_shared_subprocess() -> dict:
    scripts = {n: globals()[n] for n in ("SHARDED", "SHARD_MAP", "SHARD_MAP_ADJOINTS")}
    adjoints, with_event = SHARED_RUN_ADJOINTS
    env = dict(os.environ, ADJOINTS=adjoints, WITH_EVENT=with_event)
    done = subprocess.run([sys.executable, "-c", f"SCRIPTS = {scripts!r}\n" + RUNNER],
                          capture_output=True, text=True, timeout=600, env=env)
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory, worker_id):
    """Runs SHARDED, SHARD_MAP and SHARD_MAP_ADJOINTS (the event's part) in
    one subprocess, once per run (pytest-xdist's workers share it through a
    file under the run's temporary folder, its lock held while it runs);
    returns a check of one script's outcome."""
    outcome = {}

    def check(name):
        if not outcome and worker_id == "master":
            outcome.update(_run_the_shared_subprocess())
        elif not outcome:
            shared = tmp_path_factory.getbasetemp().parent / "odekit-four-devices.json"
            with open(shared.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not shared.exists():
                    shared.write_text(json.dumps(_run_the_shared_subprocess()))
                outcome.update(json.loads(shared.read_text()))
        done = SimpleNamespace(**outcome)
        parts, current = {}, None
        for line in done.stdout.splitlines():
            if line.startswith("<<") and line.endswith(">>") and " " not in line:
                current = parts[line[2:-2]] = []      # a script's start
            elif current is not None:
                current.append(line)
        assert name in parts, \
            f"{name} did not start (exit {done.returncode}):\n{done.stderr[-3000:]}"
        part = parts[name]
        assert part[-2:] == ["ok", f"<<{name} passed>>"], \
            "\n".join(part)[-3000:] + "\n" + done.stderr[-3000:]

    return check


def test_shard_map_of_a_vmapped_solve_and_its_gradient(four_devices):
    four_devices("SHARD_MAP")


# --- item 2: tolerances below the state's precision -------------------------

def test_rtol_below_the_state_precision_is_raised_with_a_warning():
    """bfloat16 y0 = [1, 2] at odeint's defaults froze at y(1) = [0.957, 1.914]
    (exact [0.368, 0.736]) after 22,758 'successful' steps."""
    decay = lambda y, t: -y
    exact = np.exp(-1.0) * np.array([1.0, 2.0])
    with pytest.warns(UserWarning, match="below the precision of the bfloat16 state"):
        ys = odekit.odeint(decay, jnp.array([1.0, 2.0], jnp.bfloat16), jnp.array([0.0, 1.0]))
    assert ys.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(ys[-1], np.float64), exact, rtol=0.03)
    with pytest.warns(UserWarning, match=r"rtol=1e-12 is below the precision of the float32"):
        sol = odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.array([1.0, 2.0], jnp.float32),
                               t_eval=jnp.array([1.0]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(sol.ys[-1], np.float64), exact, rtol=2e-6)


def test_float32_at_odeint_defaults_keeps_its_tolerance_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ys = odekit.odeint(lambda y, t: -y, jnp.array([1.0, 2.0], jnp.float32),
                           jnp.array([0.0, 1.0], jnp.float32))
    np.testing.assert_allclose(np.asarray(ys[-1], np.float64),
                               np.exp(-1.0) * np.array([1.0, 2.0]), rtol=1e-6)


def test_a_state_that_stops_moving_fails_as_stalled():
    """Pure absolute control (rtol=0) far below float32's resolution of y: steps
    shrink until h f is lost to rounding and y freezes while f is not zero."""
    decay = lambda y, t: -y
    y0, t = jnp.array([1.0, 2.0], jnp.float32), jnp.array([0.0, 1.0])   # float64 times
    with pytest.raises(odekit.ODESolverError, match="stopped changing.*more precise dtype"):
        odekit.odeint(decay, y0, t, rtol=0.0, atol=1e-15)
    sol = odekit.solve_ivp(lambda s, y: -y, (0.0, 1.0), y0, rtol=0.0, atol=1e-15, throw=False)
    assert int(sol.status) == odekit.status.STALLED and not bool(sol.success)
    assert float(sol.ts[sol.num_points - 1]) < 1.0


def test_rounding_noise_at_a_steady_state_is_not_a_stall():
    """f is rounding noise where y sits still (y' = 10 (y / 10) - y), or tends
    to 0 (logistic growth): no step loses a change the tolerance would see."""
    for func in (lambda y, t: 10.0 * (0.1 * y) - y, lambda y, t: y * (1.0 - y)):
        ys = odekit.odeint(func, jnp.array([0.3, 1.0, 0.5], jnp.float32),
                           jnp.array([0.0, 1000.0], jnp.float32))
        assert bool(jnp.all(jnp.isfinite(ys)))


def test_an_explicit_method_at_its_stability_limit_near_an_equilibrium_is_not_a_stall():
    """A 3-step enzyme pathway relaxing to x* = (1/6, 1/2, 1): near x* tsit5
    steps at its stability limit, where the stages cancel and y stays put
    with f ~ 5e-11 (within the tolerance of x*). Counting h f as a loss to
    rounding called that STALLED at t = 156 (found by examples/steady_state.py)."""
    def pathway(t, x):
        v0 = 1.0 / (1.0 + x[2] ** 2)
        v1 = 2.0 * x[0] / (0.5 + x[0])
        v2 = 1.5 * x[1] / (1.0 + x[1])
        return jnp.stack([v0 - v1, v1 - v2, v2 - 0.5 * x[2]])
    sol = odekit.solve_ivp(pathway, (0.0, 1000.0), jnp.ones(3), t_eval=jnp.array([1000.0]),
                           rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.ys[0], [1 / 6, 0.5, 1.0], rtol=1e-9)


# --- item 3: stiffness verdicts --------------------------------------------

def test_a_solution_decayed_below_atol_goes_on_where_the_end_is_affordable():
    """Hairer's dopri5 (SciPy's ode('dopri5'), nstiff=1000) stops y' = -y on
    [0, 1e4] at t = 3173 as 'probably stiff' (measured at rtol = atol = 1.4e-8):
    once y is below atol the step sits at the stability limit (|h| ~ 3.3).
    odekit goes on when the rest of the span needs at most 100,000 steps there,
    and says stiff (with the reason) when it would need more."""
    ys = odekit.odeint(lambda y, t: -y, 1.0, jnp.array([0.0, 1e4]))
    assert abs(float(ys[-1])) < 1.4e-8          # exact 0 to within atol (jax.experimental.ode: 9.6e-9)
    with pytest.raises(odekit.ODESolverError, match="stiff.*more than 100,000 steps"):
        odekit.odeint(lambda y, t: -y, 1.0, jnp.array([0.0, 1e7]))


@pytest.mark.parametrize("name", ["hires", pytest.param("heat_equation", marks=pytest.mark.long)])
def test_mildly_stiff_problems_solve_when_the_step_budget_allows(name):
    """HIRES and a 100-point heat equation were refused as stiff on their usual
    spans, though tsit5 solves them in 10k and 6k steps: odeint (no step
    limit) goes on, and so does solve_ivp with t_eval (its default
    max_steps=None sets no limit when nothing is recorded, issue 35.4);
    with t_eval=None (a record of 4096 steps by default) it says stiff and
    names the way on (raise max_steps), and then solves them."""
    p = get_problem(name)
    ref = np.asarray(p.exact(p.t, *p.args)) if p.exact is not None else reference_solution(p)
    scale = 1e-9 / 1e-6 + np.abs(ref)
    ys = odekit.odeint(p.func, jnp.asarray(p.y0), jnp.asarray(p.t), *p.args, method="tsit5",
                       rtol=1e-6, atol=1e-9)
    assert np.max(np.abs(np.asarray(ys) - ref) / scale) < 2e-5
    fun = lambda t, y, *a: p.func(y, t, *a)
    span, t_eval = (float(p.t[0]), float(p.t[-1])), jnp.asarray(p.t)
    with pytest.raises(odekit.ODESolverError, match="stiff.*raise max_steps"):
        odekit.solve_ivp(fun, span, jnp.asarray(p.y0), args=p.args)
    for max_steps in (None, 20_000):
        sol = odekit.solve_ivp(fun, span, jnp.asarray(p.y0), t_eval=t_eval, args=p.args,
                               max_steps=max_steps)
        assert np.max(np.abs(np.asarray(sol.ys) - ref) / scale) < 2e-5
