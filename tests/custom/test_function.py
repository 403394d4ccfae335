"""odekit.custom.Function: the PyLayer rules under jit, vmap, grad and grad of grad."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.custom import Function
from odekit.testing import check_grads


class MultiIO(Function):
    @staticmethod
    def forward(ctx, x, y, alpha):
        ctx.save_for_backward(x, y)
        ctx.alpha = alpha                 # a Python float or a JAX array
        return alpha * x + y, x * y

    @staticmethod
    def backward(ctx, d_out1, d_out2):
        x, y = ctx.saved_tensor()
        return ctx.alpha * d_out1 + d_out2 * y, d_out1 + d_out2 * x, None


class SquaredReLU(Function):
    @staticmethod
    def forward(ctx, x):
        y = jax.nn.relu(x)
        ctx.save_for_backward(y)
        return y * y

    @staticmethod
    def backward(ctx, dy):
        y, = ctx.saved_tensors            # the PyTorch spelling
        return dy * 2 * y


class Scale(Function):
    """Pytree input and output; the gradient rule is deliberately 3x the true one."""
    @staticmethod
    def forward(ctx, params, x):
        ctx.w = params["w"]               # array attribute: becomes a residual
        ctx.x = x
        return {"out": params["w"] * x, "sum": jnp.sum(x)}

    @staticmethod
    def backward(ctx, ct):
        g_out = ct["out"]
        return {"w": 3 * g_out * ctx.x}, g_out * ctx.w + ct["sum"]


X = jnp.asarray([0.3, -1.2, 2.0])
Y = jnp.asarray([1.5, 0.7, -0.4])


def _multi_loss(x, y, alpha=0.5):
    a, b = MultiIO.apply(x, y, alpha)
    return jnp.sum(jnp.sin(a) * b)


def test_example_values_and_gradients():
    out1, out2 = MultiIO.apply(X, Y, 0.5)
    np.testing.assert_allclose(out1, 0.5 * X + Y)
    np.testing.assert_allclose(out2, X * Y)
    check_grads(lambda x, y: MultiIO.apply(x, y, 0.5), (X, Y), order=1)


def test_grad_of_grad_through_a_differentiable_backward():
    check_grads(_multi_loss, (X, Y), order=2)
    check_grads(SquaredReLU.apply, (X,), order=2)
    hess = jax.hessian(lambda x: jnp.sum(SquaredReLU.apply(x)))(X)
    np.testing.assert_allclose(hess, np.diag(2.0 * (np.asarray(X) > 0)))


def test_jit_and_vmap():
    g = jax.grad(_multi_loss, argnums=(0, 1))
    want = g(X, Y)
    got = jax.jit(g)(X, Y)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w, rtol=1e-14)
    xs, ys = jnp.stack([X, 2 * X]), jnp.stack([Y, -Y])
    batched = jax.vmap(g)(xs, ys)
    for i in range(2):
        for b, w in zip(batched, g(xs[i], ys[i])):
            np.testing.assert_allclose(b[i], w, rtol=1e-14)
    out = jax.jit(jax.vmap(lambda x: MultiIO.apply(x, Y, 0.5)))(xs)
    np.testing.assert_allclose(out[1], xs * Y[None])


def test_array_alpha_is_a_residual_and_gets_none_gradient():
    """An array alpha flows to backward through ctx; its gradient None means zero."""
    alpha = jnp.asarray(0.25)
    grads = jax.jit(jax.grad(_multi_loss, argnums=(0, 1, 2)))(X, Y, alpha)
    np.testing.assert_allclose(grads[0], jax.grad(_multi_loss)(X, Y, 0.25))
    assert grads[2] == 0.0
    # under jit the forward's arrays are tracers; a closure would raise UnexpectedTracerError
    lin = jax.jit(lambda x, a: jax.vjp(lambda v: MultiIO.apply(v, Y, a), x)[1]((x, x)))
    np.testing.assert_allclose(lin(X, alpha)[0], alpha * X + X * Y)


def test_static_inputs_reach_forward_as_python_values():
    seen = []

    class Static(Function):
        @staticmethod
        def forward(ctx, x, power, name, fn):
            seen.append((type(power), name))
            ctx.power, ctx.fn = power, fn
            ctx.save_for_backward(x)
            return fn(x) ** power

        @staticmethod
        def backward(ctx, ct):
            x, = ctx.saved_tensor()
            return ct * ctx.power * ctx.fn(x) ** (ctx.power - 1) * jnp.cos(x), None, None, None

    f = lambda x: jnp.sum(Static.apply(x, 3, "cube", jnp.sin))
    np.testing.assert_allclose(jax.jit(jax.grad(f))(X), 3 * jnp.sin(X) ** 2 * jnp.cos(X))
    assert all(t is int and n == "cube" for t, n in seen)


def test_pytree_inputs_and_outputs_use_the_users_rule():
    params = {"w": jnp.asarray([2.0, -1.0, 0.5])}
    out = Scale.apply(params, X)
    np.testing.assert_allclose(out["out"], params["w"] * X)
    loss = lambda p, x: jnp.sum(Scale.apply(p, x)["out"]) + 2 * Scale.apply(p, x)["sum"]
    gp, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, X)
    np.testing.assert_allclose(gp["w"], 3 * X)             # the custom (tripled) rule is used
    np.testing.assert_allclose(gx, params["w"] + 2)


def test_none_inside_a_pytree_gradient_and_single_input_bare_gradient():
    class Pair(Function):
        @staticmethod
        def forward(ctx, xy):
            return xy[0] * xy[1]

        @staticmethod
        def backward(ctx, ct):
            return ((ct, None),)          # a 1-tuple: the single input is itself a tuple

    g = jax.grad(lambda a, b: jnp.sum(Pair.apply((a, b))), argnums=(0, 1))(X, Y)
    np.testing.assert_allclose(g[0], jnp.ones(3))
    np.testing.assert_allclose(g[1], jnp.zeros(3))


def test_integer_inputs_get_no_gradient():
    class Shift(Function):
        @staticmethod
        def forward(ctx, x, k):
            return x + k.astype(x.dtype)

        @staticmethod
        def backward(ctx, ct):
            return ct, None

    k = jnp.asarray([1, 2, 3])
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(Shift.apply(x, k) ** 2))(X),
                               2 * (np.asarray(X) + np.asarray(k)))


def test_float32_gradients_keep_their_dtype():
    x = X.astype(jnp.float32)
    g = jax.grad(lambda v: jnp.sum(SquaredReLU.apply(v)))(x)
    assert g.dtype == jnp.float32
    assert odekit.custom.Function is Function


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        assert isinstance(x, jax.Array), type(x)      # never a Python or NumPy scalar
        ctx.x = x
        return x * x

    @staticmethod
    def backward(ctx, ct):
        assert isinstance(ct, jax.Array), type(ct)
        return 2 * ctx.x * ct


def test_python_and_numpy_scalar_inputs_under_grad_and_vjp():
    """jax.grad(f)(3.0) hands the rule Python/NumPy scalars; forward still sees arrays."""
    assert float(jax.grad(Square.apply)(3.0)) == 6.0
    assert float(jax.grad(Square.apply)(np.float32(3.0))) == 6.0
    assert float(jax.grad(jax.grad(Square.apply))(3.0)) == 2.0
    out, vjp = jax.vjp(Square.apply, 3.0)
    assert float(out) == 9.0 and float(vjp(1.0)[0]) == 6.0
    np.testing.assert_allclose(jax.grad(lambda x, y: MultiIO.apply(x, y, 0.5)[1], (0, 1))(2.0, 5.0), (5.0, 2.0))


def test_closures_over_jit_and_vmap_tracers_work():
    """Closed-over values that are not differentiated (jit/vmap tracers) are fine."""
    def loss(w, x):
        class Scaled(Function):
            @staticmethod
            def forward(ctx, x):
                return w * x

            @staticmethod
            def backward(ctx, ct):
                return w * ct
        return jnp.sum(Scaled.apply(x))

    np.testing.assert_allclose(jax.jit(jax.grad(loss, argnums=1))(2.0, X), 2.0 * jnp.ones(3))
    ws = jnp.asarray([1.0, 3.0])
    np.testing.assert_allclose(jax.vmap(jax.grad(loss, argnums=1), (0, None))(ws, X),
                               ws[:, None] * jnp.ones((2, 3)))


def test_forward_may_branch_on_concrete_values_outside_jit():
    """Outside jit a forward may use Python control flow on values, as in PyTorch."""
    class Clip(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.positive = bool(x > 0)
            return x if ctx.positive else jnp.zeros_like(x)

        @staticmethod
        def backward(ctx, ct):
            return ct if ctx.positive else jnp.zeros_like(ct)

    assert float(Clip.apply(jnp.asarray(-2.0))) == 0.0
    assert float(jax.grad(Clip.apply)(jnp.asarray(3.0))) == 1.0
