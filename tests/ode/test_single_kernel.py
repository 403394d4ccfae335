"""The single-kernel compilation of small solver loops (odekit.ode.engine.single_kernel)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from odekit import odeint
from odekit import _kernel_scope as kernel_scope
from odekit.ode.engine import single_kernel

CPU = jax.default_backend() == "cpu"


def pendulum(y, t, b, g):
    return jnp.stack([y[1], -b * y[1] - g * jnp.sin(y[0])])


def linear(y, t, a):
    return a @ y


def _countdown(x, n):
    """A small while loop: halve x n times."""
    return lax.while_loop(lambda c: c[1] > 0, lambda c: (0.5 * c[0] + jnp.sin(c[0]), c[1] - 1),
                          (x, n))[0]


@pytest.fixture
def switched_on(monkeypatch):
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "1")


def test_on_by_default_and_switched_off_by_the_environment(monkeypatch):
    monkeypatch.delenv(single_kernel.ENV_SWITCH, raising=False)
    assert single_kernel.switched_on()
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "1")
    assert single_kernel.switched_on()
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "0")
    assert not single_kernel.switched_on()


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_eligible_for_elementwise_functions_on_small_states():
    y = jnp.ones(2)
    assert single_kernel.eligible(pendulum, y, 0.0, 0.25, 9.8)


def test_not_eligible_for_matrix_products_large_states_or_callbacks():
    y = jnp.ones(3)
    assert not single_kernel.eligible(linear, y, 0.0, jnp.eye(3))
    big = jnp.ones(single_kernel.MAX_ELEMENTS + 1)
    assert not single_kernel.eligible(lambda y, t: -y, big, 0.0)
    callback = lambda y, t: jax.pure_callback(lambda v: -v, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
    assert not single_kernel.eligible(callback, y, 0.0)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_tagged_loop_compiles_to_one_kernel_call_and_matches():
    x = jnp.linspace(0.1, 2.0, 5)
    tagged = jax.jit(lambda x: single_kernel.run(_countdown, x, 7)).lower(x).compile()
    hlo = tagged.as_text()
    assert 'xla_cpu_small_call="true"' in hlo
    np.testing.assert_allclose(tagged(x), jax.jit(_countdown)(x, 7), rtol=1e-15)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_forward_mode_through_the_tagged_loop_is_the_loops_own():
    """Its operands travel as bytes, whose derivative is zero: differentiated
    directly (where JAX drops an adjoint's rule around it), the tangent is
    the untagged loop's, not 0; under vmap too."""
    x, dx = jnp.linspace(0.1, 2.0, 5), jnp.linspace(1.0, 2.0, 5)
    tangent = jax.jit(lambda x, dx: jax.jvp(lambda x: single_kernel.run(_countdown, x, 7),
                                            (x,), (dx,))[1])(x, dx)
    expected = jax.jvp(lambda x: _countdown(x, 7), (x,), (dx,))[1]
    assert np.max(np.abs(expected)) > 0
    np.testing.assert_allclose(tangent, expected, rtol=1e-14)
    batched = jax.vmap(lambda x, dx: jax.jvp(lambda x: single_kernel.run(_countdown, x, 7),
                                             (x,), (dx,))[1])(x[:, None], dx[:, None])
    np.testing.assert_allclose(batched[:, 0], expected, rtol=1e-14)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_tagged_loop_under_vmap_loops_over_members_in_one_kernel():
    xs = jnp.linspace(0.1, 2.0, 12).reshape(4, 3)
    ns = jnp.arange(4)
    batched = jax.jit(jax.vmap(lambda x, n: single_kernel.run(_countdown, x, n))).lower(
        xs, ns).compile()
    expected = jnp.stack([_countdown(x, n) for x, n in zip(xs, ns)])
    np.testing.assert_array_equal(batched(xs, ns), expected)  # each member on its own
    hlo = batched.as_text()
    assert 'xla_cpu_small_call="true"' in hlo
    # Only some arguments batched, and vmap of vmap.
    half = jax.vmap(lambda x: single_kernel.run(_countdown, x, 3))(xs)
    np.testing.assert_array_equal(half, jnp.stack([_countdown(x, 3) for x in xs]))
    nested = jax.jit(jax.vmap(jax.vmap(lambda x, n: single_kernel.run(_countdown, x, n),
                                       (0, None)), (None, 0)))(xs, ns)
    assert nested.shape == (4, 4, 3)
    for j, n in enumerate(ns):
        np.testing.assert_array_equal(nested[j], jnp.stack([_countdown(x, n) for x in xs]))


def test_tracing_inside_is_set_only_while_the_loop_body_is_traced():
    seen = []

    def body(x, n):
        seen.append(kernel_scope.inside())
        return _countdown(x, n)

    x = jnp.linspace(0.1, 2.0, 6).reshape(2, 3)
    assert not kernel_scope.inside()
    jax.jit(lambda x: single_kernel.run(body, x, 4))(x[0]).block_until_ready()
    jax.jit(jax.vmap(lambda x: single_kernel.run(body, x, 4)))(x).block_until_ready()
    assert seen and all(seen)
    assert not kernel_scope.inside()

    def broken(x):
        raise RuntimeError("a body that fails to trace")

    with pytest.raises(RuntimeError):   # the flag is reset when tracing fails
        single_kernel.run(broken, jnp.ones(2))
    assert not kernel_scope.inside()


def _while_loops(program: str) -> int:
    """While loops in a lowered program."""
    return program.count("stablehlo.while")


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_rodas5p_rolls_its_stages_in_one_kernel_only(monkeypatch):
    """Inside the kernel rodas5p's stage loop stays a loop (a shorter program
    compiles faster); kernel by kernel it is unrolled. Both are right."""
    from odekit import solve_ivp
    from odekit.testing.problems import get_problem, reference_solution
    problem = get_problem("robertson")
    ts = jnp.asarray(problem.t)

    def solve(y0):
        return solve_ivp(lambda t, y, *a: problem.func(y, t, *a),
                         (problem.t0, float(problem.t[-1])), y0, t_eval=ts, args=problem.args, method="rodas5p", rtol=1e-8,
                         atol=1e-12).ys

    y0 = jnp.asarray(problem.y0)
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "1")
    kernel = jax.jit(lambda y0: solve(y0))
    rolled = _while_loops(kernel.lower(y0).as_text())
    with monkeypatch.context() as patched:
        patched.setattr(kernel_scope, "inside", lambda: False)
        unrolled = _while_loops(jax.jit(lambda y0: solve(y0)).lower(y0).as_text())
    assert rolled == unrolled + 1
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "0")
    ordinary = jax.jit(lambda y0: solve(y0))
    for ys in (kernel(y0), ordinary(y0)):
        np.testing.assert_allclose(ys, reference_solution(problem), rtol=1e-5, atol=1e-10)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_odeint_same_values_with_and_without_single_kernel(switched_on, monkeypatch):
    ts = jnp.linspace(0.0, 10.0, 41)
    y0 = jnp.array([np.pi - 0.1, 0.0])
    solve = lambda y0, b: odeint(pendulum, y0, ts, b, 9.8)
    grad = lambda y0, b: jax.grad(lambda y0, b: solve(y0, b).sum(), (0, 1))(y0, b)
    compiled = jax.jit(solve).lower(y0, 0.25).compile()
    assert 'inlineable="false",xla_cpu_small_call="true"' in compiled.as_text()
    with_kernel = (compiled(y0, 0.25), jax.jit(grad)(y0, 0.25))
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "0")
    compiled = jax.jit(lambda y0, b: solve(y0, b)).lower(y0, 0.25).compile()
    assert "inlineable" not in compiled.as_text()  # the switch is part of the cached options
    without = (compiled(y0, 0.25), jax.jit(lambda y0, b: grad(y0, b))(y0, 0.25))
    # Without the single kernel the loop runs in segments (odekit.ode.engine.segments)
    # and clips steps at every fourth output time: another step sequence,
    # so the two agree to the solution's accuracy (~5e-7 here), not to rounding.
    for a, b in zip(jax.tree.leaves(with_kernel), jax.tree.leaves(without)):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-8)


def test_matrix_product_dynamics_take_the_ordinary_path_and_are_right(switched_on):
    a = jnp.array([[-1.0, 0.5], [0.0, -2.0]])
    ts = jnp.linspace(0.0, 1.0, 5)
    ys = jax.jit(lambda y0: odeint(linear, y0, ts, a))(jnp.array([1.0, 1.0]))
    expected = np.stack([jax.scipy.linalg.expm(a * t) @ np.ones(2) for t in np.asarray(ts)])
    np.testing.assert_allclose(ys, expected, rtol=1e-6)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_single_kernel_odeint_under_vmap_scan_and_grad(switched_on):
    ts = jnp.linspace(0.0, 1.0, 5)
    step = lambda y, b: (odeint(pendulum, y, ts, b, 9.8)[-1], None)
    run = lambda y: jax.lax.scan(step, y, jnp.array([0.1, 0.2]))[0]
    y0 = jnp.array([1.0, 0.0])
    expected = odeint(pendulum, odeint(pendulum, y0, ts, 0.1, 9.8)[-1], ts, 0.2, 9.8)[-1]
    np.testing.assert_allclose(jax.jit(run)(y0), expected, rtol=1e-12)
    g = jax.jit(jax.grad(lambda y: run(y).sum()))(y0)
    assert np.all(np.isfinite(g))
    angles = jnp.array([0.5, 1.0, 2.0])
    batched = jax.jit(jax.vmap(lambda a: odeint(pendulum, jnp.stack([a, 0.0 * a]), ts, 0.25, 9.8)))
    single = jnp.stack([odeint(pendulum, jnp.array([a, 0.0]), ts, 0.25, 9.8) for a in angles])
    np.testing.assert_allclose(batched(angles), single, rtol=1e-12)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_single_kernel_gradient_matches_finite_differences(switched_on):
    from odekit.testing import check_grads
    ts = jnp.linspace(0.0, 2.0, 6)
    loss = jax.jit(lambda y0, b, g: odeint(pendulum, y0, ts, b, g, rtol=1e-10, atol=1e-10))
    assert 'xla_cpu_small_call="true"' in jax.jit(
        jax.grad(lambda *a: loss(*a).sum(), (0, 1, 2))).lower(
        jnp.array([2.0, 0.0]), 0.25, 9.8).compile().as_text()
    check_grads(loss, (jnp.array([2.0, 0.0]), jnp.asarray(0.25), jnp.asarray(9.8)), order=1,
                rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_operands_the_loop_ignores_do_not_break_compilation():
    # XLA's single-kernel emitter aborts the process on an unused parameter;
    # run() passes all operands as one buffer, which the loop always reads.
    ignores = lambda x, unused, n, flag: _countdown(x, n)
    x = jnp.linspace(0.1, 2.0, 5)
    tagged = jax.jit(lambda x, u: single_kernel.run(ignores, x, u, 7, jnp.array(True))).lower(
        x, jnp.ones(3)).compile()
    assert 'xla_cpu_small_call="true"' in tagged.as_text()
    np.testing.assert_allclose(tagged(x, jnp.ones(3)), _countdown(x, 7), rtol=1e-15)


@pytest.mark.parametrize("leaf", [
    np.linspace(-1, 1, 6).reshape(2, 3), np.float32(1.5), np.arange(4, dtype=np.int32),
    np.array([1 + 2j, -3.5j]), np.array([0.5 - 1j], np.complex64), np.array([True, False]),
    np.zeros((0, 3)), np.array([np.inf, -np.inf, np.nan, -0.0, 5e-324]),
], ids=["f64", "f32", "i32", "c128", "c64", "bool", "empty", "special"])
def test_packing_operands_into_bytes_is_exact(leaf):
    operands = ({"a": jnp.asarray(leaf)}, [jnp.asarray(2.0)])
    buffer, unpack = single_kernel._pack(operands)
    assert buffer.dtype == jnp.uint8
    back = jax.jit(unpack)(buffer)
    assert jax.tree.structure(back) == jax.tree.structure(operands)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(operands)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.atleast_1d(np.asarray(a)).view(np.uint8),
                                      np.atleast_1d(np.asarray(b)).view(np.uint8))


def _shooting(y0, b):
    """Initial velocity that brings a damped oscillator to theta=1 at t=1."""
    import odekit
    ends = lambda v, b: odeint(pendulum, jnp.stack([y0[0], v]), jnp.array([0.0, 1.0]), b, 9.8)[-1, 0] - 1.0
    return odekit.root(ends, 0.0, b).x


def _nested(y0, b):
    inner = lambda y, t, b: -b * y
    outer = lambda y, t, b: -odeint(inner, y, jnp.array([0.0, 0.1]), b)[-1]
    return odeint(outer, y0, jnp.array([0.0, 0.5, 1.0]), b)


def _nested_exact(y0, b):
    """_nested's value and gradient of its sum: y' = -exp(-0.1 b) y, so
    y(t) = y0 exp(-c t) with c = exp(-0.1 b)."""
    t, c = np.array([0.0, 0.5, 1.0]), np.exp(-0.1 * float(b))
    decay = np.exp(-c * t)
    value = np.asarray(y0)[None, :] * decay[:, None]
    return value, (np.full(2, decay.sum()), float(np.sum(y0)) * np.sum(0.1 * c * t * decay))


COMPOSITIONS = {
    "one output time": lambda y0, b: odeint(pendulum, y0, jnp.array([0.0]), b, 9.8),
    "two output times": lambda y0, b: odeint(pendulum, y0, jnp.array([0.0, 1.0]), b, 9.8),
    "fori_loop": lambda y0, b: lax.fori_loop(
        0, 3, lambda i, y: odeint(pendulum, y, jnp.array([0.0, 0.3]), b, 9.8)[-1], y0),
    "cond": lambda y0, b: lax.cond(b > 0, lambda: odeint(pendulum, y0, jnp.linspace(0.0, 1.0, 3),
                                                         b, 9.8), lambda: jnp.zeros((3, 2))),
    # a new function under jax.checkpoint at each call: checkpoint keeps the
    # trace of a function it has seen (and so the switch it was traced with)
    "checkpoint": lambda y0, b: jax.checkpoint(
        lambda y0, b: odeint(pendulum, y0, jnp.linspace(0.0, 1.0, 3), b, 9.8))(y0, b),
    "complex": lambda y0, b: jnp.abs(odeint(lambda y, t, b: 1j * b * y - 0.1 * y, y0.astype(complex),
                                            jnp.linspace(0.0, 1.0, 3), b)),
    "pytree and mixed dtypes": lambda y0, b: odeint(
        lambda y, t, b: {"u": -b * y["u"], "v": (b * y["u"][0]).astype(jnp.float32) - y["v"]},
        {"u": y0, "v": jnp.ones(1, jnp.float32)}, jnp.linspace(0.0, 1.0, 3), b)["u"],
    "unused and integer args": lambda y0, b: odeint(lambda y, t, b, unused, n: -b * y * n, y0,
                                                    jnp.linspace(0.0, 1.0, 3), b, jnp.ones(4), 2),
    "odeint inside func": _nested,
    "odeint inside root": _shooting,
}
# In the long run only: root (23 s); two output times, the plain solve, whose
# value and gradient with the switch on and off
# test_odeint_same_values_with_and_without_single_kernel compares, and whose
# grad of grad the cond composition takes on the same pendulum.
LONG_COMPOSITIONS = ("odeint inside root", "two output times")
# The single kernel's grad of grad (3-7 s of compilation each) in CI for these:
# control flow, complex values, unused and integer arguments; for the others in
# the long run. The nested solve's compiles for a minute: never.
SECOND_ORDER_IN_CI = ("cond", "complex", "unused and integer args")
NO_SECOND_ORDER = ("odeint inside func",)
# Closed forms: the nested solve's gradient compiles for ~10 s on each path, so
# in CI its ordinary path compiles the value only, and the single kernel's value
# and gradient are checked against the closed form as well (the ordinary
# path's gradient in the long run).
EXACT = {"odeint inside func": _nested_exact}
ONE_KERNEL = 'xla_cpu_small_call="true"'


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.long)
                                  if name in LONG_COMPOSITIONS else name
                                  for name in COMPOSITIONS])
def test_compositions_agree_with_the_ordinary_path(name, monkeypatch):
    """Values and gradients under jit, with the switch on and off, and the
    single kernel's grad of grad against central differences of its gradient
    (and, in the long run, against the ordinary path's), for compositions
    that once crashed XLA's emitter or might."""
    fn = COMPOSITIONS[name]
    y0, b = jnp.array([2.0, 0.5]), jnp.asarray(0.3)
    total = lambda y0, b: sum(jnp.sum(leaf) for leaf in jax.tree.leaves(fn(y0, b)))
    long = os.environ.get("ODEKIT_LONG_TESTS") == "1"
    second = name not in NO_SECOND_ORDER and (long or name in SECOND_ORDER_IN_CI)

    def compiled(switch):
        """The value, the gradient (and grad of grad) compiled with the switch
        set. New functions each time: jax.jit keeps the trace of a function
        it has seen, and the switch is read when odeint is traced."""
        monkeypatch.setenv(single_kernel.ENV_SWITCH, switch)
        programs = {"value": (lambda y0, b: fn(y0, b), (y0, b))}
        if switch == "1" or long or name not in EXACT:
            programs["gradient"] = (lambda y0, b: jax.grad(total, (0, 1))(y0, b), (y0, b))
        if second and (switch == "1" or long):
            programs["second"] = (lambda b: jax.grad(lambda b: jax.grad(total, 1)(y0, b))(b), (b,))
        return {key: (jax.jit(program).lower(*args).compile(), args)
                for key, (program, args) in programs.items()}

    kernel, ordinary = compiled("1"), compiled("0")
    # the values' programs: the odeint loops in one kernel with the switch on,
    # not with it off (root's Newton steps take reverse mode, which is
    # compiled as one kernel either way)
    kernels = [program.as_text().count(ONE_KERNEL) for program, _ in (kernel["value"],
                                                                       ordinary["value"])]
    assert kernels[0] > kernels[1], kernels
    results = {switch: {key: program(*args) for key, (program, args) in programs.items()}
               for switch, programs in (("1", kernel), ("0", ordinary))}
    for a in jax.tree.leaves(results["1"]):
        assert np.all(np.isfinite(a))
    for key in results["0"]:
        for a, b_ in zip(jax.tree.leaves(results["1"][key]), jax.tree.leaves(results["0"][key])):
            np.testing.assert_allclose(a, b_, rtol=1e-7, atol=1e-10)
    if name in EXACT:
        value, gradient = EXACT[name](y0, b)
        np.testing.assert_allclose(results["1"]["value"], value, rtol=1e-7, atol=1e-10)
        for a, b_ in zip(results["1"]["gradient"], gradient):
            np.testing.assert_allclose(a, b_, rtol=1e-7, atol=1e-10)
    if second:
        gradient = kernel["gradient"][0]           # compiled above: no new program
        step = 1e-3
        difference = (gradient(y0, b + step)[1] - gradient(y0, b - step)[1]) / (2 * step)
        np.testing.assert_allclose(results["1"]["second"], difference, rtol=1e-4, atol=1e-6)


def _pairwise_field(bodies):
    """Softened 1-D attraction between ``bodies`` particles (state: positions,
    velocities): one (bodies, bodies) reduction per evaluation."""
    def field(t, y):
        x, v = y[:bodies], y[bodies:]
        d = x[:, None] - x[None, :]
        return jnp.concatenate([v, -jnp.sum(d / (d * d + 1.0) ** 1.5, axis=1)])
    return field


@pytest.mark.skipif(not CPU, reason="the single-kernel path exists on the CPU only")
def test_large_reductions_take_the_ordinary_path_and_are_right():
    """A field that reduces 64 x 64 numbers once failed to compile ("Fusion
    kind not implemented on CPU": XLA hands such reductions to a library
    kernel); now the loop is not tagged, and the result is SciPy's."""
    import scipy.integrate

    import odekit
    small, large = _pairwise_field(30), _pairwise_field(64)
    engine = lambda field: (lambda y, t: field(t, y))
    assert single_kernel.eligible(engine(small), jnp.ones(60), jnp.zeros(()))
    assert not single_kernel.eligible(engine(large), jnp.ones(128), jnp.zeros(()))
    y0 = jnp.concatenate([jnp.linspace(0.0, 1.0, 64), jnp.zeros(64)])
    solve = jax.jit(lambda y: odekit.solve_ivp(large, (0.0, 1.0), y, method="tsit5", rtol=1e-8,
                                               atol=1e-10).ys[-1]).lower(y0).compile()
    assert 'xla_cpu_small_call="true"' not in solve.as_text()
    reference = scipy.integrate.solve_ivp(lambda t, y: np.asarray(large(t, jnp.asarray(y))),
                                          (0.0, 1.0), np.asarray(y0), method="DOP853",
                                          rtol=1e-11, atol=1e-12).y[:, -1]
    np.testing.assert_allclose(solve(y0), reference, rtol=1e-6, atol=1e-8)
