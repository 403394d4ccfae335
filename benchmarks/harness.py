"""Shared benchmark harness: jit, warm up, block until ready, take medians.

Every benchmark in this folder answers one question, prints a markdown table,
writes it to ``benchmarks/results/<name>.md`` and draws a PNG next to it.
Timings are medians over repeats because the machines are shared and noisy;
comparisons are ratios measured in the same run.
"""
from __future__ import annotations

import gc
import os
import random
import statistics
import time
from typing import Any, Callable, Sequence

import jax

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def block(x: Any) -> Any:
    """Wait for every array leaf of ``x`` (JAX or NumPy) to be ready."""
    return jax.block_until_ready(x)


def median_time(fn: Callable[[], Any], repeats: int = 21, number: int = 1,
                min_time: float = 0.0) -> float:
    """Median wall time in seconds of one ``fn()`` call (already compiled).

    Args:
      fn: zero-argument callable; its result is blocked on.
      repeats: how many timings the median is taken over.
      number: calls per timing (the timing is divided by it); raised
        automatically so that one timing lasts at least ``min_time`` seconds.
      min_time: lower bound on the duration of one timing.
    """
    block(fn())  # warm up (compilation, caches)
    if min_time > 0:
        start = time.perf_counter()
        block(fn())
        once = max(time.perf_counter() - start, 1e-7)
        number = max(number, int(min_time / once) + 1)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        block(out)
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def interleaved_medians(fns: dict[str, Callable[[], Any]], rounds: int = 200) -> dict[str, float]:
    """Median wall time in seconds of one call of each (compiled) function.

    The calls alternate one by one (``a, b, a, b, ...``) so that every
    function sees the same spells of machine noise, which a block of repeats
    per function does not guarantee on a shared machine. The order within a
    round is shuffled (seeded): a call right after a long one (a 56 ms diffrax
    backsolve gradient) runs with cold caches, and in a fixed order the same
    function would always pay for it (a 2.5 ms gradient measured 4.6 ms in
    that place, 2.5 ms elsewhere: checkpoint_head_notes.md).
    """
    for fn in fns.values():
        block(fn())  # warm up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name, fn in order:
            start = time.perf_counter()
            block(fn())
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def first_call_time(make_fn: Callable[[], Callable[[], Any]], repeats: int = 3) -> float:
    """Median time of the first call of a freshly built jitted function.

    ``make_fn`` must return a *new* function each time (e.g. a new
    ``jax.jit(lambda ...)``) so that every first call traces and compiles.
    """
    samples = []
    for _ in range(repeats):
        fn = make_fn()
        start = time.perf_counter()
        block(fn())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved_first_calls(makers: dict[str, Callable[[], Callable[[], Any]]],
                            repeats: int = 5, warmup: bool = True) -> dict[str, float]:
    """Median first-call time (trace + compile + run) of each contender.

    ``makers[name]()`` must return a zero-argument call whose first use
    traces and compiles afresh (e.g. a new ``jax.jit`` after
    ``jax.clear_caches()``). The contenders take turns, round by round, so
    that each sees the same spells of machine noise; an untimed warm-up round
    first pays what only the process's first compilations pay (MLIR
    dialects, lazily imported lowering rules), which would otherwise fall on
    whichever contender is measured first. Garbage left by the previous
    contender is collected before each timing, not during it.
    """
    samples: dict[str, list[float]] = {name: [] for name in makers}
    for r in range(repeats + (1 if warmup else 0)):
        for name, make in makers.items():
            fn = make()
            gc.collect()
            start = time.perf_counter()
            block(fn())
            if r or not warmup:
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats are printed with 3 significant digits."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_result(name: str, text: str, out_dir: str = RESULTS_DIR) -> str:
    """Write ``text`` to ``<out_dir>/<name>.md`` (default benchmarks/results) and return the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.md")
    with open(path, "w") as fh:
        fh.write(text.rstrip() + "\n")
    return path


def machine_description() -> str:
    """One line naming the JAX version, backend and CPU count of this run."""
    return (f"jax {jax.__version__}, backend {jax.default_backend()}, "
            f"{os.cpu_count()} CPUs, x64={jax.config.jax_enable_x64}")
