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


def test_readme_solve_ivp_examples_run_and_say_what_they_print():
    """The solve_ivp section's code runs as written, and its comments hold."""
    text = README.read_text()
    section = text[text.index("## Solving ODEs"):text.index("## Drop-in for")]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 2
    first, fit = {}, {}
    exec(blocks[0], first)  # noqa: S102 - the README's own example
    sol = first["sol"]
    assert (int(sol.status), bool(sol.success), sol.message) == (1, True, "A termination event occurred.")
    exec(blocks[1], fit)  # noqa: S102
    assert abs(float(fit["fit"].x[0]) - 0.8) < 1e-4
