"""Values within 2 ulp and first derivatives within 4 ulp of mpmath, eager, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from odekit import special

NAMES = ["expit", "log_expit", "softplus", "logit"]
DTYPES = ["float32", "float64"]


def _derivative(f):
    return jax.vmap(jax.grad(f))


def _run(fun, x, mode):
    if mode == "jit":
        return jax.jit(fun)(x)
    if mode == "vmap":
        return jax.vmap(fun)(x)
    return fun(x)


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("order,max_ulp", [(0, 2.0), (1, 4.0)])
def test_ulp_error_against_mpmath(name, dtype, mode, order, max_ulp, reference):
    x, hi, lo = reference.table(name, dtype, order)
    f = getattr(special, name)
    fun = f if order == 0 else (lambda v: jax.grad(f)(v)) if mode == "vmap" else _derivative(f)
    got = np.asarray(_run(fun, jnp.asarray(x), mode))
    assert got.dtype == np.dtype(dtype)
    err = reference.ulp_error(got, hi, lo, dtype)
    worst = int(np.argmax(err))
    assert np.all(np.isfinite(got)), f"non-finite {name} at {x[~np.isfinite(got)][:5]}"
    assert err[worst] <= max_ulp, (
        f"{name} order {order} {dtype} {mode}: {err[worst]:.2f} ulp at x={x[worst]!r} "
        f"(got {got[worst]!r}, want {hi[worst]!r})")


@pytest.mark.parametrize("name", NAMES)
def test_second_derivative_against_mpmath(name, reference):
    """grad of grad is accurate relative to the scale of the first two derivatives."""
    x, hi2, lo2 = reference.table(name, "float64", 2)
    _, hi1, _ = reference.table(name, "float64", 1)
    f = getattr(special, name)
    got = np.asarray(jax.jit(jax.vmap(jax.grad(jax.grad(f))))(jnp.asarray(x)))
    finite = np.isfinite(hi2)              # logit'' overflows where the truth does
    assert np.all(np.isfinite(got[finite]))
    assert not np.isnan(got).any()
    x, got, hi1, hi2, lo2 = (a[finite] for a in (x, got, hi1, hi2, lo2))
    err = np.abs((got - hi2) - lo2) / (np.abs(hi2) + np.abs(hi1))
    worst = int(np.argmax(err))
    assert err[worst] <= 64 * np.finfo(np.float64).eps, f"{name}'' at {x[worst]!r}: {err[worst]:.3g}"
