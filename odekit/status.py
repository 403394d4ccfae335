"""One table of solver status codes, one exception hierarchy, one way to raise.

Every odekit solver ends with an int32 ``status``: ``0`` is success, ``1`` a
terminal event (also a success), negative codes are failures. With
``throw=True`` a failure raises a subclass of :class:`SolverError` through
:func:`raise_if_failed`:

* a concrete status is checked in Python and raises the error itself;
* a traced status (under ``jit``, ``vmap``, ``grad``) is checked by a
  ``lax.cond`` whose failing branch calls back to the host, which raises.
  A ``custom_vmap`` rule turns a batch axis into an ordinary axis and reduces
  it, so the cond stays a cond and the callback runs at most once per call
  and sees the whole batch. The check's token is tied into the returned
  value so it is never removed as dead code.

The callback is odekit's own primitive (:data:`raise_failure_p`), not
``jax.pure_callback``, for two reasons. Over several devices (a batch placed
with a ``NamedSharding``) it is replicated: every device gathers the batch
and raises, where a ``pure_callback`` runs on device 0 alone while the
others wait for its result in a collective, until XLA aborts the process.
Inside ``shard_map`` the failure flag is summed over the mesh axes first, so
every device takes the failing branch together. And it logs nothing: a
``pure_callback`` logs "jax.pure_callback failed" and a traceback to stderr
for every exception, also one the caller catches.

What the caller catches from a compiled check (jax 0.10.2, CPU, tested in
``tests/test_status.py``): the exception raised on the host does not cross
XLA, and its class depends on JAX's dispatch path. Calls through the Python
path (the call that compiles a jitted function, later calls of a function
that has never succeeded, eager ``vmap``/``grad``) raise
``jax.errors.JaxRuntimeError`` (a ``RuntimeError``); calls through the C++
fast path, which a jitted function takes once it has succeeded, raise
``ValueError``. Catch :data:`ERRORS` to cover every path. JAX writes the
text: its own first line (on the CPU ``"INTERNAL: CpuCallback error calling
callback: Traceback (most recent call last):"``, at times after ``"INTERNAL:
Error dispatching computation: "`` over several devices), one ``File ...`` line
per Python frame of the thread that ran the callback (the caller's whole
stack on one device), then ``"<ErrorClass>: <odekit's message>"`` to the
end. odekit cannot put its message first (JAX builds the text from the
traceback; no hook runs on the way to the caller); :func:`failure_message`
returns it from any of these exceptions (``None`` for one that is no odekit
failure).

Over several devices the failed computation also leaves its error in JAX's
runtime tokens: ``jax.effects_barrier()`` raises it again until a later call
through JAX's Python path replaces the tokens, and JAX would print it at
exit ("Exception ignored in atexit callback"). odekit drops such tokens at
exit when their error is an odekit failure (:func:`_forget_failures_at_exit`):
the caller got the exception when it read the result.
"""
from __future__ import annotations

import atexit
import contextlib
import re
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import ShapedArray
from jax.custom_batching import custom_vmap
from jax.extend.core import Primitive
from jax.interpreters import mlir

from odekit import _lax as ops
from odekit._tree import varying_axes

SUCCESS = 0
TERMINATED = 1        # a terminal event stopped an ODE solve (counts as success)
MAX_STEPS = -1        # step/iteration limit reached
STEP_UNDERFLOW = -2   # ODE step size underflowed (t + h == t or h below rounding of t)
NONFINITE = -3        # nan/inf state, derivative, iterate or residual
STIFF = -4            # ODE: problem detected as stiff for an explicit method
BAD_TIMES = -5        # ODE: output times not strictly monotonic (seen at run time under jit)
STALLED = -6          # ODE: the state stopped changing though its derivative is not zero
SINGULAR = -7         # root: singular Jacobian
BAD_BRACKET = -8      # root bisection: bracket has no sign change
NO_PROGRESS = -9      # root: line search could not reduce |f|
BACKSOLVE_UNSTABLE = -10  # ODE backsolve adjoint: its re-integrated y left the forward solution
NOT_A_ROOT = -11      # root bisection: the bracket closed on a sign change where |f| is not small
BAD_SPARSITY = -12    # ODE: df/dy has a nonzero outside the given jac_sparsity pattern
DAE_INCONSISTENT = -13  # ODE with a mass matrix: y0 violates the algebraic equations, or index > 1

MESSAGES: dict[int, str] = {
    SUCCESS: "success",
    TERMINATED: "a terminal event occurred",
    MAX_STEPS: "the maximum number of steps was reached",
    STEP_UNDERFLOW: "the step size underflowed (the problem may be stiff or singular there)",
    NONFINITE: "non-finite (nan or inf) state, derivative, iterate or residual",
    STIFF: ("the problem appears to be stiff: the step size has been limited by the "
            "method's stability for many steps, so an explicit method would crawl and "
            "accumulate rounding"),
    BAD_TIMES: "the output times t are not strictly monotonic",
    STALLED: ("the state stopped changing although its derivative is not zero (the "
              "tolerance is below the precision of the dtype)"),
    SINGULAR: "singular Jacobian: the linear system for the step could not be solved",
    BAD_BRACKET: ("f(lower) and f(upper) have the same sign, so (lower, upper) does not "
                  "bracket a root"),
    NO_PROGRESS: "the line search could not reduce |f(x)| along the step",
    BACKSOLVE_UNSTABLE: ("the backward solve of the continuous (backsolve) adjoint re-integrated "
                         "y away from the forward solution, beyond the tolerance: its gradient "
                         "is not reliable for this problem"),
    NOT_A_ROOT: ("the bracket closed on a sign change of f that is not a root (a pole or a "
                 "discontinuity): |f| did not shrink as the bracket shrank"),
    BAD_SPARSITY: ("the Jacobian df/dy at the start has a nonzero outside the given sparsity "
                   "pattern (jac_sparsity or lband/uband)"),
    DAE_INCONSISTENT: ("the initial value does not satisfy the algebraic equations of the "
                       "mass-matrix DAE to the tolerance, or the DAE is not of index 1 there "
                       "(the algebraic equations' Jacobian in the algebraic components is "
                       "singular)"),
}


def message(code: int) -> str:
    """The human text of a status ``code`` (``"status <code>"`` if unknown)."""
    return MESSAGES.get(int(code), f"status {code}")


class SolverError(RuntimeError):
    """Base class of every odekit solver failure."""


class ODESolverError(SolverError):
    """Raised when an ODE solve stops before reaching its final time."""


class RootSolverError(SolverError):
    """Raised when ``odekit.root`` or ``odekit.fixed_point`` fails."""


#: Every class a failed solve reaches its caller as: the odekit class itself
#: outside compiled code; ``JaxRuntimeError`` or ``ValueError`` from JAX's
#: dispatch under ``jit`` (see the module docstring). ``except ERRORS``.
ERRORS = (SolverError, jax.errors.JaxRuntimeError, ValueError)

_LINE_START = re.compile(r"(?:\A|\n)(\w+): ")   # "ODESolverError: " opens the message


def failure_message(error: BaseException) -> str | None:
    """odekit's message in ``error``, or ``None`` if ``error`` is no odekit failure.

    Args:
      error: an exception caught around a call of an odekit solver: a
        :class:`SolverError`, or the ``JaxRuntimeError`` / ``ValueError``
        that JAX raises when the failure was found in compiled code (its
        text ends with ``"<ErrorClass>: <message>"``).

    Returns:
      The message (it names the solver, the reason and the numbers).
    """
    if isinstance(error, SolverError):
        return str(error)
    text, names = str(error), _solver_error_names()
    return next((text[m.end():] for m in _LINE_START.finditer(text) if m.group(1) in names),
                None)


def _solver_error_names(cls: type = SolverError) -> set[str]:
    return {cls.__name__}.union(*(_solver_error_names(sub) for sub in cls.__subclasses__()))


Describe = Callable[..., str]


def _is_traced(tree: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def _raising_host(describe: Describe, error: type[SolverError]) -> Callable[..., None]:
    def host(status: np.ndarray, *fields: np.ndarray) -> None:
        raise error(describe(np.asarray(status), *map(np.asarray, fields)))
    return host


# ``raise_failure_p.bind(status, *fields, host=host)`` calls ``host`` on the
# host, which raises; it is bound only in the failing branch of the check.
raise_failure_p = Primitive("odekit_raise_failure")


@raise_failure_p.def_abstract_eval
def _raise_failure_abstract_eval(*avals: Any, host: Callable) -> ShapedArray:
    return ShapedArray((), jnp.bool_)


@raise_failure_p.def_impl
def _raise_failure_impl(*operands: Any, host: Callable) -> np.ndarray:
    host(*map(np.asarray, operands))  # eager (``jax.disable_jit``): the odekit error itself
    return np.True_


def _raise_failure_lowering(ctx: mlir.LoweringRuleContext, *operands: Any,
                            host: Callable) -> Sequence[Any]:
    """A host callback with no sharding annotation: in a program partitioned
    over several devices the partitioner replicates it, so every device
    gathers the whole batch, calls ``host`` and stops with the error (a
    ``pure_callback`` runs on device 0 alone while the others wait for its
    result in a collective, and XLA aborts the process after 40 s). No
    ``logging`` record either (``pure_callback`` logs a traceback for every
    exception, even one the caller catches)."""
    def callback(*arrays: np.ndarray) -> tuple[np.ndarray]:
        host(*arrays)
        return (np.True_,)
    results, _, _ = mlir.emit_python_callback(
        ctx, callback, None, list(operands), ctx.avals_in, ctx.avals_out,
        has_side_effect=False, returns_token=False)
    return results


mlir.register_lowering(raise_failure_p, _raise_failure_lowering, cacheable=False)


def _gather_axes(operands: tuple) -> tuple[str, ...]:
    """The ``shard_map`` axes whose devices hold different members: those the
    operands vary along, or every manual axis when none is known to vary (as
    with ``check_vma=False``). Empty outside ``shard_map``."""
    manual = jax.sharding.get_abstract_mesh().manual_axes
    varying = frozenset().union(*(varying_axes(v) for v in operands)) & frozenset(manual)
    return tuple(sorted(varying or manual))


def _vary_along(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    missing = tuple(sorted(set(axes) - varying_axes(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


# (members, padded size, type of the values vmapped) of each ``padded_batch`` being traced.
_PADDED_BATCHES: list[tuple[int, int, type]] = []


@contextlib.contextmanager
def padded_batch(size: int, padded: int, example: Any) -> Iterator[None]:
    """While ``jax.vmap`` of a batch of ``size`` members padded to ``padded``
    with copies of its last member is traced (``odekit.ensemble`` pads a
    batch so that it splits evenly over devices), failure checks batched
    along that axis count and name the caller's members only.

    A copy fails exactly when the member it copies does, so the checks
    drop the padding rows after folding any failure among them into the
    last member's row: no failure is ever dropped, even if the rows were
    not copies. ``example`` is one of the vmapped values (a tracer of the
    enclosing ``jit``): a check is batched along the padded axis when its
    operands are values of that kind, not the tracers of a ``vmap`` inside
    the mapped function, whose axis may happen to have the same size.
    """
    _PADDED_BATCHES.append((size, padded, type(example)))
    try:
        yield
    finally:
        _PADDED_BATCHES.pop()


def _drop_padding(axis_size: int, operands: list) -> list:
    """``operands`` (batch axis leading) without the rows of a
    :func:`padded_batch` being traced, when the axis is its; else unchanged."""
    if not _PADDED_BATCHES:
        return operands
    size, padded, kind = _PADDED_BATCHES[-1]
    if axis_size != padded or size == padded or any(
            isinstance(v, jax.core.Tracer) and type(v) is not kind for v in operands):
        return operands
    status = operands[0]
    tail = lax.slice_in_dim(status, size - 1, padded) < 0
    tail_failed = jnp.any(tail.reshape(padded - size + 1, -1), axis=1)
    source = size - 1 + jnp.argmax(tail_failed)   # the last member, or the first failed copy
    return [lax.dynamic_update_index_in_dim(
                lax.slice_in_dim(v, 0, size), lax.dynamic_index_in_dim(v, source, 0, False),
                size - 1, 0)
            for v in operands]


def _make_check(describe: Describe, error: type[SolverError]) -> Callable[..., jax.Array]:
    """A ``custom_vmap`` function ``(status, *fields) -> True`` that raises on failure.

    Inside ``shard_map`` every device must take the same branch (a device
    that raises while another waits in a later collective aborts the
    process), so the failure flag is summed over the mesh axes along which
    devices hold different members, and the failing branch gathers them all
    (each member once) before raising.
    """
    host = _raising_host(describe, error)

    def raise_now(operands: tuple, axes: tuple[str, ...]) -> jax.Array:
        if axes:
            operands = tuple(lax.all_gather(_vary_along(v, axes), axes) for v in operands)
        return raise_failure_p.bind(*operands, host=host)

    @custom_vmap
    def check(status: jax.Array, *fields: jax.Array) -> jax.Array:
        failed = ops.any_of(lax.lt(status, np.zeros((), status.dtype)))
        axes = _gather_axes((status, *fields))
        if axes:
            failed = lax.psum(_vary_along(failed.astype(jnp.int32), axes), axes) > 0
        return lax.cond(failed, partial(raise_now, axes=axes), lambda _: jnp.bool_(True),
                        (status, *fields))

    @check.def_vmap
    def check_batched(axis_size: int, in_batched: list, *operands: Any) -> tuple:
        # The batch axis becomes an ordinary leading axis: one any() and one
        # cond per call, and the callback sees every member.
        def full(v: jax.Array, batched: bool) -> jax.Array:
            return v if batched else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
        operands = _drop_padding(axis_size, jax.tree.map(full, list(operands), list(in_batched)))
        return check(*operands), False

    return check


def _tie(token: jax.Array, value: Any) -> Any:
    """``value`` with its array leaves selected by ``token`` (True whenever
    the call returns), so the compiler cannot drop the check.

    Every numeric leaf is tied (integer and boolean ones too, so a value
    without floating leaves is still guarded); ``float0`` leaves (symbolic
    zero cotangents) and non-arrays pass through. The unused branch is zeros,
    not NaN: a NaN constant would trip ``jax_debug_nans`` when executed
    eagerly (``jax.disable_jit``).
    """
    def tie(v: Any) -> Any:
        if not hasattr(v, "dtype") or v.dtype == jax.dtypes.float0:
            return v
        return lax.select(token, v, lax.full_like(v, 0))
    return jax.tree.map(tie, value)


def raise_if_failed(status: jax.Array, value: Any, fields: tuple, describe: Describe,
                    error: type[SolverError]) -> Any:
    """Raise ``error(describe(...))`` if any ``status < 0``; else return ``value``.

    Args:
      status: int32 array, a scalar (or batched under ``vmap``).
      value: pytree returned unchanged; under a trace every array leaf
        (every inexact one in particular) is tied to the check's token so
        the check is not dead code.
      fields: tuple of arrays of the same batch shape as ``status``, passed
        to ``describe``.
      describe: ``describe(status, *fields) -> str`` on NumPy arrays, which
        have leading batch axes when the call is batched (one per ``vmap``).
        Called only when some status is negative.
      error: the :class:`SolverError` subclass to raise.

    Returns:
      ``value``.

    Raises:
      SolverError: ``error`` itself when ``status`` is concrete; under a
        trace the error raised at run time reaches the caller as
        ``jax.errors.JaxRuntimeError`` or ``ValueError`` (all in
        :data:`ERRORS`; see the module docstring), whose text ends with
        odekit's message (:func:`failure_message`).
    """
    operands = (status, *fields)
    if not _is_traced(operands):
        status = np.asarray(status)
        if np.any(status < 0):
            raise error(describe(status, *map(np.asarray, fields)))
        return value
    operands = jax.tree.map(lax.stop_gradient, operands)
    token = _make_check(describe, error)(*operands)
    return _tie(token, value)


def _forget_failures_at_exit() -> None:
    """Drop JAX's runtime tokens that hold an odekit failure (see the module
    docstring); JAX's own exit handlers, registered before odekit's, run
    after this one. A no-op if JAX's internals have moved."""
    try:
        from jax._src import dispatch
        tokens = dispatch.runtime_tokens.output_runtime_tokens
    except (ImportError, AttributeError):
        return
    for device, token in list(tokens.items()):
        try:
            token.block_until_ready()
        except Exception as error:  # noqa: BLE001 - only odekit's own are dropped
            if failure_message(error) is not None:
                tokens.pop(device, None)


atexit.register(_forget_failures_at_exit)
