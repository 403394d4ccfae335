"""``import odekit`` stays light: SciPy, matplotlib and mpmath load only when used.

odekit.testing needs SciPy for reference solutions and the tests use mpmath
and matplotlib, but a user who only solves an ODE should not pay their import
time (SciPy alone takes about a second). Checked in a fresh interpreter,
since the test session has imported them all already.
"""
import subprocess
import sys

HEAVY = ("scipy", "matplotlib", "mpmath")


def test_import_odekit_does_not_import_scipy_matplotlib_or_mpmath():
    code = ("import sys, odekit, odekit.testing, odekit.special, odekit.custom\n"
            f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_scipy_is_imported_when_a_reference_solution_needs_it():
    code = ("import sys, numpy as np, odekit.testing as t\n"
            "t.scipy_solution(t.get_problem('exponential_decay'), np.linspace(0, 1, 3))\n"
            "assert 'scipy.integrate' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
