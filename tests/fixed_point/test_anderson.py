"""The Anderson safeguard: a bad proposal falls back to the plain step and restarts;
memory m keeps m + 1 pairs (m differences, Walker & Ni's Anderson(m))."""
import jax.numpy as jnp
import numpy as np

from odekit.fixed_point import anderson
from odekit.fixed_point.iteration import point

OPTIONS = {"history": 3, "damping": 1.0, "regularization": 1e-10}


def test_rejected_proposal_falls_back_and_restarts():
    fun = jnp.cos
    it, history = anderson._init(fun, jnp.array(1.0), OPTIONS)
    # Poison the history so that the proposal lands far from the fixed point.
    history = history._replace(points=history.points.at[0].set(50.0))
    new, history = anderson._step(fun, it, history, OPTIONS)
    np.testing.assert_allclose(new.x, np.cos(1.0))  # the plain step from x = 1
    np.testing.assert_array_equal(history.used, [True, False, False, False])
    assert int(history.slot) == 1


def test_accepted_proposal_extends_the_history():
    fun = jnp.cos
    it, history = anderson._init(fun, jnp.array(1.0), OPTIONS)
    for expected_used in ([True, True, False, False], [True, True, True, False]):
        it, history = anderson._step(fun, it, history, OPTIONS)
        np.testing.assert_array_equal(history.used, expected_used)
    plain = point(fun, jnp.cos(jnp.cos(1.0)))  # two plain iterations
    assert abs(float(it.residual)) < abs(float(plain.residual)) / 5
