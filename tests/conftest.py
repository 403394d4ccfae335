"""Test configuration: float64 everywhere, strict dtype promotion and strict
rank promotion (users, and JAX's own tests, turn these on)."""
import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
