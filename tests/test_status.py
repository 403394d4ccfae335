"""odekit.status: one code table, one exception hierarchy, one way to raise.

What a caller catches when the failure is found inside compiled code
(measured here on jax 0.10.2, CPU; the host's own exception does not
cross XLA):

* a concrete status (no trace, also under ``jax.disable_jit()`` without
  ``vmap``/``grad``): the odekit error class itself (``RootSolverError``,
  ``ODESolverError``);
* calls through JAX's Python dispatch path: the call that compiles a jitted
  function, later calls of a jitted function that has never succeeded, an
  eager ``vmap`` or ``grad``: ``jax.errors.JaxRuntimeError``, a
  ``RuntimeError``;
* calls through the C++ fast path, which a jitted function takes once it has
  succeeded: ``ValueError``, which is not a ``RuntimeError``. (A second
  ``jax.jit`` wrapper of a function whose compiled executable first failed
  stays on the Python path, so which class a given call sees depends on
  history: catch ``status.ERRORS``.)

In every case ``str(exception)`` ends with odekit's message, which
``status.failure_message`` returns, and nothing is written to stderr.
"""
import logging
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odekit
import odekit.ode
from odekit import status

CODES = {name: getattr(status, name) for name in
         ("SUCCESS", "TERMINATED", "MAX_STEPS", "STEP_UNDERFLOW", "NONFINITE", "STIFF",
          "BAD_TIMES", "STALLED", "SINGULAR", "BAD_BRACKET", "NO_PROGRESS",
          "BACKSOLVE_UNSTABLE", "NOT_A_ROOT", "BAD_SPARSITY", "DAE_INCONSISTENT")}


def test_codes_are_unique_and_every_code_has_a_message():
    assert len(set(CODES.values())) == len(CODES)
    assert set(status.MESSAGES) == set(CODES.values())
    assert all(status.message(code) == status.MESSAGES[code] for code in CODES.values())
    assert status.message(42) == "status 42"
    assert (status.SUCCESS, status.TERMINATED) == (0, 1)
    assert all(code < 0 for name, code in CODES.items() if name not in ("SUCCESS", "TERMINATED"))


def test_one_exception_hierarchy():
    assert issubclass(status.SolverError, RuntimeError)
    assert issubclass(status.ODESolverError, status.SolverError)
    assert issubclass(status.RootSolverError, status.SolverError)
    assert odekit.SolverError is status.SolverError
    assert odekit.ODESolverError is status.ODESolverError is odekit.ode.ODESolverError
    assert odekit.RootSolverError is status.RootSolverError


def describe(code, t):
    """The message of a (possibly batched) check, as a solver would build it."""
    code, t = np.ravel(code), np.ravel(t)
    failed = np.flatnonzero(code < 0)
    return (f"{failed.size} of {code.size} members failed; the first, member {failed[0]}, "
            f"with {status.message(code[failed[0]])} at t={t[failed[0]]:g}")


def checked(t, error=status.ODESolverError):
    """``2 t``, checked: a negative ``t`` is a failure (NONFINITE)."""
    code = jnp.where(t < 0, status.NONFINITE, status.SUCCESS).astype(jnp.int32)
    return status.raise_if_failed(code, {"y": 2 * t, "code": code}, (t,), describe, error)["y"]


def test_concrete_status_raises_the_error_class_itself():
    value = {"y": np.ones(2)}
    assert status.raise_if_failed(np.int32(1), value, (), describe, status.ODESolverError) is value
    with pytest.raises(status.RootSolverError, match=r"1 of 1 members failed.*non-finite"):
        checked(jnp.float64(-1.0), status.RootSolverError)
    with jax.disable_jit():
        with pytest.raises(status.ODESolverError, match="at t=-2"):
            checked(jnp.float64(-2.0))


def test_under_jit_first_call_raises_jax_runtime_error():
    solve = jax.jit(lambda t: checked(t))  # a fresh function: no cached executable
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        solve(-3.0).block_until_ready()
    assert "ODESolverError: 1 of 1 members failed" in str(info.value)
    assert "at t=-3" in str(info.value)
    with pytest.raises(jax.errors.JaxRuntimeError, match="at t=-4"):  # never succeeded yet
        solve(-4.0).block_until_ready()


def test_under_jit_a_call_after_a_success_raises_value_error():
    solve = jax.jit(lambda t: checked(t))
    assert float(solve(1.5)) == 3.0
    with pytest.raises(ValueError) as info:
        solve(-5.0).block_until_ready()
    assert not isinstance(info.value, RuntimeError)
    assert "ODESolverError: 1 of 1 members failed" in str(info.value)
    assert "at t=-5" in str(info.value)


def counting(calls):
    def count(code, t):
        calls.append(np.shape(code))
        return describe(code, t)
    return count


@pytest.mark.parametrize("jit", [False, True])
def test_under_vmap_the_callback_runs_once_and_counts_the_failures(jit):
    calls = []

    def one(t):
        code = jnp.where(t < 0, status.MAX_STEPS, status.SUCCESS).astype(jnp.int32)
        return status.raise_if_failed(code, t, (t,), counting(calls), status.RootSolverError)
    solve = jax.jit(jax.vmap(one)) if jit else jax.vmap(one)
    t = jnp.arange(1024.0).at[jnp.array([7, 9, 700])].set(-1.0)
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError),
                       match="3 of 1024 members failed; the first, member 7, with the maximum"):
        solve(t).block_until_ready()
    assert calls == [(1024,)]
    np.testing.assert_array_equal(solve(jnp.arange(4.0)), jnp.arange(4.0))
    assert calls == [(1024,)]  # a success never calls back


def test_nested_vmap_passes_every_batch_axis():
    calls = []

    def one(t):
        code = jnp.where(t < 0, status.STIFF, status.SUCCESS).astype(jnp.int32)
        return status.raise_if_failed(code, t, (t,), counting(calls), status.ODESolverError)
    t = jnp.ones((2, 3)).at[1, 2].set(-1.0)
    with pytest.raises(jax.errors.JaxRuntimeError, match="1 of 6 members failed; the first, "
                                                         "member 5, with the problem appears"):
        jax.jit(jax.vmap(jax.vmap(one)))(t).block_until_ready()
    assert calls == [(2, 3)]


def test_padded_batch_counts_members_and_never_drops_a_failure():
    """odekit.ensemble's padding (issue 27.20): rows past the caller's members
    are not counted, but a failure among them still raises (folded into the
    last member's row), and a vmap inside of the same size is left alone."""
    calls = []

    def one(t):
        code = jnp.where(t < 0, status.MAX_STEPS, status.SUCCESS).astype(jnp.int32)
        return status.raise_if_failed(code, t, (t,), counting(calls), status.RootSolverError)

    def padded(t, size, fn):
        with status.padded_batch(size, t.shape[0], t):
            return jax.vmap(fn)(t)

    last = jnp.array([1.0, 2.0, -3.0, -3.0, -3.0])     # member 2, padded with 2 copies
    with pytest.raises(status.ERRORS, match="1 of 3 members failed; the first, member 2, "):
        jax.jit(partial(padded, size=3, fn=one))(last).block_until_ready()
    assert calls[-1] == (3,)
    not_copies = jnp.array([1.0, 2.0, 3.0, 4.0, -5.0])  # padding that is no copy still fails
    with pytest.raises(status.ERRORS, match="1 of 3 members failed; the first, member 2, "
                                            "with the maximum number of steps.* at t=-5"):
        jax.jit(partial(padded, size=3, fn=one))(not_copies).block_until_ready()
    inner = jnp.ones((5, 5)).at[0, 4].set(-1.0)          # an inner vmap of the padded size
    with pytest.raises(status.ERRORS, match="1 of 15 members failed; the first, member 4, "):
        jax.jit(partial(padded, size=3, fn=jax.vmap(one)))(inner).block_until_ready()
    np.testing.assert_array_equal(jax.jit(partial(padded, size=3, fn=one))(jnp.arange(5.0)),
                                  jnp.arange(5.0))


def test_under_grad_gradients_pass_and_failures_raise():
    assert float(jax.grad(checked)(1.0)) == 2.0
    assert float(jax.jit(jax.grad(checked))(1.0)) == 2.0
    np.testing.assert_array_equal(jax.vmap(jax.grad(checked))(jnp.ones(3)), 2.0)
    assert float(jax.jvp(checked, (1.0,), (1.0,))[1]) == 2.0
    with pytest.raises(jax.errors.JaxRuntimeError, match="at t=-1"):
        jax.grad(checked)(-1.0)
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match="member 1,"):
        jax.jit(jax.vmap(jax.grad(checked)))(jnp.array([1.0, -1.0, -2.0])).block_until_ready()


def test_throw_path_ties_the_value():
    # Only the value leaves the jitted function; an untied check would be
    # dead code, removed by JAX or XLA, and this call would return 8.0.
    jaxpr = jax.make_jaxpr(checked)(1.0)
    assert "custom_vmap_call" in str(jaxpr) and "odekit_raise_failure" in str(jaxpr)
    with pytest.raises(jax.errors.JaxRuntimeError, match="at t=-4"):
        jax.jit(lambda t: checked(t) + 0.0)(-4.0).block_until_ready()
    # a value with only integer leaves is guarded too
    only_ints = jax.jit(lambda k: status.raise_if_failed(k, k + 1, (k,), describe,
                                                         status.RootSolverError))
    assert int(only_ints(jnp.int32(3))) == 4
    with pytest.raises(ValueError, match="RootSolverError: 1 of 1 members failed"):
        only_ints(jnp.int32(-7)).block_until_ready()


def test_settings_users_turn_on_do_not_fire_inside_the_check():
    with jax.debug_nans(True), jax.debug_infs(True), jax.numpy_dtype_promotion("strict"):
        assert float(jax.jit(checked)(0.5)) == 1.0
        np.testing.assert_array_equal(jax.vmap(jax.grad(checked))(jnp.ones(2)), 2.0)
        with jax.disable_jit():
            np.testing.assert_array_equal(jax.vmap(checked)(jnp.ones(2)), 2.0)
            with pytest.raises(jax.errors.JaxRuntimeError, match="member 1,"):
                jax.vmap(checked)(jnp.array([1.0, -1.0]))


def failures(one, bad, good):
    """The exceptions of a failing first (compiling) call of a fresh jitted
    ``one``, and of a failing call of another after a success (the fast path)."""
    caught = []
    for calls in ([bad], [good, bad]):
        solve = jax.jit(lambda x: one(x))
        for x in calls:
            try:
                solve(x).block_until_ready()
            except status.ERRORS as error:
                caught.append(error)
    return caught


def test_the_classes_to_catch_and_the_message_in_them(capfd, caplog):
    """JAX's text: its own first line, the host's traceback, then odekit's
    class and message to the end; failure_message returns the message from
    every class a failure reaches the caller as."""
    caught = failures(checked, -3.0, 1.0)
    assert [type(e) for e in caught] == [jax.errors.JaxRuntimeError, ValueError]
    expected = f"1 of 1 members failed; the first, member 0, with {status.message(-3)} at t=-3"
    for error in caught:
        text = str(error)
        assert text.startswith("INTERNAL: CpuCallback error calling callback: Traceback")
        assert text.endswith(f"\nODESolverError: {expected}")
        assert status.failure_message(error) == expected
    assert status.failure_message(status.RootSolverError("no root")) == "no root"
    assert status.failure_message(ValueError("an unrelated error")) is None
    assert status.failure_message(RuntimeError("x\nKeyError: y")) is None
    # Nothing on stderr, no log record (a pure_callback logged "jax.pure_callback
    # failed" and a traceback for every failure, a caught one too).
    assert capfd.readouterr().err == ""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_caught_failure_of_a_batch_leaves_stderr_clean(capfd, caplog):
    caught = failures(jax.vmap(checked), jnp.array([1.0, -1.0, 2.0]), jnp.ones(3))
    assert [type(e) for e in caught] == [jax.errors.JaxRuntimeError, ValueError]
    assert all("1 of 3 members failed; the first, member 1," in status.failure_message(e)
               for e in caught)
    assert capfd.readouterr().err == ""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_check_is_one_host_callback_in_the_failing_branch():
    hlo = jax.jit(checked).lower(1.0).as_text()
    assert hlo.count("xla_ffi_python_cpu_callback") == 1
    assert "sharding" not in hlo.split("xla_ffi_python_cpu_callback")[1].split("\n")[0]
    host = lambda status, t: (_ for _ in ()).throw(status_error(status, t))
    with pytest.raises(status.ODESolverError, match="eager"):   # the primitive's own impl
        status.raise_failure_p.bind(np.int32(-1), np.float64(2.0), host=host)


def status_error(code, t):
    return status.ODESolverError(f"eager status {int(code)} at t={float(t)}")
