"""Registry of integration methods, looked up by lower-case name."""
from __future__ import annotations

from odekit.ode.tableaux import TABLEAUX, ButcherTableau

EXPLICIT_METHODS: dict[str, ButcherTableau] = dict(TABLEAUX)


def get_tableau(method: str) -> ButcherTableau:
    """The tableau registered as ``method``; ValueError naming the choices."""
    try:
        return EXPLICIT_METHODS[method]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown method {method!r}; choose one of "
                         f"{sorted(EXPLICIT_METHODS)}.") from None
