"""SciPy's ``solve_ivp`` interface on top of ``odekit.solve_ivp``, to run
SciPy's own test file (``scipy/integrate/_ivp/tests/test_ivp.py``) against
odekit.

What the adapter maps, and nothing more:

* SciPy's method names (or solver classes) to odekit's: RK45 -> dopri5,
  RK23 -> bosh3, DOP853 -> dopri8, Radau -> kvaerno5 (implicit, order 5),
  BDF -> rodas5p (L-stable Rosenbrock), LSODA -> auto (explicit until
  stiff, then rodas5p); in the quick mode (:data:`QUICK`) the explicit ones
  all to dopri5 and the stiff ones to rodas5p.
* SciPy's defaults (``rtol=1e-3``, ``atol=1e-6``) and its argument forms:
  ``y0`` read as one float or complex array (odekit reads a list as a
  pytree of scalars); ``args`` passed on unchanged; ``vectorized=True`` read as SciPy defines it
  (``fun(t, y[:, None])[:, 0]`` is dy/dt); ``jac`` a constant matrix (dense
  or scipy.sparse) turned into a function; ``jac`` given to an explicit
  method dropped with SciPy's own warning.
* The results to SciPy's layout: ``t`` (n,), ``y`` (n_state, n) state-leading,
  ``sol(t)`` state-leading, ``t_events``/``y_events`` lists trimmed to the
  occurrences (an empty ``y_events`` entry of shape (0,), and empty lists for
  ``t``/``y`` when no ``t_eval`` point was reached, as SciPy returns them),
  ``nfev``/``njev``/``nlu`` from ``sol.stats``.

Two things only save compilations, without changing a result: a field that
closes over nothing is replaced by the first one seen with the same code
(SciPy's loops build ``lambda t, y: -y`` anew for each method, and odekit
keys its programs by the function), and ``sol(t)`` evaluates at times padded
to a multiple of :data:`DENSE_BLOCK` (one program per shape of ``t``).

odekit traces ``fun``, ``jac`` and the events with JAX; SciPy's test
functions build arrays with NumPy (``np.array([...])``, ``np.vstack``).
:func:`load_scipy_tests` therefore loads the test file as a new module whose
``np`` (and the sparse constructors) dispatch to ``jax.numpy`` when an
argument is a JAX tracer and to NumPy otherwise; the test bodies themselves
(assertions, reference solutions) keep running on NumPy.
"""
from __future__ import annotations

import importlib.util
import os
import types
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy
import scipy.sparse

import odekit

#: SciPy's method name -> odekit's.
METHODS = {"RK45": "dopri5", "RK23": "bosh3", "DOP853": "dopri8",
           "Radau": "kvaerno5", "BDF": "rodas5p", "LSODA": "auto"}
#: The quick mode's: one explicit and one stiff method, so that SciPy's loops
#: over its six methods compile two programs per scenario, not six (each
#: compilation takes seconds).
QUICK_METHODS = {"RK45": "dopri5", "RK23": "dopri5", "DOP853": "dopri5",
                 "Radau": "rodas5p", "BDF": "rodas5p", "LSODA": "rodas5p"}
EXPLICIT = {"dopri5", "bosh3", "dopri8", "tsit5"}

#: Quick mode (the default; ODEKIT_LONG_TESTS=1 runs everything): see
#: QUICK_METHODS and covering_product.
QUICK = os.environ.get("ODEKIT_LONG_TESTS") != "1"

TEST_FILE = os.path.join(os.path.dirname(scipy.__file__), "integrate", "_ivp", "tests",
                         "test_ivp.py")


def _has_tracer(tree: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


class TracingNumPy(types.ModuleType):
    """NumPy whose functions run ``jax.numpy``'s counterpart when an argument
    holds a JAX tracer (so a NumPy-written vector field can be traced);
    constants, types and submodules are NumPy's."""

    def __init__(self) -> None:
        super().__init__("numpy")

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        counterpart = getattr(jnp, name, None)
        if (not callable(value) or isinstance(value, (type, types.ModuleType))
                or counterpart is None):
            return value

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            if _has_tracer((args, kwargs)):
                return counterpart(*args, **kwargs)
            return value(*args, **kwargs)
        dispatch.__name__ = name
        return dispatch


def _tracing_sparse(constructor: Callable) -> Callable:
    """A scipy.sparse constructor that builds a dense ``jax.numpy`` array from
    traced entries (odekit takes a dense Jacobian)."""
    def build(data: Any, *args: Any, **kwargs: Any) -> Any:
        if _has_tracer(data):
            return jnp.asarray(jnp.array(data))
        return constructor(data, *args, **kwargs)
    return build


def covering_product(*factors: Any) -> list[tuple]:
    """A quick stand-in for ``itertools.product``: ``2 max(len(f))``
    combinations in which every value of every factor occurs (twice, with
    other partners the second time), instead of all of them. Each
    combination is its own compiled solve; the full product of SciPy's
    test_integration is 72 of them."""
    factors = [list(f) for f in factors]
    rounds = 2 * max(len(f) for f in factors)
    width = rounds // 2
    picks = []
    for i in range(rounds):
        shift = i // width
        pick = tuple((i + shift * k) % len(f) for k, f in enumerate(factors))
        if pick not in picks:   # indices: the values may be arrays
            picks.append(pick)
    return [tuple(f[j] for f, j in zip(factors, pick)) for pick in picks]


def load_scipy_tests(solve_ivp: Callable, quick: bool = QUICK) -> types.ModuleType:
    """SciPy's ``test_ivp.py`` as a fresh module whose ``solve_ivp`` is
    ``solve_ivp`` and whose ``np`` / ``csc_matrix`` trace under JAX; with
    ``quick``, its ``product`` loops run :func:`covering_product`."""
    spec = importlib.util.spec_from_file_location("scipy_test_ivp_through_odekit", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.solve_ivp = solve_ivp
    module.np = TracingNumPy()
    module.csc_matrix = _tracing_sparse(scipy.sparse.csc_matrix)
    if quick:
        module.product = covering_product
    return module


class OdeResult(dict):
    """SciPy's result: a dict whose keys are also attributes."""

    __getattr__ = dict.__getitem__


#: ``sol(t)`` is evaluated at a multiple of this many times (padded with
#: ``t``'s first time, the padding's values dropped): odekit compiles one
#: program per shape of ``t``, and SciPy's tests ask at 1, 2, 3, 50, 250, ...
#: times, each a compilation of seconds for a stiff method's replayed step.
DENSE_BLOCK = 256


class StateLeadingDense:
    """odekit's ``sol.sol`` with SciPy's layout: ``sol(t)`` is (n_state,) for a
    scalar ``t`` and (n_state, len(t)) for an array of times."""

    def __init__(self, dense: Callable) -> None:
        self.dense = dense

    def __call__(self, t: Any) -> np.ndarray:
        times = np.asarray(t, dtype=float).reshape(-1)
        if times.size == 0:
            return np.asarray(self.dense(times)).T
        padded = np.full(-(-times.size // DENSE_BLOCK) * DENSE_BLOCK, times[0])
        padded[:times.size] = times
        values = np.asarray(self.dense(padded))[:times.size]
        return values[0] if np.ndim(t) == 0 else values.reshape(np.shape(t) + values.shape[1:]).T


_wrapped: dict = {}
_canonical: dict = {}


def _canonical_function(fun: Callable) -> Callable:
    """The first function seen with ``fun``'s code and globals, when ``fun``
    closes over nothing and has no defaults or attributes (the same field:
    SciPy's loops build ``lambda t, y: -y`` anew for each method, and
    odekit's programs are keyed by the function object)."""
    code = getattr(fun, "__code__", None)
    if (code is None or fun.__closure__ or fun.__defaults__ or fun.__kwdefaults__
            or getattr(fun, "__dict__", None)):
        return fun
    return _canonical.setdefault((code, id(fun.__globals__)), fun)


def _vectorized(fun: Callable) -> Callable:
    """SciPy's ``vectorized=True`` field as a field of one state."""
    if fun not in _wrapped:   # one function per field: odekit's program cache can hit
        def one_state(t, y, *args):
            return jnp.asarray(fun(t, y[:, None], *args))[:, 0]
        _wrapped[fun] = one_state
    return _wrapped[fun]


def _constant_jacobian(jac: Any) -> Callable:
    matrix = np.asarray(jac.toarray() if scipy.sparse.issparse(jac) else jac, dtype=float)
    return lambda t, y, *args: jnp.asarray(matrix)


def _method_name(method: Any) -> str:
    name = method if isinstance(method, str) else getattr(method, "__name__", method)
    return (QUICK_METHODS if QUICK else METHODS).get(name, name)


def solve_ivp(fun: Callable, t_span: Any, y0: Any, method: Any = "RK45", t_eval: Any = None,
              dense_output: bool = False, events: Any = None, vectorized: bool = False,
              args: Any = None, **options: Any) -> OdeResult:
    """``scipy.integrate.solve_ivp``'s signature and result, solved by odekit."""
    name = _method_name(method)
    y0 = np.asarray(y0)   # SciPy's y0 is one array, real (float) or complex
    y0 = y0.astype(complex if np.iscomplexobj(y0) else float)
    options.setdefault("rtol", 1e-3)
    options.setdefault("atol", 1e-6)
    jac = options.pop("jac", None)
    if jac is not None and name in EXPLICIT:
        warnings.warn("The following arguments have no effect for a chosen solver: `jac`.",
                      UserWarning, stacklevel=2)
        jac = None
    if jac is not None and not callable(jac):
        jac = _constant_jacobian(jac)
    fun = _canonical_function(fun)
    if vectorized:
        fun = _vectorized(fun)
    if args is not None:
        options["args"] = args
    out = odekit.solve_ivp(fun, tuple(t_span), y0, method=name, t_eval=t_eval,
                           dense_output=dense_output, events=events, jac=jac, throw=False,
                           **options)
    n = int(out.num_points)
    t = np.asarray(out.ts[:n])
    y = np.asarray(out.ys[:n]).T
    if t_eval is not None and n == 0:
        t, y = [], []
    t_events = y_events = None
    if out.t_events is not None:
        t_list = [out.t_events] if callable(events) else list(out.t_events)
        y_list = [out.y_events] if callable(events) else list(out.y_events)
        counts = np.asarray(out.event_counts)
        t_events = [np.asarray(te[:k]) for te, k in zip(t_list, counts)]
        y_events = [np.asarray(ye[:k]) if k else np.array([]) for ye, k in zip(y_list, counts)]
    stats = {k: int(out.stats[k]) for k in ("nfev", "njev", "nlu")}
    return OdeResult(t=t, y=y, sol=StateLeadingDense(out.sol) if dense_output else None,
                     t_events=t_events, y_events=y_events, nfev=stats["nfev"],
                     njev=stats["njev"], nlu=stats["nlu"], status=int(out.status),
                     message=out.message, success=bool(out.success))
