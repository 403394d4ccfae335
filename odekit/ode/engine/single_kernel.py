"""Compile a whole solver loop into ONE kernel on XLA's CPU backend.

Why: XLA:CPU runs a program as a sequence of "thunks", one per fused
kernel, and a ``while`` loop re-dispatches every kernel of its body on every
iteration. For an ODE with a handful of unknowns one adaptive step is ~15
tiny kernels, so the dispatch costs more than the arithmetic (the
measurements: ``benchmarks/results/layout_notes.md``). XLA has a path that
emits a called computation as a single LLVM function with native control
flow: a ``call`` carrying the frontend attribute
``xla_cpu_small_call="true"`` (XLA's own
``SmallWhileLoopHoistingPass`` tags while loops that access fewer than 1 kB
this way; ``ThunkEmitter::EmitCallThunk`` compiles tagged calls with the
``ComputationKernelEmitter``). :func:`run` tags the solver's loop like that
(``inlineable="false"`` keeps XLA's call inliner from dissolving the call).

The tag means something to XLA's CPU compiler only, and so does the
member-by-member loop under ``vmap``, so :func:`run` stages out both ways
with ``lax.platform_dependent``: on the CPU the tagged call, on any other
platform the same loop untagged and batched the ordinary way (traced once:
the second branch finds the first's trace in ``jit``'s cache). The choice is
made when the program is lowered, for the platform it is lowered for (that
of the devices its inputs are placed on, or ``lowering_platforms``), not
from ``jax.default_backend()`` at trace time, which a jitted caller's cached
trace would keep: a solve traced in a CPU-default process and placed on a
GPU runs untagged there.

When it applies (all must hold, checked at trace time; otherwise the loop
compiles the ordinary way, in segments (:mod:`odekit.ode.engine.segments`), whose
steps stop at every few output times, so the results agree to the solver's
accuracy):

* it is not switched off: ``ODEKIT_SINGLE_KERNEL=0`` in the environment
  when ``odeint`` is called turns it off (:func:`switched_on`; a jitted
  caller keeps what it saw at its first trace);
* the solve is likely to run on the CPU (:func:`likely_platform`: the
  devices of concrete operands, else ``jax.default_device``, else the
  default backend). This only saves tracing the tagged loop where it would
  not be used; the platform of the lowering decides;
* the process has one CPU device: the tagged call of a batch sharded over
  several devices would hold collectives, which the single-kernel emitter
  cannot link, and a jitted function's placement is not known at trace time;
* the loop's state is small (at most ``MAX_ELEMENTS`` numbers): for larger
  states the kernels dominate and XLA's own fusion (threaded, vectorised) is
  the better choice;
* the user's function uses only primitives in :data:`ALLOWED` (elementwise
  math, indexing, reshaping, reductions of at most :data:`LARGEST_REDUCTION`
  numbers, control flow). Matrix products,
  custom calls, callbacks, scatter, sort, FFT and linear algebra go through
  runtime libraries that the single-kernel emitter cannot call.

Under ``vmap`` the kernel loops over the batch members (a ``custom_vmap``
rule), each solved on its own: a batched loop itself cannot be compiled this
way (its batched indexing becomes scatter/gather and XLA picks library
fusions for its batched reductions; the single-kernel emitter implements
neither).

The operands travel into the tagged call as ONE byte buffer (:func:`_pack`):
XLA's emitter aborts the process (a CHECK failure, "All or none of the slices
should have an explicit index") when a parameter of the tagged computation is
unused, as happens when the loop ignores an operand (the output cotangents of
a two-point solve, an argument that func ignores). Compositions that once
triggered it (grad of grad, odeint inside func, a single output interval,
odeint inside ``root``) are tested against the ordinary path.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Any, Callable

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.xla_metadata import set_xla_metadata

from odekit import _kernel_scope as kernel_scope
from odekit._tree import tree_ravel
from odekit.ode.linalg import jacobian, linear_system

Pytree = Any

MAX_ELEMENTS = 256
ENV_SWITCH = "ODEKIT_SINGLE_KERNEL"

# Primitives the single-kernel emitter compiles natively (no runtime library):
# elementwise math, indexing, reshaping, reductions and control flow. Kept
# short on purpose; anything else takes the ordinary path.
ALLOWED = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh broadcast_in_dim cbrt ceil clamp
complex concatenate conj convert_element_type copy copy_p cos cosh div dynamic_slice
dynamic_update_slice eq erf erfc exp exp2 expm1 floor ge gt imag integer_pow iota is_finite
le log log1p logistic lt max min mul ne neg not or pad pow real reduce_and reduce_max
reduce_min reduce_or reduce_prod reduce_sum rem reshape rev round rsqrt select_n sign sin
sinh slice sqrt square squeeze stack sub tan tanh transpose unstack xor stop_gradient
optimization_barrier split pjit jit closed_call remat checkpoint custom_jvp_call
custom_vjp_call cond while scan odekit_sealed_jvp
""".split())


def _jaxprs_in(value: Any):
    """Sub-jaxprs held by an equation parameter (any nesting)."""
    if isinstance(value, jax.extend.core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jax.extend.core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _jaxprs_in(item)


#: Largest operand (in numbers) of a reduction the loop may hold. XLA's CPU
#: backend (jax 0.10.2) hands a reduction of 4096 numbers or more to a
#: YNNPACK library fusion, which the single-kernel emitter cannot compile
#: (the program fails with "Fusion kind not implemented on CPU": a 64-body
#: pairwise sum in a field, a 6 x 6 history product over 256 unknowns);
#: 2304 numbers compiled. Half the observed limit, for other versions.
LARGEST_REDUCTION = 2048


def _reduces_too_much(eqn) -> bool:
    if not eqn.primitive.name.startswith("reduce_") or not eqn.invars:
        return False
    shape = getattr(getattr(eqn.invars[0], "aval", None), "shape", ())
    return int(np.prod(shape, dtype=np.int64)) > LARGEST_REDUCTION


def _uses_only_allowed(jaxpr, allowed: frozenset) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name not in allowed or _reduces_too_much(eqn):
            return False
        for param in eqn.params.values():
            for sub in _jaxprs_in(param):
                if not _uses_only_allowed(sub, allowed):
                    return False
    return True


def switched_on() -> bool:
    """Whether it is on: yes unless ``ODEKIT_SINGLE_KERNEL=0``. The front ends
    read this when called and record it in their static options."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def likely_platform(*operands: Pytree) -> str:
    """The platform a computation on ``operands`` will most likely run on, as
    far as it is known at trace time: that of the devices holding concrete
    (committed) array operands, else of ``jax.default_device``, else the
    default backend. Under ``jit`` operands are tracers and placement is
    decided later: only the lowering platform is certain."""
    for leaf in jax.tree.leaves(operands):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) \
                and getattr(leaf, "committed", False):
            return next(iter(leaf.devices())).platform
    device = jax.config.jax_default_device   # a Device, a platform name or None
    if device is not None:
        return device if isinstance(device, str) else device.platform
    return jax.default_backend()


def _cpu_device_count() -> int:
    try:
        return jax.device_count("cpu")
    except RuntimeError:  # no CPU backend (JAX_PLATFORMS without "cpu")
        return 0


def compilable(fn: Callable, *example: Pytree, allowed: frozenset = ALLOWED) -> bool:
    """Whether ``fn(*example)`` can be compiled as one kernel: likely on the
    one CPU device, and using only ``allowed`` primitives (:data:`ALLOWED`).
    ``example`` holds arrays or ``jax.ShapeDtypeStruct``; the caller bounds
    the size."""
    if likely_platform(*example) != "cpu" or _cpu_device_count() != 1:
        # Elsewhere the tag is never lowered; over several CPU devices a
        # sharded batch would put collectives into the tagged call.
        return False
    structs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)),
                           example)
    try:
        jaxpr = jax.make_jaxpr(fn)(*structs)
    except Exception:  # noqa: BLE001 - an untraceable fn gets the ordinary path
        return False
    return _uses_only_allowed(jaxpr.jaxpr, allowed)


def eligible(func: Callable, *example: Pytree) -> bool:
    """Whether a loop over ``func(*example)`` may be compiled as one kernel:
    :func:`compilable`, and the first argument (the loop state) holds at
    most MAX_ELEMENTS numbers."""
    if sum(np.size(leaf) for leaf in jax.tree.leaves(example[0])) > MAX_ELEMENTS:
        return False
    return compilable(func, *example)


def _as_bytes(leaf: jax.Array) -> jax.Array:
    """The bytes of ``leaf`` as a flat uint8 vector (complex as (re, im) pairs)."""
    if jnp.iscomplexobj(leaf):
        leaf = jnp.stack([jnp.real(leaf), jnp.imag(leaf)], axis=-1)
    if leaf.dtype == jnp.bool_:
        leaf = leaf.astype(jnp.uint8)
    return lax.bitcast_convert_type(leaf, jnp.uint8).reshape(-1)


def _storage(struct: jax.ShapeDtypeStruct) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a leaf as :func:`_as_bytes` stores it."""
    dtype = np.dtype(struct.dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return tuple(struct.shape) + (2,), np.dtype(jnp.finfo(dtype).dtype)
    if dtype == np.bool_:
        return tuple(struct.shape), np.dtype(np.uint8)
    return tuple(struct.shape), dtype


def _num_bytes(struct: jax.ShapeDtypeStruct) -> int:
    shape, dtype = _storage(struct)
    return int(np.prod(shape, dtype=int)) * dtype.itemsize


def _from_bytes(buffer: jax.Array, struct: jax.ShapeDtypeStruct) -> jax.Array:
    """Inverse of :func:`_as_bytes` for a leaf of shape and dtype ``struct``."""
    shape, dtype = _storage(struct)
    if dtype.itemsize > 1:
        shape = shape + (dtype.itemsize,)
    leaf = lax.bitcast_convert_type(buffer.reshape(shape), dtype)
    if jnp.issubdtype(struct.dtype, jnp.complexfloating):
        return lax.complex(leaf[..., 0], leaf[..., 1])
    return leaf.astype(struct.dtype)


def _pack(operands: Pytree) -> tuple[jax.Array, Callable[[jax.Array], Pytree]]:
    """All leaves of ``operands`` as ONE uint8 buffer, and the inverse map.

    Why: XLA's single-kernel emitter aborts the process (CHECK failure
    "All or none of the slices should have an explicit index") when a
    parameter of the tagged computation is unused, which happens whenever the
    loop ignores one of its operands (e.g. the output cotangents of a
    two-point solve, or an argument func ignores). One buffer holding the
    state is always used.
    """
    leaves, treedef = jax.tree.flatten(operands)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    structs = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in leaves]
    offsets = np.cumsum([0] + [_num_bytes(struct) for struct in structs])
    buffer = jnp.concatenate([_as_bytes(leaf) for leaf in leaves])

    def unpack(buffer: jax.Array) -> Pytree:
        return jax.tree.unflatten(treedef, [
            _from_bytes(buffer[start:stop], struct)
            for start, stop, struct in zip(offsets[:-1], offsets[1:], structs)])

    return buffer, unpack


def _tagged_call(fn: Callable, *operands: Pytree) -> Pytree:
    """``fn(*operands)`` as a call tagged for the single-kernel emitter."""
    buffer, unpack = _pack(operands)

    def untagged(buffer):
        # JAX lowers a call's body under the call's attributes; reset them so
        # that only the outer call is tagged (inner calls of a region that a
        # later transformation moves out of it must stay ordinary).
        with set_xla_metadata(xla_cpu_small_call="false", inlineable="true"):
            return fn(*unpack(buffer))

    with set_xla_metadata(xla_cpu_small_call="true", inlineable="false"):
        return jax.jit(untagged)(buffer)


def _each_member(fn: Callable, in_batched: list) -> Callable:
    """``fn`` applied member by member (a loop, ``lax.map``) to the batched
    leaves, with the unbatched leaves shared: ``g(batched, shared)``."""
    def members(batched: list, shared: list, treedef) -> Pytree:
        def one(member: list) -> Pytree:
            it_member, it_shared = iter(member), iter(shared)
            leaves = [next(it_member) if b else next(it_shared) for b in in_batched]
            return fn(*jax.tree.unflatten(treedef, leaves))
        return lax.map(one, batched)
    return members


def _untagged(fn: Callable, *operands: Pytree) -> Pytree:
    """``fn(*operands)`` as the tagged call sees it (operands without weak
    types, the same attributes), so that a jitted ``fn`` traced for one
    branch is not traced again for the other."""
    strong = jax.tree.map(lambda v: lax.convert_element_type(v, jnp.asarray(v).dtype), operands)
    with set_xla_metadata(xla_cpu_small_call="false", inlineable="true"):
        return fn(*strong)


def run(fn: Callable, *operands: Pytree) -> Pytree:
    """``fn(*operands)`` compiled as one CPU kernel (see the module doc), and
    the same loop untagged, batched the ordinary way, where the program is
    lowered for another platform.

    ``fn`` must be a pure function of ``operands`` (pytrees of arrays) that
    closes over no traced values. Under ``vmap`` the kernel loops over the
    batch, each member taking its own steps (so a batched solve equals the
    unbatched ones exactly, and no member runs for as many steps as the
    slowest one, as in a batched loop; measured in
    ``benchmarks/results/layout_notes.md``). Nested ``vmap`` nests the loops.
    Forward mode differentiates the untagged loop (JAX's derivative of the
    while loop); reverse mode fails (``custom_vmap`` has none): call it only
    inside custom rules, as the adjoint solvers do.
    """
    # The platform choice sits inside the custom_vmap: around it (where it
    # would also hide nothing from autodiff), JAX's transpose of a scan over
    # a solve (grad of grad through fori_loop) mixes up the adjoint's residuals.
    fn = jax.jit(fn)   # traced by one branch, found in the trace cache by the other

    @jax.custom_jvp
    def chosen(*ops):
        return lax.platform_dependent(*ops, cpu=partial(_tagged_call, fn),
                                      default=partial(_untagged, fn))

    @chosen.defjvp
    def _loop_jvp(primals, tangents):
        # JAX's own derivative of the untagged loop: the tagged call's operands
        # travel as bytes, whose derivative is zero (a silent 0 where JAX's
        # partial evaluation dropped an adjoint's rule around this loop).
        return jax.jvp(partial(_untagged, fn), primals, tangents)

    @jax.custom_batching.custom_vmap
    def placed(*ops):
        return chosen(*ops)

    @placed.def_vmap
    def batched(axis_size, in_batched, *ops):
        leaves, treedef = jax.tree.flatten(list(ops))
        mask = jax.tree.leaves(list(in_batched))
        members = partial(_each_member(fn, mask), treedef=treedef)
        in_axes = jax.tree.map(lambda b: 0 if b else None, list(in_batched))
        ordinary = lambda *ops: jax.vmap(partial(_untagged, fn), in_axes=tuple(in_axes))(*ops)
        split = lambda *ops: run(members, [leaf for leaf, b in zip(jax.tree.leaves(list(ops)), mask)
                                           if b],
                                 [leaf for leaf, b in zip(jax.tree.leaves(list(ops)), mask)
                                  if not b])
        with kernel_scope.entered():
            out = lax.platform_dependent(*ops, cpu=split, default=ordinary)
        return out, jax.tree.map(lambda _: True, out)

    with kernel_scope.entered():
        return placed(*operands)


#: The linear algebra's own gathers (static index arrays: a structured
#: Jacobian's entries, block stacks) compile natively in the one kernel
#: (``gather`` is emitted elementwise; ``scatter`` is not). The user's
#: function is still held to :data:`ALLOWED`.
LINEAR_ALGEBRA_ALLOWED = ALLOWED | {"gather"}


def stiff_linear_algebra_fits(func: Callable, y0: Any, t0: jax.Array, args: tuple) -> bool:
    """Whether a stiff method's linear algebra on ``func(y, t, *args)`` can
    run inside one CPU kernel (this module's loop): the system is factored
    in lax operations (a dense W of n <= ``lu.LAX_MAX_SIZE``, a structured
    small dense one, or blocks of at most ``stacked_lu.MAX_BLOCK`` unknowns:
    ``factors_in_lax``: their programs are elementwise operations, static
    slices, gathers and reductions of at most n numbers by construction,
    tested in tests/ode/linalg), has no mass matrix (applied by library
    calls), and its J and f_t (forward mode of ``func``, or ``func``'s own
    Jacobian) use only primitives the single-kernel emitter compiles (found
    by tracing at trace time; nothing runs). Banded systems stay kernel by
    kernel."""
    system = linear_system.of(func)
    if getattr(system, "mass", None) is not None:
        return False
    flat, unravel = tree_ravel(y0)
    if not system.factors_in_lax(flat.shape[0]):
        return False

    def jacobian_and_time_derivative(y, t, *args):
        bound = jacobian.bind(func, args)
        field = lambda v, s: tree_ravel(bound(unravel(v), s))[0].astype(v.dtype)
        return system.jacobian_with_time_derivative(bound, field, tree_ravel(y)[0], t)

    return compilable(jacobian_and_time_derivative, y0, t0, *args,
                      allowed=LINEAR_ALGEBRA_ALLOWED)
