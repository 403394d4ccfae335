"""pytest set-up for SciPy's solve_ivp tests run through odekit (see
adapter.py): the fixture and marks SciPy's file uses, and the per-test
marks (reasoned differences) of test_scipy_ivp.DIFFERENCES."""
import pytest


def pytest_configure(config: pytest.Config) -> None:
    for mark in ("slow", "fail_slow(seconds)", "thread_unsafe(reason)"):
        config.addinivalue_line("markers", f"{mark}: used by SciPy's test_ivp.py")


@pytest.fixture
def num_parallel_threads() -> int:
    """SciPy's fixture (from pytest-run-parallel): tests run on one thread."""
    return 1


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        differences = getattr(item.module, "DIFFERENCES", None)
        if differences is None:
            continue
        mark = differences.get(item.name, differences.get(item.originalname))
        if mark is not None:
            item.add_marker(mark)
        if item.originalname in getattr(item.module, "LONG_ONLY", ()):
            item.add_marker(pytest.mark.skip(
                reason="heavy: set ODEKIT_LONG_TESTS=1 to run it"))
