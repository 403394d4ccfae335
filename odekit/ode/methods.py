"""Registry of integration methods, looked up by lower-case name."""
from __future__ import annotations

from odekit.ode import stiffness
from odekit.ode.tableaux import TABLEAUX, ButcherTableau

EXPLICIT_METHODS: dict[str, ButcherTableau] = dict(TABLEAUX)


def get_tableau(method: str) -> ButcherTableau:
    """The tableau registered as ``method``; ValueError naming the choices."""
    try:
        return EXPLICIT_METHODS[method]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown method {method!r}; choose one of "
                         f"{sorted(EXPLICIT_METHODS)}.") from None


def method_table() -> str:
    """Markdown table of the registered methods (the README embeds it verbatim;
    a test keeps the two identical)."""
    rows = ["| method | order (embedded) | stages | FSAL | dense output order | real stability interval |",
            "|---|---|---|---|---|---|"]
    for name, tab in EXPLICIT_METHODS.items():
        extra = f" + {len(tab.extra_c)} for dense output" if len(tab.extra_c) else ""
        rows.append(f"| `\"{name}\"` | {tab.order} ({tab.error_order}) | {tab.num_stages}{extra} | "
                    f"{'yes' if tab.fsal else 'no'} | {tab.dense_order} | "
                    f"[-{stiffness.stability_boundary(tab):.2f}, 0] |")
    return "\n".join(rows)
