"""Shared plumbing for the examples: command line, float64, timing, tables,
finite differences and figure output. Not an example itself."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import matplotlib  # noqa: E402  (after the JAX setting, before pyplot)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (re-exported for the examples)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def parse_args(description: str,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> argparse.Namespace:
    """``--quick`` (smaller problem, under a minute on 2 CPU cores), ``--out DIR``,
    and whatever ``add_arguments(parser)`` adds."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("--quick", action="store_true",
                        help="smaller problem and fewer repeats (the test suite's mode)")
    parser.add_argument("--out", default=OUT_DIR,
                        help="folder for the PNG and the printed report (default examples/out)")
    args = parser.parse_args()
    _keep_report(args)
    return args


class _Tee:
    """Writes to the console and to a file, so that what an example prints
    is kept beside its picture (the figures the README quotes)."""

    def __init__(self, console: Any, path: str):
        self.console, self.file = console, open(path, "w")

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.console.write(text)

    def flush(self) -> None:
        self.console.flush()
        self.file.flush()


def _keep_report(args: argparse.Namespace) -> None:
    """Copy stdout to ``out/NAME.txt`` (``NAME.quick.txt`` with --quick)."""
    os.makedirs(args.out, exist_ok=True)
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    suffix = ".quick.txt" if args.quick else ".txt"
    sys.stdout = _Tee(sys.stdout, os.path.join(args.out, name + suffix))


def save_figure(fig: Any, out_dir: str, name: str) -> str:
    """Save ``fig`` as ``out_dir/name.png``, close it, print and return the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time in seconds of ``fn()`` (blocked until ready), after one warm-up call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def central_differences(f: Callable[[np.ndarray], Any], x: np.ndarray,
                        rel_step: float = 1e-6) -> np.ndarray:
    """Jacobian of ``f`` at ``x`` (shape (p,)) by central differences.

    Column j is ``(f(x + h_j e_j) - f(x - h_j e_j)) / (2 h_j)`` with
    ``h_j = rel_step * max(|x_j|, 1)``; truncation error O(h^2), rounding
    error O(eps / h), so ~1e-6 relative step balances them in float64.
    Returns an array of shape ``f(x).shape + (p,)``.
    """
    x = np.asarray(x, dtype=np.float64)
    columns = []
    for j in range(x.size):
        h = rel_step * max(abs(x[j]), 1.0)
        step = np.zeros_like(x)
        step[j] = h
        columns.append((np.asarray(f(x + step)) - np.asarray(f(x - step))) / (2.0 * h))
    return np.stack(columns, axis=-1)


def relative_error(approx: Any, reference: Any) -> float:
    """``max |approx - reference| / max |reference|`` (a scalar)."""
    approx, reference = np.asarray(approx), np.asarray(reference)
    return float(np.max(np.abs(approx - reference)) / np.max(np.abs(reference)))


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a markdown table; floats with 4 significant digits."""
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(fmt(v) for v in row) + " |")
