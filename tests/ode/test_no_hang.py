"""Nothing hangs: solves that cannot advance (t + h == t, a zero error scale,
a nan error norm) end in bounded time with the right answer or a clear
failure. Each case ran forever before the redesign (default mxstep=inf);
they run in a subprocess under a timeout so that a regression fails instead
of hanging the suite."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import odekit

    def run(name, call):
        try:
            value = np.asarray(call()).tolist()
            print(json.dumps({"case": name, "value": value}), flush=True)
        except odekit.SolverError as error:
            print(json.dumps({"case": name, "error": str(error)}), flush=True)
        except Exception as error:  # under vmap/jit: JAX's class with odekit's text
            print(json.dumps({"case": name, "error": str(error)}), flush=True)

    t01 = jnp.array([0.0, 1.0])
    run("zero_state_atol0", lambda: odekit.odeint(lambda y, t: -y, 0.0, t01, atol=0.0))
    run("cos_atol0", lambda: odekit.odeint(lambda y, t: jnp.cos(t) + 0 * y, 0.0, t01, atol=0.0))
    run("tiny_state_atol0", lambda: odekit.odeint(lambda y, t: -y, 1e-300, t01, atol=0.0))
    run("hmax_below_rounding", lambda: odekit.odeint(lambda y, t: -y, 1.0, jnp.array([1.0, 2.0]),
                                                     hmax=1e-17))
    run("vmap_zero_component_atol0", lambda: jax.vmap(lambda y0: odekit.odeint(
        lambda y, t: -y, y0, t01, atol=0.0))(jnp.array([[1.0, 0.0], [1.0, 1.0]]))[:, -1])
    run("solve_ivp_zero_state_atol0", lambda: odekit.solve_ivp(
        lambda t, y: -y, (0.0, 1.0), jnp.array([0.0]), atol=0.0, t_eval=t01).ys[:, 0])
    run("solve_ivp_max_step_below_rounding", lambda: odekit.solve_ivp(
        lambda t, y: -y, (1e9, 1e9 + 1.0), jnp.array([1.0]), max_step=1e-9, throw=False).status)
    run("nan_from_the_start", lambda: odekit.solve_ivp(
        lambda t, y: jnp.log(y - 2.0), (0.0, 1.0), jnp.array([1.0]), throw=False).status)
""")


@pytest.fixture(scope="module")
def outcomes():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=240)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, done.stderr[-2000:]
    return {line["case"]: line for line in lines}


def test_a_zero_component_with_atol_zero_is_solved_exactly(outcomes):
    assert outcomes["zero_state_atol0"]["value"] == [0.0, 0.0]
    assert outcomes["solve_ivp_zero_state_atol0"]["value"] == [0.0, 0.0]
    flat = sum(outcomes["vmap_zero_component_atol0"]["value"], [])
    assert flat == pytest.approx([0.36787944117, 0.0, 0.36787944117, 0.36787944117], rel=1e-7)


def test_relative_tolerance_alone_solves_a_growing_state(outcomes):
    assert outcomes["cos_atol0"]["value"][-1] == pytest.approx(0.8414709848, rel=1e-7)
    assert outcomes["tiny_state_atol0"]["value"][-1] == pytest.approx(3.678794411714e-301, rel=1e-7)


def test_a_step_below_the_rounding_of_t_fails_at_once(outcomes):
    assert "step size underflowed" in outcomes["hmax_below_rounding"]["error"]
    assert outcomes["solve_ivp_max_step_below_rounding"]["value"] == -2   # STEP_UNDERFLOW


def test_a_nan_derivative_at_the_start_is_a_status(outcomes):
    assert outcomes["nan_from_the_start"]["value"] == -3   # NONFINITE


BANDED_GRADIENT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import odekit

    points = 1000                                      # state 2000, band width 2
    x = jnp.arange(1, points + 1) / (points + 1)

    def brusselator(t, y, a, b, alpha):
        u, v = y[0::2], y[1::2]
        c = alpha * (points + 1) ** 2
        lap = lambda w, edge: jnp.concatenate([edge, w[:-1]]) - 2 * w + jnp.concatenate([w[1:], edge])
        du = a + u * u * v - (b + 1) * u + c * lap(u, jnp.ones(1))
        dv = b * u - u * u * v + c * lap(v, jnp.full(1, 3.0))
        return jnp.stack([du, dv], axis=1).reshape(-1)

    y0 = jnp.stack([1 + jnp.sin(2 * jnp.pi * x), jnp.full(points, 3.0)], axis=1).reshape(-1)
    loss = lambda p: jnp.mean(odekit.solve_ivp(brusselator, (0.0, 10.0), y0, args=p,
                                               t_eval=jnp.array([5.0, 10.0]), method="rodas5p",
                                               lband=2, uband=2, rtol=1e-6, atol=1e-8).ys ** 2)
    p = (1.0, 3.0, 0.02)
    g = jax.jit(jax.grad(loss))(p)
    f = jax.jit(loss)
    fd = []
    for i in range(3):
        step = 1e-4 * p[i]
        up, down = list(p), list(p)
        up[i] += step
        down[i] -= step
        fd.append((float(f(tuple(up))) - float(f(tuple(down)))) / (2 * step))
    print(json.dumps({"gradient": [float(v) for v in g], "central": fd}))
""")


@pytest.mark.long
def test_gradient_through_the_banded_path_finishes():
    """jax.grad of rodas5p on the banded path at state 2000: its reverse pass
    through the banded factorisation's scan stalled inside XLA's CPU runtime
    (every thread waiting) with default threading; the solves' own
    derivative rule no longer builds that program."""
    done = subprocess.run([sys.executable, "-c", BANDED_GRADIENT], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(result["gradient"], result["central"], rtol=1e-4)
