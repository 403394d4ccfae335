"""Compiled programs stay bounded in a long-lived process (issue 35 item 1).

Every eager solve of a new function compiles a program; before the bounded
cache (odekit._programs) each one stayed for the life of the process, and a
loop of ~100 (rodas5p, events, dense output) to ~210 (tsit5) distinct solves
exhausted Linux's 65,530 memory mappings and killed the process inside XLA.
"""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit import _programs

HEAVY_METHODS = ("tsit5", "rodas5p", "kvaerno5", "dopri5")


def test_the_same_key_gives_the_same_program_and_the_table_is_bounded(monkeypatch):
    monkeypatch.setattr(_programs, "MAX_PROGRAMS", 3)
    _programs.clear()

    def body(scale, x):
        return scale * x

    first = _programs.compiled(body, 2.0)
    assert _programs.compiled(body, 2.0) is first
    for scale in (3.0, 4.0, 5.0):
        _programs.compiled(body, scale)
    assert _programs.cached_count() == 3
    assert _programs.compiled(body, 2.0) is not first      # evicted, compiled anew
    np.testing.assert_array_equal(_programs.compiled(body, 5.0)(jnp.arange(3.0)), [0.0, 5.0, 10.0])


def test_repeated_calls_with_one_function_reuse_its_program():
    def fun(t, y, k):
        return -k * y

    _programs.clear()
    for k in (1.0, 2.0, 3.0):
        sol = odekit.solve_ivp(fun, (0.0, 1.0), jnp.array([1.0]), args=(jnp.asarray(k),),
                               t_eval=jnp.array([1.0]))
        np.testing.assert_allclose(sol.ys[0, 0], np.exp(-k), rtol=1e-6)
    assert _programs.cached_count() == 1


LOOP = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import odekit
    from odekit import _programs

    heavy, cheap, methods = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
    counts = [_programs.memory_mappings()]
    for i in range(heavy):
        c = 1.0 + 0.01 * i       # a new closure each time: a new program
        sol = odekit.solve_ivp(lambda t, y: jnp.stack([y[1], -c * y[0]]), (0.0, 4.0),
                               jnp.array([1.0, 0.0]), method=methods[i % len(methods)],
                               events=lambda t, y: y[0], dense_output=True, rtol=1e-8, atol=1e-10)
        first_zero = np.pi / 2 / np.sqrt(c)
        assert abs(float(sol.t_events[0]) - first_zero) < 1e-5, (i, sol.t_events)
        assert abs(float(sol.sol(1.0)[0]) - np.cos(np.sqrt(c))) < 1e-5
        counts.append(_programs.memory_mappings())
    for i in range(cheap):
        c = 1.0 + 0.01 * i
        ys = odekit.odeint(lambda y, t: -c * y, jnp.array([1.0]), jnp.array([0.0, 1.0]))
        assert abs(float(ys[1, 0]) - np.exp(-c)) < 1e-6
    counts.append(_programs.memory_mappings())
    print("MAPPINGS", *counts)
''')


def test_hundreds_of_distinct_solves_keep_the_mapping_count_bounded(tmp_path):
    """A subprocess with a table of 3 programs: distinct solves with events
    and dense output over four methods (about 150-700 mappings each when
    kept), then distinct odeint solves. Once the table is full the count
    must stop growing (without the bound it rose by ~150-700 a solve, and
    the process died after ~100-210). Quick mode: 6 + 12 solves, the heavy
    ones by tsit5 and rodas5p (without the bound 12 odeint programs add
    ~1,800 mappings, well past the 500 allowed); set ODEKIT_LONG_TESTS=1 for
    48 + 400 over all four methods."""
    long = os.environ.get("ODEKIT_LONG_TESTS") == "1"
    heavy, cheap = (48, 400) if long else (6, 12)
    methods = HEAVY_METHODS if long else HEAVY_METHODS[:2]
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    root = os.path.dirname(os.path.dirname(odekit.__file__))   # this odekit, not another install
    env = dict(os.environ, ODEKIT_MAX_PROGRAMS="3", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    # the suite's compile flags (tests/conftest.py), without a device count
    env["XLA_FLAGS"] = " ".join(flag for flag in os.environ.get("XLA_FLAGS", "").split()
                                if "device_count" not in flag)
    done = subprocess.run([sys.executable, str(script), str(heavy), str(cheap), ",".join(methods)],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("MAPPINGS"))
    counts = [int(c) for c in line.split()[1:]]
    warm = max(counts[1:5])      # the table is full after 3 heavy solves
    assert counts[heavy] < warm + 500, counts
    assert counts[-1] < warm + 500, counts
