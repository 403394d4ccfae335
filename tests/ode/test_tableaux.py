"""Order conditions and measured convergence of the Butcher tableaux.

Order conditions (Butcher): weights w have order p iff for every rooted tree t
with at most p vertices, sum_i w_i Phi_i(t) = 1 / gamma(t), where
Phi_i(leaf) = 1 and Phi_i([t_1, ..., t_m]) = prod_k (A Phi(t_k))_i, and
gamma(t) = |t| * prod_k gamma(t_k). Dense output of order q: the same with
w = b(theta) and right-hand side theta**|t| / gamma(t), for |t| <= q.
"""
import dataclasses
import functools

import mpmath
import numpy as np
import pytest

from odekit.ode.methods.explicit_tableaux import BOSH3, DOPRI5, TABLEAUX, ButcherTableau
from odekit.testing import rooted_trees

METHODS = sorted(TABLEAUX)
THETAS = [0.1, 0.25, 0.5, 0.7, 0.9, 1.0]
TOL = 1e-12  # absolute residual of an order condition satisfied in float64
FAIL = 1e-7  # a residual at least this large means the condition is violated


# --- rooted trees (odekit.testing.rooted_trees) -----------------------------
_trees, _gamma = rooted_trees.trees, rooted_trees.density


def _stage_weights(a, tree, cache):
    """Phi(t) as the (n,) vector over stages, memoised in ``cache``."""
    if tree not in cache:
        phi = np.ones(a.shape[0])
        for child in tree:
            phi = phi * (a @ _stage_weights(a, child, cache))
        cache[tree] = phi
    return cache[tree]


@functools.lru_cache(maxsize=None)
def _extended(name):
    """(A, c) over all stages, the extra dense-output stages included."""
    tab = TABLEAUX[name]
    s, n = tab.num_stages, tab.dense.shape[0]
    a = np.zeros((n, n))
    a[:s, :s] = tab.a
    a[s:] = tab.extra_a
    return a, np.concatenate([tab.c, tab.extra_c])


def _residuals(name, weights, orders, theta=1.0):
    """Max |sum_i w_i Phi_i(t) - theta**|t| / gamma(t)| per tree order."""
    a, _ = _extended(name)
    w = np.zeros(a.shape[0])
    w[: len(weights)] = weights
    cache = {}
    return {
        n: max(abs(w @ _stage_weights(a, t, cache) - theta**n / _gamma(t))
               for t in _trees(n))
        for n in orders
    }


def _dense_weights(tab, theta):
    """b_i(theta) = sum_j dense[i, j] theta**(j + 1)."""
    powers = theta ** np.arange(1, tab.dense.shape[1] + 1)
    return tab.dense @ powers


def test_rooted_tree_counts_match_oeis_a000081():
    assert [len(_trees(n)) for n in range(1, 9)] == [1, 1, 2, 4, 9, 20, 48, 115]
    assert _gamma(((), ())) == 3 and _gamma((((),),)) == 6


# --- order conditions ----------------------------------------------------------


@pytest.mark.parametrize("name", METHODS)
def test_solution_weights_have_the_stated_order(name):
    tab = TABLEAUX[name]
    res = _residuals(name, tab.b, range(1, tab.order + 1))
    assert max(res.values()) < TOL, res


@pytest.mark.parametrize("name", METHODS)
def test_embedded_weights_have_exactly_the_error_order(name):
    tab = TABLEAUX[name]
    q = tab.error_order
    res = _residuals(name, tab.b - tab.b_error, range(1, q + 2))
    assert max(res[n] for n in range(1, q + 1)) < TOL, res
    assert res[q + 1] > FAIL, res


def test_dopri8_secondary_estimate_is_third_order():
    tab = TABLEAUX["dopri8"]
    res = _residuals("dopri8", tab.b - tab.b_error_secondary, range(1, 5))
    assert max(res[n] for n in range(1, 4)) < TOL, res
    assert res[4] > FAIL, res
    assert all(TABLEAUX[m].b_error_secondary is None for m in METHODS if m != "dopri8")


@pytest.mark.parametrize("name", METHODS)
def test_dense_output_satisfies_continuous_order_conditions(name):
    tab = TABLEAUX[name]
    q = tab.dense_order
    for theta in THETAS:
        res = _residuals(name, _dense_weights(tab, theta), range(1, q + 1), theta)
        assert max(res.values()) < TOL, (theta, res)
    # ... and no more: some condition of order q + 1 fails inside the step.
    res = _residuals(name, _dense_weights(tab, 0.5), [q + 1], 0.5)
    assert res[q + 1] > FAIL, res


@pytest.mark.parametrize("name", METHODS)
def test_dense_output_starts_at_y0_with_slope_f0(name):
    """y(theta) = y0 + h theta k_0 + O(theta**2): continuity and y'(t0) = f0."""
    expected = np.zeros(TABLEAUX[name].dense.shape[0])
    expected[0] = 1.0
    np.testing.assert_array_equal(TABLEAUX[name].dense[:, 0], expected)


# --- measured convergence of one step -----------------------------------------
# One step is taken in 40-digit mpmath arithmetic so that rounding does not
# hide the error; what remains is the float64 rounding of the coefficients
# themselves (order conditions hold to ~1e-16, ~5e-14 for dopri8's dense
# output), which floors the one-step error at about that times h. The step
# sizes are the largest for which each method is in its asymptotic regime
# and stays well above that floor.

STEP_SIZES = {"bosh3": 0.1, "dopri5": 0.05, "tsit5": 0.05, "dopri8": 0.5}
DENSE_THETAS = [0.2, 0.4, 0.6, 0.8]
PROBLEMS = {
    # name: (f(t, y), start times, exact solution y(t)), in mpmath
    "decay": (lambda t, y: -y, [0.0], lambda t: mpmath.exp(-t)),
    "cos": (lambda t, y: mpmath.cos(t) * y, [0.0, 0.7, 1.4, 2.1, 2.8],
            lambda t: mpmath.exp(mpmath.sin(t))),
}


def _one_step_errors(tab, fun, t0, exact, h):
    """|error| of y1, of the embedded y1_hat and (max over theta) of dense output."""
    a, c = _extended(tab.name)
    mpf = np.vectorize(mpmath.mpf, otypes=[object])  # exact copies of the floats
    a, c, b, b_err = mpf(a), mpf(c), mpf(tab.b), mpf(tab.b_error)
    y0 = exact(t0)
    k = np.zeros(a.shape[0], dtype=object)
    for i in range(a.shape[0]):
        k[i] = fun(t0 + c[i] * h, y0 + h * (a[i, :i] @ k[:i]))
    s = tab.num_stages
    y1 = y0 + h * (b @ k[:s])
    errors = [abs(y1 - exact(t0 + h)), abs(y1 - h * (b_err @ k[:s]) - exact(t0 + h))]
    dense = mpf(tab.dense)
    errors.append(max(
        abs(y0 + h * (dense @ theta ** np.arange(1, dense.shape[1] + 1)) @ k
            - exact(t0 + theta * h))
        for theta in map(mpmath.mpf, DENSE_THETAS)))
    return [float(e) for e in errors]


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("name", METHODS)
def test_one_step_errors_converge_with_the_stated_orders(name, problem):
    tab = TABLEAUX[name]
    fun, starts, exact = PROBLEMS[problem]
    hs = STEP_SIZES[name] * 0.5 ** np.arange(3)
    with mpmath.workdps(40):
        # the worst case over several start times, so that no error constant
        # happens to vanish
        errors = np.array([
            np.max([_one_step_errors(tab, fun, mpmath.mpf(t0), exact, mpmath.mpf(h))
                    for t0 in starts], axis=0)
            for h in hs
        ])
    slopes = np.polyfit(np.log(hs), np.log(errors), 1)[0]
    expected = [tab.order + 1, tab.error_order + 1, tab.dense_order + 1]
    np.testing.assert_allclose(slopes, expected, atol=0.4, err_msg=f"errors {errors}")


# --- validation -----------------------------------------------------------------


def test_registry_and_read_only_arrays():
    assert {name: tab.name for name, tab in TABLEAUX.items()} == {m: m for m in METHODS}
    for tab in TABLEAUX.values():
        assert tab.fsal and tab.dense.dtype == np.float64
        with pytest.raises(ValueError):
            tab.b[0] = 1.0
    assert hash(TABLEAUX["dopri5"]) == hash(DOPRI5) and TABLEAUX["dopri5"] == DOPRI5
    assert repr(DOPRI5) == ("ButcherTableau('dopri5', order=5, error_order=4, "
                            "stages=7, dense_order=4)")
    assert TABLEAUX["dopri8"].dense.shape == (16, 7)
    assert TABLEAUX["dopri8"].extra_a.shape == (3, 16)


def _broken_a():
    a = np.array(BOSH3.a)
    a[1, 0], a[1, 1] = 0.0, 0.5  # same row sum, but implicit
    return a


@pytest.mark.parametrize("change, message", [
    (dict(c=[0.0, 0.5, 0.7, 1.0]), "row-sum condition c\\[2\\]"),
    (dict(a=_broken_a()), "a \\(with extra_a\\) is not strictly lower"),
    (dict(b=[2 / 9, 1 / 3, 4 / 9 + 1e-6, 0.0]), "sum\\(b\\) == 1"),
    (dict(b_error=BOSH3.b_error + 1e-6), "sum\\(b_error\\) == 0"),
    (dict(b=[1 / 3, 1 / 3, 1 / 3, 0.0]), "fsal"),
    (dict(dense=BOSH3.dense + 1e-6), "dense output at theta=1"),
    (dict(c=[0.0, 0.5, 1.0]), "c has shape"),
    (dict(error_order=3), "need 0 < error_order < order"),
])
def test_inconsistent_tableau_is_rejected(change, message):
    with pytest.raises(ValueError, match="'bosh3': " + message):
        dataclasses.replace(BOSH3, **change)


def test_extra_stages_are_validated_too():
    with pytest.raises(ValueError, match="'dopri8': row-sum condition c\\[15\\]"):
        dataclasses.replace(TABLEAUX["dopri8"], extra_c=[0.1, 0.2, 0.8])
    extra_a = np.array(TABLEAUX["dopri8"].extra_a)
    extra_a[0, 13] = 1.0  # stage 13 may not use itself
    with pytest.raises(ValueError, match="'dopri8': a \\(with extra_a\\)"):
        dataclasses.replace(TABLEAUX["dopri8"], extra_a=extra_a)


def test_constructor_copies_and_freezes_inputs():
    b = np.array(BOSH3.b)
    tab = dataclasses.replace(BOSH3, b=b, name="copy")
    b[0] = 5.0
    assert tab.b[0] == BOSH3.b[0] and not tab.b.flags.writeable
    assert isinstance(tab, ButcherTableau)
