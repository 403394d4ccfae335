"""Jacobian sparsity detection from the jaxpr: the detected pattern holds
every nonzero of ``jax.jacfwd`` at random points (never misses one) and, for
the usual right-hand sides, equals it; conservative answers where indices
depend on the state; SciPy-ordered wrapper; large n."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse
from jax import lax

import odekit.ode
from odekit.ode.linalg.sparsity import as_pattern, color_columns, compressed_jacobian
from odekit.ode.linalg.sparsity_detection import jacobian_sparsity

N = 12


def lap_roll(y):
    return jnp.roll(y, 1) - 2 * y + jnp.roll(y, -1) + y ** 2


def lap_slices(y):
    inner = y[:-2] - 2 * y[1:-1] + y[2:]
    return jnp.concatenate([y[:1] - y[1:2], inner, 2.0 * y[-1:]]) * jnp.exp(y)


def lap_pad(y):
    p = jnp.pad(y, 1)
    return p[:-2] + p[2:] - 2 * y * y


def robertson(y):
    z = y.reshape(-1, 3)
    a, b, c = z[:, 0], z[:, 1], z[:, 2]
    return jnp.stack([-0.04 * a + 1e4 * b * c, 0.04 * a - 1e4 * b * c - 3e7 * b ** 2,
                      3e7 * b ** 2], axis=1).reshape(-1)


def brusselator_1d(y):
    u, v = y[0::2], y[1::2]
    one = jnp.ones(1, y.dtype)
    lap = lambda w, b: jnp.concatenate([b, w[:-1]]) - 2 * w + jnp.concatenate([w[1:], b])  # noqa: E731
    du = 1 + u * u * v - 4 * u + 4.0 * lap(u, one)
    dv = 3 * u - u * u * v + 4.0 * lap(v, 3 * one)
    return jnp.stack([du, dv], axis=1).reshape(-1)


def brusselator_2d(y):
    m = 4
    u, v = y[:m * m].reshape(m, m), y[m * m:].reshape(m, m)

    def lap(w):
        return (jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1)
                - 4 * w)
    du = 1 + u * u * v - 4.4 * u + 0.1 * lap(u)
    dv = 3.4 * u - u * u * v + 0.1 * lap(v)
    return jnp.concatenate([du.ravel(), dv.T.ravel()])


A = np.eye(N) + np.eye(N, k=2) - 0.5 * np.eye(N, k=-5)


def dot_closure(y):
    return jnp.dot(jnp.asarray(A), y * y)


def dot_arg(y, params):
    return params["A"] @ jnp.sin(y) + params["k"] * y


def matrix_state(y):
    z = y.reshape(3, 4)
    return (z.T @ jnp.asarray(np.eye(3))).ravel() + jnp.sum(z, axis=1).repeat(4)


def fori_static(y):
    return lax.fori_loop(0, 2, lambda i, c: c + jnp.roll(c, 1) * c, y)


def fori_dynamic_bound(y, k):
    return lax.fori_loop(0, k, lambda i, c: c + 0.1 * jnp.roll(c, 1) * c, y)


def fori_indexing(y):
    return lax.fori_loop(0, N - 1, lambda i, c: c.at[i + 1].add(c[i] * c[i + 1]), y)


def scan_fn(y):
    xs = (1.0 + jnp.arange(3.0))[:, None] * jnp.ones((1, N))
    carry, out = lax.scan(lambda c, x: (c * x + jnp.roll(c, 1), c[::-1]), y, xs)
    return carry + out[1]


def where_fn(y):
    return jnp.where(y > 0, y ** 2, y * jnp.roll(y, 1))


def softplus_fn(y):
    return jax.nn.softplus(jnp.roll(y, 2)) * y


def vmapped(y):
    inner = lambda a, b: jnp.stack([a * b, a - jnp.sin(b)])  # noqa: E731
    return jax.vmap(inner)(y[::2], y[1::2]).T.reshape(-1)


def at_updates(y):
    return (y * 2).at[0].add(y[5] ** 2).at[3].set(y[1]).at[jnp.array([2, 2, 7])].add(y[:3])


def cumulative(y):
    return jnp.cumsum(y[::-1]) * y + jnp.sum(y[:3] ** 2)


def jitted_inner(y):
    return jax.jit(lambda z: jnp.tanh(z[1:]) - z[:-1])(jnp.concatenate([y, y[:1]]))


def checkpointed(y):
    return jax.checkpoint(lambda z: jnp.sin(z) * jnp.roll(z, 3))(y)


def cond_static(y):
    return lax.cond(True, lambda v: v * jnp.roll(v, 1), lambda v: v, y)


@jax.custom_vjp
def _cube(x):
    return x ** 3


_cube.defvjp(lambda x: (x ** 3, x), lambda x, g: (3 * x ** 2 * g,))


def custom_vjp_fn(y):
    return _cube(y) + jnp.roll(y, -1)


def take_fn(y):
    idx = np.array([3, 0, 0, 11, 5, 6, 7, 2, 9, 1, 10, 4])
    return jnp.take(y, jnp.asarray(idx)) * y + lax.dynamic_slice(y, (2,), (N,)) ** 2


def transpose_fn(y):
    z = y.reshape(3, 4)
    return jnp.concatenate([z.T.ravel() ** 2, jnp.zeros(0, y.dtype)]) + jnp.max(z, axis=0).repeat(3)


EXACT = {
    "roll": (lap_roll, ()),
    "slices": (lap_slices, ()),
    "pad": (lap_pad, ()),
    "robertson": (robertson, ()),
    "brusselator_1d": (brusselator_1d, ()),
    "brusselator_2d": (brusselator_2d, ()),
    "dot_closure": (dot_closure, ()),
    "dot_arg_pytree": (dot_arg, ({"A": jnp.asarray(A), "k": jnp.asarray(2.0)},)),
    "matrix_state": (matrix_state, ()),
    "fori_static": (fori_static, ()),
    "fori_dynamic_bound": (fori_dynamic_bound, (3,)),
    "fori_indexing": (fori_indexing, ()),
    "scan": (scan_fn, ()),
    "where": (where_fn, ()),
    "softplus": (softplus_fn, ()),
    "vmap": (vmapped, ()),
    "at_updates": (at_updates, ()),
    "cumulative": (cumulative, ()),
    "jit": (jitted_inner, ()),
    "checkpoint": (checkpointed, ()),
    "cond_static": (cond_static, ()),
    "custom_vjp": (custom_vjp_fn, ()),
    "take": (take_fn, ()),
    "transpose_reduce": (transpose_fn, ()),
}


def true_pattern(fun, n, args, points=3):
    """Nonzeros of jacfwd (jacrev for custom_vjp) at random points and their negatives (both branches
    of sign tests), unioned."""
    rng = np.random.default_rng(0)
    found = None
    flat = lambda v: jnp.ravel(fun(v, *args))  # noqa: E731
    # jitted: one program for the points (op by op, each point ran ~5 small ones)
    forward, reverse = jax.jit(jax.jacfwd(flat)), jax.jit(jax.jacrev(flat))
    for _ in range(points):
        r = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
        for y in (r, -r):
            try:
                jac = np.asarray(forward(jnp.asarray(y))) != 0
            except TypeError:  # a custom_vjp function: reverse mode
                jac = np.asarray(reverse(jnp.asarray(y))) != 0
            found = jac if found is None else found | jac
    return found


def size_of(name):
    return 32 if name == "brusselator_2d" else N


@pytest.mark.parametrize("name", list(EXACT))
def test_detected_equals_jacfwd_pattern(name):
    fun, args = EXACT[name]
    n = size_of(name)
    detected = jacobian_sparsity(fun, jnp.ones(n), *args)
    assert isinstance(detected, scipy.sparse.csr_array) and detected.dtype == bool
    truth = true_pattern(fun, n, args)
    assert detected.shape == truth.shape
    dense = detected.toarray()
    assert not (truth & ~dense).any(), "a nonzero was missed"
    np.testing.assert_array_equal(dense, truth)


def gather_at_argmax(y):
    return y[jnp.argmax(y)] * y


def while_on_state(y):
    return lax.while_loop(lambda c: c[1][0] < 3, lambda c: (c[0] + 1, c[1] + jnp.roll(c[1], 1)),
                          (0, y))[1]


def sorted_fn(y):
    return jnp.sort(y) * 2.0


def solve_fn(y):
    m = jnp.asarray(np.eye(N) * 4 + np.eye(N, k=1))
    return jnp.linalg.solve(m, y ** 2)


def fft_fn(y):
    return jnp.real(jnp.fft.fft(y.astype(jnp.complex128)))[:N]


def dynamic_index(y):
    i = jnp.asarray(y[0] > 0, dtype=jnp.int32)
    return lax.dynamic_slice(y, (i * 3,), (4,)).sum() + y


CONSERVATIVE = {
    "gather_at_argmax": gather_at_argmax,
    "while_on_state": while_on_state,
    "sort": sorted_fn,
    "solve": solve_fn,
    "fft": fft_fn,
    "dynamic_index": dynamic_index,
}


@pytest.mark.parametrize("name", list(CONSERVATIVE))
def test_conservative_never_misses(name):
    fun = CONSERVATIVE[name]
    detected = jacobian_sparsity(fun, jnp.ones(N)).toarray()
    truth = true_pattern(fun, N, ())
    assert not (truth & ~detected).any(), "a nonzero was missed"


def test_scipy_order_wrapper_and_time_unknown():
    def fun(t, y, k):
        return jnp.where(t > 1, jnp.roll(y, 1) * k, y * y)

    assert odekit.ode.jacobian_sparsity.__doc__
    pattern = odekit.ode.jacobian_sparsity(fun, 0.0, jnp.ones(5), 2.0).toarray()
    # t is an unknown value: the pattern holds at every time (both branches).
    np.testing.assert_array_equal(pattern, np.eye(5, dtype=bool) | np.eye(5, k=-1, dtype=bool)
                                  | np.eye(5, k=4, dtype=bool))


def test_detected_pattern_feeds_compressed_jacobian():
    n = 400
    sparsity = odekit.ode.jacobian_sparsity(lambda t, y: brusselator_1d(y) * (1 + t), 0.0,
                                            jnp.ones(n))
    pattern = as_pattern(sparsity, n)
    coloring = color_columns(pattern)
    assert coloring.num_colors <= 5
    y = jnp.asarray(np.random.default_rng(1).uniform(0.5, 2, n))
    values = jax.jit(lambda y: compressed_jacobian(lambda y, t: brusselator_1d(y), y, 0.0,
                                                   pattern, coloring))(y)
    jac = np.array(jax.jit(jax.jacfwd(brusselator_1d))(y))
    np.testing.assert_allclose(values, jac[pattern.rows, pattern.cols], rtol=1e-13)
    jac[pattern.rows, pattern.cols] = 0
    assert not jac.any()


def test_outputs_pytree_and_nonflat_state():
    def fun(y):
        return {"a": y[:, 0] * y[:, 1], "b": jnp.sum(y, axis=0)}

    pattern = jacobian_sparsity(fun, jnp.ones((3, 2))).toarray()
    expected = np.zeros((5, 6), bool)
    for i in range(3):
        expected[i, [2 * i, 2 * i + 1]] = True
    expected[3, 0::2] = True
    expected[4, 1::2] = True
    np.testing.assert_array_equal(pattern, expected)


def test_constant_output_and_args_without_dependence():
    pattern = jacobian_sparsity(lambda y, c: c * 2.0, jnp.ones(4), jnp.ones(4))
    assert pattern.shape == (4, 4) and pattern.nnz == 0


@pytest.mark.parametrize("n", [9_999, 99_999])
def test_detection_is_fast_at_large_n(n):
    def fun(y):
        body = brusselator_1d(y[:-1])
        return jnp.concatenate([body, y[-1:] * robertson(y[:3])[:1]])

    start = time.perf_counter()
    pattern = jacobian_sparsity(fun, jnp.ones(n))
    elapsed = time.perf_counter() - start
    assert pattern.shape == (n, n)
    assert pattern.nnz < 5 * n
    assert elapsed < 30.0, elapsed  # ~0.2 s measured at n = 1e5 on an idle core


def test_constant_masks_are_exact():
    mask = np.arange(N) % 3 == 0

    def fun(y):
        boundary = jnp.where(jnp.asarray(mask), 1.0 - y, jnp.roll(y, 1) * y)
        return boundary + jnp.asarray(mask, dtype=y.dtype) * jnp.roll(y, -2)

    detected = jacobian_sparsity(fun, jnp.ones(N)).toarray()
    np.testing.assert_array_equal(detected, true_pattern(fun, N, ()))


def test_long_loops_reach_a_fixed_point():
    def fun(y, k):
        y = lax.fori_loop(0, 1000, lambda i, c: c + 1e-3 * jnp.roll(c, 1), y)
        return lax.fori_loop(0, k, lambda i, c: 0.5 * c, y)

    detected = jacobian_sparsity(fun, jnp.ones(N), jnp.asarray(300)).toarray()
    assert detected.all()  # 1000 shifts couple every element to every other
    blocks = jacobian_sparsity(lambda y: lax.fori_loop(0, 1000, lambda i, c: c * c, y.reshape(4, 3)),
                               jnp.ones(N)).toarray()
    np.testing.assert_array_equal(blocks, np.eye(N, dtype=bool))


def test_inside_jit_with_traced_args():
    found = {}

    @jax.jit
    def run(y, k):
        found["pattern"] = jacobian_sparsity(lambda v, k: k * jnp.roll(v, 1), y, k)
        return y

    run(jnp.ones(5), jnp.asarray(2.0))
    np.testing.assert_array_equal(found["pattern"].toarray(), np.eye(5, k=-1, dtype=bool)
                                  | np.eye(5, k=4, dtype=bool))


def test_dense_fallback_at_large_n_says_what_to_do(monkeypatch):
    import odekit.ode.linalg.sparsity_detection as detection
    monkeypatch.setattr(detection, "_MAX_DENSE", 1000)
    with pytest.raises(ValueError, match="dense Jacobian, or pass jac_sparsity"):
        jacobian_sparsity(lambda y: jnp.real(jnp.fft.fft(y.astype(jnp.complex128))), jnp.ones(100))
