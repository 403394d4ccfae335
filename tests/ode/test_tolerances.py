"""Per-component tolerances (issue 35, item 2): rtol and atol as arrays or
pytrees shaped like y0, in every method and adjoint of solve_ivp and odeint.

A tolerance is static: a float, or a hashable record of NumPy arrays
(odekit.ode.engine.controller.PerElement) whose entries become constants of
the program; a tolerance whose entries are all equal is a float (the
scalar path, unchanged)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odekit
from odekit.ode.adjoints import continuous
from odekit.ode.arguments import static_tolerance
from odekit.ode.engine import single_kernel
from odekit.ode.engine.controller import PerElement
from odekit.testing import check_grads, get_problem

ALL_METHODS = ["bosh3", "dopri5", "tsit5", "dopri8", "rodas5p", "kvaerno5", "auto"]

# --- Robertson: a trace species resolved by its own atol ------------------------

K = (0.04, 1e4, 3e7)
T_ROB = np.concatenate([[0.0], np.logspace(-5.0, 5.0, 11)])
ATOL_ROB = np.array([1e-8, 1e-14, 1e-8])
RTOL_ROB = 1e-6


def _robertson_np(t, y):
    k1, k2, k3 = K
    return np.array([-k1 * y[0] + k2 * y[1] * y[2],
                     k1 * y[0] - k2 * y[1] * y[2] - k3 * y[1] ** 2, k3 * y[1] ** 2])


def _robertson_jac(t, y):
    k1, k2, k3 = K
    return np.array([[-k1, k2 * y[2], k2 * y[1]],
                     [k1, -k2 * y[2] - 2 * k3 * y[1], -k2 * y[1]],
                     [0.0, 2 * k3 * y[1], 0.0]])


@pytest.fixture(scope="module")
def robertson_reference():
    """SciPy's Radau at rtol 1e-12 (about a second with the NumPy field)."""
    ref = scipy.integrate.solve_ivp(_robertson_np, (0.0, T_ROB[-1]), [1.0, 0.0, 0.0],
                                    method="Radau", rtol=1e-12, atol=[1e-14, 1e-20, 1e-14],
                                    t_eval=T_ROB, jac=_robertson_jac)
    assert ref.success
    return ref.y.T


def _tolerance_units(ys, ref, atol):
    """Error of each component in units of its own tolerance, the largest over time."""
    return np.max(np.abs(np.asarray(ys) - ref) / (atol + RTOL_ROB * np.abs(ref)), axis=0)


# (kvaerno5's error control takes per-component atol in CI:
# test_each_entry_drives_the_steps[kvaerno5])
@pytest.mark.parametrize("method", ["rodas5p", pytest.param("kvaerno5", marks=pytest.mark.long)])
def test_robertson_per_component_atol_resolves_the_small_species(method, robertson_reference):
    p = get_problem("robertson")
    fun = lambda t, y, *k: p.func(y, t, *k)
    solve = lambda atol: odekit.solve_ivp(fun, (0.0, T_ROB[-1]), jnp.asarray(p.y0), args=p.args,
                                          t_eval=jnp.asarray(T_ROB), method=method,
                                          rtol=RTOL_ROB, atol=atol)
    per_component = solve(list(ATOL_ROB))
    scalar = solve(1e-8)
    # Measured: at most 2.9 (rodas5p) / 1.1 (kvaerno5) tolerances per component.
    units = _tolerance_units(per_component.ys, robertson_reference, ATOL_ROB)
    assert np.all(units < 6), units
    # SciPy with the same per-component atol lands in the same place (0.43 here).
    scipy_sol = scipy.integrate.solve_ivp(_robertson_np, (0.0, T_ROB[-1]), [1.0, 0.0, 0.0],
                                          method="Radau", rtol=RTOL_ROB, atol=ATOL_ROB,
                                          t_eval=T_ROB, jac=_robertson_jac)
    assert np.all(_tolerance_units(scipy_sol.y.T, robertson_reference, ATOL_ROB) < 6)
    # A scalar atol of 1e-8 does not resolve y2 (~1e-5 and less): measured 150 to
    # 1000 of y2's per-component tolerances, a relative error of 3e-4 to 2e-3.
    y2_scalar = _tolerance_units(scalar.ys, robertson_reference, ATOL_ROB)[1]
    assert y2_scalar > 30, y2_scalar
    rel = lambda sol: np.max(np.abs(np.asarray(sol.ys)[1:, 1] / robertson_reference[1:, 1] - 1))
    assert rel(per_component) < 1e-5 < 1e-4 < rel(scalar)
    assert per_component.stats["num_steps"] > scalar.stats["num_steps"]


# --- the error control uses every entry, in every method -----------------------

def _slow_and_fast(t, y):
    """y0' = -y0 (slow); (y1, y2) = (sin, cos)(40 t), driven (no stability limit)."""
    omega = 40.0
    return jnp.stack([-y[0], omega * jnp.cos(omega * t), -omega * jnp.sin(omega * t)])


Y_SF = jnp.array([1.0, 0.0, 1.0])


# bosh3 and dopri5 share tsit5's error control (rk_step with its tableau's
# error weights; dopri8 has its own second error estimate): long, like auto
# (tsit5 then rodas5p, both in CI).
LONG_ENTRY_METHODS = ("bosh3", "dopri5", "auto")


@pytest.mark.parametrize("method", [m if m not in LONG_ENTRY_METHODS
                                    else pytest.param(m, marks=pytest.mark.long)
                                    for m in ALL_METHODS])
def test_each_entry_drives_the_steps(method):
    solve = lambda **tol: odekit.solve_ivp(_slow_and_fast, (0.0, 2.0), Y_SF, method=method,
                                           **tol)
    uniform = solve(rtol=1e-6, atol=1e-9)
    loose_fast = solve(rtol=1e-6, atol=[1e-9, 1e3, 1e3])
    # the same through an rtol per component
    loose_fast_r = solve(rtol=[1e-6, 1e3, 1e3], atol=1e-9)
    alone = odekit.solve_ivp(lambda t, y: -y, (0.0, 2.0), Y_SF[:1], method=method, rtol=1e-6,
                             atol=1e-9)
    steps = lambda sol: int(sol.stats["num_steps"])
    # Loosening only the fast components cuts the steps; with a huge atol they
    # do not drive the steps at all: the slow component alone does.
    assert steps(loose_fast) < steps(uniform) / 2, (steps(loose_fast), steps(uniform))
    assert steps(loose_fast) <= steps(alone) + 2, (steps(loose_fast), steps(alone))
    # (a loose rtol alone still leaves atol near the zeros of sin and cos)
    assert steps(loose_fast_r) < steps(uniform) / 2, (steps(loose_fast_r), steps(uniform))
    # ... and the slow component is still solved to its tolerance
    assert abs(float(loose_fast.ys[-1, 0]) - np.exp(-2.0)) < 1e-5
    # a uniform array is the scalar: the same program and the same numbers
    same = solve(rtol=[1e-6] * 3, atol=np.full(3, 1e-9))
    np.testing.assert_array_equal(same.ys, uniform.ys)


# odeint hands its tolerances to the same methods as solve_ivp, whose error
# control takes per-component tolerances in every method above: CI runs
# odeint's default (dopri5) and an implicit method; the others are long.
@pytest.mark.parametrize("method", [pytest.param("bosh3", marks=pytest.mark.long), "dopri5",
                                    pytest.param("tsit5", marks=pytest.mark.long),
                                    pytest.param("dopri8", marks=pytest.mark.long), "rodas5p",
                                    pytest.param("kvaerno5", marks=pytest.mark.long)])
def test_odeint_per_component_atol(method):
    t = jnp.linspace(0.0, 2.0, 5)
    func = lambda y, t: _slow_and_fast(t, y)
    ys = odekit.odeint(func, Y_SF, t, rtol=1e-8, atol=[1e-10, 1e3, 1e3], method=method)
    np.testing.assert_allclose(ys[:, 0], np.exp(-t), rtol=1e-6)
    tight = odekit.odeint(func, Y_SF, t, rtol=1e-8, atol=1e-10, method=method)
    np.testing.assert_allclose(tight[:, 2], np.cos(40 * t), atol=1e-5)


# --- pytrees ---------------------------------------------------------------------

def _tree_field(t, y):
    a, b = y["a"], y["b"]
    return {"a": jnp.stack([-a[0], -0.5 * a[1]]), "b": 1e-5 * jnp.cos(10.0 * t) + 0 * b}


def _flat_field(t, y):
    return jnp.stack([-y[0], -0.5 * y[1], 1e-5 * jnp.cos(10.0 * t) + 0 * y[2]])


# (rodas5p: long; the per-leaf tolerance is the same record of arrays in every
# method's error norm, and rodas5p takes per-component atol in CI above)
@pytest.mark.parametrize("method", ["tsit5", pytest.param("rodas5p", marks=pytest.mark.long)])
def test_pytree_y0_with_per_leaf_atol(method):
    y0 = {"a": jnp.array([1.0, 2.0]), "b": jnp.array(2e-6)}
    t_eval = jnp.linspace(0.0, 3.0, 7)
    tree = odekit.solve_ivp(_tree_field, (0.0, 3.0), y0, t_eval=t_eval, method=method,
                            rtol=1e-4, atol={"a": 1e-8, "b": 1e-14})
    flat = odekit.solve_ivp(_flat_field, (0.0, 3.0), jnp.array([1.0, 2.0, 2e-6]),
                            t_eval=t_eval, method=method, rtol=1e-4, atol=[1e-8, 1e-8, 1e-14])
    assert int(tree.stats["num_steps"]) == int(flat.stats["num_steps"])
    np.testing.assert_allclose(tree.ys["a"], flat.ys[:, :2], rtol=1e-10)
    np.testing.assert_allclose(tree.ys["b"], flat.ys[:, 2], rtol=1e-10)
    # leaves of the tolerance may be arrays broadcasting to the leaves
    mixed = odekit.solve_ivp(_tree_field, (0.0, 3.0), y0, t_eval=t_eval, method=method,
                             rtol={"a": [1e-4, 1e-4], "b": 1e-4},
                             atol={"a": np.array([1e-8, 1e-8]), "b": 1e-14})
    np.testing.assert_array_equal(mixed.ys["b"], tree.ys["b"])
    # the small leaf is resolved with its own atol, not with the scalar one
    t = np.asarray(t_eval)
    b_exact = 1e-6 * (2.0 + np.sin(10.0 * t))     # b' = 1e-5 cos(10 t), b(0) = 2e-6
    scalar = odekit.solve_ivp(_tree_field, (0.0, 3.0), y0, t_eval=t_eval, method=method,
                              rtol=1e-4, atol=1e-8)
    err = lambda sol: np.max(np.abs(np.asarray(sol.ys["b"]) - b_exact) / b_exact)
    assert err(tree) < 1e-3 and err(tree) < err(scalar) / 10, (err(tree), err(scalar))


def test_odeint_pytree_per_leaf_atol_and_backsolve_gradient():
    y0 = {"a": jnp.array([1.0, 2.0]), "b": jnp.array(1e-6)}
    t = jnp.linspace(0.0, 1.0, 4)
    func = lambda y, t, k: jax.tree.map(lambda d: k * d, _tree_field(t, y))
    loss = lambda k: odekit.odeint(func, y0, t, k, rtol=1e-9,
                                   atol={"a": [1e-10, 1e-9], "b": 1e-16})["b"].sum()
    check_grads(loss, (jnp.array(1.0),), modes=("rev",), rtol=1e-5, atol=1e-12)


# --- gradients -------------------------------------------------------------------

def _loss(adjoint, method="tsit5"):
    def loss(y0, k):
        fun = lambda t, y, k: jnp.stack([-k * y[0], -3.0 * y[1] + y[0], 1e-3 * y[0] * y[1]])
        sol = odekit.solve_ivp(fun, (0.0, 1.0), y0, args=(k,), t_eval=jnp.linspace(0, 1, 4),
                               method=method, rtol=1e-9, atol=[1e-12, 1e-10, 1e-15],
                               adjoint=adjoint)
        return sol.ys
    return loss


ARGS = (jnp.array([1.0, 0.5, 1e-3]), jnp.array(0.7))


@pytest.mark.parametrize("adjoint, method, modes", [
    ("checkpoint", "tsit5", ("fwd", "rev")),
    # (rodas5p's steps differentiated by checkpoint, the Jacobian reverse mode
    # transposes for a few inputs: in CI in tests/ode/test_adjoint_forward.py;
    # per-component atol only sets its steps)
    pytest.param("checkpoint", "rodas5p", ("rev",), marks=pytest.mark.long),
    ("backsolve", "dopri5", ("rev",)),
    pytest.param("interpolate", "kvaerno5", ("rev",), marks=pytest.mark.long),
])
def test_gradients_with_per_component_atol(adjoint, method, modes):
    check_grads(jax.jit(_loss(adjoint, method)), ARGS, modes=modes, rtol=1e-5, atol=1e-10)


@pytest.mark.long   # each adjoint meets central differences with per-component atol in CI
def test_adjoints_agree_with_per_component_atol():
    grad = lambda adjoint: jax.grad(lambda *a: _loss(adjoint)(*a).sum(), (0, 1))(*ARGS)
    reference = grad("checkpoint")
    forward = jax.jacfwd(lambda *a: _loss("forward")(*a).sum(), (0, 1))(*ARGS)
    for other in (grad("backsolve"), grad("interpolate"), forward):
        for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(reference)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


@pytest.mark.long
def test_backsolve_second_order_with_per_component_atol():
    # grad of grad goes through the interval-by-interval backward solve
    def loss(k):
        ys = odekit.odeint(lambda y, t, k: jnp.stack([-k * y[0], -2.0 * y[1] + y[0]]),
                           jnp.array([1.0, 1e-4]), jnp.array([0.0, 0.5]), k, rtol=1e-9,
                           atol=[1e-12, 1e-16])
        return ys[-1, 1]
    check_grads(loss, (jnp.array(0.7),), order=2, modes=("rev",), rtol=1e-4, atol=1e-12)


def test_backward_state_tolerance_layout():
    atol = PerElement([np.array([1e-6, 0.0]), np.array(1e-9)])
    y = (jnp.ones(2), jnp.ones(()))
    a, args_bar, monitor = y, [jnp.ones(3)], jnp.zeros(())
    flat = continuous.augmented_tolerance(atol, (y, a, args_bar, monitor), 2)
    np.testing.assert_array_equal(flat.leaves[0], [1e-6, 0.0, 1e-9] + [1e-9] * 7)
    mixed = (y, a, [jnp.ones(3, jnp.float32)], monitor)      # leaves of two dtypes: a tree
    tree = continuous.augmented_tolerance(atol, mixed, 2)
    assert [leaf.tolist() for leaf in tree.leaves] == [[1e-6, 0.0], 1e-9, 1e-9, 1e-9, 1e-9, 1e-9]
    assert continuous.augmented_tolerance(atol, None, 0) == 1e-9   # interpolate: no y
    assert continuous.augmented_tolerance(1e-7, mixed, 2) == 1e-7


# --- jit, vmap, the single kernel ----------------------------------------------

def test_jit_and_vmap():
    solve = lambda y0, k: odekit.solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), y0, args=(k,),
                                           rtol=1e-6, atol=[1e-9, 1e-3]).ys[-1]
    y0 = jnp.array([1.0, 1.0])
    eager = solve(y0, 2.0)
    np.testing.assert_array_equal(jax.jit(solve)(y0, 2.0), eager)
    ks = jnp.array([0.5, 1.0, 2.0])
    batched = jax.vmap(solve, in_axes=(None, 0))(y0, ks)
    for i, k in enumerate(ks):
        np.testing.assert_allclose(batched[i], solve(y0, k), rtol=1e-12)
    np.testing.assert_allclose(batched[:, 0], np.exp(-np.asarray(ks)), rtol=1e-5)
    # odeint under jit(vmap)
    ode = lambda y0: odekit.odeint(lambda y, t: -y, y0, jnp.linspace(0, 1, 3),
                                   atol=np.array([1e-10, 1e-4]))
    out = jax.jit(jax.vmap(ode))(jnp.stack([y0, 2 * y0]))
    np.testing.assert_allclose(out[:, -1, 0], [np.exp(-1), 2 * np.exp(-1)], rtol=1e-7)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the single kernel is CPU only")
def test_single_kernel_and_segments_agree(monkeypatch):
    def run():
        return odekit.solve_ivp(_slow_and_fast, (0.0, 2.0), Y_SF, rtol=1e-6,
                                atol=[1e-9, 1e-3, 1e-3], t_eval=jnp.linspace(0, 2, 5))
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "1")
    one = run()
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "0")
    other = run()
    np.testing.assert_allclose(one.ys, other.ys, rtol=1e-5, atol=1e-5)
    assert abs(float(one.ys[-1, 0]) - np.exp(-2.0)) < 1e-5


def test_the_output_window_changes_no_value(monkeypatch):
    """Kernel by kernel the loop fills t_eval a window at a time; the window
    (16 outputs for 2 float64 states, 4 from 8 states up) sets how often a
    step is taken again, never which steps: the values are the same."""
    from odekit.ode.engine import solve as engine_solve
    assert engine_solve.output_window(jnp.ones(2)) == 16
    assert engine_solve.output_window(jnp.ones(4)) == 8
    assert engine_solve.output_window(jnp.ones(100)) == 4
    assert engine_solve.output_window({"a": jnp.ones(2, jnp.float32), "b": jnp.ones(())}) == 16
    monkeypatch.setenv(single_kernel.ENV_SWITCH, "0")
    field = lambda t, y, w: jnp.stack([y[1], -w * jnp.sin(y[0])])
    t_eval = jnp.linspace(0.0, 10.0, 101)
    run = lambda: jax.jit(lambda w: odekit.solve_ivp(
        lambda t, y, w: field(t, y, w), (0.0, 10.0), jnp.array([3.0, 0.0]), args=(w,),
        t_eval=t_eval, rtol=1e-8, atol=1e-8))(9.8)
    wide = run()
    monkeypatch.setattr(engine_solve, "WIDEST_OUTPUT_WINDOW", 4)
    narrow = run()
    np.testing.assert_array_equal(wide.ys, narrow.ys)
    assert int(wide.stats["num_steps"]) == int(narrow.stats["num_steps"])


def test_tolerance_is_static_and_hashable():
    y0 = jnp.ones(3)
    a = static_tolerance([1e-6, 1e-9, 1e-9], "atol", y0)
    b = static_tolerance(np.array([1e-6, 1e-9, 1e-9]), "atol", y0)
    assert isinstance(a, PerElement) and a == b and hash(a) == hash(b)
    assert a != static_tolerance([1e-6, 1e-9, 1e-8], "atol", y0)
    assert static_tolerance([1e-9, 1e-9, 1e-9], "atol", y0) == 1e-9   # uniform: a float
    assert type(static_tolerance(1e-9, "atol", y0)) is float
    # a per-leaf tolerance broadcasts leaf by leaf
    tree = static_tolerance({"x": 1e-6, "y": [1e-8, 1e-9]}, "atol",
                            {"x": jnp.ones(()), "y": jnp.ones(2)})
    assert [leaf.tolist() for leaf in tree.leaves] == [1e-6, [1e-8, 1e-9]]


# --- bad tolerances ---------------------------------------------------------------

decay = lambda t, y: -y


@pytest.mark.parametrize("kwargs, error, match", [
    ({"atol": [1e-6, 1e-9, 1e-9]}, ValueError, r"atol of shape \(3,\) does not broadcast to "
                                               r"the shape \(2,\) of y0"),
    ({"rtol": np.ones((2, 2)) * 1e-6}, ValueError, r"rtol of shape \(2, 2\)"),
    ({"atol": [1e-6, -1e-9]}, ValueError, "atol must be non-negative and finite in every entry"),
    ({"atol": [1e-6, np.nan]}, ValueError, "atol must be non-negative and finite"),
    ({"rtol": [1e-6, np.inf]}, ValueError, "rtol must be non-negative and finite"),
    ({"atol": ["a", "b"]}, TypeError, "atol must be a number or an array of numbers"),
    ({"rtol": [0.0, 1e-6], "atol": [0.0, 1e-9]}, ValueError,
     r"rtol and atol cannot both be zero \(they are at index \(0,\)"),
])
def test_bad_tolerances_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        odekit.solve_ivp(decay, (0.0, 1.0), jnp.ones(2), **kwargs)
    with pytest.raises(error, match=match.replace("solve_ivp", "odeint")):
        odekit.odeint(lambda y, t: -y, jnp.ones(2), jnp.linspace(0, 1, 3), **kwargs)


def test_bad_pytree_tolerances_raise():
    y0 = {"a": jnp.ones(2), "b": jnp.ones(())}
    field = lambda t, y: jax.tree.map(jnp.negative, y)
    with pytest.raises(ValueError, match=r"atol must be a number or a pytree with the "
                                         r"structure of y0"):
        odekit.solve_ivp(field, (0.0, 1.0), y0, atol={"a": 1e-6})
    with pytest.raises(ValueError, match=r"atol must be a number or a pytree"):
        odekit.solve_ivp(field, (0.0, 1.0), y0, atol=[1e-6, 1e-9])
    with pytest.raises(ValueError, match=r"shape \(3,\) does not broadcast to the shape \(2,\) "
                                         r"of y0's leaf 0"):
        odekit.solve_ivp(field, (0.0, 1.0), y0, atol={"a": [1.0, 2.0, 3.0], "b": 1e-6})
    with pytest.raises(ValueError, match="atol must be non-negative"):
        odekit.solve_ivp(field, (0.0, 1.0), y0, atol={"a": 1e-6, "b": -1.0})


def test_traced_array_tolerance_is_rejected():
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda a: odekit.solve_ivp(decay, (0.0, 1.0), jnp.ones(2), atol=a))(
            jnp.array([1e-6, 1e-9]))
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda a: odekit.odeint(lambda y, t: -y, jnp.ones(2), jnp.linspace(0, 1, 3),
                                        rtol=[a, 1e-6]))(1e-6)


def test_rtol_floor_applies_per_entry():
    y0 = jnp.ones(2, jnp.float32)
    with pytest.warns(UserWarning, match="rtol entries down to 1e-12 are below the precision"):
        rtol = odekit.ode.arguments.effective_rtol(static_tolerance([1e-3, 1e-12], "rtol", y0),
                                                   y0, "solve_ivp")
    floor = 4 * float(jnp.finfo(jnp.float32).eps)
    np.testing.assert_allclose(rtol.leaves[0], [1e-3, floor])
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # entries at or above the floor: no warning
        kept = odekit.ode.arguments.effective_rtol(static_tolerance([1e-3, 0.0], "rtol", y0),
                                                   y0, "solve_ivp")
    np.testing.assert_array_equal(kept.leaves[0], [1e-3, 0.0])
    with pytest.warns(UserWarning, match="rtol entries"):
        sol = odekit.solve_ivp(decay, (0.0, 1.0), y0, rtol=[1e-3, 1e-12], atol=1e-6)
    np.testing.assert_allclose(sol.ys[-1], np.exp(-1.0), rtol=1e-4)
