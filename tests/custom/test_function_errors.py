"""Every misuse of odekit.custom.Function fails at trace time with a message saying what to change."""
import jax
import jax.numpy as jnp
import pytest

from odekit.custom import Function

X = jnp.asarray([0.3, -1.2, 2.0])


def _make(forward, backward):
    return type("Bad", (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _grad(fn, *args):
    return jax.grad(lambda x: jnp.sum(fn.apply(x, *args)))(X)


def test_wrong_number_of_gradients_says_expected_and_got():
    bad = _make(lambda ctx, x, y: x * y, lambda ctx, ct: (ct, ct, ct))
    with pytest.raises(ValueError, match=r"returned 3 gradients .* called with 2 inputs"):
        _grad(bad, X)
    with pytest.raises(ValueError, match=r"returned 3 gradients .* called with 2 inputs"):
        jax.jit(lambda x: jax.grad(lambda v: jnp.sum(bad.apply(v, X)))(x))(X)


def test_gradient_shape_and_dtype_must_match_the_input():
    bad_shape = _make(lambda ctx, x: 2 * x, lambda ctx, ct: jnp.sum(ct))
    with pytest.raises(ValueError, match=r"shape \(\) .* input has shape \(3,\)"):
        _grad(bad_shape)
    bad_dtype = _make(lambda ctx, x: 2 * x, lambda ctx, ct: ct.astype(jnp.float32))
    with pytest.raises(ValueError, match="dtype float32 but the input has .* dtype float64"):
        _grad(bad_dtype)


def test_gradient_structure_must_match_a_pytree_input():
    bad = _make(lambda ctx, p: p["a"] * 2, lambda ctx, ct: ({"b": ct},))
    with pytest.raises(ValueError, match="structure of that input"):
        jax.grad(lambda x: jnp.sum(bad.apply({"a": x})))(X)


def test_gradient_for_a_static_input_is_refused():
    bad = _make(lambda ctx, x, k: k * x, lambda ctx, ct: (ct, 1.0))
    with pytest.raises(ValueError, match="non-array input 2 .* return None"):
        _grad(bad, 2)       # a Python int is static (a Python float is an array)


def test_gradient_for_an_integer_input_is_refused():
    bad = _make(lambda ctx, x, k: x * k.astype(x.dtype), lambda ctx, ct: (ct, ct))
    with pytest.raises(ValueError, match="integer dtype int64; .*return None"):
        _grad(bad, jnp.asarray([1, 2, 3]))


@pytest.mark.parametrize("method", ["forward", "backward"])
def test_forward_and_backward_must_be_static_methods(method):
    body = {"forward": staticmethod(lambda ctx, x: x), "backward": staticmethod(lambda ctx, ct: ct)}
    body[method] = lambda ctx, *a: a[0]
    with pytest.raises(TypeError, match=f"{method} must be a static method: put @staticmethod"):
        type("NotStatic", (Function,), body)


def test_missing_backward_is_reported_at_apply():
    partial = type("NoBackward", (Function,), {"forward": staticmethod(lambda ctx, x: x)})
    with pytest.raises(TypeError, match="NoBackward has no 'backward'; define it as a @staticmethod"):
        partial.apply(X)


def test_saved_tensor_without_save_for_backward():
    bad = _make(lambda ctx, x: x * x, lambda ctx, ct: ct * ctx.saved_tensor()[0])
    with pytest.raises(RuntimeError, match=r"never called ctx.save_for_backward"):
        _grad(bad)
    alias = _make(lambda ctx, x: x * x, lambda ctx, ct: ct * ctx.saved_tensors[0])
    with pytest.raises(RuntimeError, match=r"never called ctx.save_for_backward"):
        _grad(alias)


def test_calling_forward_directly_is_refused():
    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, ct):
            return 2 * ct

    with pytest.raises(RuntimeError, match=r"Double.forward was called directly; call Double.apply"):
        Double.forward(X)
    with pytest.raises(RuntimeError, match="called directly"):
        Double.forward(None, X)
    assert jnp.allclose(Double.apply(X), 2 * X)


def test_forward_must_return_arrays_and_apply_takes_no_keywords():
    bad = _make(lambda ctx, x: 1.5, lambda ctx, ct: ct)
    with pytest.raises(TypeError, match="returned a float; outputs must be arrays"):
        bad.apply(X)
    ok = _make(lambda ctx, x: x, lambda ctx, ct: ct)
    with pytest.raises(TypeError, match="takes its inputs positionally"):
        ok.apply(x=X)


def test_branching_on_a_python_float_input_names_the_input():
    """Python floats are arrays (as in jnp); a forward that needs one as a Python
    value (under jit) gets a note saying which input it was and what to do."""
    bad = _make(lambda ctx, x, a: x * (2.0 if a > 0 else 1.0), lambda ctx, ct: (ct, None))
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        jax.jit(lambda x: bad.apply(x, 0.5))(X)
    assert any("input(s) [1] are Python floats" in note and "close over it" in note
               for note in info.value.__notes__)


def test_forward_mode_is_not_defined_for_a_custom_vjp():
    ok = _make(lambda ctx, x: x * x, lambda ctx, ct: ct)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(ok.apply, (X,), (X,))


def _closing_over(w, in_forward):
    class Closure(Function):
        @staticmethod
        def forward(ctx, x):
            return w * x if in_forward else 2 * x

        @staticmethod
        def backward(ctx, ct):
            return 2 * ct if in_forward else w * ct

    return Closure


def test_forward_closing_over_a_differentiated_array_says_pass_it_as_input():
    """Closed-over tracers are hoisted; a differentiated one has no rule: clear error."""
    loss = lambda w, x: jnp.sum(_closing_over(w, True).apply(x))
    for transformed in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1))),
                        jax.grad(jax.jit(loss), argnums=0)):
        with pytest.raises(TypeError, match=r"Closure.forward closes over an array \(shape \(\), "
                           r"dtype float64\) that is being differentiated.* pass that array to Closure.apply"):
            transformed(2.0, X)


def test_backward_closing_over_a_differentiated_array_says_pass_it_as_input():
    loss = lambda w, x: jnp.sum(_closing_over(w, False).apply(x))
    with pytest.raises(jax.errors.UnexpectedTracerError,
                       match="Closure.backward used a traced value .* pass that array to Closure.apply"):
        jax.grad(loss, argnums=(0, 1))(2.0, X)


def test_backward_returning_a_list_is_named_in_the_message():
    bad = _make(lambda ctx, x, y: x * y, lambda ctx, ct: [ct, ct])
    with pytest.raises(ValueError, match=r"returned a list but Bad.apply was called with 2 inputs; return a tuple"):
        _grad(bad, X)


def test_backward_assigned_after_class_creation_must_be_static():
    late = type("Late", (Function,), {"forward": staticmethod(lambda ctx, x: 2 * x)})
    late.backward = lambda ctx, ct: 2 * ct
    with pytest.raises(TypeError, match="Late has a non-static 'backward'; define it as a @staticmethod"):
        late.apply(X)
