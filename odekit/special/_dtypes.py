"""Input promotion and the shared custom_jvp rule of the special functions (private)."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def promote(x: ArrayLike) -> jax.Array:
    """x as a floating array: integers and booleans go to the default float dtype."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"odekit.special functions are real-valued; got dtype {x.dtype}. "
                        "Pass a real floating array.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.zeros((), float).dtype)
    return x


def evaluate(kernel: Callable[[jax.Array], jax.Array], x: ArrayLike) -> jax.Array:
    """kernel(x) in x's floating dtype; half precisions are computed in float32."""
    x = promote(x)
    if x.dtype in _KERNEL_DTYPES:
        return kernel(x)
    return kernel(x.astype(np.float32)).astype(x.dtype)


def define_jvp(fun: jax.custom_jvp, derivative: Callable[[jax.Array], jax.Array]) -> None:
    """Give ``fun`` the rule ``d fun(x) = derivative(x) dx``.

    The rule calls ``fun`` itself for the primal output and ``derivative`` is
    written with custom_jvp functions, so every order of derivative goes
    through accurate rules instead of differentiating the kernels.
    """
    def rule(primals, tangents):
        (x,), (t,) = primals, tangents
        y = fun(x)
        t = t if hasattr(t, "dtype") else jnp.asarray(t)   # jax.jvp passes Python scalars through
        if t.dtype == jax.dtypes.float0:      # integer input: no derivative
            return y, jnp.zeros_like(y)
        return y, t.astype(y.dtype) * derivative(promote(x)).astype(y.dtype)

    fun.defjvp(rule)
