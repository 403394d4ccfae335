"""Test configuration: float64 everywhere, strict dtype promotion and strict
rank promotion (users, and JAX's own tests, turn these on).

The suite is compile-bound (most tests compile a solver once and run it on
a small problem), so XLA's CPU backend compiles with LLVM's cheap pipeline
(``--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes``;
27% less time on tests/ode/test_dae.py, 21% on test_bdf_dense_events.py).
The arithmetic is the same IEEE arithmetic (no fast-math either way); only
the generated code is slower. Subprocess tests inherit it.
``ODEKIT_TEST_FULL_OPT=1`` tests with XLA's default optimisation instead.
Set before JAX starts its backends (which read ``XLA_FLAGS`` once)."""
import os

if os.environ.get("ODEKIT_TEST_FULL_OPT") != "1":
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
