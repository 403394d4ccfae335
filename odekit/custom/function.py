"""PyLayer / torch.autograd.Function-style custom rules on top of jax.custom_vjp.

A subclass supplies two static methods::

    class MultiIO(odekit.custom.Function):
        @staticmethod
        def forward(ctx, x, y, alpha):
            ctx.save_for_backward(x, y)
            ctx.alpha = alpha
            return alpha * x + y, x * y

        @staticmethod
        def backward(ctx, d_out1, d_out2):
            x, y = ctx.saved_tensor()
            return ctx.alpha * d_out1 + d_out2 * y, d_out1 + d_out2 * x, None

    out1, out2 = MultiIO.apply(x, y, 0.5)

How it maps onto ``jax.custom_vjp`` (JEP 4008):

* Inputs are flattened to leaves. Array leaves (``jax.Array``, NumPy arrays
  and scalars, tracers) and Python floats (weakly typed arrays, as ``jnp``
  and ``jax.grad`` treat them, so ``apply(3.0)`` is ``apply(jnp.asarray(3.0))``
  with or without an enclosing transformation) are the differentiable primal
  arguments; every other leaf (Python ints and bools, strings, callables,
  ...) is static and travels with the tree structure as the single
  ``nondiff_argnums`` argument. A float that ``forward`` must see as a
  Python value (to branch on it) is closed over instead of passed.
* ``forward`` is traced once per ``apply`` (see closure conversion below)
  and serves both the primal and the fwd rule. Everything
  stored on ``ctx`` (``save_for_backward`` and plain attributes) becomes the
  residual: ``ctx`` is a pytree whose array leaves are the residual arrays and
  whose other leaves ride in its tree structure. ``backward`` therefore sees
  arrays only as residuals, never as closures over the forward trace.
* A plain ``tuple`` returned by ``forward`` is that many outputs and
  ``backward`` gets one cotangent per output; any other return value is one
  output. ``backward`` returns one gradient per ``apply`` argument: ``None``
  for no gradient (required for static arguments), else a pytree matching the
  argument with ``None`` allowed at any leaf; shapes and dtypes must match.
* ``forward`` is closure-converted (:mod:`odekit.custom.closure`): traced values
  it closes over (from an enclosing ``jit``, ``vmap`` or ``grad``) become
  extra primal arguments of the custom_vjp, registered with
  ``symbolic_zeros=True`` so that the fwd rule sees which are perturbed. One
  that is being differentiated is an error (``backward`` has no gradient for
  it: pass it to ``apply``); the others get a zero cotangent. ``forward`` and
  ``backward`` always receive JAX arrays, also under ``jax.grad(f)(3.0)``.
* ``apply`` works under ``jit``, ``vmap``, ``grad`` and grad of grad (when
  ``backward`` is differentiable). Forward mode (``jax.jvp``) is not defined
  for a custom_vjp, as in JAX.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from odekit.custom.closure import closure_convert

__all__ = ["Function", "FunctionCtx"]


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _partition(tree: Any) -> tuple[list, Any, tuple]:
    """(array leaves, treedef, static leaves with positions) of a pytree."""
    leaves, treedef = jax.tree.flatten(tree)
    arrays = [leaf for leaf in leaves if _is_array(leaf)]
    static = tuple((i, leaf) for i, leaf in enumerate(leaves) if not _is_array(leaf))
    return arrays, treedef, static


def _merge(arrays: Any, treedef: Any, static: tuple) -> Any:
    """Inverse of :func:`_partition`."""
    fixed = dict(static)
    it = iter(arrays)
    leaves = [fixed[i] if i in fixed else next(it) for i in range(treedef.num_leaves)]
    return jax.tree.unflatten(treedef, leaves)


_NOT_SAVED = object()


@jax.tree_util.register_pytree_node_class
class FunctionCtx:
    """The ``ctx`` handed to ``forward`` and ``backward``; a residual pytree.

    Store arrays with :meth:`save_for_backward` and anything else as
    attributes (``ctx.alpha = alpha``); both reach ``backward``.
    """

    __slots__ = ("__dict__", "_owner")

    def __init__(self, owner: type | None = None) -> None:
        self._owner = owner
        self._saved = _NOT_SAVED

    def save_for_backward(self, *values: Any) -> None:
        """Keep ``values`` (arrays or pytrees of arrays) for ``backward``."""
        self._saved = values

    def saved_tensor(self) -> tuple:
        """The values given to :meth:`save_for_backward`, as a tuple (Paddle spelling)."""
        if self._saved is _NOT_SAVED:
            name = self._owner.__name__ if self._owner else "Function"
            raise RuntimeError(
                f"{name}: ctx.saved_tensor() was called but forward never called "
                "ctx.save_for_backward(...); save the arrays backward needs in forward.")
        return tuple(self._saved)

    @property
    def saved_tensors(self) -> tuple:
        """PyTorch spelling of :meth:`saved_tensor`."""
        return self.saved_tensor()

    def tree_flatten(self):
        names = tuple(sorted(vars(self)))
        arrays, treedef, static = _partition(tuple(vars(self)[n] for n in names))
        return arrays, (self._owner, names, treedef, static)

    @classmethod
    def tree_unflatten(cls, aux, arrays):
        owner, names, treedef, static = aux
        ctx = cls(owner)
        vars(ctx).update(zip(names, _merge(list(arrays), treedef, static)))
        return ctx


class _Spec(NamedTuple):
    """The static (nondiff) argument of the custom_vjp: everything but arrays."""
    cls: type
    treedef: Any          # of the tuple of apply's positional arguments
    static: tuple         # (leaf index, value) of the non-array leaves
    forward: Callable     # (*arrays, *consts) -> (outputs, ctx), closure-converted
    num_consts: int       # how many closed-over traced values were hoisted into consts
    floats: tuple = ()    # indices of apply's inputs that hold Python floats


def _is_python_float(leaf: Any) -> bool:
    """True for a Python float or complex (not a NumPy scalar, which is already an array)."""
    return isinstance(leaf, (float, complex)) and not isinstance(leaf, np.generic)


def _float_as_array(leaf: Any) -> Any:
    """A Python float (or complex) leaf as a weakly typed JAX array, as in ``jnp``."""
    return jnp.asarray(leaf) if _is_python_float(leaf) else leaf


def _as_array(leaf: Any) -> Any:
    """A JAX array for a Python-scalar or NumPy leaf, the leaf itself otherwise.

    Under ``jax.grad(f)(3.0)`` JAX hands custom_vjp rules concrete Python
    scalars (``float`` subclasses) or NumPy arrays instead of JAX arrays;
    ``forward`` and ``backward`` are promised JAX arrays (``x.shape``,
    ``x * x`` an array). float0 cotangents (of integer outputs) stay as they are.
    """
    if isinstance(leaf, (bool, int, float, complex)):
        return jnp.asarray(leaf)
    if isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype != jax.dtypes.float0:
        return jnp.asarray(leaf)
    return leaf


_NEEDS_CONCRETE = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                   jax.errors.TracerIntegerConversionError)


def _call_user(spec: _Spec, method: str, *args: Any) -> Any:
    """``spec.cls.<method>(*args)``, explaining leaked tracers (closures over traced values)."""
    try:
        return getattr(spec.cls, method)(*args)
    except _NEEDS_CONCRETE as err:
        if spec.floats:
            err.add_note(
                f"{spec.cls.__name__}.apply: input(s) {list(spec.floats)} are Python floats, "
                "which apply passes to forward as JAX arrays (as jnp does); to use one as a "
                "Python value, close over it in forward instead of passing it to apply.")
        raise
    except jax.errors.UnexpectedTracerError as err:
        name = spec.cls.__name__
        raise jax.errors.UnexpectedTracerError(
            f"{name}.{method} used a traced value that is not one of its arguments: most "
            f"likely it closes over an array that an enclosing jax.grad/jax.vjp "
            f"differentiates. backward can only return gradients for {name}.apply's "
            f"inputs, so pass that array to {name}.apply as an input (and return its "
            f"gradient from backward) instead of closing over it.\n{err}") from err


def _run_forward(spec: _Spec, arrays: tuple) -> tuple[Any, FunctionCtx]:
    ctx = FunctionCtx(spec.cls)
    args = _merge([_as_array(a) for a in arrays], spec.treedef, spec.static)
    out = _call_user(spec, "forward", ctx, *args)
    for leaf in jax.tree.leaves(out):
        if not _is_array(leaf):
            raise TypeError(
                f"{spec.cls.__name__}.forward returned a {type(leaf).__name__}; outputs "
                "must be arrays (or tuples/pytrees of arrays): wrap constants in jnp.asarray.")
    return out, ctx


def _run_forward_flat(spec: _Spec, *arrays: Any) -> tuple[Any, FunctionCtx]:
    return _run_forward(spec, arrays)


def _hoist_closure(spec: _Spec, arrays: list) -> tuple:
    """(spec, *arrays, *consts) with forward closure-converted (JEP 4008).

    Traced values that ``forward`` closes over become explicit inputs of the
    custom_vjp, so its fwd rule can tell whether one is being differentiated
    (an error: ``backward`` has no gradient for it). A ``forward`` that needs
    concrete values (Python control flow on array values, possible only
    outside ``jit``) is run as it is, without hoisting.
    """
    try:
        forward, consts = closure_convert(spec.forward, *arrays)
    except _NEEDS_CONCRETE:
        return (spec, *arrays)
    return (spec._replace(forward=forward, num_consts=len(consts)), *arrays, *consts)


def _primal(spec: _Spec, *arrays_and_consts):
    return spec.forward(*arrays_and_consts)[0]


def _fwd(spec: _Spec, *primals: CustomVJPPrimal):
    """The fwd rule (``symbolic_zeros=True``, so each primal says if it is perturbed).

    A hoisted closed-over value that is being differentiated has no gradient
    rule (``backward`` only covers ``apply``'s inputs): that is an error.
    """
    num_arrays = len(primals) - spec.num_consts
    for const in primals[num_arrays:]:
        if const.perturbed:
            name = spec.cls.__name__
            raise TypeError(
                f"{name}.forward closes over an array (shape {jnp.shape(const.value)}, dtype "
                f"{jnp.result_type(const.value)}) that is being differentiated, but backward can "
                f"only return gradients for {name}.apply's inputs: pass that array to "
                f"{name}.apply as an input and return its gradient from backward.")
    values = [p.value for p in primals]
    out, ctx = spec.forward(*values)
    avals = tuple(jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a),
                                       weak_type=jax.typeof(a).weak_type)
                  for a in values[:num_arrays])
    return out, (ctx, _Avals(avals))


def _instantiate(cotangent: Any) -> Any:
    """Zeros for a symbolic-zero cotangent (an output that was not used), else an array."""
    if isinstance(cotangent, SymbolicZero):
        if cotangent.aval.dtype == jax.dtypes.float0:
            return np.zeros(cotangent.aval.shape, jax.dtypes.float0)
        return jnp.zeros(cotangent.aval.shape, cotangent.aval.dtype)
    return _as_array(cotangent)


class _Avals:
    """Shapes and dtypes of the array inputs, carried in the residual structure."""

    def __init__(self, avals: tuple) -> None:
        self.avals = avals


jax.tree_util.register_pytree_node(_Avals, lambda a: ((), a.avals), lambda aux, _: _Avals(aux))


def _bwd(spec: _Spec, residuals, cotangent):
    ctx, avals = residuals
    name = spec.cls.__name__
    cotangent = jax.tree.map(_instantiate, cotangent,
                             is_leaf=lambda c: isinstance(c, SymbolicZero))
    cotangents = cotangent if type(cotangent) is tuple else (cotangent,)
    grads = _call_user(spec, "backward", ctx, *cotangents)
    num_inputs = len(spec.treedef.children())
    if num_inputs == 1 and type(grads) is not tuple:
        grads = (grads,)                   # a bare gradient for a single input
    if type(grads) is not tuple or len(grads) != num_inputs:
        got = f"{len(grads)} gradients" if type(grads) is tuple else f"a {type(grads).__name__}"
        raise ValueError(
            f"{name}.backward returned {got} but {name}.apply was called with "
            f"{num_inputs} inputs; return a tuple with one gradient per input "
            "(None for inputs that need none, e.g. non-array inputs).")
    # (a single input that is itself a tuple needs a 1-tuple: ``return (grad,)``)
    leaves = _gradient_leaves(spec, grads)
    arrays = [(i, leaf) for i, leaf in enumerate(leaves) if i not in dict(spec.static)]
    checked = tuple(_check_gradient(name, i, g, aval) for (i, g), aval in zip(arrays, avals.avals))
    return checked + (None,) * spec.num_consts          # hoisted consts are never perturbed


def _gradient_leaves(spec: _Spec, grads: tuple) -> list:
    """Flatten the gradients to the input leaves; None stands for a whole argument."""
    name = spec.cls.__name__
    leaves = []
    for k, (g, sub) in enumerate(zip(grads, spec.treedef.children())):
        if g is None:
            leaves += [None] * sub.num_leaves
            continue
        try:
            leaves += sub.flatten_up_to(g)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{name}.backward: the gradient for input {k} does not have the structure "
                f"of that input ({sub}); return a matching pytree or None.") from err
    static = dict(spec.static)
    for i, leaf in enumerate(leaves):
        if i in static and leaf is not None:
            raise ValueError(
                f"{name}.backward returned a gradient for the non-array input "
                f"{static[i]!r} (leaf {i}); non-array inputs are static, return None for them.")
    return leaves


def _check_gradient(name: str, index: int, g: Any, aval: jax.ShapeDtypeStruct):
    integer = not jnp.issubdtype(aval.dtype, jnp.inexact)
    if g is None:
        return None if integer else jnp.zeros(aval.shape, aval.dtype)
    if integer:
        raise ValueError(
            f"{name}.backward returned a gradient for input leaf {index} of integer dtype "
            f"{aval.dtype}; integer inputs have no gradient, return None for them.")
    shape, dtype = jnp.shape(g), jnp.result_type(g)
    if aval.weak_type and shape == aval.shape and jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(g).astype(aval.dtype)   # a Python float's gradient: any precision
    if shape != aval.shape or dtype != aval.dtype:
        raise ValueError(
            f"{name}.backward: the gradient for input leaf {index} has shape {shape} and "
            f"dtype {dtype} but the input has shape {aval.shape} and dtype {aval.dtype}; "
            "return a gradient shaped and typed like its input.")
    return g


_rule = jax.custom_vjp(_primal, nondiff_argnums=(0,))
_rule.defvjp(_fwd, _bwd, symbolic_zeros=True)


def _guard_forward(cls: type, forward: Callable) -> staticmethod:
    """Wrap ``forward`` so that calling it without ``apply`` fails loudly."""
    @functools.wraps(forward)
    def guarded(ctx, *args, **kwargs):
        owner = getattr(ctx, "_owner", None)
        if not (isinstance(ctx, FunctionCtx) and isinstance(owner, type) and issubclass(owner, cls)):
            raise RuntimeError(
                f"{cls.__name__}.forward was called directly; call "
                f"{cls.__name__}.apply(...) instead, which creates ctx and registers backward.")
        return forward(ctx, *args, **kwargs)
    return staticmethod(guarded)


class Function:
    """Base class of PyLayer-style custom-gradient functions (see the module docstring).

    Subclasses define ``forward(ctx, *inputs)`` and ``backward(ctx, *cotangents)``
    as static methods and are called as ``Sub.apply(*inputs)``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in ("forward", "backward"):
            if method in cls.__dict__ and not isinstance(cls.__dict__[method], staticmethod):
                raise TypeError(
                    f"{cls.__name__}.{method} must be a static method: put @staticmethod "
                    f"above 'def {method}(ctx, ...)'.")
        if "forward" in cls.__dict__:
            cls.forward = _guard_forward(cls, cls.__dict__["forward"].__func__)

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run ``forward`` on ``args`` with ``backward`` as its reverse-mode rule.

        Args:
          *args: the inputs, each an array, a pytree of arrays or a static
            (non-array) value; Python floats are arrays.

        Returns:
          What ``forward`` returns.

        Raises:
          TypeError: keyword arguments, or a subclass without forward/backward.
        """
        if kwargs:
            raise TypeError(
                f"{cls.__name__}.apply takes its inputs positionally (got keywords "
                f"{sorted(kwargs)}); backward returns gradients by position.")
        for method in ("forward", "backward"):
            found = inspect.getattr_static(cls, method, None)
            if not isinstance(found, staticmethod):
                problem = "has no" if found is None else "has a non-static"
                raise TypeError(
                    f"{cls.__name__} {problem} '{method}'; define it as a @staticmethod "
                    f"'def {method}(ctx, ...)' before calling {cls.__name__}.apply.")
        floats = tuple(i for i, arg in enumerate(args)
                       if any(map(_is_python_float, jax.tree.leaves(arg))))
        arrays, treedef, static = _partition(jax.tree.map(_float_as_array, args))
        base = _Spec(cls, treedef, static, forward=None, num_consts=0, floats=floats)
        spec = base._replace(forward=functools.partial(_run_forward_flat, base))
        return _rule(*_hoist_closure(spec, arrays))
