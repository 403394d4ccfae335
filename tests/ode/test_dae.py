"""solve_ivp(..., mass_matrix=M): linearly implicit systems M y' = f(t, y) and
index-1 differential-algebraic equations (DAEs) with rodas5p and bdf.

References: Robertson's kinetics with its conservation law as the algebraic
equation (Hairer & Wanner, Solving ODEs II, Sec. VI.10) against the ODE form
by SciPy's Radau at rtol 1e-10; a linear DAE with a closed form, also
rotated so that M has no zero rows or columns (the null-space path).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp as scipy_solve_ivp

import odekit
from odekit import status as codes
from odekit.testing import check_grads

RATES = (0.04, 3e7, 1e4)
M_ROBERTSON = np.diag([1.0, 1.0, 0.0])
Y0 = jnp.array([1.0, 0.0, 0.0])


def robertson_dae(t, y, k1, k2, k3):
    """Robertson with the third equation replaced by y1 + y2 + y3 = 1."""
    return jnp.stack([-k1 * y[0] + k3 * y[1] * y[2],
                      k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                      y[0] + y[1] + y[2] - 1.0])


def robertson_ode(t, y, k1, k2, k3):
    return np.array([-k1 * y[0] + k3 * y[1] * y[2],
                     k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                     k2 * y[1] ** 2])


def _rates():
    return tuple(jnp.asarray(k) for k in RATES)


def _reference(t_eval):
    ref = scipy_solve_ivp(robertson_ode, (0.0, float(t_eval[-1])), [1.0, 0.0, 0.0],
                          method="Radau", rtol=1e-10, atol=1e-14, t_eval=np.asarray(t_eval),
                          args=RATES)
    assert ref.success
    return ref.y.T


def _relative_error(ys, ref, floor=1e-12):
    ys = np.asarray(ys)
    return np.max(np.abs(ys - ref) / (np.abs(ref) + floor))


MASS_METHODS = ["rodas5p", "bdf"]


@pytest.mark.parametrize("method", MASS_METHODS)
def test_robertson_dae_matches_the_ode_form_on_0_40(method):
    t_eval = jnp.array([0.4, 4.0, 40.0])
    sol = odekit.solve_ivp(robertson_dae, (0.0, 40.0), Y0, args=_rates(), method=method,
                           rtol=1e-8, atol=1e-12, t_eval=t_eval, mass_matrix=M_ROBERTSON)
    assert int(sol.status) == 0
    # rodas5p 4e-9, bdf 6e-8 (its steps: 291, 5 Jacobians, 57 LUs; rodas5p 114 of each)
    assert _relative_error(sol.ys, _reference(t_eval)) < 1e-6
    # the algebraic equation holds at every output, to rounding
    np.testing.assert_allclose(np.sum(np.asarray(sol.ys), axis=1), 1.0, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(np.asarray(sol.y0), np.asarray(Y0))


# (long: the same check over the whole stiff span; to 40 above in CI)
@pytest.mark.long
@pytest.mark.parametrize("method", MASS_METHODS)
def test_robertson_dae_matches_the_ode_form_to_1e5(method):
    t_eval = jnp.array([1.0, 1e2, 1e4, 1e5])
    sol = odekit.solve_ivp(robertson_dae, (0.0, 1e5), Y0, args=_rates(), method=method,
                           rtol=1e-7, atol=1e-11, t_eval=t_eval, mass_matrix=M_ROBERTSON)
    assert int(sol.status) == 0
    assert _relative_error(sol.ys, _reference(t_eval), floor=1e-10) < 1e-4


def _linear_x(t):
    """x1' = -x1 + x2, 0 = x2 - cos t, x1(0) = 1: x1 = (cos t + sin t + e^-t) / 2, x2 = cos t."""
    return jnp.stack([(jnp.cos(t) + jnp.sin(t) + jnp.exp(-t)) / 2, jnp.cos(t)], axis=-1)


def linear_dae(t, x):
    return jnp.stack([-x[0] + x[1], x[1] - jnp.cos(t)])


# (long: unrotated, M = diag(1, 0) is a coordinate-aligned M like Robertson's,
# whose solutions meet the reference in CI with both methods above)
@pytest.mark.parametrize("method", MASS_METHODS)
@pytest.mark.parametrize("rotated", [pytest.param(False, marks=pytest.mark.long), True])
def test_linear_dae_matches_its_closed_form(rotated, method):
    """Also for y = T x: M_y = diag(1, 0) T^-1 has no zero row or column
    (the algebraic equation and component come from M's null spaces)."""
    t_eval = jnp.linspace(0.5, 5.0, 6)
    mass = np.diag([1.0, 0.0])
    fun, y0, exact = linear_dae, jnp.array([1.0, 1.0]), _linear_x(t_eval)
    if rotated:
        rotation = np.array([[2.0, 1.0], [1.0, 1.0]])
        inverse = np.linalg.inv(rotation)
        left = np.array([[1.0, 0.0], [1.0, 1.0]])          # rows mixed: no zero row either
        mass = left @ mass @ inverse
        fun = lambda t, y: jnp.asarray(left) @ linear_dae(t, jnp.asarray(inverse) @ y)
        y0 = jnp.asarray(rotation) @ y0
        exact = exact @ jnp.asarray(rotation).T
        assert np.all(np.any(mass != 0, axis=0)) and np.all(np.any(mass != 0, axis=1))
    sol = odekit.solve_ivp(fun, (0.0, 5.0), y0, method=method, rtol=1e-9, atol=1e-12,
                           t_eval=t_eval, mass_matrix=mass)
    assert int(sol.status) == 0
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(exact), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("method", [pytest.param("rodas5p", marks=pytest.mark.long), "bdf"])
def test_dense_output_of_the_dae(method):
    sol = odekit.solve_ivp(linear_dae, (0.0, 3.0), jnp.array([1.0, 1.0]), method=method,
                           rtol=1e-9, atol=1e-12, mass_matrix=np.diag([1.0, 0.0]),
                           dense_output=True)
    ts = jnp.array([0.3, 1.7, 2.9])
    np.testing.assert_allclose(np.asarray(sol.sol(ts)), np.asarray(_linear_x(ts)), atol=1e-6)


def _solve_short(k1, k3, adjoint="checkpoint", method="rodas5p"):
    sol = odekit.solve_ivp(robertson_dae, (0.0, 2.0), Y0, args=(k1, jnp.asarray(3e7), k3),
                           method=method, rtol=1e-9, atol=1e-13, t_eval=jnp.array([0.5, 2.0]),
                           mass_matrix=M_ROBERTSON, max_steps=256, adjoint=adjoint)
    return sol.ys * jnp.array([[1.0, 1e4, 1.0]])   # y2 is ~1e-5: scale it up


# (long: bdf, and forward mode: with two inputs the checkpoint rule is one
# forward-mode Jacobian, which reverse mode transposes; a second compilation
# of the same loop for the untransposed product)
@pytest.mark.parametrize("method, mode", [
    ("rodas5p", "rev"), pytest.param("rodas5p", "fwd", marks=pytest.mark.long),
    pytest.param("bdf", "rev", marks=pytest.mark.long),
    pytest.param("bdf", "fwd", marks=pytest.mark.long)])
def test_checkpoint_gradients_match_finite_differences(method, mode):
    check_grads(jax.jit(lambda k1, k3: _solve_short(k1, k3, method=method)),
                (jnp.asarray(0.04), jnp.asarray(1e4)), modes=(mode,), rtol=1e-5, atol=1e-9)


@pytest.mark.long   # 25 s on CI's machine; both adjoints' DAE gradients meet central differences in CI
def test_forward_adjoint_matches_checkpoint():
    k1, k3 = jnp.asarray(0.04), jnp.asarray(1e4)
    forward = jax.jacfwd(lambda k: _solve_short(k, k3, "forward"))(k1)
    checkpoint = jax.grad(lambda k: jnp.sum(_solve_short(k, k3)))(k1)
    np.testing.assert_allclose(float(jnp.sum(forward)), float(checkpoint), rtol=1e-8)


@pytest.mark.long
def test_interpolate_adjoint_on_robertson_matches_checkpoint():
    k1, k3 = jnp.asarray(0.04), jnp.asarray(1e4)
    weights = jnp.array([[0.3, 1.0, -0.7], [0.6, 2.0, -1.4]])
    loss = lambda adjoint: lambda k1, k3: jnp.sum(_solve_short(k1, k3, adjoint) * weights)
    interpolate = jax.grad(loss("interpolate"), argnums=(0, 1))(k1, k3)
    checkpoint = jax.grad(loss("checkpoint"), argnums=(0, 1))(k1, k3)
    np.testing.assert_allclose(np.asarray(interpolate), np.asarray(checkpoint), rtol=1e-7)


_ROTATION = np.array([[2.0, 1.0], [1.0, 1.0]])
_MIXING = np.array([[1.0, 0.0], [1.0, 1.0]])


def _parametrized_linear(t, x, a, b):
    return jnp.stack([-a * x[0] + x[1], x[1] - b * jnp.cos(t)])


def _linear_loss(a, b, c, t0, t1, adjoint="interpolate", rotated=False, method="rodas5p"):
    """Rows at t0, inside and at t1 of the linear DAE (also rotated: M with
    no zero row or column), its algebraic component of y0 computed
    (dae_initialize) from a wrong guess."""
    fun, mass, to_y = _parametrized_linear, np.diag([1.0, 0.0]), lambda x: x
    if rotated:
        inverse = jnp.asarray(np.linalg.inv(_ROTATION))
        fun = lambda t, y, a, b: jnp.asarray(_MIXING) @ _parametrized_linear(t, inverse @ y, a, b)
        mass = _MIXING @ mass @ np.linalg.inv(_ROTATION)
        to_y = lambda x: jnp.asarray(_ROTATION) @ x
    y0 = to_y(jnp.stack([c, b * jnp.cos(t0) + 0.3]))
    sol = odekit.solve_ivp(fun, (t0, t1), y0, args=(a, b), method=method, rtol=1e-10,
                           atol=1e-12, t_eval=jnp.stack([t0, 1.5, t1]), mass_matrix=mass,
                           dae_initialize=True, adjoint=adjoint)
    return jnp.sum(sol.ys * jnp.array([[0.5, -1.0], [1.0, 2.0], [0.7, 0.4]]))


_LINEAR_INPUTS = tuple(jnp.asarray(v) for v in (0.8, 1.3, 1.1, 0.2, 3.0))


def test_interpolate_adjoint_of_a_dae_matches_finite_differences():
    """The adjoint DAE M^T lambda' = -J^T lambda with consistent jumps:
    derivatives in the parameters, the differential part of y0, t0 and t1
    (M with no zero row or column; Robertson's diagonal M above)."""
    check_grads(jax.jit(lambda *inputs: _linear_loss(*inputs, rotated=True)), _LINEAR_INPUTS,
                modes=("rev",), rtol=1e-6, atol=1e-9)


def _linear_gradient(method):
    return jax.jit(jax.grad(lambda a, *rest: _linear_loss(a, *rest, "interpolate", True, method),
                            argnums=range(5)))


@pytest.mark.long
def test_interpolate_adjoint_of_a_dae_under_vmap():
    rodas5p = _linear_gradient("rodas5p")
    a_values = jnp.array([0.8, 1.2])
    batched = jax.jit(jax.vmap(lambda a: rodas5p(a, *_LINEAR_INPUTS[1:])[0]))(a_values)
    one_by_one = [rodas5p(a, *_LINEAR_INPUTS[1:])[0] for a in a_values]
    np.testing.assert_allclose(np.asarray(batched), np.asarray(one_by_one), rtol=1e-9)


@pytest.mark.long
def test_interpolate_adjoint_of_a_dae_with_bdf():
    np.testing.assert_allclose(np.asarray(_linear_gradient("bdf")(*_LINEAR_INPUTS)),
                               np.asarray(_linear_gradient("rodas5p")(*_LINEAR_INPUTS)),
                               rtol=1e-6, atol=1e-9)


# (long: bdf; the mass matrix is the same under vmap for both methods, and bdf's
# own batching, each member its order and step, is in test_bdf.py)
@pytest.mark.parametrize("method", ["rodas5p", pytest.param("bdf", marks=pytest.mark.long)])
def test_jit_and_vmap_over_a_rate_constant(method):
    def final(k1):
        sol = odekit.solve_ivp(robertson_dae, (0.0, 4.0), Y0, args=(k1, jnp.asarray(3e7),
                               jnp.asarray(1e4)), method=method, rtol=1e-8, atol=1e-12,
                               t_eval=jnp.array([4.0]), mass_matrix=M_ROBERTSON)
        return sol.ys[-1]

    ks = jnp.array([0.04, 0.05])
    batched = jax.jit(jax.vmap(final))(ks)
    for k, row in zip(ks, batched):
        ref = scipy_solve_ivp(robertson_ode, (0.0, 4.0), [1.0, 0.0, 0.0], method="Radau",
                              rtol=1e-10, atol=1e-14, args=(float(k), 3e7, 1e4))
        assert _relative_error(row, ref.y[:, -1]) < 1e-6


@pytest.mark.parametrize("method", ["tsit5", "dopri5", "kvaerno5", "auto"])
def test_methods_without_mass_matrices_refuse_it(method):
    with pytest.raises(ValueError, match="mass_matrix is taken by method='bdf' or 'rodas5p'"):
        odekit.solve_ivp(robertson_dae, (0.0, 1.0), Y0, args=_rates(), method=method,
                         mass_matrix=M_ROBERTSON)


M_COUPLED = np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])   # not diagonal
# singular in a direction mixing y2 and y3 (no zero column): dense algebra only
M_MIXED = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("options, mass, match", [
    (dict(adjoint="backsolve"), M_ROBERTSON, "adjoint='checkpoint'"),
    (dict(jac_sparsity="auto"), M_MIXED, "zero rows"),
    (dict(lband=1, uband=1), M_MIXED, "zero rows"),
])
def test_unsupported_options_refuse_a_mass_matrix(options, mass, match):
    with pytest.raises(ValueError, match=match):
        odekit.solve_ivp(robertson_dae, (0.0, 1.0), Y0, args=_rates(), method="rodas5p",
                         mass_matrix=mass, **options)


_STRUCTURES = {"auto": dict(jac_sparsity="auto"), "banded": dict(linear_solver="banded"),
               "structured-dense": dict(jac_sparsity=np.ones((3, 3)), linear_solver="dense")}


# M is folded into J's values by the structured system (with_mass_folded) for
# either method: in CI each method with one structured LU, the other pairings
# long (Robertson's found pattern is full: "auto" takes the structured dense LU)
@pytest.mark.parametrize("structure, method", [
    ("auto", "rodas5p"), ("banded", "bdf"),
    *[pytest.param(structure, method, marks=pytest.mark.long) for structure, method in [
        ("auto", "bdf"), ("banded", "rodas5p"), ("structured-dense", "rodas5p"),
        ("structured-dense", "bdf")]]])
def test_structured_solvers_take_a_diagonal_mass_matrix(structure, method):
    """A diagonal M (here a scipy.sparse one) folded into J's diagonal values:
    the structured LUs give the dense path's solution."""
    import scipy.sparse
    kw = dict(args=_rates(), method=method, rtol=1e-8, atol=1e-12, t_eval=jnp.array([4.0, 40.0]))
    dense = odekit.solve_ivp(robertson_dae, (0.0, 40.0), Y0, mass_matrix=M_ROBERTSON, **kw)
    sparse = odekit.solve_ivp(robertson_dae, (0.0, 40.0), Y0,
                              mass_matrix=scipy.sparse.diags([1.0, 1.0, 0.0]), **kw,
                              **_STRUCTURES[structure])
    assert int(sparse.status) == 0
    # the structured LUs' rounding may move a step decision: agreement to the
    # solve's rtol (1e-8), measured 2e-9 (bdf, banded)
    np.testing.assert_allclose(np.asarray(sparse.ys), np.asarray(dense.ys), rtol=1e-8, atol=1e-14)
    assert abs(int(sparse.stats["num_steps"]) - int(dense.stats["num_steps"])) <= 2


@pytest.mark.parametrize("method", ["rodas5p", pytest.param("bdf", marks=pytest.mark.long)])
def test_structured_solvers_take_a_non_diagonal_mass_matrix(method):
    """M with an off-diagonal entry (its singular part a zero row and
    column): folded into the pattern's values, the banded LU gives the
    dense path's solution of the same system."""
    kw = dict(args=_rates(), method=method, rtol=1e-8, atol=1e-12, t_eval=jnp.array([4.0, 40.0]),
              mass_matrix=M_COUPLED)
    dense = odekit.solve_ivp(robertson_dae, (0.0, 40.0), Y0, **kw)
    banded = odekit.solve_ivp(robertson_dae, (0.0, 40.0), Y0, lband=2, uband=2, **kw)
    assert int(banded.status) == 0 and int(dense.status) == 0
    np.testing.assert_allclose(np.asarray(banded.ys), np.asarray(dense.ys), rtol=1e-9, atol=1e-14)


def _finite_elements(points):
    """u_t = u_xx on (0, 1) by linear finite elements: the consistent mass
    matrix (h/6)(1, 4, 1) (tridiagonal, not lumped) on the interior nodes,
    the boundary values algebraic (0 = u_0 = u_N: zero rows and columns of
    M); u(x, 0) = sin(pi x), so u = exp(-pi^2 t) sin(pi x) up to O(h^2)."""
    import scipy.sparse
    x = np.linspace(0.0, 1.0, points + 1)
    h = 1.0 / points
    mass = scipy.sparse.diags([np.full(points, h / 6), np.full(points + 1, 4 * h / 6),
                               np.full(points, h / 6)], [-1, 0, 1]).tolil()
    for boundary in (0, points):
        mass[boundary, :] = 0.0
        mass[:, boundary] = 0.0

    def field(t, u):
        return jnp.concatenate([u[:1], (u[:-2] - 2.0 * u[1:-1] + u[2:]) / h, u[-1:]])

    return field, jnp.sin(jnp.pi * jnp.asarray(x)), mass.tocsr(), x


# (long: the structured non-diagonal mass matrix is checked in CI above)
@pytest.mark.parametrize("method", [pytest.param("rodas5p", marks=pytest.mark.long),
                                    pytest.param("bdf", marks=pytest.mark.long)])
def test_a_finite_element_mass_matrix(method):
    """A sparse, non-diagonal M through jac_sparsity="auto": equal to the
    dense path with the same M made dense (40 elements), then at 20,000
    elements (a dense M alone would be 3.2 GB) within the FEM error."""
    kw = dict(method=method, rtol=1e-7, atol=1e-10, t_eval=jnp.array([0.1]))
    field, u0, mass, _ = _finite_elements(40)
    sparse = odekit.solve_ivp(field, (0.0, 0.1), u0, mass_matrix=mass, jac_sparsity="auto", **kw)
    dense = odekit.solve_ivp(field, (0.0, 0.1), u0, mass_matrix=mass.toarray(), **kw)
    np.testing.assert_allclose(np.asarray(sparse.ys), np.asarray(dense.ys), rtol=1e-10,
                               atol=1e-13)
    if method == "rodas5p":
        field, u0, mass, x = _finite_elements(20_000)
        sol = odekit.solve_ivp(field, (0.0, 0.1), u0, mass_matrix=mass, jac_sparsity="auto",
                               **kw)
        assert int(sol.status) == 0
        exact = np.exp(-np.pi ** 2 * 0.1) * np.sin(np.pi * x)
        np.testing.assert_allclose(np.asarray(sol.ys[-1]), exact, atol=1e-8)


def _heat_dae(points):
    """u_t = u_xx on (0, 1) by second differences at ``points`` intervals, the
    boundary values as algebraic equations 0 = u_0 = u_N (zero rows of a
    diagonal M); u(x, 0) = sin(pi x), so u = exp(-pi^2 t) sin(pi x) up to
    O(dx^2)."""
    import scipy.sparse
    x = jnp.linspace(0.0, 1.0, points + 1)

    def field(t, u, kappa):
        inner = kappa * (u[:-2] - 2.0 * u[1:-1] + u[2:]) * points ** 2
        return jnp.concatenate([u[:1], inner, u[-1:]])

    diagonal = np.ones(points + 1)
    diagonal[[0, -1]] = 0.0
    return field, jnp.sin(jnp.pi * x), scipy.sparse.diags(diagonal), x


# (long: bdf; a large size is a matter of the structured linear system, the same
# for both methods; bdf's banded LU with a diagonal M is in CI above)
@pytest.mark.parametrize("method", ["rodas5p", pytest.param("bdf", marks=pytest.mark.long)])
def test_a_large_dae_with_a_sparse_mass_matrix(method):
    """20,001 unknowns: a dense path would hold a 3.2 GB Jacobian and factor it
    (O(n^3)); the banded path is O(n) in memory."""
    field, u0, mass, x = _heat_dae(20_000)
    sol = odekit.solve_ivp(field, (0.0, 0.1), u0, args=(jnp.asarray(1.0),), method=method,
                           rtol=1e-6, atol=1e-9, t_eval=jnp.array([0.1]), mass_matrix=mass,
                           jac_sparsity="auto")
    assert int(sol.status) == 0
    exact = np.exp(-np.pi ** 2 * 0.1) * np.sin(np.pi * np.asarray(x))
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), exact, atol=2e-6)
    assert abs(float(sol.ys[-1, 0])) < 1e-12 and abs(float(sol.ys[-1, -1])) < 1e-12


@pytest.mark.long   # 25 s on CI's machine; DAE checkpoint gradients meet central differences in CI
def test_gradient_through_a_structured_dae():
    """d (sum of u(0.05)) / d kappa through the banded LU with a diagonal M,
    against central differences (checkpoint adjoint, reverse and forward)."""
    field, u0, mass, _ = _heat_dae(24)

    def total(kappa):
        sol = odekit.solve_ivp(field, (0.0, 0.05), u0, args=(kappa,), method="rodas5p",
                               rtol=1e-9, atol=1e-12, t_eval=jnp.array([0.05]),
                               mass_matrix=mass, linear_solver="banded")
        return jnp.sum(sol.ys[-1])

    check_grads(total, (jnp.asarray(0.7),), modes=("rev", "fwd"), rtol=1e-5, atol=1e-9)


def test_a_large_sparse_mass_matrix_with_a_mixed_null_space_is_refused():
    """Its last row is zero but no column is: the null space mixes
    components, which needs the dense SVD (taken up to n = 4096)."""
    import scipy.sparse
    n = 5000
    coupled = scipy.sparse.eye(n, format="lil")
    coupled[n - 1, n - 1] = 0.0
    coupled[n - 2, n - 1] = 0.5
    with pytest.raises(ValueError, match="null space mixes components"):
        odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(n), method="bdf",
                         mass_matrix=coupled.tocsr())


@pytest.mark.parametrize("mass, error, match", [
    (np.eye(2), ValueError, r"shape \(3, 3\)"),
    (np.diag([1.0, np.nan, 0.0]), ValueError, "non-finite"),
    (np.diag([1.0, np.inf, 0.0]), ValueError, "non-finite"),
    (np.array([["a"] * 3] * 3), TypeError, "real numeric"),
])
def test_bad_mass_matrices_are_refused(mass, error, match):
    with pytest.raises(error, match=match):
        odekit.solve_ivp(robertson_dae, (0.0, 1.0), Y0, args=_rates(), method="rodas5p",
                         mass_matrix=mass)


def test_a_traced_mass_matrix_is_refused():
    @jax.jit
    def solve(mass):
        return odekit.solve_ivp(robertson_dae, (0.0, 1.0), Y0, args=_rates(), method="rodas5p",
                                mass_matrix=mass).ys

    with pytest.raises(TypeError, match="mass_matrix must be concrete"):
        solve(jnp.asarray(M_ROBERTSON))


def test_dae_initialize_needs_a_mass_matrix():
    with pytest.raises(ValueError, match="no mass_matrix was given"):
        odekit.solve_ivp(robertson_dae, (0.0, 1.0), Y0, args=_rates(), method="rodas5p",
                         dae_initialize=True)


INCONSISTENT = jnp.array([1.0, 0.0, 0.3])   # y1 + y2 + y3 = 1.3


def test_an_inconsistent_y0_is_an_error_naming_the_option():
    with pytest.raises(ValueError, match="dae_initialize=True"):
        odekit.solve_ivp(robertson_dae, (0.0, 1.0), INCONSISTENT, args=_rates(),
                         method="rodas5p", mass_matrix=M_ROBERTSON)


def test_an_inconsistent_traced_y0_gives_a_status():
    solve = jax.jit(lambda y0: odekit.solve_ivp(
        robertson_dae, (0.0, 1.0), y0, args=_rates(), method="rodas5p", t_eval=jnp.array([1.0]),
        mass_matrix=M_ROBERTSON, throw=False).status)
    assert int(solve(INCONSISTENT)) == codes.DAE_INCONSISTENT
    assert int(solve(Y0)) == 0


def test_dae_initialize_computes_the_algebraic_components():
    t_eval = jnp.array([0.4, 4.0])
    sol = odekit.solve_ivp(robertson_dae, (0.0, 4.0), INCONSISTENT, args=_rates(),
                           method="rodas5p", rtol=1e-8, atol=1e-12, t_eval=t_eval,
                           mass_matrix=M_ROBERTSON, dae_initialize=True)
    assert int(sol.status) == 0
    np.testing.assert_allclose(np.asarray(sol.y0), [1.0, 0.0, 0.0], atol=1e-14)
    assert _relative_error(sol.ys, _reference(t_eval)) < 1e-6


def test_dae_initialize_gradient_flows_through_the_initial_value():
    """y3(0) = 1 - y1(0) - y2(0): d y3(0) / d y1(0) = -1 (implicit function theorem)."""
    def first(y0):
        sol = odekit.solve_ivp(robertson_dae, (0.0, 0.1), y0, args=_rates(), method="rodas5p",
                               t_eval=jnp.array([0.1]), mass_matrix=M_ROBERTSON,
                               dae_initialize=True)
        return sol.y0[2]

    grad = jax.jit(jax.grad(first))(jnp.array([0.9, 0.0, 0.5]))
    np.testing.assert_allclose(np.asarray(grad), [-1.0, -1.0, 0.0], atol=1e-12)


def index_two(t, y):
    """y1' = y2, 0 = y1 - sin t: index 2 (the constraint does not involve y2)."""
    return jnp.stack([y[1], y[0] - jnp.sin(t)])


def test_an_index_two_dae_fails_loudly():
    with pytest.raises(ValueError, match="not of index 1.*reduce the index"):
        odekit.solve_ivp(index_two, (0.0, 1.0), jnp.array([0.0, 1.0]), method="rodas5p",
                         mass_matrix=np.diag([1.0, 0.0]))
    with pytest.raises(ValueError, match="not of index 1"):
        odekit.solve_ivp(index_two, (0.0, 1.0), jnp.array([0.0, 1.0]), method="rodas5p",
                         mass_matrix=np.diag([1.0, 0.0]), dae_initialize=True)


def test_an_index_two_dae_under_jit_gives_a_failure_status():
    solve = jax.jit(lambda y0: odekit.solve_ivp(
        index_two, (0.0, 1.0), y0, method="rodas5p", t_eval=jnp.array([1.0]),
        mass_matrix=np.diag([1.0, 0.0]), throw=False))
    sol = solve(jnp.array([0.0, 1.0]))
    assert int(sol.status) == codes.DAE_INCONSISTENT and not bool(sol.success)
    assert np.all(np.isnan(np.asarray(sol.ys)))
    with pytest.raises(odekit.status.ERRORS, match="index"):
        jax.jit(lambda y0: odekit.solve_ivp(
            index_two, (0.0, 1.0), y0, method="rodas5p", t_eval=jnp.array([1.0]),
            mass_matrix=np.diag([1.0, 0.0])).ys)(jnp.array([0.0, 1.0]))


# (long: bdf; an invertible M has no algebraic part, the same MassMatrix for
# both methods, whose DAEs are in CI)
@pytest.mark.parametrize("method", ["rodas5p", pytest.param("bdf", marks=pytest.mark.long)])
def test_a_nonsingular_mass_matrix_is_a_linearly_implicit_ode(method):
    """M y' = -M y with M invertible is y' = -y."""
    mass = np.array([[2.0, 1.0], [0.5, 3.0]])
    sol = odekit.solve_ivp(lambda t, y: -(jnp.asarray(mass) @ y), (0.0, 2.0), jnp.array([1.0, 2.0]),
                           method=method, rtol=1e-9, atol=1e-12, t_eval=jnp.array([2.0]),
                           mass_matrix=mass)
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), np.exp(-2.0) * np.array([1.0, 2.0]),
                               rtol=1e-7)


@pytest.mark.parametrize("method", MASS_METHODS)
def test_events_on_the_dae(method):
    """x2 = cos t crosses 0 at t = pi / 2 (an event on an algebraic component)."""
    def crossing(t, x):
        return x[1]
    crossing.terminal = True
    sol = odekit.solve_ivp(linear_dae, (0.0, 3.0), jnp.array([1.0, 1.0]), method=method,
                           rtol=1e-9, atol=1e-12, mass_matrix=np.diag([1.0, 0.0]),
                           events=crossing)
    assert int(sol.status) == 1
    np.testing.assert_allclose(float(sol.t_events[0]), np.pi / 2, rtol=1e-7)


@pytest.mark.parametrize("rotated", [False, True])
def test_the_consistent_initial_slope_is_the_solution_derivative(rotated):
    """MassMatrix.slope (where bdf's history starts) against the closed form's
    derivative at t = 0.3: x1' = -x1 + x2, x2' = d/dt cos t = -sin t (the
    algebraic component's slope keeps 0 = x2 - cos t holding)."""
    from odekit.ode.linalg import mass_matrix as mass_matrices
    t = jnp.asarray(0.3)
    x = _linear_x(t)
    slope = jax.jacfwd(_linear_x)(t)
    mass, fun, y = np.diag([1.0, 0.0]), linear_dae, x
    if rotated:       # y = T x, M_y = L M_x T^-1, f_y = L f_x(T^-1 y)
        rotation, left = np.array([[2.0, 1.0], [1.0, 1.0]]), np.array([[1.0, 0.0], [1.0, 1.0]])
        inverse = np.linalg.inv(rotation)
        mass = left @ mass @ inverse
        fun = lambda t, y: jnp.asarray(left) @ linear_dae(t, jnp.asarray(inverse) @ y)
        y, slope = jnp.asarray(rotation) @ x, jnp.asarray(rotation) @ slope
    m = mass_matrices.from_argument(mass, 2, "test")

    @jax.jit     # one program (op by op, ~50 small ones)
    def consistent_slope(t, y):
        f_t = jax.jacfwd(lambda s: fun(s, y))(t)
        jac = jax.jacfwd(lambda v: fun(t, v))(y)
        return m.slope(fun(t, y), lambda v: jac @ v, f_t)

    np.testing.assert_allclose(consistent_slope(t, y), slope, rtol=1e-12, atol=1e-14)


# (long: rodas5p, whose float32 and half-precision states are in CI in
# test_stiff.py and test_stiff_dtypes.py; bdf's are here only)
@pytest.mark.parametrize("method", [pytest.param("rodas5p", marks=pytest.mark.long), "bdf"])
def test_a_float32_state(method):
    """A float32 state keeps its dtype and lands within its tolerance of the
    float64 reference; the constraint holds to float32's precision."""
    rates = tuple(jnp.asarray(k, jnp.float32) for k in RATES)
    sol = odekit.solve_ivp(robertson_dae, (0.0, 4.0), Y0.astype(jnp.float32), args=rates,
                           method=method, rtol=1e-4, atol=1e-7,
                           t_eval=jnp.array([4.0], jnp.float32), mass_matrix=M_ROBERTSON)
    assert int(sol.status) == 0 and sol.ys.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(sol.ys, np.float64), _reference(jnp.array([4.0])),
                               rtol=1e-3, atol=1e-8)
    assert abs(float(jnp.sum(sol.ys[-1])) - 1.0) < 1e-6


@pytest.mark.parametrize("method", [pytest.param("rodas5p", marks=pytest.mark.long), "bdf"])
def test_a_float16_state(method):
    """float16 (Robertson's rates do not fit it): the linear DAE, its linear
    algebra in float32, the state's dtype kept, within float16's precision."""
    t_eval = jnp.array([1.0, 3.0], jnp.float16)
    sol = odekit.solve_ivp(lambda t, x: linear_dae(t.astype(x.dtype), x), (0.0, 3.0),
                           jnp.array([1.0, 1.0], jnp.float16), method=method, rtol=1e-2,
                           atol=1e-3, t_eval=t_eval, mass_matrix=np.diag([1.0, 0.0]))
    assert int(sol.status) == 0 and sol.ys.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(sol.ys, np.float64),
                               np.asarray(_linear_x(t_eval.astype(jnp.float64))), atol=2e-2)


def test_a_complex_state_is_refused():
    with pytest.raises(TypeError, match="needs a real state"):
        odekit.solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.array([1.0 + 1.0j, 0.0j]),
                         method="bdf", mass_matrix=np.diag([1.0, 0.0]))


def test_sparse_mass_matrix_products_and_pseudo_inverses():
    """A coordinate-aligned sparse M (zero row 1, zero column 3) kept as
    entries: products and pseudo-inverses equal NumPy's on the dense M."""
    import scipy.sparse
    from odekit.ode.linalg import mass_matrix
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(5, 5)) + 5 * np.eye(5)
    dense[1, :] = 0.0
    dense[:, 3] = 0.0
    mass = mass_matrix.from_argument(scipy.sparse.csr_array(dense), 5, "test")
    assert mass.entries is not None and mass.matrix is None and mass.coordinate_aligned
    assert mass.num_algebraic == 1
    v = jnp.asarray(rng.normal(size=5))
    pinv = np.linalg.pinv(dense)
    adjoint = mass.for_adjoint(2)
    # one program (op by op, these ran ~100 small ones)
    times, transpose_times, array, pinv_times, transpose_pinv_times, adjoint_array = jax.jit(
        lambda v: (mass.times(v), mass.transpose_times(v), mass.array(jnp.float64),
                   mass.pseudo_inverse_times(v), mass.transpose_pseudo_inverse_times(v),
                   adjoint.array(jnp.float64)))(v)
    np.testing.assert_allclose(np.asarray(times), dense @ np.asarray(v), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(transpose_times), dense.T @ np.asarray(v), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(array), dense)
    np.testing.assert_allclose(np.asarray(pinv_times), pinv @ np.asarray(v), rtol=1e-10,
                               atol=1e-13)
    np.testing.assert_allclose(np.asarray(transpose_pinv_times), pinv.T @ np.asarray(v),
                               rtol=1e-10, atol=1e-13)
    expected = np.zeros((7, 7))
    expected[:5, :5], expected[5:, 5:] = dense.T, np.eye(2)
    np.testing.assert_allclose(np.asarray(adjoint_array), expected)
    np.testing.assert_allclose(adjoint.left_null[:5], mass.right_null)
