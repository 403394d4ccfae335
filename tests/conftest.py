"""Test configuration: float64 everywhere, strict dtype promotion and strict
rank promotion (users, and JAX's own tests, turn these on)."""
import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


import os  # noqa: E402

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
