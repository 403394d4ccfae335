"""Test configuration: float64 everywhere, strict dtype promotion and strict
rank promotion (users, and JAX's own tests, turn these on).

The suite is compile-bound (most tests compile a solver once and run it on
a small problem), so XLA's CPU backend compiles with LLVM's cheap pipeline
(``--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes``:
21-27% less time on compile-bound files, 1508 s against 1882 s for the
whole suite on 2 cores). ``ODEKIT_TEST_FULL_OPT=1`` compiles with XLA's
default pipeline instead (what users get; the suite passes with both).
LLVM's code generation is not split into parallel parts
(``--xla_cpu_parallel_codegen_split_count=1``: the two xdist workers already
fill the two cores; 5-8% less time on the span and odeint-gradient files,
measured twice each way). XLA's CPU fusions are emitted by the older
elemental emitters, not the MLIR fusion emitters
(``--xla_cpu_use_fusion_emitters=false``: XLA's backend compile 26-27 s ->
16-18 s on gradients, solves with events and dense output of rodas5p, bdf
and kvaerno5 on Robertson; the whole suite, 2 workers on 2 cores, 1280 s
against 1944 s, that run sharing the machine with a few niced scripts).
Subprocess tests inherit the flags. Set before JAX starts its backends
(which read ``XLA_FLAGS`` once).

Many tests compile the same computation again (a new lambda around the same
solver and problem): JAX's persistent compilation cache, in a temporary
folder shared by the xdist workers of one run and removed at its end, makes
those a read (9% less time on the adjoint files). ``ODEKIT_TEST_NO_CACHE=1``
turns it off."""
import os
import shutil
import tempfile

if os.environ.get("ODEKIT_TEST_FULL_OPT") != "1":
    _CHEAP = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
              "--xla_cpu_parallel_codegen_split_count=1 --xla_cpu_use_fusion_emitters=false")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _CHEAP).strip()

# The controller makes the folder; the workers it starts inherit the variable.
_CACHE_VARIABLE = "ODEKIT_TEST_XLA_CACHE"
_OWN_CACHE = None
if os.environ.get("ODEKIT_TEST_NO_CACHE") != "1" and _CACHE_VARIABLE not in os.environ:
    _OWN_CACHE = os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="odekit-test-xla-")

import jax  # noqa: E402

if _CACHE_VARIABLE in os.environ and os.environ.get("ODEKIT_TEST_NO_CACHE") != "1":
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_VARIABLE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


import pytest  # noqa: E402

#: ``ODEKIT_LONG_TESTS=1`` runs the tests marked ``@pytest.mark.long`` too
#: (heavy variants of checks whose quick form runs in CI; see README).
LONG = os.environ.get("ODEKIT_LONG_TESTS") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "long: heavy variant, run with ODEKIT_LONG_TESTS=1")


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if LONG:
        return
    skip = pytest.mark.skip(reason="heavy variant: set ODEKIT_LONG_TESTS=1 to run it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
