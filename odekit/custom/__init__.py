"""Custom-derivative building blocks: the PyLayer-style Function, closure
conversion, and the implicit-function-theorem rule and iteration core shared
by fixed_point and root (siblings that import only from here)."""
from odekit.custom.function import Function, FunctionCtx

__all__ = ["Function", "FunctionCtx"]
