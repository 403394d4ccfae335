"""Benchmark: how fast do odekit's stiff methods solve large stiff systems
whose Jacobian is sparse, against SciPy, SUNDIALS CVODE, diffsol and diffrax?

Question (issue 28, item 5): at 500..8000 unknowns, does odekit's sparse
path (``jac_sparsity=`` + a structured ``linear_solver=``) beat SciPy's BDF
with ``jac_sparsity``, come within 2x of diffsol, and grow linearly in n?

Problems (float64):

* ``bruss1d``: the 1-D Brusselator of Hairer & Wanner (Solving ODEs II,
  BRUSS): ``u_t = A + u^2 v - (B+1) u + alpha u_xx``,
  ``v_t = B u - u^2 v + alpha v_xx`` on x in [0, 1], Dirichlet u = 1, v = 3
  at both ends, N interior points, dx = 1/(N+1), u(x,0) = 1 + sin(2 pi x),
  v(x,0) = 3, A = 1, B = 3, alpha = 1/50, t in [0, 10]; the state is
  interleaved (u_1, v_1, u_2, v_2, ...) so that J is banded (bandwidth 2).
  N = 250..4000 (state 500..8000). rtol 1e-6, atol 1e-8.
* ``robertson``: Robertson's kinetics x ngroups (block-diagonal, groups of
  3 species, k1 = 0.04, k2 = 3e7, k3 = 1e4, y0 = (1, 0, 0) per group) to
  t = 1e10, ngroups = 1..1000. rtol 1e-6, atol 1e-10.
* ``bruss2d``: the 2-D Brusselator (BRUSS-2D) as in the SciML benchmarks
  (``brusselator_2d_loop``): N x N points of linspace(0, 1, N), periodic
  wrap, ``u_t = alpha/dx^2 lap(u) + B + u^2 v - (A+1) u + f(x, y, t)``,
  ``v_t = alpha/dx^2 lap(v) + A u - u^2 v``, A = 3.4, B = 1, alpha = 10
  (SciML's ``p = (3.4, 1., 10., step(xyd))``; far stiffer than alpha = 0.1),
  f = 5 in the disc (x-0.3)^2 + (y-0.6)^2 <= 0.1^2 for t >= 1.1,
  u0 = 22 (y(1-y))^1.5, v0 = 27 (x(1-x))^1.5, t in [0, 11.5]; state
  interleaved per grid point. N = 32, 64 (state 2048, 8192). rtol 1e-6,
  atol 1e-8.

Contenders, measured in the same run at the same tolerances (the error
column says how accurate each was):

* SciPy ``solve_ivp(method="BDF", jac_sparsity=S)`` with a NumPy field;
* odekit ``solve_ivp`` jitted (``jax.jit`` around a function calling it
  with ``t_eval`` = the output times): rodas5p and kvaerno5 with
  ``jac_sparsity="auto"`` (found from the traced field) or the explicit
  pattern S (a scipy.sparse matrix), ``linear_solver="auto"`` or the forced
  structured solver ("banded", "block_diagonal"); odekit dense rodas5p
  (``jac_sparsity=None``) only at n <= 500 (above that it takes minutes);
* diffrax Kvaerno5 (dense Jacobian, PID controller) at n <= 500;
* SUNDIALS CVODE (BDF) via scikit-sundae: banded linear solver
  (difference-quotient band Jacobian) for bruss1d and robertson, its sparse
  solver (SuperLU_MT, colored difference quotients) for bruss2d;
* diffsol BDF via pydiffsol with the model in DiffSL (faer sparse matrices
  and sparse LU; its state is species-major and is permuted back).

None of the anchors is a dependency: each is used when importable.

Reported per problem, size and contender: the median time of warm calls
(interleaved rounds; slow contenders get fewer rounds), the first call
(odekit/diffrax: trace + compile + run of the jitted function; diffsol:
JIT-compiling the DiffSL model + run; CVODE/SciPy: construction + run),
steps, nfev, njev, nlu where the solver reports them, and the max abs error
at the output times against a SciPy BDF reference with jac_sparsity at
rtol 1e-10 (atol 1e-12; robertson 1e-14), cached on disk. With
``--memory``, the peak resident memory of a fresh process running one
configuration once (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), minus
that process's peak after imports and setup, for a selection of
configurations. A gradient table: ``jax.grad`` of a loss on bruss1d at
state 2000 with respect to (A, B, alpha) (adjoint="checkpoint") against
central differences of tight SciPy solves, and its time over the forward
solve. A threads table reruns a few configurations in a child process with
``OPENBLAS_NUM_THREADS=1``.

Run: ``python benchmarks/large_stiff.py`` (tens of minutes on 2 loaded
cores) writes ``large_stiff.md`` and ``large_stiff.png`` to ``--out``
(default benchmarks/results); ``--quick`` runs the smallest size of each
problem with fewer contenders and 3 rounds (under a minute once the small
references are cached); ``--threads 1`` re-executes itself with
``OPENBLAS_NUM_THREADS=1`` (and OMP/MKL) set before NumPy and JAX load.
"""
from __future__ import annotations

import os
import sys

# --threads must take effect before NumPy/JAX load their BLAS: re-execute.
if "--threads" in sys.argv:
    _threads = sys.argv[sys.argv.index("--threads") + 1]
    if os.environ.get("OPENBLAS_NUM_THREADS") != _threads:
        for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[_name] = _threads
        os.execv(sys.executable, [sys.executable] + sys.argv)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.integrate  # noqa: E402
import scipy.sparse  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import odekit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.abspath(__file__)
CACHE_DIR = os.environ.get("ODEKIT_BENCH_CACHE", "/tmp/odekit_large_stiff")
# References of the smallest sizes live with the results (so that --quick
# needs no reference solve); the larger ones in CACHE_DIR.
SMALL_REFERENCES = os.path.join(harness.RESULTS_DIR, "large_stiff_reference.npz")
REF_RTOL = 1e-10
DENSE_MAX_N = 500        # odekit dense rodas5p and diffrax Kvaerno5 only up to here
SLOW_S = 3.0             # a warm call slower than this gets SLOW_ROUNDS timings in all
SLOW_ROUNDS = 2
VERY_SLOW_S = 20.0       # ... and slower than this, one (the first warm call)
GRADIENT_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
HAS_SPARSE = "jac_sparsity" in inspect.signature(odekit.solve_ivp).parameters


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------------
# Problems


@dataclasses.dataclass(frozen=True)
class Problem:
    """One test problem at one size. ``jax_field(t, y, *args)`` and
    ``numpy_field(t, y, *args)`` are the same function (checked at start-up);
    ``pattern`` is J's nonzero pattern (scipy.sparse, the diagonal
    included); ``band`` its (lower, upper) bandwidth in the natural order
    (None where periodic wrap makes it full); ``diffsl`` the model in DiffSL
    with ``diffsl_order``: the index into our state of each diffsol state."""

    name: str
    size: int            # grid points / groups
    n: int               # state size
    y0: np.ndarray
    t0: float
    t_out: tuple          # output times; the last one is t1
    args: tuple           # floats
    rtol: float
    atol: float
    ref_atol: float
    jax_field: Callable
    numpy_field: Callable
    pattern: scipy.sparse.csr_array
    band: tuple | None
    diffsl: Callable[[], str]
    diffsl_order: np.ndarray
    forced_solvers: tuple  # structured linear solvers that fit, besides the one "auto" picks

    @property
    def key(self) -> str:
        text = repr((self.name, self.size, self.y0.tobytes().hex()[:64], self.t0, self.t_out,
                     self.args, REF_RTOL, self.ref_atol))
        return f"{self.name}_{self.size}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def _coo(n, rows, cols) -> scipy.sparse.csr_array:
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    keep = (rows >= 0) & (rows < n) & (cols >= 0) & (cols < n)
    data = np.ones(int(keep.sum()))
    matrix = scipy.sparse.coo_array((data, (rows[keep], cols[keep])), shape=(n, n)).tocsr()
    matrix.data[:] = 1.0
    return matrix


def _f(x: float) -> str:
    return repr(float(x))


# 1-D Brusselator ---------------------------------------------------------

def bruss1d_jax(t, y, a, b, alpha):
    n = y.shape[0] // 2
    uv = y.reshape(n, 2)
    u, v = uv[:, 0], uv[:, 1]
    c = alpha * (n + 1) ** 2
    one, three = jnp.ones((1,), y.dtype), jnp.full((1,), 3.0, y.dtype)
    up = jnp.concatenate([one, u, one])
    vp = jnp.concatenate([three, v, three])
    uuv = u * u * v
    du = a + uuv - (b + 1) * u + c * (up[:-2] - 2 * u + up[2:])
    dv = b * u - uuv + c * (vp[:-2] - 2 * v + vp[2:])
    return jnp.stack([du, dv], axis=1).reshape(-1)


def bruss1d_numpy(t, y, a, b, alpha):
    n = y.shape[0] // 2
    u, v = y[0::2], y[1::2]
    c = alpha * (n + 1) ** 2
    up = np.concatenate([[1.0], u, [1.0]])
    vp = np.concatenate([[3.0], v, [3.0]])
    uuv = u * u * v
    out = np.empty_like(y)
    out[0::2] = a + uuv - (b + 1) * u + c * (up[:-2] - 2 * u + up[2:])
    out[1::2] = b * u - uuv + c * (vp[:-2] - 2 * v + vp[2:])
    return out


def _laplacian_1d_diffsl(m: int) -> str:
    return (f"    (0..{m - 1}, 1..{m}): 1.0,\n    (0..{m}, 0..{m}): -2.0,\n"
            f"    (1..{m}, 0..{m - 1}): 1.0,\n")


def bruss1d(size: int) -> Problem:
    m, n = size, 2 * size
    x = np.arange(1, m + 1) / (m + 1)
    y0 = np.empty(n)
    y0[0::2], y0[1::2] = 1 + np.sin(2 * np.pi * x), 3.0
    i = np.arange(m)
    u, v = 2 * i, 2 * i + 1
    pattern = _coo(n, [u, u, u, u, v, v, v, v], [u - 2, u, u + 2, v, v - 2, v, v + 2, u])

    def diffsl() -> str:
        xs = ", ".join(_f(value) for value in x)
        return f"""
in_i {{ a = 1.0, b = 3.0, alpha = 0.02 }}
L_ij {{
{_laplacian_1d_diffsl(m)}}}
e_i {{ (0): 1.0, (1:{m - 1}): 0.0, ({m - 1}): 1.0 }}
x_i {{ {xs} }}
ini_i {{ 1.0 + sin(2.0 * 3.141592653589793 * x_i) }}
u_i {{ (0:{m}): ini_i, ({m}:{n}): 3.0 }}
X_i {{ u_i[0:{m}] }}
Y_i {{ u_i[{m}:{n}] }}
c {{ alpha * {(m + 1) ** 2}.0 }}
lx_i {{ L_ij * X_j }}
ly_i {{ L_ij * Y_j }}
F_i {{
    a + X_i * X_i * Y_i - (b + 1.0) * X_i + c * (lx_i + e_i),
    b * X_i - X_i * X_i * Y_i + c * (ly_i + 3.0 * e_i),
}}
"""

    order = np.concatenate([u, v])   # diffsol state (X..., Y...) -> our index
    return Problem("bruss1d", size, n, y0, 0.0, (5.0, 10.0), (1.0, 3.0, 0.02), 1e-6, 1e-8,
                   1e-12, bruss1d_jax, bruss1d_numpy, pattern, (2, 2), diffsl, order, ())


# Robertson x ngroups -----------------------------------------------------

def robertson_jax(t, y, k1, k2, k3):
    g = y.reshape(-1, 3)
    a, b, c = g[:, 0], g[:, 1], g[:, 2]
    da = -k1 * a + k3 * b * c
    db = k1 * a - k2 * b * b - k3 * b * c
    dc = k2 * b * b
    return jnp.stack([da, db, dc], axis=1).reshape(-1)


def robertson_numpy(t, y, k1, k2, k3):
    a, b, c = y[0::3], y[1::3], y[2::3]
    out = np.empty_like(y)
    out[0::3] = -k1 * a + k3 * b * c
    out[1::3] = k1 * a - k2 * b * b - k3 * b * c
    out[2::3] = k2 * b * b
    return out


def robertson(size: int) -> Problem:
    g, n = size, 3 * size
    y0 = np.tile([1.0, 0.0, 0.0], g)
    base = 3 * np.arange(g)
    rows = [base + r for r in range(3) for _ in range(3)]
    cols = [base + c for _ in range(3) for c in range(3)]
    pattern = _coo(n, rows, cols)

    def diffsl() -> str:
        return f"""
in_i {{ k1 = 0.04, k2 = 30000000.0, k3 = 10000.0 }}
u_i {{ (0:{g}): 1.0, ({g}:{3 * g}): 0.0 }}
X_i {{ u_i[0:{g}] }}
Y_i {{ u_i[{g}:{2 * g}] }}
Z_i {{ u_i[{2 * g}:{3 * g}] }}
F_i {{
    -k1 * X_i + k3 * Y_i * Z_i,
    k1 * X_i - k2 * Y_i * Y_i - k3 * Y_i * Z_i,
    k2 * Y_i * Y_i,
}}
"""

    order = np.concatenate([base, base + 1, base + 2])
    return Problem("robertson", size, n, y0, 0.0, (1.0, 1e5, 1e10), (0.04, 3e7, 1e4), 1e-6,
                   1e-10, 1e-14, robertson_jax, robertson_numpy, pattern, (2, 2), diffsl,
                   order, ("banded",))


# 2-D Brusselator (SciML's BRUSS-2D) ---------------------------------------

def _bruss2d_grid(m: int):
    xyd = np.linspace(0.0, 1.0, m)
    x, y = np.meshgrid(xyd, xyd, indexing="ij")      # x along axis 0 (i), y along axis 1 (j)
    disc = ((x - 0.3) ** 2 + (y - 0.6) ** 2 <= 0.1 ** 2).astype(float)
    return xyd, x, y, disc


def bruss2d(size: int) -> Problem:
    m = size
    nn, n = m * m, 2 * m * m
    xyd, x, y, disc = _bruss2d_grid(m)
    dx = xyd[1] - xyd[0]
    y0 = np.stack([22 * (y * (1 - y)) ** 1.5, 27 * (x * (1 - x)) ** 1.5], axis=-1).reshape(-1)
    disc_j = jnp.asarray(disc)

    def jax_field(t, yy, a, b, alpha):
        uv = yy.reshape(m, m, 2)
        u, v = uv[..., 0], uv[..., 1]
        c = alpha / dx ** 2

        def lap(w):
            return (jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1)
                    + jnp.roll(w, -1, 1) - 4 * w)

        forcing = jnp.where(t >= 1.1, 5.0, 0.0) * disc_j
        uuv = u * u * v
        du = c * lap(u) + b + uuv - (a + 1) * u + forcing
        dv = c * lap(v) + a * u - uuv
        return jnp.stack([du, dv], axis=-1).reshape(-1)

    def numpy_field(t, yy, a, b, alpha):
        uv = yy.reshape(m, m, 2)
        u, v = uv[..., 0], uv[..., 1]
        c = alpha / dx ** 2

        def lap(w):
            return (np.roll(w, 1, 0) + np.roll(w, -1, 0) + np.roll(w, 1, 1)
                    + np.roll(w, -1, 1) - 4 * w)

        forcing = (5.0 if t >= 1.1 else 0.0) * disc
        uuv = u * u * v
        out = np.empty((m, m, 2))
        out[..., 0] = c * lap(u) + b + uuv - (a + 1) * u + forcing
        out[..., 1] = c * lap(v) + a * u - uuv
        return out.reshape(-1)

    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    point = (i * m + j).reshape(-1)
    neighbours = [((i + di) % m * m + (j + dj) % m).reshape(-1)
                  for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1))]
    rows, cols = [], []
    for s in (0, 1):
        for q in [point] + neighbours:
            rows.append(2 * point + s)
            cols.append(2 * q + s)
        rows.append(2 * point + s)
        cols.append(2 * point + 1 - s)
    pattern = _coo(n, rows, cols)

    def diffsl() -> str:
        # species-major state (u over points k = i m + j, then v); periodic 5-point Laplacian
        lap = [f"    (0..{nn}, 0..{nn}): -4.0,",
               f"    (0..{nn - m}, {m}..{nn}): 1.0,", f"    ({m}..{nn}, 0..{nn - m}): 1.0,",
               f"    ({nn - m}..{nn}, 0..{m}): 1.0,", f"    (0..{m}, {nn - m}..{nn}): 1.0,"]
        for r in range(m):
            s = r * m
            lap += [f"    ({s}..{s + m - 1}, {s + 1}..{s + m}): 1.0,",
                    f"    ({s + 1}..{s + m}, {s}..{s + m - 1}): 1.0,",
                    f"    ({s + m - 1}, {s}): 1.0,", f"    ({s}, {s + m - 1}): 1.0,"]
        flat = disc.reshape(-1)
        runs, start = [], 0
        for k in range(1, nn + 1):
            if k == nn or flat[k] != flat[start]:
                runs.append(f"({start}:{k}): {_f(flat[start])}")
                start = k
        u0 = ", ".join(_f(value) for value in y0[0::2])
        v0 = ", ".join(_f(value) for value in y0[1::2])
        lap_text = "\n".join(lap)
        return f"""
in_i {{ a = 3.4, b = 1.0, alpha = 10.0 }}
L_ij {{
{lap_text}
}}
disc_i {{ {", ".join(runs)} }}
iu_i {{ {u0} }}
iv_i {{ {v0} }}
u_i {{ (0:{nn}): iu_i, ({nn}:{n}): iv_i }}
X_i {{ u_i[0:{nn}] }}
Y_i {{ u_i[{nn}:{n}] }}
c {{ alpha * {_f(1 / dx ** 2)} }}
lx_i {{ L_ij * X_j }}
ly_i {{ L_ij * Y_j }}
F_i {{
    c * lx_i + b + X_i * X_i * Y_i - (a + 1.0) * X_i + piecewise(t - 1.1, 5.0, 0.0) * disc_i,
    c * ly_i + a * X_i - X_i * X_i * Y_i,
}}
"""

    order = np.concatenate([2 * point, 2 * point + 1])
    return Problem("bruss2d", size, n, y0, 0.0, (5.0, 11.5), (3.4, 1.0, 10.0), 1e-6, 1e-8,
                   1e-12, jax_field, numpy_field, pattern, None, diffsl, order, ())


PROBLEMS = {"bruss1d": bruss1d, "robertson": robertson, "bruss2d": bruss2d}
SIZES = {"bruss1d": (250, 500, 1000, 2000, 4000), "robertson": (1, 10, 100, 1000),
         "bruss2d": (32, 64)}
SIZE_LABEL = {"bruss1d": "N (grid points)", "robertson": "groups", "bruss2d": "N x N grid"}
THREAD_CASES = (("robertson", 100),)
MEMORY_CASES = (("bruss1d", 250), ("bruss1d", 4000), ("robertson", 1000))
MEMORY_KEYS = ("scipy-bdf", "odekit-rodas5p-pattern-auto", "odekit-rodas5p-dense", "cvode",
               "diffsol")


def check_fields(p: Problem) -> None:
    """The NumPy and JAX fields agree and J lies on the pattern (jacfwd at a
    random state, small sizes only)."""
    rng = np.random.default_rng(0)
    y = p.y0 * (1 + 0.1 * rng.standard_normal(p.n)) + 0.01
    for t in (0.5, 2.0):
        np.testing.assert_allclose(p.numpy_field(t, y, *p.args),
                                   p.jax_field(t, jnp.asarray(y), *p.args), rtol=1e-11, atol=1e-9)
    if p.n <= 2100:
        jac = np.asarray(jax.jacfwd(lambda v: p.jax_field(2.0, v, *p.args))(jnp.asarray(y)))
        outside = (jac != 0) & (p.pattern.toarray() == 0)
        assert not outside.any(), f"{p.name}: nonzeros outside the pattern"


# ---------------------------------------------------------------------------
# Reference


def _load_small() -> dict:
    if os.path.exists(SMALL_REFERENCES):
        with np.load(SMALL_REFERENCES) as data:
            return {k: data[k] for k in data.files}
    return {}


def reference(p: Problem, log: Callable[[str], None]) -> np.ndarray:
    """(len(t_out), n): SciPy BDF with jac_sparsity at rtol 1e-10, cached."""
    small = _load_small()
    if p.key in small:
        return small[p.key]
    path = os.path.join(CACHE_DIR, p.key + ".npy")
    if os.path.exists(path):
        return np.load(path)
    log(f"{p.name} {p.size}: reference solve (SciPy BDF, rtol {REF_RTOL:g})")
    start = time.perf_counter()
    sol = scipy.integrate.solve_ivp(p.numpy_field, (p.t0, p.t_out[-1]), p.y0, method="BDF",
                                    t_eval=p.t_out, rtol=REF_RTOL, atol=p.ref_atol, args=p.args,
                                    jac_sparsity=p.pattern)
    if not sol.success:
        raise RuntimeError(f"reference failed: {sol.message}")
    ys = sol.y.T.copy()
    log(f"  ... {time.perf_counter() - start:.1f} s")
    os.makedirs(CACHE_DIR, exist_ok=True)
    np.save(path, ys)
    if p.size == SIZES[p.name][0]:
        small[p.key] = ys
        os.makedirs(os.path.dirname(SMALL_REFERENCES), exist_ok=True)
        np.savez_compressed(SMALL_REFERENCES, **small)
    return ys


# ---------------------------------------------------------------------------
# Contenders


@dataclasses.dataclass
class Runner:
    call: Callable[[], Any]              # one solve; the first call compiles
    ys: Callable[[Any], np.ndarray]      # (len(t_out), n) in our state order
    work: Callable[[Any], dict]          # steps, nfev, njev, nlu (what is known)


@dataclasses.dataclass(frozen=True)
class Contender:
    key: str          # short id (for --one)
    solver: str
    config: str
    build: Callable[[Problem], Runner]
    skip: Callable[[Problem], str | None] = lambda p: None   # a reason to leave it out


def scipy_runner(p: Problem) -> Runner:
    def call():
        sol = scipy.integrate.solve_ivp(p.numpy_field, (p.t0, p.t_out[-1]), p.y0, method="BDF",
                                        t_eval=p.t_out, rtol=p.rtol, atol=p.atol, args=p.args,
                                        jac_sparsity=p.pattern)
        if not sol.success:
            raise RuntimeError(sol.message)
        return sol

    return Runner(call, lambda sol: sol.y.T,
                  lambda sol: dict(nfev=sol.nfev, njev=sol.njev, nlu=sol.nlu))


def odekit_runner(method: str, sparsity: str | None, solver: str | None) -> Callable:
    def build(p: Problem) -> Runner:
        options = {}
        if sparsity == "auto":
            options["jac_sparsity"] = "auto"
        elif sparsity == "pattern":
            options["jac_sparsity"] = p.pattern
        if solver is not None:
            options["linear_solver"] = solver
        t_out = jnp.asarray(p.t_out)

        @jax.jit
        def solve(y0, args):
            sol = odekit.solve_ivp(p.jax_field, (p.t0, p.t_out[-1]), y0, t_eval=t_out, args=args,
                                   method=method, rtol=p.rtol, atol=p.atol, **options)
            return sol.ys, sol.stats

        y0, args = jnp.asarray(p.y0), tuple(jnp.asarray(a) for a in p.args)

        def work(out):
            stats = out[1]
            names = {"num_steps": "steps", "nfev": "nfev", "njev": "njev", "nlu": "nlu",
                     "nlinsolve": "nsolve", "num_linear_solves": "nsolve"}
            return {short: int(stats[k]) for k, short in names.items() if k in stats}

        return Runner(lambda: solve(y0, args), lambda out: np.asarray(out[0]), work)

    return build


def diffrax_runner(p: Problem) -> Runner:
    import diffrax

    term = diffrax.ODETerm(lambda t, y, args: p.jax_field(t, y, *args))

    @jax.jit
    def solve(y0, args):
        sol = diffrax.diffeqsolve(
            term, diffrax.Kvaerno5(), t0=p.t0, t1=p.t_out[-1], dt0=None, y0=y0, args=args,
            saveat=diffrax.SaveAt(ts=jnp.asarray(p.t_out)), max_steps=200_000,
            stepsize_controller=diffrax.PIDController(rtol=p.rtol, atol=p.atol))
        return sol.ys, sol.stats["num_steps"]

    y0, args = jnp.asarray(p.y0), tuple(jnp.asarray(a) for a in p.args)
    return Runner(lambda: solve(y0, args), lambda out: np.asarray(out[0]),
                  lambda out: dict(steps=int(out[1])))


def cvode_runner(p: Problem) -> Runner:
    from sksundae.cvode import CVODE

    def rhs(t, y, yp):
        yp[:] = p.numpy_field(t, y, *p.args)

    if p.band is not None:
        linear = dict(linsolver="band", lband=p.band[0], uband=p.band[1])
    else:
        pattern = scipy.sparse.csc_matrix(p.pattern)
        pattern.indices = pattern.indices.astype(np.int32)   # sksundae wants int32 indices
        pattern.indptr = pattern.indptr.astype(np.int32)
        linear = dict(linsolver="sparse", sparsity=pattern)
    state = {}

    def call():
        if "solver" not in state:      # construction is part of the first call
            state["solver"] = CVODE(rhs, method="BDF", rtol=p.rtol, atol=p.atol,
                                    max_num_steps=1_000_000, **linear)
        sol = state["solver"].solve(np.array((p.t0,) + tuple(p.t_out)), p.y0)
        if not sol.success:
            raise RuntimeError(sol.message)
        return sol

    return Runner(call, lambda sol: np.asarray(sol.y)[1:],
                  lambda sol: dict(nfev=int(sol.nfev), njev=int(sol.njev)))


def diffsol_runner(p: Problem) -> Runner:
    import pydiffsol

    state = {}
    params = np.asarray(p.args, dtype=float)
    t_out = np.asarray(p.t_out, dtype=float)

    def call():
        if "ode" not in state:         # JIT-compiling the model is part of the first call
            ode = pydiffsol.Ode(p.diffsl(), matrix_type=pydiffsol.faer_sparse,
                                linear_solver=pydiffsol.lu, ode_solver=pydiffsol.bdf)
            ode.rtol, ode.atol = p.rtol, p.atol
            state["ode"] = ode
        return state["ode"].solve_dense(params, t_out)

    def ys(sol):
        out = np.empty((len(p.t_out), p.n))
        out[:, p.diffsl_order] = np.asarray(sol.ys).T
        return out

    return Runner(call, ys, lambda sol: {})


def lu_used(p: Problem, c: Contender) -> str:
    """The LU an odekit configuration uses (what linear_solver="auto" picks,
    by odekit's own trace-time rule), or the anchor's."""
    if c.solver != "odekit":
        return {"scipy-bdf": "SuperLU (splu)", "cvode": "band" if p.band else "SuperLU_MT",
                "diffsol": "faer sparse LU", "diffrax-kvaerno5": "dense"}.get(c.key, "")
    if "dense" in c.key:
        return "dense"
    solver = c.key.rsplit("-", 1)[-1]
    if solver != "auto":
        return solver
    try:
        from odekit.ode.linalg import ordering, sparsity
        pattern = sparsity.with_diagonal(sparsity.as_pattern(p.pattern, p.n))
        return "auto: " + ordering.choose(p.n, pattern.rows, pattern.cols)
    except Exception:  # noqa: BLE001 -- internal API; the label is only informative
        return "auto"


def _dense_only(p: Problem) -> str | None:
    return None if p.n <= DENSE_MAX_N else f"dense Jacobian: left out above n = {DENSE_MAX_N}"


def _needs_sparse(p: Problem) -> str | None:
    if not HAS_SPARSE:
        return "odekit.solve_ivp has no jac_sparsity yet"
    if p.name == "bruss2d" and p.size > 32:
        return ("left out: its banded LU (RCM bandwidth 253, 33 blocks of 253 x 253) would "
                "take well over 10 minutes a solve here (32 x 32, bandwidth 125: see above)")
    return None


def contenders(problem_name: str, quick: bool) -> list[Contender]:
    rows = [Contender("scipy-bdf", "scipy", "BDF, jac_sparsity=S", scipy_runner)]
    forced = PROBLEMS[problem_name](SIZES[problem_name][0]).forced_solvers
    if quick or problem_name == "bruss2d":
        # quick: odekit's first calls dominate; bruss2d: one solve takes minutes (the band
        # after RCM is wide), so one configuration
        sparse = [("rodas5p", "pattern", "auto"), ("bdf", "pattern", "auto")]
        if problem_name == "bruss2d":   # GMRES with a block-Jacobi preconditioner
            sparse += [("rodas5p", "pattern", "krylov"), ("bdf", "pattern", "krylov")]
    else:
        sparse = [("rodas5p", "auto", "auto"), ("rodas5p", "pattern", "auto")]
        sparse += [("rodas5p", "pattern", s) for s in forced]
        sparse += [("kvaerno5", "pattern", "auto"), ("bdf", "pattern", "auto")]
    for method, sparsity, solver in sparse:
        pattern = "S" if sparsity == "pattern" else '"auto"'
        rows.append(Contender(f"odekit-{method}-{sparsity}-{solver}", "odekit", f"{method}, "
                              f"jac_sparsity={pattern}, linear_solver=\"{solver}\"",
                              odekit_runner(method, sparsity, solver), _needs_sparse))
    if not quick:
        rows.append(Contender("odekit-rodas5p-dense", "odekit", "rodas5p, dense (jac_sparsity=None)",
                              odekit_runner("rodas5p", None, None), _dense_only))
        if have("diffrax"):
            rows.append(Contender("diffrax-kvaerno5", "diffrax", "Kvaerno5, dense, PID",
                                  diffrax_runner, _dense_only))
    if have("sksundae"):
        config = "BDF, sparse LU (SuperLU_MT)" if problem_name == "bruss2d" else "BDF, band LU"
        rows.append(Contender("cvode", "CVODE (scikit-sundae)", config, cvode_runner))
    if have("pydiffsol"):
        rows.append(Contender("diffsol", "diffsol (pydiffsol)", "BDF, faer sparse LU, DiffSL",
                              diffsol_runner))
    return rows


# ---------------------------------------------------------------------------
# Measurement


def measure(p: Problem, cands: list[Contender], rounds: int, log: Callable) -> list[dict]:
    """One dict per contender: first call, then interleaved warm rounds."""
    ref = reference(p, log)
    results, runners = [], []
    for c in cands:
        row = dict(problem=p.name, size=p.size, n=p.n, key=c.key, solver=c.solver,
                   config=c.config, time=None, first=None, rounds=0, work={}, error=None,
                   note=c.skip(p))
        results.append(row)
        runners.append(None)
        if row["note"]:
            continue
        log(f"{p.name} {p.size} (n={p.n}): {c.solver} {c.config}")
        try:
            runner = c.build(p)
            row["lu"] = lu_used(p, c)
            start = time.perf_counter()
            out = harness.block(runner.call())
            row["first"] = time.perf_counter() - start
            start = time.perf_counter()
            out = harness.block(runner.call())
            row["samples"] = [time.perf_counter() - start]
            row["work"] = runner.work(out)
            ys = runner.ys(out)
            row["error"] = float(np.max(np.abs(ys - ref))) if np.all(np.isfinite(ys)) else np.inf
            runners[-1] = runner
            log(f"  first {row['first']:.2f} s, warm {row['samples'][0]:.3g} s, "
                f"error {row['error']:.2e}, {row['work']}")
        except Exception as exc:  # noqa: BLE001 -- a failed contender is a result
            row["note"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            log("  " + row["note"])
    for r in range(1, rounds):
        for row, runner in zip(results, runners):
            first = row["samples"][0] if runner is not None else 0.0
            if runner is None or (r >= SLOW_ROUNDS and first > SLOW_S) or first > VERY_SLOW_S:
                continue
            start = time.perf_counter()
            harness.block(runner.call())
            row["samples"].append(time.perf_counter() - start)
    for row in results:
        samples = row.pop("samples", None)
        if samples:
            row["time"], row["rounds"] = statistics.median(samples), len(samples)
    return results


# ---------------------------------------------------------------------------
# Memory: one configuration in a fresh process


def one(problem: str, size: int, key: str) -> dict:
    p = PROBLEMS[problem](size)
    cand = {c.key: c for c in contenders(problem, False)}[key]
    reason = cand.skip(p)
    if reason:
        return dict(note=reason)
    runner = cand.build(p)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    harness.block(runner.call())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(base_mb=base, peak_mb=peak)


def memory_table(cases, log) -> tuple[str, list[dict]]:
    rows, records = [], []
    for problem, size in cases:
        p = PROBLEMS[problem](size)
        for c in contenders(problem, False):
            if c.skip(p) or c.key not in MEMORY_KEYS:
                continue
            if c.key == "diffsol" and p.n > 4000:
                continue   # its DiffSL compile alone takes minutes there (see the first calls)
            log(f"memory: {problem} {size} {c.key}")
            proc = subprocess.run([sys.executable, SCRIPT, "--one", problem, str(size), c.key],
                                  capture_output=True, text=True, timeout=900)
            try:
                result = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                result = dict(note=f"failed: {proc.stderr.strip().splitlines()[-1][:120]}"
                              if proc.stderr.strip() else "failed")
            records.append(dict(problem=problem, size=size, n=p.n, key=c.key, **result))
            if "peak_mb" in result:
                rows.append([problem, p.n, f"{c.solver} {c.config}", result["peak_mb"],
                             result["peak_mb"] - result["base_mb"]])
            else:
                rows.append([problem, p.n, f"{c.solver} {c.config}", "-", result.get("note")])
    header = ["problem", "n", "solver", "peak RSS (MB)", "peak - RSS after setup (MB)"]
    return harness.markdown_table(header, rows), records


# ---------------------------------------------------------------------------
# Gradient


def gradient_table(size: int, log, fd_step: float = 1e-4) -> tuple[str, dict]:
    """jax.grad of loss = mean over outputs and state of y^2 on bruss1d with
    respect to (A, B, alpha), rodas5p with the explicit pattern, against
    central differences of SciPy BDF solves at rtol 1e-10 (cached)."""
    p = bruss1d(size)
    if not HAS_SPARSE:
        return "left out: odekit.solve_ivp has no jac_sparsity yet", {}
    t_out = jnp.asarray(p.t_out)
    y0 = jnp.asarray(p.y0)

    def loss(params):
        sol = odekit.solve_ivp(p.jax_field, (p.t0, p.t_out[-1]), y0, t_eval=t_out,
                               args=tuple(params), method="rodas5p", rtol=p.rtol, atol=p.atol,
                               jac_sparsity=p.pattern, adjoint="checkpoint")
        return jnp.mean(sol.ys ** 2)

    params = jnp.asarray(p.args)
    forward, grad = jax.jit(loss), jax.jit(jax.grad(loss))
    log("gradient: compile")
    start = time.perf_counter()
    harness.block(grad(params))
    first = time.perf_counter() - start
    times = harness.interleaved_medians({"forward": lambda: forward(params),
                                         "grad": lambda: grad(params)}, rounds=3)
    g = np.asarray(grad(params))
    fd_path = os.path.join(CACHE_DIR, f"{p.key}_fd_{fd_step:g}.npy")
    if os.path.exists(fd_path):
        fd = np.load(fd_path)
    else:
        log("gradient: central differences (6 SciPy BDF solves at rtol 1e-10)")
        fd = np.empty(3)
        for k in range(3):
            values = []
            for sign in (1, -1):
                args = list(p.args)
                h = fd_step * abs(args[k])
                args[k] += sign * h
                sol = scipy.integrate.solve_ivp(p.numpy_field, (p.t0, p.t_out[-1]), p.y0,
                                                method="BDF", t_eval=p.t_out, rtol=REF_RTOL,
                                                atol=p.ref_atol, args=tuple(args),
                                                jac_sparsity=p.pattern)
                values.append(np.mean(sol.y ** 2))
            fd[k] = (values[0] - values[1]) / (2 * fd_step * abs(p.args[k]))
        os.makedirs(CACHE_DIR, exist_ok=True)
        np.save(fd_path, fd)
    rel = np.abs(g - fd) / np.abs(fd)
    row = ["rodas5p, jac_sparsity=S, adjoint=\"checkpoint\"", p.n, times["forward"] * 1e3,
           times["grad"] * 1e3, times["grad"] / times["forward"], first,
           " ".join(f"{v:.6g}" for v in g), " ".join(f"{v:.6g}" for v in fd),
           float(rel.max())]
    header = ["odekit", "n", "forward (ms)", "gradient (ms)", "gradient / forward",
              "gradient first call (s)", "d loss / d(A, B, alpha)", "central differences",
              "max rel. difference"]
    return harness.markdown_table(header, [row]), dict(ratio=times["grad"] / times["forward"],
                                                       rel=float(rel.max()))


# ---------------------------------------------------------------------------
# Tables, targets, figure

HEADER = ["n", "solver", "configuration", "LU", "time (ms)", "vs SciPy BDF", "first call (s)",
          "rounds", "steps", "nfev", "njev", "nlu", "max abs error"]


def results_table(results: list[dict]) -> str:
    rows = []
    scipy_time = {r["size"]: r["time"] for r in results if r["key"] == "scipy-bdf"}
    for r in results:
        if r["note"] and r["time"] is None:
            rows.append([r["n"], r["solver"], r["config"], r.get("lu", "-"), "-", "-", "-", "-",
                         "-", "-", "-", "-", r["note"]])
            continue
        w = r["work"]
        base = scipy_time.get(r["size"])
        ratio = r["time"] / base if base else "-"
        rows.append([r["n"], r["solver"], r["config"], r.get("lu", ""), r["time"] * 1e3, ratio,
                     r["first"],
                     r["rounds"], w.get("steps", "n/a"), w.get("nfev", "n/a"),
                     w.get("njev", "n/a"), w.get("nlu", "n/a"), f"{r['error']:.2e}"])
    return harness.markdown_table(HEADER, rows)


def _best_odekit(rows: list[dict]) -> dict | None:
    ours = [r for r in rows if r["solver"] == "odekit" and r["time"] is not None
            and "dense" not in r["config"]]
    return min(ours, key=lambda r: r["time"]) if ours else None


def targets_table(results: list[dict], gradient: dict) -> str:
    rows = []
    by_case: dict = {}
    for r in results:
        by_case.setdefault((r["problem"], r["size"]), []).append(r)
    for (problem, size), rs in by_case.items():
        n = rs[0]["n"]
        best = _best_odekit(rs)
        if best is None or n < 1000:
            continue
        for other, factor, label in (("scipy-bdf", 1.0, "faster than SciPy BDF"),
                                     ("diffsol", 2.0, "within 2x of diffsol")):
            ref = [r for r in rs if r["key"] == other and r["time"] is not None]
            if not ref:
                continue
            ratio = best["time"] / ref[0]["time"]
            rows.append([f"{problem} n={n}: best odekit sparse {label}", best["config"],
                         f"{ratio:.3g}x", f"< {factor:g}x", "yes" if ratio < factor else "NO"])
    for problem, size, label in (("robertson", 1000, "Robertson x 1000 (n = 3000)"),
                                 ("bruss1d", 4000, "1-D Brusselator, state 8000")):
        rs = by_case.get((problem, size))
        best = _best_odekit(rs) if rs else None
        if best is None:
            continue
        rows.append([f"{label} in under 1 s", best["config"], f"{best['time']:.3g} s", "< 1 s",
                     "yes" if best["time"] < 1 else "NO"])
        rows.append([f"{label}: first call under 3 s", best["config"], f"{best['first']:.3g} s",
                     "< 3 s", "yes" if best["first"] < 3 else "NO"])
    if gradient:
        rows.append(["bruss1d n=2000: gradient under 10x forward", "rodas5p, S, checkpoint",
                     f"{gradient['ratio']:.3g}x", "< 10x", "yes" if gradient["ratio"] < 10 else "NO"])
        rows.append(["bruss1d n=2000: gradient agrees with central differences", "",
                     f"{gradient['rel']:.2e} rel.", "< 1e-3", "yes" if gradient["rel"] < 1e-3
                     else "NO"])
    return harness.markdown_table(["target", "odekit configuration", "measured", "target", "met"],
                                  rows)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in PROBLEMS if any(r["problem"] == name for r in results)]
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.4), squeeze=False)
    labels = []
    for r in results:
        label = f"{r['solver']} {r['config']}"
        if label not in labels:
            labels.append(label)
    cmap = plt.get_cmap("tab20")
    for ax, name in zip(axes[0], names):
        for k, label in enumerate(labels):
            rows = [r for r in results if r["problem"] == name
                    and f"{r['solver']} {r['config']}" == label and r["time"] is not None]
            if not rows:
                continue
            ax.loglog([r["n"] for r in rows], [r["time"] for r in rows], marker="o", ms=4,
                      color=cmap(k % 20), linestyle="-" if rows[0]["solver"] == "odekit" else "--",
                      label=label)
        ax.set(xlabel="n (state size)", ylabel="time per solve (s)", title=name)
        ax.grid(True, which="both", alpha=0.3)
    handles, names_ = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in names_:
                handles.append(h)
                names_.append(lab)
    fig.legend(handles, names_, loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * ((len(names_) + 2) // 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def threads_table(cases, rounds: int, log) -> tuple[str | None, list, str]:
    """The cases rerun in a child process with the other OpenBLAS setting:
    unset (OpenBLAS's default threads) when this run has
    OPENBLAS_NUM_THREADS=1, else 1."""
    env = dict(os.environ)
    args = [sys.executable, SCRIPT, "--json", "--no-write", "--rounds", str(rounds),
            "--cases", ",".join(f"{p}:{s}" for p, s in cases)]
    if os.environ.get("OPENBLAS_NUM_THREADS") == "1":
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(name, None)
        other = "unset (OpenBLAS default threads)"
    else:
        args[2:2] = ["--threads", "1"]
        other = "1"
    log(f"threads: child process with OPENBLAS_NUM_THREADS {other}")
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=3600, env=env)
        return None, json.loads(proc.stdout.strip().splitlines()[-1]), other
    except Exception as exc:  # noqa: BLE001 -- a failure is a result
        return f"child failed: {type(exc).__name__}: {str(exc)[:200]}", [], other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes, 3 rounds")
    parser.add_argument("--out", default=harness.RESULTS_DIR, help="results folder")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--threads", default=None, help="set OPENBLAS_NUM_THREADS (re-executes)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 5; 3 quick)")
    parser.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated")
    parser.add_argument("--cases", default=None, help="problem:size,... instead of the sizes")
    parser.add_argument("--memory", action="store_true", help="peak memory table (subprocesses)")
    parser.add_argument("--no-threads-table", action="store_true")
    parser.add_argument("--no-gradient", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the main tables of the last run (CACHE_DIR/last_results.json)")
    parser.add_argument("--gradient-size", type=int, default=1000, help="bruss1d N of the gradient")
    parser.add_argument("--gradient-timeout", type=int, default=900, help="seconds")
    parser.add_argument("--gradient-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=3, metavar=("PROBLEM", "SIZE", "KEY"),
                        help="run one configuration once, print peak memory as JSON")
    options = parser.parse_args()
    if options.one:
        print(json.dumps(one(options.one[0], int(options.one[1]), options.one[2])))
        return
    log = lambda text: print(text, file=sys.stderr, flush=True)
    rounds = options.rounds or (3 if options.quick else 5)
    if options.cases:
        cases = [(c.split(":")[0], int(c.split(":")[1])) for c in options.cases.split(",")]
    else:
        cases = [(name, size) for name in options.problems.split(",")
                 for size in (SIZES[name][:1] if options.quick else SIZES[name])]
    if options.gradient_child:
        text, summary = gradient_table(options.gradient_child, log)
        print(json.dumps(dict(text=text, summary=summary)))
        return
    load = os.getloadavg()
    start = time.perf_counter()
    results = []
    saved = os.path.join(CACHE_DIR, "last_results.json")
    if options.resume:
        with open(saved) as fh:
            results = json.load(fh)
        log(f"resumed the main tables from {saved}")
    for name, size in ([] if options.resume else cases):
        p = PROBLEMS[name](size)
        check_fields(p)
        results += measure(p, contenders(name, options.quick), rounds, log)
    if options.json:
        print(json.dumps(results, default=float))
        return
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(saved, "w") as fh:
        json.dump(results, fh, default=float)
    sections = []
    for name in PROBLEMS:
        rs = [r for r in results if r["problem"] == name]
        if rs:
            p = PROBLEMS[name](rs[0]["size"])
            sections += [f"## {name}: time per solve against n",
                         f"rtol {p.rtol:g}, atol {p.atol:g}, t in [{p.t0:g}, {p.t_out[-1]:g}], "
                         f"output at t = {', '.join(f'{t:g}' for t in p.t_out)}; "
                         f"sizes ({SIZE_LABEL[name]}): "
                         + ", ".join(str(s) for s in sorted({r['size'] for r in rs})) + ".",
                         results_table(rs)]
    gradient = {}
    if not options.quick and not options.no_gradient:
        log("gradient (child process)")
        # In a child with a time limit and XLA's CPU Eigen threading off: with it on
        # (jax 0.10.2, 2 cores) the gradient's executable at state 2000 hung inside XLA (all
        # threads idle in futex waits) twice, at state 500 and 1000 it did not.
        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + GRADIENT_XLA_FLAGS).strip()
        try:
            proc = subprocess.run([sys.executable, SCRIPT, "--gradient-child",
                                   str(options.gradient_size)], capture_output=True, text=True,
                                  timeout=options.gradient_timeout, env=env)
            child = json.loads(proc.stdout.strip().splitlines()[-1])
            text, gradient = child["text"], child["summary"]
        except subprocess.TimeoutExpired:
            text, gradient = (f"not finished: the gradient's child process was stopped after "
                              f"{options.gradient_timeout} s (compile + first call)"), {}
        except Exception as exc:  # noqa: BLE001 -- a failure is a result
            text, gradient = f"failed: {type(exc).__name__}: {str(exc)[:300]}", {}
        log(text[:300])
        sections += [f"## Gradient on bruss1d (state {2 * options.gradient_size}) with respect to "
                     "(A, B, alpha)",
                     f"Child process with XLA_FLAGS={GRADIENT_XLA_FLAGS!r}: with XLA's "
                     "default CPU threading this gradient (state 2000) hung inside the "
                     "compiled executable on this machine (all threads idle), twice. "
                     "loss = mean over the output times and the state of y^2; jax.grad through "
                     "odekit's checkpoint adjoint (rtol 1e-6, atol 1e-8) against central "
                     "differences (relative step 1e-4) of SciPy BDF solves at rtol 1e-10; "
                     "forward and gradient timed interleaved (3 rounds).", text]
    sections += ["## Targets (issue 28)", targets_table(results, gradient)]
    if not options.quick and not options.no_threads_table:
        failure, child, other = threads_table(THREAD_CASES, min(rounds, 3), log)
        here = {(r["problem"], r["size"], r["key"]): r for r in results}
        mine_label = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
        rows = []
        for r in child:
            mine = here.get((r["problem"], r["size"], r["key"]))
            if r["time"] is None or mine is None or mine["time"] is None:
                continue
            rows.append([r["problem"], r["n"], f"{r['solver']} {r['config']}", mine["time"] * 1e3,
                         r["time"] * 1e3, r["time"] / mine["time"]])
        sections += [f"## OPENBLAS_NUM_THREADS {mine_label} (the tables above) against {other}",
                     "The same configurations rerun in a child process after the main tables "
                     "(so not interleaved with them; the load may have changed), with the "
                     "other setting of OPENBLAS_NUM_THREADS (and OMP_NUM_THREADS, "
                     "MKL_NUM_THREADS) fixed before NumPy and JAX load.",
                     failure or harness.markdown_table(
                         ["problem", "n", "solver", f"OPENBLAS_NUM_THREADS {mine_label} (ms)",
                          f"OPENBLAS_NUM_THREADS {other} (ms)", "ratio"], rows)]
    if options.memory:
        text, _ = memory_table(MEMORY_CASES, log)
        sections += ["## Peak memory", "One configuration run once (first call: compile "
                     "included) in a fresh process; resource.getrusage ru_maxrss at the end "
                     "and after imports and problem setup. RSS includes the Python, NumPy, "
                     "SciPy and JAX runtime (a few hundred MB); the second column is what the "
                     "solve added.", text]
    versions = [f"scipy {scipy.__version__}"]
    for module in ("diffrax", "sksundae", "pydiffsol"):
        if have(module):
            import importlib.metadata as md
            dist = {"sksundae": "scikit-sundae"}.get(module, module)
            versions.append(f"{dist} {md.version(dist)}")
        else:
            versions.append(f"{module} not installed")
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset (OpenBLAS default)")
    header = [
        "# Large stiff systems: odekit's sparse Jacobians and structured linear solvers "
        "against SciPy BDF, CVODE, diffsol and diffrax (float64)",
        f"{harness.machine_description()}, {', '.join(versions)}; OPENBLAS_NUM_THREADS "
        f"{threads}; load average {load[0]:.1f} at the start (2 cores shared with other "
        f"workers: timings are noisy, ratios are of the same run); "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
        + (" (quick mode)" if options.quick else "")
        + f"; {time.perf_counter() - start:.0f} s in all"
        + (f" (the main tables were resumed from the run of "
           f"{datetime.datetime.fromtimestamp(os.path.getmtime(saved)).strftime('%Y-%m-%d %H:%M')}"
           f", whose load and duration the report's text gives)" if options.resume else "") + ".",
        "Command: `python benchmarks/large_stiff.py" + (" --quick" if options.quick else "")
        + (f" --threads {options.threads}" if options.threads else "")
        + (" --memory" if options.memory else "") + "`. time = median of warm calls over "
        f"interleaved rounds ({rounds}; a contender slower than {SLOW_S:g} s gets "
        f"{SLOW_ROUNDS}, slower than {VERY_SLOW_S:g} s 1); first call = trace + compile + run (odekit, diffrax: the jitted "
        "solve; diffsol: DiffSL JIT + run; SciPy, CVODE: construction + run). error = max abs "
        "deviation at the output times from SciPy BDF with jac_sparsity at rtol 1e-10. SciPy's "
        "and CVODE's nfev include the difference-quotient Jacobian's evaluations; n/a: not "
        "reported by that solver. See the module docstring for the problems' definitions.",
    ]
    text = "\n\n".join(header + sections)
    print(text)
    if not options.no_write:
        os.makedirs(options.out, exist_ok=True)
        with open(os.path.join(options.out, "large_stiff.md"), "w") as fh:
            fh.write(text + "\n")
        try:
            plot(results, os.path.join(options.out, "large_stiff.png"))
        except Exception as exc:  # noqa: BLE001
            log(f"plot failed: {exc}")
        print(f"\nwrote {os.path.join(options.out, 'large_stiff.md')}")


if __name__ == "__main__":
    main()
