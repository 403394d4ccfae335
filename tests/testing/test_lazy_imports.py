"""``import odekit`` stays light: SciPy, matplotlib and mpmath load only when used.

odekit.testing needs SciPy for reference solutions and the tests use mpmath
and matplotlib, but a user who only solves an ODE should not pay their import
time (SciPy alone takes about a second). Checked in a fresh interpreter,
since the test session has imported them all already: one interpreter for
both tests (each start imports JAX), which reports what ``import odekit``
loaded and then whether a reference solution loaded SciPy.
"""
import json
import subprocess
import sys

import pytest

HEAVY = ("scipy", "matplotlib", "mpmath")


@pytest.fixture(scope="module")
def fresh_interpreter():
    code = ("import json, sys, numpy as np, odekit, odekit.testing, odekit.special, odekit.custom\n"
            f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
            "t = odekit.testing\n"
            "t.scipy_solution(t.get_problem('exponential_decay'), np.linspace(0, 1, 3))\n"
            "print(json.dumps({'heavy': heavy, 'scipy': 'scipy.integrate' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_odekit_does_not_import_scipy_matplotlib_or_mpmath(fresh_interpreter):
    assert not fresh_interpreter["heavy"], fresh_interpreter["heavy"]


def test_scipy_is_imported_when_a_reference_solution_needs_it(fresh_interpreter):
    assert fresh_interpreter["scipy"]
