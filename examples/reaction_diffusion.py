"""A reaction-diffusion PDE by the method of lines: the 1-D Brusselator,
solved with a sparse Jacobian and a banded LU, and its parameters' gradient.

Model (Hairer & Wanner, Solving ODEs II, Sec. IV.1, "BRUSS"):
    u_t = A + u^2 v - (B + 1) u + alpha u_xx
    v_t = B u - u^2 v + alpha v_xx,          x in [0, 1], t in [0, 10]
with u = 1, v = 3 at both ends, u(x, 0) = 1 + sin(2 pi x), v(x, 0) = 3 and
A = 1, B = 3, alpha = 1/50. Central differences on N interior points give
2N coupled ODEs; the state is interleaved (u_1, v_1, u_2, v_2, ...), so
df/dy is banded with two diagonals either side. Diffusion makes the system
stiff (eigenvalues down to -4 alpha (N + 1)^2).

``solve_ivp(method="rodas5p", jac_sparsity="auto")`` finds that band from
the traced vector field, evaluates the Jacobian by compressed forward mode
(5 jvps whatever N, against 2N for the dense Jacobian) and factors the
iteration matrix with a banded LU (O(N) per step instead of O(N^3)). We
compare with SciPy's BDF given the same pattern (``jac_sparsity``), and take
the gradient of a loss with respect to (A, B, alpha) by ``jax.grad`` through
the solve (the checkpoint adjoint, through the banded LU), checked against
central differences.

Run: ``python examples/reaction_diffusion.py [--quick] [--out DIR]``; writes
reaction_diffusion.png.
"""
from __future__ import annotations

import time

import _common
from _common import plt

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse

import odekit

PARAMS = jnp.array([1.0, 3.0, 1.0 / 50.0])     # A, B, alpha
T_END = 10.0
TOL = dict(rtol=1e-6, atol=1e-9)


def brusselator(t, y, params):
    """dy/dt (2N,) of the interleaved state y = (u_1, v_1, ..., u_N, v_N)."""
    a, b, alpha = params[0], params[1], params[2]
    uv = y.reshape(-1, 2)
    u, v = uv[:, 0], uv[:, 1]
    n = u.shape[0]
    dx2 = (1.0 / (n + 1)) ** 2
    u_ext = jnp.concatenate([jnp.ones((1,), u.dtype), u, jnp.ones((1,), u.dtype)])
    v_ext = jnp.concatenate([jnp.full((1,), 3.0, v.dtype), v, jnp.full((1,), 3.0, v.dtype)])
    u_xx = (u_ext[:-2] - 2 * u + u_ext[2:]) / dx2
    v_xx = (v_ext[:-2] - 2 * v + v_ext[2:]) / dx2
    du = a + u * u * v - (b + 1) * u + alpha * u_xx
    dv = b * u - u * u * v + alpha * v_xx
    return jnp.stack([du, dv], axis=1).reshape(-1)


def initial_state(n):
    x = np.arange(1, n + 1) / (n + 1)
    return jnp.asarray(np.stack([1 + np.sin(2 * np.pi * x), np.full(n, 3.0)], axis=1).ravel())


def band_pattern(size):
    """SciPy's jac_sparsity for the interleaved state: |i - j| <= 2."""
    offsets = range(-2, 3)
    return scipy.sparse.diags_array([np.ones(size - abs(k)) for k in offsets],
                                    offsets=list(offsets), shape=(size, size))


def solve(params, y0, t_eval, **options):
    return odekit.solve_ivp(brusselator, (0.0, T_END), y0, t_eval=t_eval, args=(params,),
                            method="rodas5p", jac_sparsity="auto", **{**TOL, **options})


def scipy_bdf(y0, t_eval, rtol=1e-6, atol=1e-9):
    field = jax.jit(brusselator)
    fun = lambda t, y: np.asarray(field(t, jnp.asarray(y), PARAMS))
    start = time.perf_counter()
    sol = scipy.integrate.solve_ivp(fun, (0.0, T_END), np.asarray(y0), method="BDF",
                                    t_eval=np.asarray(t_eval), rtol=rtol, atol=atol,
                                    jac_sparsity=band_pattern(y0.shape[0]))
    return sol, time.perf_counter() - start


def main():
    opts = _common.parse_args(__doc__)
    n = 100 if opts.quick else 500
    y0 = initial_state(n)
    ts = jnp.linspace(0.0, T_END, 101)

    start = time.perf_counter()
    run = jax.jit(lambda p: solve(p, y0, ts))
    sol = run(PARAMS)
    jax.block_until_ready(sol.ys)
    first = time.perf_counter() - start
    runtime = _common.median_time(lambda: run(PARAMS), 1 if opts.quick else 7)
    ys = np.asarray(sol.ys)
    stats = {k: int(v) for k, v in sol.stats.items() if np.ndim(v) == 0}
    bdf, bdf_time = scipy_bdf(y0, ts)
    reference, _ = scipy_bdf(y0, ts, rtol=1e-10, atol=1e-13)   # a few seconds at n = 500
    error = float(np.max(np.abs(ys - reference.y.T)))
    bdf_error = float(np.max(np.abs(bdf.y.T - reference.y.T)))
    print(f"1-D Brusselator, N = {n} grid points (state {2 * n}), t in [0, {T_END:g}], "
          f"rtol {TOL['rtol']:g}, atol {TOL['atol']:g}")
    _common.print_table(
        ["solver", "time (s)", "steps", "Jacobians", "LUs", "max abs error"],
        [("odekit rodas5p, jac_sparsity='auto' (banded LU)", runtime, stats["num_steps"],
          stats["njev"], stats["nlu"], error),
         ("SciPy BDF, jac_sparsity (SuperLU)", bdf_time, bdf.t.size - 1, bdf.njev, bdf.nlu,
          bdf_error)])
    print(f"odekit first call (trace + compile + run): {first:.2f} s; reference: SciPy BDF "
          f"at rtol 1e-10")

    # gradient of the mean of u over the last output with respect to (A, B, alpha)
    def loss(p):
        return jnp.mean(solve(p, y0, ts[-1:]).ys[-1, 0::2])

    grad_fn = jax.jit(jax.grad(loss))
    grad = np.asarray(grad_fn(PARAMS))
    loss_jit = jax.jit(loss)
    grad_time = _common.median_time(lambda: grad_fn(PARAMS), 1 if opts.quick else 3)
    loss_time = _common.median_time(lambda: loss_jit(PARAMS), 1 if opts.quick else 3)
    tight = jax.jit(lambda p: jnp.mean(solve(p, y0, ts[-1:], rtol=1e-10, atol=1e-13)
                                       .ys[-1, 0::2]))
    fd = _common.central_differences(lambda p: tight(jnp.asarray(p)), np.asarray(PARAMS),
                                     rel_step=1e-5)
    grad_error = _common.relative_error(grad, fd)
    print(f"\nd mean(u(T)) / d (A, B, alpha) = {np.array2string(grad, precision=5)} by jax.grad "
          f"(checkpoint adjoint through the banded LU), {grad_time / loss_time:.1f}x the "
          f"forward solve; central differences of rtol 1e-10 solves: "
          f"{np.array2string(fd, precision=5)}; relative difference {grad_error:.1e}")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3))
    x = np.arange(1, n + 1) / (n + 1)
    image = axes[0].imshow(ys[:, 0::2].T, origin="lower", aspect="auto", cmap="viridis",
                           extent=(0.0, T_END, x[0], x[-1]))
    fig.colorbar(image, ax=axes[0], label="u")
    axes[0].set(xlabel="t", ylabel="x", title=f"Brusselator u(x, t), N = {n} (odekit rodas5p, "
                                               "banded LU)")
    for k, colour in ((0, "C0"), (50, "C1"), (100, "C2")):
        axes[1].plot(x, ys[k, 0::2], color=colour, label=f"u, t = {float(ts[k]):g}")
        axes[1].plot(x, reference.y[0::2, k], "k:", lw=1)
    axes[1].set(xlabel="x", ylabel="u", title="odekit (lines), SciPy BDF rtol 1e-10 (dotted)")
    axes[1].legend(fontsize=8)
    _common.save_figure(fig, opts.out, "reaction_diffusion")
    if error > 1e-3 or grad_error > 1e-4:
        raise SystemExit(f"check failed: error {error:.1e}, gradient {grad_error:.1e}")


if __name__ == "__main__":
    main()
