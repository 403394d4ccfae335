"""The README stays true: its method table is the registry's, and it names
the two commands. (Its code blocks, and the guides', run in test_docs.py,
which also keeps the checks of the solve_ivp examples that moved to
docs/solving-odes.md.)"""
import pathlib

import pytest

from odekit.ode.methods import method_table

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@pytest.mark.parametrize("name", ["README.md", "docs/solving-odes.md"])
def test_method_table_matches_registry(name):
    assert method_table() in (ROOT / name).read_text(), (
        f"{name}'s method table is stale; paste odekit.ode.methods.method_table() into it.")


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert 'python -m pip install -e ".[dev]" && python benchmarks/pendulum.py' in text
    assert 'python -m pip install -e ".[dev]" && python -m pytest' in text


def test_readme_is_a_front_door():
    """A newcomer reads it in five minutes; the manual lives in docs/."""
    assert len(README.read_text().splitlines()) <= 300
