"""Cases an adversarial pass found in the fixed-point, root and custom-rule area
(issue 17): each failed, crashed or gave no acceleration before its fix."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
from odekit.custom import Function

# A 6-gene negative feedback loop: gene 0 is activated by gene 5, gene i > 0 is
# repressed by gene i - 1 (Hill coefficient 2, 5% leak). Expression levels
# span two orders of magnitude, so g' is far from normal (|g'|_2 ~ 9) while its
# spectral radius at the steady state is 0.95 (thresholds at 0.4954 of the
# regulator's maximum were chosen for that).
MAX_RATE = np.array([5.0, 50.0, 2.0, 20.0, 100.0, 10.0])
THRESHOLD = 0.4954 * np.roll(MAX_RATE, 1)
ACTIVATED = np.array([True, False, False, False, False, False])
TOL = float(np.finfo(np.float64).eps) ** 0.75   # fixed_point's float64 default


def gene_network(x, xp=jnp):
    """Steady state x = g(x): x_i = A_i (0.05 + h_i((x_{i-1} / K_i)^2))."""
    u = (xp.roll(x, 1) / THRESHOLD) ** 2
    return MAX_RATE * (0.05 + xp.where(ACTIVATED, u / (1 + u), 1 / (1 + u)))


def textbook_anderson(g, x0, memory=5, max_steps=1000):
    """Anderson(m) of Walker & Ni (2011), Alg. AA: x+ = g(x) - dG gamma with
    gamma = argmin |f - dF gamma| over the last m differences (no safeguard).

    Returns (x, steps) at the first evaluated x with |g(x) - x| <= TOL (1 + |x|),
    counted as odekit counts steps."""
    x = x0
    gs, fs = [g(x)], [g(x) - x]
    for step in range(max_steps):
        if np.all(np.abs(fs[-1]) <= TOL + TOL * np.abs(x)):
            return x, step
        x = gs[-1]
        if len(fs) > 1:
            df, dg = np.diff(fs, axis=0).T, np.diff(gs, axis=0).T
            x = x - dg @ np.linalg.lstsq(df, fs[-1], rcond=None)[0]
        gs, fs = (gs + [g(x)])[-memory - 1:], (fs + [g(x) - x])[-memory - 1:]
    raise AssertionError("textbook Anderson did not converge")


def test_anderson_at_its_defaults_accelerates_on_a_gene_network():
    # Was 498 steps (a failure at the old max_steps=256) against 523 for plain
    # iteration: the safeguard compared each proposal with the current residual
    # only, and every restart made Anderson plain iteration again; and memory
    # 5 held 5 iterates (4 differences), Anderson(4).
    x_star, reference = textbook_anderson(lambda x: gene_network(x, np), np.zeros(6))
    steps = 1e-6 * x_star * np.eye(6)                    # central differences, columns j
    jac = np.stack([gene_network(x_star + h, np) - gene_network(x_star - h, np)
                    for h in steps], axis=1) / (2e-6 * x_star)
    assert 0.945 < max(abs(np.linalg.eigvals(jac))) < 0.955
    assert np.linalg.norm(jac, 2) > 5      # far from normal: the residual is not monotone
    res = odekit.fixed_point(gene_network, jnp.zeros(6), method="anderson")
    assert bool(res.success) and int(res.num_steps) <= 2 * reference   # 20 and 20
    np.testing.assert_allclose(res.x, x_star, rtol=1e-10)


def test_plain_iteration_fits_the_default_step_budget():
    x_star, _ = textbook_anderson(lambda x: gene_network(x, np), np.zeros(6))
    res = odekit.fixed_point(gene_network, jnp.zeros(6))              # 523 steps; was 256 allowed
    assert bool(res.success)
    np.testing.assert_allclose(res.x, x_star, rtol=1e-10)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_anderson_with_half_precision_unknowns(dtype):
    # LAPACK has no float16/bfloat16 solve: was a raw NotImplementedError.
    mix = np.array([[0.5, 0.9, 0.0], [-0.9, 0.5, 0.3], [0.0, 0.2, 0.4]])
    shift = np.array([0.1, 0.2, 0.3])

    def f(x):
        return jnp.tanh(jnp.asarray(mix, x.dtype) @ x) + jnp.asarray(shift, x.dtype)

    exact, _ = textbook_anderson(lambda x: np.tanh(mix @ x) + shift, np.zeros(3))
    eps = float(jnp.finfo(dtype).eps)
    res = odekit.fixed_point(f, jnp.zeros(3, dtype), method="anderson", rtol=eps, atol=eps)
    assert res.x.dtype == dtype and bool(res.success)
    np.testing.assert_allclose(np.asarray(res.x, np.float64), exact, rtol=0, atol=2 * eps)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_implicit_gradient_of_half_precision_unknowns(dtype):
    # The implicit rule's dense solve with several unknowns hit LAPACK's
    # NotImplementedError too; it now factors in float32 and casts back.
    def fixed(a):
        return odekit.fixed_point(lambda x, a: 0.5 * jnp.cos(x) + a, jnp.zeros(2, a.dtype), a).x

    a = jnp.array([0.3, 0.2])
    grad = jax.grad(lambda a: fixed(a).sum())(a.astype(dtype))
    assert grad.dtype == dtype
    exact = jax.grad(lambda a: fixed(a).sum())(a)
    np.testing.assert_allclose(np.asarray(grad, np.float64), exact, rtol=4 * float(jnp.finfo(dtype).eps))


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, ct):
        x, = ctx.saved_tensor()
        return 3 * x ** 2 * ct


class Scale(Function):
    @staticmethod
    def forward(ctx, x, a):
        ctx.save_for_backward(x, a)
        return a * x

    @staticmethod
    def backward(ctx, ct):
        x, a = ctx.saved_tensor()
        return a * ct, jnp.sum(x * ct)


def test_function_apply_takes_a_python_float_as_an_array():
    # Was: the float was static, forward returned a float, and apply blamed it.
    out = Cube.apply(3.0)
    assert isinstance(out, jax.Array) and float(out) == 27.0
    assert float(jax.jit(Cube.apply)(3.0)) == 27.0
    assert float(jax.grad(Cube.apply)(3.0)) == 27.0
    assert float(jax.grad(jax.grad(Cube.apply))(3.0)) == 18.0


def test_function_gradients_with_a_python_float_argument():
    x = jnp.asarray([1.0, -2.0, 0.5], jnp.float32)
    out = Scale.apply(x, 0.5)                  # a weakly typed float keeps float32
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, 0.5 * np.asarray(x))
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(Scale.apply(v, 0.5)))(x), [0.5] * 3)
    # d/da of sum(a * x): backward's float32 gradient is taken for the Python float
    assert float(jax.grad(lambda a: jnp.sum(Scale.apply(x, a)))(0.5)) == -0.5
    assert float(jax.jit(jax.grad(lambda a: jnp.sum(Scale.apply(x, a) ** 2)))(2.0)) == 21.0
