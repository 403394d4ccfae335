"""A progress meter for ODE solves, reported from inside the compiled loop.

``open_meter`` creates a meter on the host (a callback that returns its
int32 id), ``report_carried`` is called in the loop body on every attempted
step and sends ``t``, ``h`` and the step count to the host every ``EVERY``
attempts (a ``lax.cond`` around a host callback that returns the meter id,
which the loop carries), and ``close_meter`` draws the final state and
closes the meter. ``report`` is the same report as an effect, for loops
that do not carry the id.

Where the callbacks run:

* The loop's reports have no effect (a callback whose result is used), so
  they also run inside ``jax.checkpoint``, which refuses effects ("Effects
  not supported in partial-eval of checkpoint/remat"): the checkpointed loop
  of the checkpoint adjoint in reverse mode. ``jax.checkpoint`` recomputes
  stretches of the loop in the backward pass and their reports come again;
  the host drops them (the meter is closed by then, and a meter never goes
  back to fewer attempts).
* On one CPU device the callbacks are ``buffer_callback``s (the host reads
  the buffers themselves); on other backends, and in a process with
  several devices, JAX's own callbacks: a program partitioned over devices
  (a batch sharded by ``jit``, :func:`odekit.ensemble`) needs a sharding on
  every callback, which JAX gives its own (they run once, on the first
  device) and not a ``buffer_callback`` (XLA stopped with "RET_CHECK
  failure ... Side-effect HLO must have sharding"). XLA may log that it
  gathers the batch's values to that device ("Involuntary full
  rematerialization"): the reports are small. The host redraws
a meter at most once per ``MIN_INTERVAL`` seconds, as a ``tqdm`` bar when
tqdm is installed, else as one stderr line redrawn with ``'\\r'``. A solve
without ``progress`` does not call these functions, so it pays nothing.

Under ``vmap`` a meter is opened once per call, not once per member, and
shows the least advanced member among those still stepping (their common
attempt count is the largest one); the final line shows the least advanced
member overall and the worst status. ``custom_vmap`` rules turn batch axes
into ordinary axes, so the ``EVERY`` test stays a ``cond`` on the largest
step count and the callbacks run once per call, seeing every member.
"""
from __future__ import annotations

import itertools
import math
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

try:  # a callback that is handed the host buffers themselves
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # older jax
    _buffer_callback = None

from odekit import status as codes

EVERY = 64            # attempted steps between reports from the compiled loop
MIN_INTERVAL = 0.1    # seconds between two redraws of one meter (at most ~10 per second)
NAME = "odekit"

_LOCK = threading.RLock()
_METERS: dict[int, "_Meter"] = {}
_IDS = itertools.count(1)


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------

def _load_tqdm() -> Any:
    """``tqdm.tqdm`` or None when tqdm is not importable."""
    try:
        import tqdm
        return tqdm.tqdm
    except Exception:  # ImportError, or a broken installation
        return None


def _unpack(packed: np.ndarray, num_ints: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Split a packed callback operand (see :func:`_pack`) into member rows:
    the first id, the ids, the integer fields and the float fields (float64)."""
    packed = np.asarray(packed)
    rows = packed.reshape(-1, packed.shape[-1])
    ints = rows[:, :num_ints].astype(np.int64)
    kind = np.float32 if packed.dtype.itemsize == 4 else np.float64
    floats = np.ascontiguousarray(rows[:, num_ints:]).view(kind).astype(np.float64)
    return int(ints[0, 0]), ints[:, 0], ints[:, 1:], floats


class _Meter:
    """One meter on the host: the span, the latest values, the display."""

    def __init__(self, ident: int, t0: np.ndarray, t1: np.ndarray, sign: float):
        self.ident = ident
        self.t0 = np.asarray(t0, np.float64).ravel()
        self.t1 = np.asarray(t1, np.float64).ravel()
        self.sign = sign
        self.last_draw = -math.inf
        self.pending: np.ndarray | None = None  # the latest report not drawn yet
        self.reported = 0    # the most attempts a report has shown
        self.fraction, self.t, self.h, self.steps = 0.0, float(self.t0[0]), math.nan, 0
        self.members, self.running = self.t0.size, self.t0.size
        self.width = 0       # length of the last stderr line (to blank its tail)
        self.bar = None
        tqdm = _load_tqdm()
        if tqdm is not None:
            self.bar = tqdm(total=1.0, desc=NAME, leave=True, mininterval=0.0,
                            bar_format="{desc}: {percentage:5.1f}%|{bar}| "
                                       "[{elapsed}<{remaining}{postfix}]")

    def _fractions(self, mine: np.ndarray, t: np.ndarray) -> np.ndarray:
        """(t - t0) / (t1 - t0) per member, clipped to [0, 1]; 1 for an empty span."""
        t0, t1 = self.t0, self.t1
        if t0.size == mine.size and t0.size > 1:
            t0, t1 = t0[mine], t1[mine]
        elif t0.size != 1:  # shapes that do not line up: use the first member's span
            t0, t1 = t0[:1], t1[:1]
        span = t1 - t0
        with np.errstate(all="ignore"):
            frac = np.where(span != 0, (t - t0) / np.where(span != 0, span, 1.0), 1.0)
        return np.clip(frac, 0.0, 1.0) + 0.0  # + 0.0: no '-0.0%'

    def _absorb(self, ids: np.ndarray, n: np.ndarray, t: np.ndarray, h: np.ndarray | None,
                stopped: bool) -> None:
        """Take the state of this meter's members; show the least advanced one
        among those still stepping (all of them once ``stopped``)."""
        mine = ids == self.ident
        n, t = n[mine], t[mine]
        frac = self._fractions(mine, t)
        steps = int(n.max())
        # Members still stepping share the largest attempt count.
        running = np.zeros_like(mine[mine]) if stopped else n == steps
        pool = running if running.any() else np.ones_like(running)
        finite = pool & np.isfinite(frac)
        pool = finite if finite.any() else pool
        candidates = np.flatnonzero(pool)
        k = int(candidates[np.argmin(frac[candidates])])
        if np.isfinite(frac[k]):
            self.fraction = float(frac[k])
        self.t = float(t[k])
        if h is not None:
            self.h = float(h[mine][k])
        self.steps, self.members, self.running = steps, int(mine.sum()), int(running.sum())

    def _absorb_pending(self) -> None:
        if self.pending is not None:
            _, ids, ints, floats = _unpack(self.pending, 2)
            self.pending = None
            self._absorb(ids, ints[:, 0], floats[:, 0], floats[:, 1], stopped=False)

    def report(self, packed: np.ndarray, now: float) -> None:
        """Keep a report; decode and draw it only if a redraw is due (cheap otherwise).
        A report of fewer attempts than one already kept is a replay
        (``jax.checkpoint`` recomputing a stretch of the loop): dropped."""
        mine = packed[..., 0] == self.ident
        steps = int(packed[..., 1][mine].max()) if mine.any() else 0
        if steps < self.reported:
            return
        self.reported = steps
        self.pending = packed
        if now - self.last_draw >= MIN_INTERVAL:
            self.last_draw = now
            self._absorb_pending()
            self._draw(None)

    def close(self, packed: np.ndarray) -> None:
        """Draw the final state and finish the display."""
        try:
            self._absorb_pending()  # for the latest step size
            _, ids, ints, floats = _unpack(packed, 3)
            self._absorb(ids, ints[:, 0], floats[:, 0], None, stopped=True)
            self._draw(ints[ids == self.ident, 1])
        finally:
            self._finish()

    def _text(self, status: np.ndarray | None) -> str:
        text = f"t={self.sign * self.t + 0.0:.6g} steps={self.steps}"  # + 0.0: no "t=-0"
        if not math.isnan(self.h):  # nan: no report yet
            text += f" h={self.sign * self.h:.2e}"
        if self.members > 1:
            text += (f" members={self.members}" if status is not None
                     else f" running={self.running}/{self.members}")
        if status is not None:
            worst = int(status.min())
            if worst < 0:
                failed = int((status < 0).sum())
                text += f" stopped: {codes.message(worst)}"
                if self.members > 1:
                    text += f" ({failed} of {self.members} members failed)"
        return text

    def _draw(self, status: np.ndarray | None) -> None:
        text = self._text(status)
        if self.bar is not None:
            self.bar.n = self.fraction
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.refresh()
            return
        with _LOCK:
            tag = NAME if len(_METERS) <= 1 else f"{NAME}[{self.ident}]"
        line = f"{tag}: {100.0 * self.fraction:5.1f}% {text}"
        pad = " " * max(self.width - len(line), 0)
        self.width = len(line)
        stream = sys.stderr
        stream.write("\r" + line + pad)
        stream.flush()

    def _finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _host_open(t0: np.ndarray, t1: np.ndarray, sign: float) -> np.ndarray:
    ident = next(_IDS) % (2**31 - 1)
    try:
        meter = _Meter(ident, t0, t1, sign)
        with _LOCK:
            _METERS[ident] = meter
    except Exception:
        pass  # a meter must never stop a solve
    return np.asarray(ident, np.int32)


def _host_report(packed: np.ndarray) -> None:
    """``packed[..., :] = [meter, num_steps, bits(t), bits(h)]`` per member."""
    try:
        packed = np.asarray(packed).copy()  # kept beyond the call: copy the buffer
        now = time.monotonic()
        ids = packed[..., 0].ravel()
        first = int(ids[0])
        idents = [first] if ids.size == 1 or (ids == first).all() else np.unique(ids).tolist()
        for ident in idents:
            meter = _METERS.get(int(ident))
            if meter is not None:
                meter.report(packed, now)
    except Exception:
        pass  # a meter must never stop a solve


def _host_close(packed: np.ndarray) -> None:
    """``packed[..., :] = [meter, num_steps, status, bits(t)]`` per member."""
    try:
        packed = np.asarray(packed).copy()
        for ident in np.unique(packed[..., 0]).tolist():
            with _LOCK:
                meter = _METERS.pop(int(ident), None)
            if meter is not None:
                meter.close(packed)
    except Exception:
        pass  # a meter must never stop a solve


# ----------------------------------------------------------------------------
# Traced side
# ----------------------------------------------------------------------------

def _leading(axis_size: int, in_batched: Any, operands: tuple) -> list:
    """Operands with the batch axis as an ordinary leading axis (broadcast if unbatched)."""
    def full(v: jax.Array, batched: bool) -> jax.Array:
        return v if batched else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
    return [full(v, b) for v, b in zip(operands, in_batched)]


def _make_open(sign: float) -> Any:
    """A fresh opener: a ``custom_vmap`` function around a ``pure_callback``.

    ``pure_callback`` rather than ``io_callback``: an IO effect cannot be
    vmapped inside a ``cond`` (a solve in a branch of a vmapped ``cond``
    would fail to trace). Its id is used by every report, so the callback
    is not dropped, and each opener holds its own callable, so two solves
    with the same span are not merged.
    """
    def host(t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        return _host_open(t0, t1, sign)

    @custom_vmap
    def open_(t0: jax.Array, t1: jax.Array) -> jax.Array:
        return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.int32), t0, t1,
                                 vmap_method="broadcast_all")

    @open_.def_vmap
    def open_batched(axis_size: int, in_batched: list, t0: jax.Array, t1: jax.Array) -> tuple:
        # One meter for the whole batch, which keeps every member's span.
        return open_(*_leading(axis_size, in_batched, (t0, t1))), False

    return open_


def _pack(ints: list, floats: list) -> jax.Array:
    """One operand for a callback: the integers, then the bits of the floats,
    stacked on a last axis of an integer type as wide as the floats (a
    callback's cost grows with its number of operands)."""
    kind = floats[0].dtype if jnp.finfo(floats[0].dtype).bits >= 32 else jnp.float32
    wide = jnp.int32 if jnp.finfo(kind).bits == 32 else jnp.int64
    fields = [v.astype(wide) for v in ints]
    fields += [lax.bitcast_convert_type(v.astype(kind), wide) for v in floats]
    shape = jnp.broadcast_shapes(*(jnp.shape(v) for v in fields))
    return jnp.stack([jnp.broadcast_to(v, shape) for v in fields], axis=-1)


def _buffers_on_host() -> bool:
    """Whether a ``buffer_callback`` can serve: a jax that has it, the CPU,
    one device (a program partitioned over several needs a sharding on every
    callback, which JAX gives its own callbacks and not a ``buffer_callback``:
    XLA stopped with "Side-effect HLO must have sharding")."""
    return _buffer_callback is not None and jax.default_backend() == "cpu" \
        and jax.device_count() == 1


def _send(host: Any, packed: jax.Array) -> None:
    """Call ``host(packed)`` on the host from the running computation, for its effect.

    On the CPU a ``buffer_callback`` hands over the buffer itself; elsewhere,
    or in a jax without it, ``jax.debug.callback``, which costs more per call
    (it wraps its operand as a ``jax.Array``). With several devices also
    ``jax.debug.callback`` (see :func:`_buffers_on_host`).
    """
    if _buffers_on_host():
        def on_buffers(ctx: Any, out: Any, operand: Any) -> None:
            host(operand)
        _buffer_callback(on_buffers, jax.ShapeDtypeStruct((), jnp.int32),
                         has_side_effect=True)(packed)
    else:
        jax.debug.callback(host, packed)


@custom_vmap
def _report(meter: jax.Array, t: jax.Array, h: jax.Array, n: jax.Array) -> tuple:
    due = lax.rem(jnp.max(n), jnp.asarray(EVERY, n.dtype)) == 0
    lax.cond(due, lambda: _send(_host_report, _pack([meter, n], [t, h])), lambda: None)
    return ()


@_report.def_vmap
def _report_batched(axis_size: int, in_batched: list, *operands: jax.Array) -> tuple:
    # The largest count is that of the members still stepping, so the cond
    # stays a cond (a batched predicate would run the callback every step).
    _report(*_leading(axis_size, in_batched, operands))
    return (), ()


def _host_echo(meter: np.ndarray, packed: np.ndarray) -> np.ndarray:
    """Report ``packed`` (:func:`_host_report`) and hand ``meter`` back: the
    result of a callback that the loop carries as its meter id."""
    _host_report(packed)
    return np.asarray(meter, np.int32)


def _echo(meter: jax.Array, packed: jax.Array) -> jax.Array:
    """``meter``, from the host after it took ``packed``: a callback without
    an effect (JAX keeps it because its result is used), so ``jax.checkpoint``
    and ``vmap`` of a ``cond`` accept it. On one CPU device a
    ``buffer_callback`` (as cheap as the effectful one: 0.30-0.38 s for both
    on a 20000-step solve, against 0.75-0.87 s with ``jax.pure_callback``);
    elsewhere a ``jax.pure_callback``, which JAX places on the first device
    of a partitioned program."""
    shape = jax.ShapeDtypeStruct(jnp.shape(meter), jnp.int32)
    if _buffers_on_host():
        def on_buffers(ctx: Any, out: Any, ids: Any, operand: Any) -> None:
            np.asarray(out)[...] = _host_echo(np.asarray(ids), operand)
        return _buffer_callback(on_buffers, shape)(meter, packed)
    return jax.pure_callback(_host_echo, shape, meter, packed, vmap_method="broadcast_all")


@custom_vmap
def _report_carried(meter: jax.Array, t: jax.Array, h: jax.Array, n: jax.Array) -> jax.Array:
    due = lax.rem(jnp.max(n), jnp.asarray(EVERY, n.dtype)) == 0
    return lax.cond(due, lambda: _echo(meter, _pack([meter, n], [t, h])), lambda: meter)


@_report_carried.def_vmap
def _report_carried_batched(axis_size: int, in_batched: list, meter: jax.Array,
                            *operands: jax.Array) -> tuple:
    # The meter keeps its own batching (one meter per call: unbatched).
    return _report_carried(meter, *_leading(axis_size, in_batched[1:], operands)), in_batched[0]


@custom_vmap
def _close(meter: jax.Array, t: jax.Array, n: jax.Array, status: jax.Array) -> tuple:
    _send(_host_close, _pack([meter, n, status], [t]))
    return ()


@_close.def_vmap
def _close_batched(axis_size: int, in_batched: list, *operands: jax.Array) -> tuple:
    _close(*_leading(axis_size, in_batched, operands))
    return (), ()


def _traced(*values: Any) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


def _time(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    return lax.stop_gradient(x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(float))


def open_meter(t_start: float | jax.Array, t_end: float | jax.Array, *,
               time_sign: float = 1.0) -> jax.Array:
    """Open a meter for a solve from ``t_start`` to ``t_end`` (either direction).

    Called once per solve inside the traced function; the meter is created
    on the host when the computation runs, so every run of a compiled solve
    (and every call under ``vmap``) gets its own meter.

    Args:
      t_start, t_end: the span; the fraction shown is
        ``(t - t_start) / (t_end - t_start)``.
      time_sign: the shown ``t`` and ``h`` are multiplied by it (``-1`` when
        the loop runs in reversed time ``s = -t``).

    Returns:
      The meter's id, an int32 scalar to pass to :func:`report` and
      :func:`close_meter`.
    """
    if not _traced(t_start, t_end):  # eager (jax.disable_jit): no callback needed
        return jnp.asarray(_host_open(np.asarray(t_start), np.asarray(t_end), float(time_sign)))
    return _make_open(float(time_sign))(_time(t_start), _time(t_end))


def report(meter: jax.Array, t: jax.Array, h: jax.Array, num_steps: jax.Array) -> None:
    """Report the loop's state; call in the loop body on every attempted step.

    Every ``EVERY`` attempts (``num_steps % EVERY == 0``) a callback hands
    ``t``, ``h`` and ``num_steps`` to the host, which redraws the meter at
    most once per ``MIN_INTERVAL`` seconds.
    """
    if not _traced(meter, t, h, num_steps):  # eager (jax.disable_jit)
        if int(np.max(num_steps)) % EVERY == 0:
            _host_report(_pack([jnp.asarray(meter), jnp.asarray(num_steps)],
                               [jnp.asarray(t), jnp.asarray(h)]))
        return
    n = jnp.asarray(num_steps)
    if not jnp.issubdtype(n.dtype, jnp.integer):
        n = n.astype(jnp.int32)
    _report(jnp.asarray(meter), _time(t), _time(h), lax.stop_gradient(n))


def report_carried(meter: jax.Array, t: jax.Array, h: jax.Array,
                   num_steps: jax.Array) -> jax.Array:
    """:func:`report` as a value: returns the meter id, which the loop must
    carry (``meter = report_carried(meter, ...)``) for the reports to run.

    The callback's result is the id it was given (:func:`_echo`); it is not
    an effect, so the report also runs where JAX refuses effects:
    inside ``jax.checkpoint`` (the checkpointed loop of the checkpoint
    adjoint, reverse mode). Where ``jax.checkpoint`` recomputes a stretch of
    the loop in the backward pass, its reports come again, after the meter
    was closed; the host drops them (a closed meter is forgotten, and a
    meter never goes back to fewer steps than it has shown).
    """
    if not _traced(meter, t, h, num_steps):  # eager (jax.disable_jit)
        report(meter, t, h, num_steps)
        return meter
    n = jnp.asarray(num_steps)
    if not jnp.issubdtype(n.dtype, jnp.integer):
        n = n.astype(jnp.int32)
    return _report_carried(jnp.asarray(meter), _time(t), _time(h), lax.stop_gradient(n))


def close_meter(meter: jax.Array, t: jax.Array, num_steps: jax.Array, status: jax.Array) -> None:
    """Draw the final state (100%, or where the solve stopped, with the
    status message of a failure) and close the meter."""
    if not _traced(meter, t, num_steps, status):  # eager (jax.disable_jit)
        _host_close(_pack([jnp.asarray(meter), jnp.asarray(num_steps), jnp.asarray(status)],
                          [jnp.asarray(t)]))
        return
    _close(jnp.asarray(meter), _time(t), lax.stop_gradient(jnp.asarray(num_steps)),
           lax.stop_gradient(jnp.asarray(status)))
