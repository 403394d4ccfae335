"""A solve by a factorisation whose derivative does not differentiate the
factorisation.

An implicit step factors its iteration matrix ``W`` once and solves with it
for every stage. Differentiating the solves by differentiating the
factorisation (the elimination's row operations, or LAPACK's getrf rule)
puts an O(n^3) computation per direction into forward mode and, in reverse
mode, a backward pass through every elimination step with its residuals
stored; it also makes the differentiated program several times larger,
hence slower to compile. The derivative of ``x = W^-1 b`` needs neither:

    dx = W^-1 (db - dW x)                     (forward mode)
    b_bar = W^-T x_bar,   W_bar = -b_bar x^T  (reverse mode)

so :func:`solve` computes the factors from ``stop_gradient(W)`` and hands
the solve to ``jax.lax.custom_linear_solve`` with ``matvec`` (``v -> W v``,
differentiated in W's values) and the transposed solve (the linear transpose
of the solve with the same factors, ``jax.linear_transpose``). The rule is
exact (not an approximation of the factorisation's derivative) and holds at
every order: the tangent is again such a solve.

Cost: per direction one solve and one product with ``dW`` (O(n^2) dense,
O(nnz) structured) instead of the factorisation's derivative; reverse mode
one transposed solve per solve.
"""
from __future__ import annotations

from typing import Callable

import jax
from jax import lax


def solve(matvec: Callable[[jax.Array], jax.Array], solve_with_factors: Callable[[jax.Array], jax.Array],
          b: jax.Array, solve_transposed: Callable[[jax.Array], jax.Array] | None = None,
          has_aux: bool = False) -> jax.Array:
    """``x = W^-1 b`` for (n,) ``b``.

    Args:
      matvec: ``v -> W v`` for (n,) v, closing over W's (differentiable)
        values; used only by derivatives. It must be written without
        library calls when the solve runs in a one-kernel CPU loop
        (:mod:`odekit.ode.engine.single_kernel`): elementwise products,
        gathers and small sums.
      solve_with_factors: ``r -> W^-1 r``, linear in r, from factors of
        ``stop_gradient(W)`` (it is never differentiated; its linear
        transpose gives ``W^-T``).
      b: the right-hand side.
      solve_transposed: ``c -> W^-T c`` (the plain transpose) from the same
        factors; by default the linear transpose of ``solve_with_factors``.
      has_aux: both solves return ``(x, aux)`` (an iteration count: aux
        carries no derivative; ``solve_transposed`` is then required) and
        so does this function.
    """
    if has_aux and solve_transposed is None:
        raise ValueError("has_aux=True needs solve_transposed (a linear transpose has no aux)")

    def transposed(_, c: jax.Array) -> jax.Array:
        if solve_transposed is not None:
            return solve_transposed(c)
        return jax.linear_transpose(solve_with_factors, c)(c)[0]

    return lax.custom_linear_solve(matvec, b, lambda _, r: solve_with_factors(r), transposed,
                                   has_aux=has_aux)
