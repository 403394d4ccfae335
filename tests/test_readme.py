"""The README stays true: its method table is the registry's."""
import pathlib

from odekit.ode.methods import method_table

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_method_table_matches_registry():
    assert method_table() in README.read_text(), (
        "README's method table is stale; paste odekit.ode.methods.method_table() into it.")


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert 'python -m pip install -e ".[dev]" && python benchmarks/pendulum.py' in text
    assert 'python -m pip install -e ".[dev]" && python -m pytest' in text
