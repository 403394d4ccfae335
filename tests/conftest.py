"""Test configuration: float64 everywhere, strict dtype promotion and strict
rank promotion (users, and JAX's own tests, turn these on).

The suite is compile-bound (most tests compile a solver once and run it on
a small problem). ``ODEKIT_TEST_CHEAP_COMPILE=1`` has XLA's CPU backend
compile with LLVM's cheap pipeline (``--xla_backend_optimization_level=0
--xla_llvm_disable_expensive_passes``: 21-27% less time on compile-bound
files, 1508 s against 1882 s for the whole suite), but it is off by default:
without LLVM's contraction of multiply-adds two paths that agree to 1e-10 at
XLA's default differ by 1e-7 (a vmapped against an unbatched gradient, t_eval
values with and without dense output). Subprocess tests inherit it.
Set before JAX starts its backends (which read ``XLA_FLAGS`` once)."""
import os

if os.environ.get("ODEKIT_TEST_CHEAP_COMPILE") == "1":
    _CHEAP = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _CHEAP).strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


import pytest  # noqa: E402

#: ``ODEKIT_LONG_TESTS=1`` runs the tests marked ``@pytest.mark.long`` too
#: (heavy variants of checks whose quick form runs in CI; see README).
LONG = os.environ.get("ODEKIT_LONG_TESTS") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "long: heavy variant, run with ODEKIT_LONG_TESTS=1")


def pytest_collection_modifyitems(config, items):
    if LONG:
        return
    skip = pytest.mark.skip(reason="heavy variant: set ODEKIT_LONG_TESTS=1 to run it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
