"""Compiled programs keyed by the user's functions, in one bounded cache.

An eager call of a solver compiles one XLA program for the user's function
(a static argument: the function is part of the program). A module-level
``jax.jit`` with the function as a static argument keeps every such program
for the life of the process, and each program holds executable memory: on
Linux each compiled program adds hundreds of memory mappings, and a process
may hold ``vm.max_map_count`` (65,530) of them. A notebook or a test loop
that solves a few hundred different models (a new ``lambda`` each time) then
dies inside XLA's compiler ("LLVM ERROR: Unable to allocate section memory",
a segmentation fault).

:func:`compiled` keeps instead one ``jax.jit`` object per key (the body and
its static arguments) in a least-recently-used table of at most
:data:`MAX_PROGRAMS` entries. Evicting an entry drops the last reference to
its ``jax.jit`` object, and JAX then frees its compiled executables. Memory
and mappings therefore stay bounded by ``MAX_PROGRAMS`` programs, while
repeated calls with the same function (the common case: parameters passed
through ``args``) keep hitting the cache.

Programs differ in size (a stiff method with events and a gradient holds
about 1,000 mappings, an explicit solve about 150), so on Linux the table is
also halved, oldest first, whenever the process holds more than
:data:`MAP_BUDGET` mappings when a new program is about to be compiled (half
of ``vm.max_map_count``; counting them costs about a millisecond, next to a
compilation of a second or more).

``MAX_PROGRAMS`` and ``MAP_BUDGET`` are read from the environment variables
``ODEKIT_MAX_PROGRAMS`` (default 32) and ``ODEKIT_MAP_BUDGET`` at import.
"""
from __future__ import annotations

import collections
import os
import threading
from functools import partial
from typing import Callable, Hashable

import jax

MAX_PROGRAMS = max(1, int(os.environ.get("ODEKIT_MAX_PROGRAMS", "32")))


def _default_map_budget() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read()) // 2
    except (OSError, ValueError):
        return None   # not Linux: no per-process mapping limit to respect


MAP_BUDGET = (int(os.environ["ODEKIT_MAP_BUDGET"]) if "ODEKIT_MAP_BUDGET" in os.environ
              else _default_map_budget())

_table: collections.OrderedDict[Hashable, Callable] = collections.OrderedDict()
_lock = threading.Lock()


def compiled(body: Callable, *static: Hashable) -> Callable:
    """``jax.jit(partial(body, *static))``, from the bounded cache.

    Args:
      body: a module-level function ``body(*static, *dynamic)``.
      *static: hashable values that the program is specialised on (the
        user's function, options records, method names).

    Returns:
      The jitted callable of the dynamic arguments. The same ``(body,
      *static)`` gives the same callable (and so JAX's compiled program)
      until :data:`MAX_PROGRAMS` other keys have been used since.
    """
    key = (body, static)
    with _lock:
        program = _table.get(key)
        if program is not None:
            _table.move_to_end(key)
            return program
        if MAP_BUDGET is not None and memory_mappings() > MAP_BUDGET:
            for _ in range((len(_table) + 1) // 2):
                _table.popitem(last=False)
        program = jax.jit(partial(body, *static))
        _table[key] = program
        while len(_table) > MAX_PROGRAMS:
            _table.popitem(last=False)
        return program


def memory_mappings() -> int:
    """How many memory mappings this process holds (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


def cached_count() -> int:
    """How many programs the cache holds now (at most :data:`MAX_PROGRAMS`)."""
    return len(_table)


def clear() -> None:
    """Drop every cached program (JAX frees them when nothing else holds them)."""
    with _lock:
        _table.clear()
