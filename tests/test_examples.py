"""Every example runs in quick mode, exits 0 and writes its PNG.

Each runs in a subprocess (its own JAX settings and caches), with strict
dtype promotion and rank promotion "raise" from the environment like the
rest of the suite, and writes into a temporary folder via ``--out``."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# example -> a line its output must contain (a key number was printed)
EXAMPLES = {
    "pendulum": "largest relative difference adjoint vs finite differences",
    "adjoint_sensitivity": "| jacfwd, adjoint=\"forward\" |",
    "fit_parameters": "best fit: relative parameter errors",
    "steady_state": "| central differences of odekit.root |",
    "ensemble": "pendulums/s",
    "stiff_kinetics": "jacfwd vs central differences",
    "reaction_diffusion": "d mean(u(T)) / d (A, B, alpha)",
    "dae_circuit": "bdf vs rodas5p:",
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_quick(name, tmp_path):
    env = dict(os.environ, JAX_NUMPY_DTYPE_PROMOTION="strict", JAX_NUMPY_RANK_PROMOTION="raise",
               MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", f"{name}.py"),
                           "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert EXAMPLES[name] in proc.stdout, proc.stdout
    png = tmp_path / f"{name}.png"
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_examples_listed():
    """A new example must be added to EXAMPLES (and so be run here)."""
    found = {f[:-3] for f in os.listdir(os.path.join(ROOT, "examples"))
             if f.endswith(".py") and not f.startswith("_")}
    assert found == set(EXAMPLES)
