"""Error norms, the PI step-size controller and the initial step size.

Error norm (Hairer, Norsett & Wanner, Solving ODEs I, eq. II.4.11): with
``scale = atol + rtol * max(|y0|, |y1|)``,

    err = sqrt(mean((e / scale)^2))          over every element of every leaf,

and for Dormand-Prince 8(5,3) the combined estimate of DOP853 (ibid.,
Sec. II.10): ``err = e5^2 / sqrt(e5^2 + 0.01 e3^2)`` with e5, e3 the norms of
the 5th- and 3rd-order estimates.

PI controller (Gustafsson 1991; Hairer, Norsett & Wanner, Sec. II.4, and the
defaults of Hairer's dopri5.f, beta = 0.04 for k = 5): with k the exponent
order (error_order + 1),

    h_new = h * clip(safety * err^(-beta1) * err_prev^(beta2), dfactor, ifactor)

beta2 = 0.2 / k (Gustafsson's memory; ``beta2=0`` is the plain rule
``h * safety * err^(-1/k)``, Hairer's dop853.f default BETA = 0 and SciPy's
DOP853), beta1 = 1 / k - 0.75 beta2; after a rejected step the step does not
grow. A step is accepted when err <= 1.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from odekit import _lax as ops

Pytree = Any

SAFETY = 0.9
IFACTOR = 10.0   # largest growth factor
DFACTOR = 0.2    # smallest shrink factor
BETA2_NUMERATOR = 0.2


class Tolerance(NamedTuple):
    """Relative and absolute tolerance (each a Python float or a :class:`PerElement`)."""

    rtol: Any
    atol: Any


class PerElement:
    """A tolerance per element of the state, static: one float64 NumPy array
    per leaf of the state, each broadcastable to its leaf's shape.

    Hashable by the arrays' shapes, dtypes and bytes (so options holding it
    key compiled programs, like a float); the arrays enter a program as
    constants. Front ends turn a tolerance whose entries are all equal into
    a plain float (:func:`uniform_or_per_element`), so a scalar tolerance
    always takes the scalar path.
    """

    __slots__ = ("leaves", "_key")

    def __init__(self, leaves: Any):
        arrays = []
        for leaf in leaves:
            array = np.array(leaf, dtype=np.float64)
            array.setflags(write=False)
            arrays.append(array)
        self.leaves = tuple(arrays)
        self._key = tuple((a.shape, a.dtype.str, a.tobytes()) for a in self.leaves)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PerElement) and self._key == other._key

    def __repr__(self) -> str:
        return f"PerElement({[a.tolist() for a in self.leaves]})"

    def times(self, factor: float) -> PerElement:
        return PerElement([a * factor for a in self.leaves])

    def tightest(self) -> float:
        """The smallest positive entry (0 when every entry is 0): one number for
        a state the entries do not describe (an adjoint's extra components)."""
        values = np.concatenate([a.ravel() for a in self.leaves])
        positive = values[values > 0]
        return float(positive.min()) if positive.size else 0.0


def uniform_or_per_element(leaves: Any) -> float | PerElement:
    """A float when every entry of ``leaves`` (arrays, one per leaf of the
    state) is the same number, else a :class:`PerElement`."""
    arrays = [np.asarray(leaf, dtype=np.float64) for leaf in leaves]
    values = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    if values.size and np.all(values == values[0]):
        return float(values[0])
    return PerElement(arrays)


def scaled_tolerance(value: float | PerElement, factor: float) -> float | PerElement:
    """``value * factor`` for a float or a :class:`PerElement`."""
    return value.times(factor) if isinstance(value, PerElement) else value * factor


def per_leaf(value: float | PerElement, count: int) -> list:
    """The tolerance of each of ``count`` leaves: the float for every leaf,
    or a :class:`PerElement`'s arrays (one per leaf)."""
    if isinstance(value, PerElement):
        if len(value.leaves) != count:
            raise ValueError(f"odekit: a per-element tolerance of {len(value.leaves)} leaves "
                             f"for a state of {count} leaves.")
        return list(value.leaves)
    return [value] * count


def _constant(value: Any, like: jax.Array) -> Any:
    """A tolerance of one leaf in the dtype of ``like``: a scalar literal for
    a number (or a 0-d array), else a NumPy constant of ``like``'s shape."""
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return ops.cast(float(value), like)
        return np.asarray(np.broadcast_to(value, like.shape), like.dtype)
    return ops.cast(value, like)


def _positive(value: Any) -> bool:
    return bool(np.all(np.asarray(value) > 0))


def _scale(size: jax.Array, rtol: Any, atol: Any) -> jax.Array:
    """``atol + rtol * size`` (size: a real leaf)."""
    return lax.add(_constant(atol, size), lax.mul(_constant(rtol, size), size))


def _leafwise(fn: Callable, tol: Tolerance, first: Pytree, *rest: Pytree) -> Pytree:
    """``fn(leaf, *other_leaves, rtol, atol)`` for each leaf of ``first``,
    with the tolerances of that leaf; a pytree like ``first``."""
    leaves, treedef = jax.tree.flatten(first)
    others = [treedef.flatten_up_to(tree) for tree in rest]
    rtols, atols = per_leaf(tol.rtol, len(leaves)), per_leaf(tol.atol, len(leaves))
    return jax.tree.unflatten(treedef, [fn(*parts) for parts in
                                        zip(leaves, *others, rtols, atols)])


def _real_dtype(leaf: Any) -> np.dtype:
    return np.dtype(jnp.finfo(leaf.dtype).dtype)


def _sum_squares(tree: Pytree) -> tuple[jax.Array, int]:
    """Sum of |x|^2 over every element, in the widest real dtype of the leaves
    (a pytree may mix float32 and float64 leaves)."""
    leaves = jax.tree.leaves(tree)
    real = np.result_type(*(_real_dtype(leaf) for leaf in leaves))
    sums = [lax.convert_element_type(ops.total(ops.abs_squared(leaf)), real) for leaf in leaves]
    total = functools.reduce(lax.add, sums) if sums else np.zeros((), real)
    return total, sum(leaf.size for leaf in leaves)


def scaled(err: Pytree, y0: Pytree, y1: Pytree, tol: Tolerance,
           slack: Pytree | None = None) -> Pytree:
    """Each error leaf divided by ``atol + rtol * max(|y0|, |y1|)`` (plus
    ``slack``, a real pytree like y, when given); an exact zero error counts
    as zero even where the scale is zero (``atol=0`` on a component that
    stays 0), any other error over a zero scale as inf."""
    def leaf(e, a, b, extra, rtol, atol):
        size = lax.max(lax.abs(a), lax.abs(b))
        scale = _scale(size, rtol, atol)
        if extra is not None:
            scale = lax.add(scale, lax.convert_element_type(extra, scale.dtype))
        ratio = lax.div(e, lax.convert_element_type(scale, e.dtype))
        if _positive(atol):
            return ratio
        return ops.select(lax.eq(e, ops.cast(0, e)), lax.full_like(e, 0), ratio)
    if slack is None:
        return _leafwise(lambda e, a, b, rtol, atol: leaf(e, a, b, None, rtol, atol),
                         tol, err, y0, y1)
    return _leafwise(leaf, tol, err, y0, y1, slack)


def probe_scale(y0: Pytree, y1: Pytree, tol: Tolerance) -> Pytree:
    """The error norm's scale ``atol + rtol * max(|y0|, |y1|)`` per element
    (real leaves like ``y0``), with 1 where it is 0: the units in which the
    stiffness test compares stages (a zero scale has no units to offer)."""
    def leaf(a, b, rtol, atol):
        scale = _scale(lax.max(lax.abs(a), lax.abs(b)), rtol, atol)
        return ops.select(lax.gt(scale, ops.cast(0, scale)), scale, 1.0)
    return _leafwise(leaf, tol, y0, y1)


def rms(tree: Pytree) -> jax.Array:
    """Root mean square over all elements of all leaves (real scalar)."""
    total, count = _sum_squares(tree)
    return lax.sqrt(lax.div(total, ops.cast(max(count, 1), total)))


def error_norm(error: Pytree, error_secondary: Pytree, y0: Pytree, y1: Pytree,
               tol: Tolerance, slack: Pytree | None = None) -> jax.Array:
    """Scaled RMS norm of the local error estimate (DOP853 form when two);
    ``slack`` (a real pytree like y, or None) widens the scale (see
    :func:`time_rounding`)."""
    e5 = rms(scaled(error, y0, y1, tol, slack))
    if error_secondary is None:
        return e5
    e3 = rms(scaled(error_secondary, y0, y1, tol, slack))
    denom = lax.sqrt(lax.add(lax.mul(e5, e5), lax.mul(lax.mul(ops.cast(0.01, e3), e3), e3)))
    # 0 / 0 -> 0 (a perfect step); nan stays nan so that the step is rejected.
    zero = lax.eq(denom, ops.cast(0, denom))
    return ops.select(zero, 0.0, lax.div(lax.mul(e5, e5), ops.select(zero, 1.0, denom)))


def error_norms(error: Pytree, error_secondary: Pytree, y0: Pytree, y1: Pytree,
                tol: Tolerance, slack: Pytree) -> tuple[jax.Array, jax.Array]:
    """:func:`error_norm` without and with ``slack``, from ONE reduction: the
    scaled errors (two, or four in the DOP853 form) are stacked along a new
    leading axis and their squares summed over the rest, so that a loop
    run kernel by kernel dispatches one reduction, not two or four."""
    estimates = [error] if error_secondary is None else [error, error_secondary]
    rows = [tree for e in estimates
            for tree in (scaled(e, y0, y1, tol), scaled(e, y0, y1, tol, slack))]
    count = len(rows)
    leaves_by_row = [jax.tree.leaves(tree) for tree in rows]
    real = np.result_type(*(_real_dtype(leaf) for leaf in leaves_by_row[0]))
    totals, size = None, 0
    for parts in zip(*leaves_by_row):
        stacked = lax.concatenate([lax.expand_dims(lax.convert_element_type(
            ops.abs_squared(part), real), (0,)) for part in parts], 0)
        summed = lax.reduce_sum(stacked, tuple(range(1, stacked.ndim)))
        totals = summed if totals is None else lax.add(totals, summed)
        size += parts[0].size
    if totals is None:
        totals = jnp.zeros((count,), real)
    norms = lax.sqrt(lax.div(totals, ops.cast(max(size, 1), totals)))
    if error_secondary is None:
        return norms[0], norms[1]
    e5, e3 = norms[:2], norms[2:]
    denom = lax.sqrt(lax.add(lax.mul(e5, e5), lax.mul(lax.mul(ops.cast(0.01, e3), e3), e3)))
    zero = lax.eq(denom, ops.cast(0, denom))
    combined = ops.select(zero, jnp.zeros_like(denom),
                          lax.div(lax.mul(e5, e5), ops.select(zero, jnp.ones_like(denom), denom)))
    return combined[0], combined[1]


def lost_to_rounding(y0: Pytree, y1: Pytree, f0: Pytree, h: jax.Array) -> Pytree:
    """The part of a step that rounding swallowed: ``h f0_i`` on the components
    the step left bit-for-bit unchanged (``y1_i == y0_i``), 0 elsewhere. When
    ``h f`` falls below half an ulp of ``y`` (a tolerance below the dtype's
    precision), every step loses it; summed over the steps (with its sign,
    so that rounding noise in ``f`` averages out) it is the change the solve
    failed to make. A pytree like ``y``.

    Only a change rounding can explain counts: ``|h f0_i| <= eps |y0_i|``.
    A larger ``h f0_i`` on an unchanged component is the method's own doing
    (an explicit step at its stability limit near an equilibrium, whose
    stages cancel), not a loss to rounding."""
    def leaf(a, b, f):
        change = lax.mul(ops.cast(h, f), f)
        ulp = lax.mul(ops.cast(jnp.finfo(a.dtype).eps, lax.abs(a)), lax.abs(a))
        kept = lax.bitwise_and(lax.eq(b, a), lax.le(lax.abs(change), ulp))
        return ops.select(kept, change, 0)
    return jax.tree.map(leaf, y0, y1, f0)


def stalled(drift: Pytree, y: Pytree, tol: Tolerance) -> jax.Array:
    """Whether the accumulated lost change exceeds the tolerance on some
    component: ``max_i |drift_i| / (atol + rtol |y_i|) > 1`` (bool scalar)."""
    def leaf(d, a, rtol, atol):
        size = lax.abs(a)
        scale = _scale(size, rtol, atol)
        return ops.any_of(lax.gt(lax.abs(d), scale))
    return functools.reduce(lax.bitwise_or, jax.tree.leaves(_leafwise(leaf, tol, drift, y)))


RESOLUTION_ULPS = 8   # a step this many ulp of t long cannot be made shorter (Hairer: 10)


def time_rounding(t: jax.Array, f0: Pytree, f1: Pytree) -> Pytree:
    """``RESOLUTION_ULPS eps(t) |t| max(|f0|, |f1|)`` per element: how much y
    moves while t moves by the smallest step the loop can take. The
    solution at a floating-point time is known to no better than that, so a
    step that short is accepted when its error is within the tolerance
    widened by it (:func:`error_norm`'s ``slack``). Without it a jump of
    the field (a kink of y, a switched forcing) ended float32 solves: at
    t = 7 a step of 8 ulp is 7e-6, and its error on a jump of f by 1,
    ~1e-7, is 10 times the default atol 1.4e-8 (jax.experimental.ode, with
    no floor on the step, steps through). Far from ``t = 0`` in float64 the
    slack is 1e-15 |t f|."""
    dt = lax.mul(ops.cast(RESOLUTION_ULPS * float(jnp.finfo(t.dtype).eps), t), lax.abs(t))

    def leaf(a, b):
        size = lax.max(lax.abs(a), lax.abs(b))
        return lax.mul(lax.convert_element_type(dt, size.dtype), size)
    return jax.tree.map(leaf, f0, f1)


def default_beta2(exponent_order: int) -> float:
    """Gustafsson's PI memory coefficient for the exponent order k: 0.2 / k
    (Hairer's dopri5.f: BETA = 0.04 for k = 5)."""
    return BETA2_NUMERATOR / float(exponent_order)


def propose_step(h: jax.Array, err: jax.Array, err_prev: jax.Array,
                 exponent_order: int, accepted: jax.Array,
                 previous_rejected: jax.Array, beta2: float | None = None) -> jax.Array:
    """Next step size from the PI rule; ``err`` may be nan (then shrink hard).

    ``beta2`` is the weight of the previous error (None: :func:`default_beta2`;
    0: the plain rule, which ignores ``err_prev``)."""
    k = float(exponent_order)
    beta2 = default_beta2(exponent_order) if beta2 is None else float(beta2)
    beta1 = 1.0 / k - 0.75 * beta2
    c = lambda value: ops.cast(value, err)
    finite = lax.is_finite(err)
    safe_err = ops.select(lax.bitwise_and(finite, lax.gt(err, c(0))), err, 1.0)
    # One exp of a sum of logs, not two powers: XLA's CPU backend inlines exp
    # and log but calls libm for pow, which is a measurable part of a step.
    exponent = lax.neg(lax.mul(c(beta1), lax.log(safe_err)))
    if beta2:
        exponent = lax.add(exponent, lax.mul(c(beta2), lax.log(lax.max(err_prev, c(1e-4)))))
    factor = lax.mul(c(SAFETY), lax.exp(exponent))
    factor = ops.select(lax.eq(err, c(0)), IFACTOR, factor)
    at_most_one = lax.min(factor, c(1.0))
    factor = ops.select(accepted, factor, at_most_one)
    factor = ops.select(lax.bitwise_and(accepted, previous_rejected), at_most_one, factor)
    factor = lax.clamp(c(DFACTOR), factor, c(IFACTOR))
    factor = ops.select(finite, factor, DFACTOR)
    return lax.mul(h, lax.convert_element_type(factor, h.dtype))


def initial_step(func: Callable, t0: jax.Array, y0: Pytree, f0: Pytree,
                 order: int, tol: Tolerance, t_end: jax.Array | None = None,
                 hmax: float = float("inf")) -> jax.Array:
    """Starting step size (Hairer, Norsett & Wanner, Solving ODEs I, II.4, p. 169).

    The trial step of the estimate (where ``func`` is evaluated once more) is
    clipped to the span ``t_end - t0`` and to ``hmax``, as in SciPy's
    ``select_initial_step``: ``func`` is never evaluated outside ``[t0,
    t_end]`` (a vector field may be undefined there, SciPy gh-9198,
    gh-17341). Returns a positive scalar of the dtype of ``t0`` (0 for an
    empty span); costs one evaluation.
    """
    c = lambda value: ops.cast(value, t0)
    scale = _leafwise(lambda v, rtol, atol: lax.add(_constant(atol, lax.abs(v)), lax.mul(
        _constant(rtol, lax.abs(v)), lax.abs(v))), tol, y0)
    norm = lambda tree: lax.convert_element_type(rms(jax.tree.map(
        lambda a, s: lax.div(a, lax.convert_element_type(s, a.dtype)), tree, scale)), t0.dtype)
    d0, d1 = norm(y0), norm(f0)
    small = lax.bitwise_or(lax.lt(d0, c(1e-5)), lax.lt(d1, c(1e-5)))
    h0 = ops.select(small, 1e-6, lax.mul(c(0.01), lax.div(d0, ops.select(lax.gt(d1, c(0)), d1, 1.0))))
    if not (isinstance(hmax, (int, float)) and hmax == float("inf")):
        h0 = lax.min(h0, c(hmax))
    t1 = lax.add(t0, h0)
    if t_end is not None:
        h0 = lax.min(h0, lax.sub(t_end, t0))
        t1 = lax.min(lax.add(t0, h0), t_end)   # t0 + fl(t_end - t0) may round past t_end
    y1 = jax.tree.map(lambda y, f: lax.add(y, lax.mul(ops.cast(h0, f), f)), y0, f0)
    f1 = func(y1, t1)
    # An empty span (h0 = 0) evaluates at t0 itself: f1 = f0, d2 = 0.
    d2 = lax.div(norm(jax.tree.map(lax.sub, f1, f0)), ops.select(lax.gt(h0, c(0)), h0, 1.0))
    dmax = lax.max(d1, d2)
    h1 = ops.select(lax.le(dmax, c(1e-15)), lax.max(c(1e-6), lax.mul(h0, c(1e-3))),
                    lax.pow(lax.div(c(0.01), ops.select(lax.gt(dmax, c(0)), dmax, 1.0)),
                            c(1.0 / (order + 1.0))))
    return lax.min(lax.mul(c(100.0), h0), h1)
