"""The progress meter (odekit.ode.engine.progress) on a small Euler loop for y' = -y.

The loop calls open_meter / report / close_meter as the ODE loop does. The
stderr meter is forced by hiding tqdm; a fake tqdm module checks the bar path.
"""
import math
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from odekit import status as codes
from odekit.ode.engine import progress


def euler(t0, t1, num_steps, max_steps=None, dtype=jnp.float64, time_sign=1.0):
    """Euler from t0 to t1 in num_steps steps (stopping after max_steps), with a meter."""
    t0 = jnp.asarray(t0, dtype)
    t1 = jnp.asarray(t1, dtype)
    h = (t1 - t0) / num_steps
    limit = num_steps if max_steps is None else max_steps
    meter = progress.open_meter(t0, t1, time_sign=time_sign)

    def cond(state):
        return state[2] < limit

    def body(state):
        t, y, n = state
        progress.report(meter, t, h, n)
        t_new = jnp.where(n + 1 == num_steps, t1, t + h)
        return t_new, y - h * y, n + 1

    t, y, n = lax.while_loop(cond, body, (t0, jnp.ones((), dtype), jnp.zeros((), jnp.int32)))
    status = jnp.where(n < num_steps, codes.MAX_STEPS, codes.SUCCESS).astype(jnp.int32)
    progress.close_meter(meter, t, n, status)
    return y, n


@pytest.fixture(autouse=True)
def no_tqdm(monkeypatch):
    """Hide tqdm (installed or not): ``import tqdm`` raises ImportError."""
    monkeypatch.setitem(sys.modules, "tqdm", None)


def lines(err):
    """The finished meter lines of ``err``, each as its list of '\\r' redraws."""
    assert err.endswith("\n"), repr(err[-200:])
    return [[d.rstrip() for d in line.split("\r") if d] for line in err.split("\n")[:-1]]


def percent(draw):
    """The percentage a drawn line shows."""
    head, _, rest = draw.partition(":")
    assert head.startswith("odekit")
    return float(rest.split("%")[0])


def test_stderr_meter_under_jit_ends_at_100(capsys):
    y, n = jax.jit(euler, static_argnums=2)(0.0, 10.0, 100_000)
    assert int(n) == 100_000 and abs(float(y) - math.exp(-10.0)) < 1e-5
    (draws,) = lines(capsys.readouterr().err)
    assert draws[0].startswith("odekit:   0.0% t=0 steps=0 h=1.00e-04")
    assert draws[-1] == "odekit: 100.0% t=10 steps=100000 h=1.00e-04"
    fractions = [percent(d) for d in draws]
    assert fractions == sorted(fractions)


def test_redraws_are_throttled(capsys, monkeypatch):
    call = jax.jit(euler, static_argnums=2)
    call(0.0, 1.0, 100_000)  # compile
    capsys.readouterr()
    start = time.monotonic()
    jax.block_until_ready(call(0.0, 1.0, 100_000))
    elapsed = time.monotonic() - start
    (draws,) = lines(capsys.readouterr().err)
    # At most one redraw per MIN_INTERVAL, plus the first and the last.
    assert len(draws) <= elapsed / progress.MIN_INTERVAL + 3
    # No throttle: one callback every EVERY attempts, plus the final draw.
    monkeypatch.setattr(progress, "MIN_INTERVAL", 0.0)
    call(0.0, 1.0, 100_000)
    (draws,) = lines(capsys.readouterr().err)
    assert len(draws) == math.ceil(100_000 / progress.EVERY) + 1
    # Infinite throttle: the first report and the final state only.
    monkeypatch.setattr(progress, "MIN_INTERVAL", math.inf)
    call(0.0, 1.0, 100_000)
    (draws,) = lines(capsys.readouterr().err)
    assert [percent(d) for d in draws] == [0.0, 100.0]


def test_meter_updates_while_the_compiled_loop_runs(capsys, monkeypatch):
    monkeypatch.setattr(progress, "MIN_INTERVAL", 0.0)
    stamps = []
    draw = progress._Meter._draw

    def stamped(self, status):
        stamps.append(time.perf_counter())
        draw(self, status)

    monkeypatch.setattr(progress._Meter, "_draw", stamped)
    call = jax.jit(euler, static_argnums=2)
    call(0.0, 1.0, 200_000)  # compile
    stamps.clear()
    start = time.perf_counter()
    jax.block_until_ready(call(0.0, 1.0, 200_000))
    end = time.perf_counter()
    capsys.readouterr()
    # The draws are spread over the run, not bunched at its end.
    assert stamps[0] - start < 0.5 * (end - start)
    assert stamps[-2] - stamps[0] > 0.3 * (end - start)


def test_backward_span(capsys):
    jax.jit(euler, static_argnums=2)(10.0, 2.0, 50_000)
    (draws,) = lines(capsys.readouterr().err)
    assert draws[0].startswith("odekit:   0.0% t=10 steps=0 h=-1.60e-04")
    assert draws[-1].startswith("odekit: 100.0% t=2 steps=50000")


def test_time_sign_shows_reversed_time(capsys):
    # The loop runs in s = -t from s = -3 to s = -1: t runs from 3 down to 1.
    jax.jit(euler, static_argnums=2, static_argnames="time_sign")(-3.0, -1.0, 1000,
                                                                   time_sign=-1.0)
    (draws,) = lines(capsys.readouterr().err)
    assert draws[0] == "odekit:   0.0% t=3 steps=0 h=-2.00e-03"
    assert draws[-1] == "odekit: 100.0% t=1 steps=1000 h=-2.00e-03"


def test_stopped_solve_shows_where_and_why(capsys):
    jax.jit(euler, static_argnums=(2, 3))(0.0, 1.0, 1000, 250)
    (draws,) = lines(capsys.readouterr().err)
    assert percent(draws[-1]) == 25.0
    assert draws[-1].endswith("stopped: " + codes.message(codes.MAX_STEPS))


def test_vmap_one_meter_shows_the_least_advanced_member(capsys, monkeypatch):
    monkeypatch.setattr(progress, "MIN_INTERVAL", 0.0)
    t0 = jnp.array([0.0, 5.0, 9.0])
    num = 10_000
    fn = jax.jit(jax.vmap(lambda a, m: euler(a, 10.0, num, m), (0, 0)))
    _, n = fn(t0, jnp.array([num, num, 3000], jnp.int32))  # the third member stops early
    assert n.tolist() == [num, num, 3000]
    (draws,) = lines(capsys.readouterr().err)
    # One callback per EVERY attempts of the batch (the cond is not turned
    # into a select), plus the final draw.
    assert len(draws) == math.ceil(num / progress.EVERY) + 1
    assert "running=3/3" in draws[0]
    # Before the third member stops, it is the least advanced (they all
    # share the fraction n / num); afterwards the others are shown.
    assert all("running=2/3" in d for d in draws[1:-1] if int(d.split("steps=")[1].split()[0]) > 3000)
    fractions = [percent(d) for d in draws[:-1]]
    assert fractions == sorted(fractions) and fractions[-1] > 99.0
    # The final line: the least advanced member overall, the worst status.
    assert percent(draws[-1]) == 30.0
    assert "members=3" in draws[-1] and "(1 of 3 members failed)" in draws[-1]


def test_vmap_over_the_state_only(capsys):
    def solve(y0):
        y, n = euler(0.0, 1.0, 1000)
        return y * y0

    jax.jit(jax.vmap(solve))(jnp.arange(4.0))
    (draws,) = lines(capsys.readouterr().err)
    assert draws[-1] == "odekit: 100.0% t=1 steps=1000 h=1.00e-03"


def test_nested_vmap_and_float32(capsys):
    t0 = jnp.array([[0.0, 1.0], [2.0, 3.0]], jnp.float32)
    fn = jax.jit(jax.vmap(jax.vmap(lambda a: euler(a, 8.0, 2000, dtype=jnp.float32))))
    y, n = fn(t0)
    assert y.dtype == jnp.float32 and n.tolist() == [[2000, 2000], [2000, 2000]]
    (draws,) = lines(capsys.readouterr().err)
    assert percent(draws[-1]) == 100.0 and "members=4" in draws[-1]


def test_disable_jit(capsys):
    with jax.disable_jit():
        y, n = euler(0.0, 1.0, 200)
    assert int(n) == 200
    (draws,) = lines(capsys.readouterr().err)
    assert draws[0].startswith("odekit:   0.0%") and percent(draws[-1]) == 100.0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_strict_promotion(capsys, dtype):
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        jax.jit(euler, static_argnums=2, static_argnames="dtype")(0.0, 2.0, 5000, dtype=dtype)
        jax.jit(jax.vmap(lambda a: euler(a, 2.0, 5000, dtype=dtype)))(jnp.array([0.0, 1.0], dtype))
    out = lines(capsys.readouterr().err)
    assert len(out) == 2 and all(percent(draws[-1]) == 100.0 for draws in out)


def test_each_solve_and_each_run_gets_its_own_meter(capsys):
    def two(t1):
        return euler(0.0, t1, 3000)[0] + euler(0.0, 2.0 * t1, 3000)[0]

    fn = jax.jit(two)
    fn(1.0)
    fn(3.0)
    out = lines(capsys.readouterr().err)
    assert len(out) == 4 and all(percent(draws[-1]) == 100.0 for draws in out)
    ends = sorted(draws[-1].split("t=")[1].split()[0] for draws in out)
    assert ends == ["1", "2", "3", "6"]


def test_forward_mode_derivatives_pass_through(capsys):
    def final(t1):
        return euler(0.0, t1, 1000)[0]

    value, slope = jax.jvp(final, (1.0,), (1.0,))
    assert np.isfinite(float(slope)) and float(slope) < 0
    assert np.isfinite(float(jax.jacfwd(final)(1.0)))
    assert percent(lines(capsys.readouterr().err)[-1][-1]) == 100.0


class FakeBar:
    instances = []

    def __init__(self, total=None, **kwargs):
        self.total, self.kwargs, self.n = total, kwargs, 0.0
        self.seen, self.postfix, self.closed = [], "", False
        FakeBar.instances.append(self)

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def refresh(self):
        self.seen.append(self.n)

    def close(self):
        self.closed = True


def test_tqdm_bar_when_installed(capsys, monkeypatch):
    fake = types.ModuleType("tqdm")
    fake.tqdm = FakeBar
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    monkeypatch.setattr(progress, "MIN_INTERVAL", 0.0)
    FakeBar.instances.clear()
    jax.jit(euler, static_argnums=2)(0.0, 4.0, 1000)
    (bar,) = FakeBar.instances
    assert bar.total == 1.0 and bar.closed
    assert bar.n == 1.0 and bar.seen[0] == 0.0 and bar.seen == sorted(bar.seen)
    assert len(bar.seen) == math.ceil(1000 / progress.EVERY) + 1
    assert bar.postfix == "t=4 steps=1000 h=4.00e-03"
    assert capsys.readouterr().err == ""  # the bar draws itself


def test_a_broken_display_never_stops_the_solve(capsys, monkeypatch):
    class Broken(FakeBar):
        def refresh(self):
            raise OSError("display gone")

    fake = types.ModuleType("tqdm")
    fake.tqdm = Broken
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    y, n = jax.jit(euler, static_argnums=2)(0.0, 1.0, 1000)
    assert int(n) == 1000 and np.isfinite(float(y))


def test_solve_in_a_vmapped_cond_and_in_lax_map(capsys):
    def branch(p):
        return lax.cond(p > 0, lambda: euler(0.0, 1.0, 1000)[0], lambda: jnp.zeros(()))

    y = jax.jit(jax.vmap(branch))(jnp.array([1.0, -1.0]))
    assert float(y[1]) == 0.0 and 0.3 < float(y[0]) < 0.4
    jax.jit(lambda ends: lax.map(lambda a: euler(0.0, a, 500)[0], ends))(jnp.array([1.0, 2.0]))
    out = lines(capsys.readouterr().err)
    assert len(out) == 3 and all(percent(draws[-1]) == 100.0 for draws in out)


def test_debug_callback_fallback(capsys, monkeypatch):
    """Without buffer_callback (older jax, other backends) jax.debug.callback reports."""
    monkeypatch.setattr(progress, "_buffer_callback", None)
    monkeypatch.setattr(progress, "MIN_INTERVAL", 0.0)
    jax.jit(euler, static_argnums=2)(0.0, 1.0, 1000)
    jax.jit(jax.vmap(lambda a: euler(a, 1.0, 1000)))(jnp.array([0.0, 0.5]))
    single, batch = lines(capsys.readouterr().err)
    assert len(single) == len(batch) == math.ceil(1000 / progress.EVERY) + 1
    assert single[-1] == "odekit: 100.0% t=1 steps=1000 h=1.00e-03"
    assert percent(batch[-1]) == 100.0 and "members=2" in batch[-1]


def test_solve_ivp_progress_meter_reaches_the_end(capfd, monkeypatch):
    import odekit
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)
    sol = odekit.solve_ivp(lambda t, y: -y, (5.0, 0.0), jnp.array([1.0]), progress=True,
                           rtol=1e-10, atol=1e-12)
    jax.effects_barrier()
    err = capfd.readouterr().err
    assert int(sol.status) == 0
    assert "100.0%" in err and "t=0" in err


def _weights_loss(progress_on, adjoint):
    """A solve with 20 perturbed numbers (W 4x4, b 4): through the checkpointed loop."""
    import odekit

    def loss(w, b, y0):
        sol = odekit.solve_ivp(lambda t, y, w, b: jnp.tanh(w @ y + b) - 0.5 * y, (0.0, 30.0), y0,
                               args=(w, b), t_eval=jnp.linspace(0.0, 30.0, 4), adjoint=adjoint,
                               rtol=1e-9, atol=1e-9, progress=progress_on)
        return jnp.sum(sol.ys ** 2)
    w = 0.5 * jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    return loss, w, 0.1 * jnp.arange(4.0)


@pytest.mark.parametrize("directions", [16, pytest.param(0, marks=pytest.mark.long)])
def test_progress_with_a_checkpointed_loop_gradient(capsys, directions):   # 20 > 16: the loop
    """Issue 27 item 13: the loop's reports were an effect, which
    jax.checkpoint refuses ("Effects not supported in partial-eval of
    checkpoint/remat"). The meter runs and the gradient is the same; the
    reports of the stretches recomputed in the backward pass are dropped."""
    import odekit
    adjoint = odekit.Checkpoint(max_directions=directions)
    loss, w, b = _weights_loss(True, adjoint)
    quiet, _, _ = _weights_loss(False, adjoint)
    y0 = jnp.ones(4)
    grad = jax.grad(loss, argnums=(0, 1))(w, b, y0)
    for a, ref in zip(grad, jax.grad(quiet, argnums=(0, 1))(w, b, y0)):
        np.testing.assert_allclose(a, ref, rtol=1e-12, atol=1e-14)
    (draws,) = lines(capsys.readouterr().err)    # one meter, one line: no replays
    assert percent(draws[-1]) == 100.0 and "t=30 " in draws[-1]
    assert [percent(d) for d in draws] == sorted(percent(d) for d in draws)


@pytest.mark.long
def test_progress_with_a_checkpointed_loop_gradient_of_a_batch(capsys):
    """A batch: the per-member gradients summed, one meter for the batch;
    the gradient against central differences."""
    import odekit
    from odekit.testing import check_grads
    adjoint = odekit.Checkpoint(max_directions=16)
    loss, w, b = _weights_loss(True, adjoint)
    quiet, _, _ = _weights_loss(False, adjoint)
    y0 = jnp.ones(4)
    y0s = jnp.stack([y0, -2.0 * y0, 0.1 * y0])
    batched = jax.grad(lambda w: jnp.sum(jax.vmap(lambda y: loss(w, b, y))(y0s)))(w)
    summed = sum(jax.grad(quiet)(w, b, y) for y in y0s)
    np.testing.assert_allclose(batched, summed, rtol=1e-10, atol=1e-12)
    capsys.readouterr()
    check_grads(lambda b: loss(w, b, y0), (b,), modes=("rev",), rtol=1e-5, atol=1e-7)


SHARDED_PROGRESS = """
import os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.modules["tqdm"] = None
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import NamedSharding, PartitionSpec as P
import odekit
from odekit.ensemble import batch_mesh

field = lambda t, y, k: -k * y
def final(k, progress):
    return odekit.solve_ivp(field, (0.0, 2.0), jnp.ones(2), args=(k,), t_eval=jnp.linspace(0.0, 2.0, 4),
                            rtol=1e-9, atol=1e-9, progress=progress).ys[-1, 0]
ks = jnp.linspace(0.5, 2.0, 8)
exact = np.exp(-2.0 * np.asarray(ks))
np.testing.assert_allclose(odekit.ensemble(lambda k: final(k, True), ks), exact, rtol=1e-7)
placed = jax.device_put(ks, NamedSharding(batch_mesh(), P("batch")))
np.testing.assert_allclose(jax.jit(jax.vmap(lambda k: final(k, True)))(placed), exact, rtol=1e-7)
# the checkpointed loop's reverse mode on the sharded batch
adjoint = odekit.Checkpoint(max_directions=0)
def loss(k, progress):
    return odekit.solve_ivp(field, (0.0, 2.0), jnp.ones(2), args=(k,), t_eval=jnp.linspace(0.0, 2.0, 4),
                            rtol=1e-9, atol=1e-9, adjoint=adjoint, progress=progress).ys[-1, 0]
grads = jax.jit(jax.vmap(jax.grad(lambda k: loss(k, True))))(placed)
np.testing.assert_allclose(grads, -2.0 * exact, rtol=1e-6)
total = jax.jit(jax.grad(lambda ks: jnp.sum(jax.vmap(lambda k: loss(k, True))(ks))))(placed)
np.testing.assert_allclose(total, -2.0 * exact, rtol=1e-6)
jax.effects_barrier()
print("ok")
"""


def test_progress_on_a_batch_sharded_over_four_devices():
    """Issue 27 item 13: a buffer_callback in a program partitioned over
    devices stopped XLA ("RET_CHECK failure ... Side-effect HLO must have
    sharding", a C++ stack dump). In a subprocess: 4 host devices."""
    import os
    import subprocess
    done = subprocess.run([sys.executable, "-c", SHARDED_PROGRESS], capture_output=True,
                          text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert "RET_CHECK" not in done.stderr and "stack trace" not in done.stderr
    # text=True reads each '\r' redraw as a line: one final draw per solve
    finals = [line for line in done.stderr.splitlines() if line.startswith("odekit: 100.0%")]
    assert len(finals) == 4 and all("members=8" in line for line in finals), done.stderr[-3000:]
